"""Bundles of split graphs and weight-shared contexts: what build_rules/dist.py and stages/dist.py add for them.

A split graph ([graphs.X] split) ships its parts in order, <chip>/<graph>.part<k>.bin (+ _ctx.onnx), and index.json
gives, under graphs.<graph>:
  parts   [{"name", "binary", "io"}] in the order the app runs them: each part's own I/O contract (dtype, scale,
          offset of every tensor as that binary takes or gives it);
  cuts    per cut, the tensors crossing it: the fixed-point type, scale and offset, which are the same on both sides
          (the whole graph was quantized once), so the app hands part k's output buffer to part k+1 as it is;
  io      the graph's own inputs and outputs, as the parts that take and give them see them.
A weight-shared context ([model] share_weights) ships as <chip>/shared/<g1>+<g2>.bin with one <graph>_ctx.onnx per
graph; index.json's `shared_contexts` names its graphs, sizes (against the graphs compiled apart) and that the x86
emulator did not load it. `dist verify` runs a split graph's parts as a chain through the bare binaries with
fixed-point buffers between them and compares with the chained _ctx.onnx models.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path


class PartsError(Exception):
    pass


def _copy(source, target: Path) -> int:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    return target.stat().st_size


def bundle_parts(bundle: Path, chip: str, graph: str, built: dict) -> tuple[dict, dict]:
    """Copy one chip's parts of a split graph into the bundle: (files {path: bytes}, index entry of the graph)."""
    from . import dist_contract as dist
    files, parts = {}, []
    for part in built["parts"]:
        name = part["name"]
        files[f"{chip}/{name}.bin"] = _copy(part["binary"], bundle / chip / f"{name}.bin")
        files[f"{chip}/{name}_ctx.onnx"] = _copy(part["ctx_model"], bundle / chip / f"{name}_ctx.onnx")
        contract = dist.contract_from_ctx(part["ctx_model"])
        parts.append({"name": name, "binary": f"{name}.bin", "ctx_model": f"{name}_ctx.onnx",
                      "io": {"inputs": contract["inputs"], "outputs": contract["outputs"]}})
    return files, chain_entry(graph, parts)


def chain_entry(graph: str, parts: list[dict]) -> dict:
    """The index entry of a split graph from its parts' contracts: the cuts, and the graph's own I/O."""
    made: dict[str, tuple[int, dict]] = {}
    cuts = []
    for k, part in enumerate(parts):
        for tensor in part["io"]["inputs"]:
            if tensor["name"] in made:
                source, given = made[tensor["name"]]
                same = {f: given[f] for f in ("dtype", "shape", "scale", "offset")} == \
                    {f: tensor[f] for f in ("dtype", "shape", "scale", "offset")}
                if not same:
                    raise PartsError(f"graph '{graph}': tensor '{tensor['name']}' leaves {parts[source]['name']} as "
                                     f"{given['dtype']} scale {given['scale']} offset {given['offset']} but enters "
                                     f"{part['name']} as {tensor['dtype']} scale {tensor['scale']} offset "
                                     f"{tensor['offset']}: the app could not pass the buffer on")
                cuts.append({"tensor": tensor["name"], "from": parts[source]["name"], "to": part["name"],
                             **{f: tensor[f] for f in ("dtype", "shape", "scale", "offset")}})
        for tensor in part["io"]["outputs"]:
            made[tensor["name"]] = (k, tensor)
    crossing = {c["tensor"] for c in cuts}
    inputs = [t for part in parts for t in part["io"]["inputs"] if t["name"] not in crossing]
    outputs = [t for part in parts for t in part["io"]["outputs"] if t["name"] not in crossing]
    return {"io": {"inputs": inputs, "outputs": outputs}, "parts": parts, "cuts": cuts,
            "how": "run parts in this order; each cut's tensor is one part's output buffer and a later part's input "
                   "buffer, with the same dtype, scale and offset: pass it on as it is"}


def bundle_shared(bundle: Path, shared: dict, chips: dict) -> dict:
    """Copy each chip's weight-shared contexts into <chip>/shared/: the index's `shared_contexts`."""
    from . import dist_contract as dist
    if shared.get("error"):
        return {"error": shared["error"], "groups": {}}
    groups: dict[str, dict] = {}
    for chip, reports in shared["chips"].items():
        for group, report_path in reports.items():
            report = json.loads(Path(report_path).read_text())
            folder = Path(report_path).parent
            files = [report["binary"], *(g["ctx_model"] for g in report["graphs"].values() if g.get("ctx_model"))]
            for name in files:
                chips[chip]["files"][f"{chip}/shared/{name}"] = _copy(folder / name, bundle / chip / "shared" / name)
            if dist.sha256(bundle / chip / "shared" / report["binary"]) != report["sha256"]:
                raise PartsError(f"{folder / report['binary']} is not the file {report_path} describes")
            entry = groups.setdefault(group, {"graphs": list(report["graphs"]), "chips": {}})
            entry["chips"][chip] = {
                "binary": f"{chip}/shared/{report['binary']}", "bytes": report["bytes"],
                "apart_bytes": report["apart_bytes"], "shared_weights": report["shared_weights"]["count"],
                "shared_weight_bytes": report["shared_weights"]["bytes"],
                "graphs": {g: {**({"ctx_model": f"{chip}/shared/{e['ctx_model']}"} if e.get("ctx_model") else {}),
                               "qnn_graph": e["qnn_graph"], "io": e["io"]} for g, e in report["graphs"].items()},
                "emulator": report["emulator"]}
    return {"groups": groups,
            "how": "one context binary per chip holds the group's graphs and stores the weights they share once: "
                   "QnnContext_createFromBinary(<chip>/shared/<group>.bin), then QnnGraph_retrieve each graph by its "
                   "qnn_graph name; or open <chip>/shared/<graph>_ctx.onnx with ONNX Runtime's QNN EP. The x86 HTP "
                   "emulator does not load it (see emulator): the graphs were checked as compiled apart, "
                   "<chip>/<graph>.bin, which have the same I/O contract"}


def part_binaries(index_graph: dict) -> list[str]:
    return [p["binary"] for p in index_graph.get("parts", [])]


def verify_chain(chip_dir: Path, graph: str, entry: dict, evaluation: Path, samples: int | None, where: str,
                 inputs: list[dict] | None = None) -> dict:
    """Each part's contract (bare binary vs its _ctx.onnx on the inputs the chain gives it), then the whole chain
    through the bare binaries with the fixed-point buffers passed on unchanged, against the chained _ctx.onnx.
    inputs: the evaluation inputs already loaded (verify reads each graph's once for all chips)."""
    import tempfile

    import numpy as np

    from . import dist_contract as dist
    from ..emulator.emulator_runs import holding_slot, open_binary
    from ..measuring.samples import load_evaluation

    if inputs is None:
        inputs, _ = load_evaluation(str(evaluation), samples)
    if samples is not None:
        inputs = inputs[:samples]
    worst = 0.0
    with holding_slot(), tempfile.TemporaryDirectory(prefix="dist-chain-") as tmp:
        bare, floats = [], []
        for k, part in enumerate(entry["parts"]):
            folder = Path(tmp) / str(k)
            folder.mkdir()
            wrapper = dist._bare_binary_model(chip_dir / part["ctx_model"], chip_dir / part["binary"], part["io"],
                                              folder)
            try:
                bare.append(open_binary(wrapper, eager=True))
                floats.append(open_binary(chip_dir / part["ctx_model"]))
            except Exception as e:
                raise dist._EmulatorRefused(f"{type(e).__name__}: {str(e).strip()[:400]}") from None
        for number, sample in enumerate(inputs):
            float_values = {n: np.asarray(v) for n, v in sample.items()}
            fixed_values = {}
            for k, part in enumerate(entry["parts"]):
                feed = {}
                for tensor in part["io"]["inputs"]:
                    name = tensor["name"]
                    # a graph input is quantized with the index's scale/offset; a cut tensor is the earlier part's
                    # output buffer, passed on as it is
                    feed[name] = fixed_values[name] if name in fixed_values else dist.quantize(float_values[name],
                                                                                               tensor)
                try:
                    raw = bare[k](feed)
                except Exception as e:
                    raise dist.DistError(f"{where}: {part['name']} refused inputs typed as the index says: "
                                         f"{str(e).strip()[:400]}") from None
                reference = floats[k]({t["name"]: float_values[t["name"]] for t in part["io"]["inputs"]})
                for tensor in part["io"]["outputs"]:  # every part's outputs, the cut tensors too
                    got = dist.dequantize(raw[tensor["name"]], tensor)
                    want = np.asarray(reference[tensor["name"]], dtype=np.float64)
                    step = tensor["scale"] if tensor["scale"] is not None else \
                        1e-6 * max(1.0, float(np.abs(want).max()))
                    steps = (float(np.abs(got - want).max()) if got.size else 0.0) / step
                    if steps > 1.0 + 1e-6:
                        raise dist.DistError(
                            f"{where}: {part['name']} (part {k + 1} of {len(entry['parts'])}, fed the earlier parts' "
                            f"fixed-point buffers as they are) differs from the chained _ctx.onnx models on output "
                            f"'{tensor['name']}' (sample {number}) by {steps:.1f} quantization steps of {step:.6g}")
                    worst = max(worst, steps)
                    fixed_values[tensor["name"]] = raw[tensor["name"]]
                    float_values[tensor["name"]] = reference[tensor["name"]]
    return {"samples": len(inputs), "worst_steps": worst, "parts": len(entry["parts"])}


def open_chains(chip_dir: Path, entry: dict, tmp: Path):
    """A split graph's parts as two functions of the whole graph's inputs (for `dist verify`'s greedy steps):
    through the bare binaries in fixed point, each cut's buffer passed on as it is, and through the chained
    _ctx.onnx models in float. Each returns every part's outputs, the cut tensors too."""
    from . import dist_contract as dist
    from ..emulator.emulator_runs import open_binary

    bare, floats = [], []
    for k, part in enumerate(entry["parts"]):
        folder = Path(tmp) / str(k)
        folder.mkdir()
        wrapper = dist._bare_binary_model(chip_dir / part["ctx_model"], chip_dir / part["binary"], part["io"], folder)
        bare.append(open_binary(wrapper, eager=True))
        floats.append(open_binary(chip_dir / part["ctx_model"]))

    def chained(runners):
        def run(feed: dict) -> dict:
            values, made = dict(feed), {}
            for part, runner in zip(entry["parts"], runners):
                outputs = runner({t["name"]: values[t["name"]] for t in part["io"]["inputs"]})
                values.update(outputs)
                made.update(outputs)
            return made
        return run

    return chained(bare), chained(floats)


def check_shared_targets(bundle: Path, index: dict) -> int:
    """Each weight-shared context's embedded SoC against its chip; returns how many were checked."""
    from . import dist_contract as dist
    from ..toolchains.qnn_binary import read_binary_target
    count = 0
    for group, entry in (index.get("shared_contexts") or {}).get("groups", {}).items():
        for chip, made in entry["chips"].items():
            binary = bundle / made["binary"]
            if not binary.is_file():
                raise dist.DistError(f"{binary}: missing (index.json: shared context {group} for {chip})")
            target = read_binary_target(binary)
            if target["soc_type"] != index["chips"][chip]["ro.soc.model"]:
                raise dist.DistError(f"{binary}: built for soc_type={target['soc_type']}, index.json says {chip}")
            count += 1
    return count
