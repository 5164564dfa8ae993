"""The last step of `doit tune` (not a stage): the proposal built exactly as the build will build it, and measured
as the check measures it.

The search measures candidates compiled in-process, often on a subset of the evaluation samples. A proposal is
only worth applying if the variant it writes builds to a binary that meets the targets, so before tune writes it:
the proposed [variants] section is loaded with the model's model.toml as the build loads it (config.load_model:
`inherits`, per-graph overrides, the same validation), each targeted graph is quantized by the quantize stage's
write_qdq from the same calibration ranges, compiled for the tuning chip by the compile stage's
compile_context_binary (with the block option for blocked int4 weights, as compile sets it), and its context binary
run on the emulator over the whole evaluation set by check's measurement (each of its first samples run twice: a
binary that does not repeat itself is a miss). Those numbers go into the proposal's comments; a proposal that misses
when built fails the task, naming what the search measured and what the binary gives.
(Measured on YOLOv8n before this step: tune proposed W4A16 LPBQ with 36 of 64 layers at int8, det_f1 0.94 as it
measured it; built, det_f1 0.03: its in-process sessions ran the blocked layers in float16.)
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ...build_state import layout
from ...errors import BuildError
from ...quantization.quant_spec import QuantSpec
from .precision import clean, describe, meets, values


def build_and_measure(params: dict, section: str) -> dict:
    """{"graphs": graph -> {"summary", "meets", "bytes"}, "model": the model's gate or None} of the proposal
    `section` (the [variants.<name>] text tune writes), built for the tuning chip as the build builds it. Graphs: those
    with a target. Raises BuildError when one misses. The model's [evaluate] gate (params["evaluate"], when the model
    has one) is judged on every graph's binary once each graph meets its own (tune_model_gate.py); its miss is
    returned, not raised: tune decides what follows."""
    from .. import check
    from ..quantize import write_qdq
    from ...quantization.block_quant import float_scale_blocks
    from ...measuring.samples import load_evaluation, load_labels
    from ...toolchains import ort_qnn
    import onnx
    chip = params["chip"]
    found, binaries, model = {}, {}, None
    with tempfile.TemporaryDirectory(prefix="tune-as-built-") as work:
        variant = _load_variant(params, section, Path(work))
        for graph in params["graphs"]:
            if not graph.get("target") and not params.get("evaluate"):
                continue  # (the model's gate runs every graph: then each is built)
            name = graph["name"]
            spec = QuantSpec.from_settings(variant.settings_for(name))
            qdq = Path(work, f"{name}.qdq.onnx")
            print(f"as built: {name}: quantize, compile for {chip['name']}"
                  + (", run on all evaluation samples" if graph.get("target") else ""), flush=True)
            if spec.is_aimet:
                _aimet(params, graph, spec, qdq)
            else:
                ranges = layout.calibration_ranges(params["model"], name, spec.calibration_method,
                                                   spec.calibration_samples)
                write_qdq(spec, graph["onnx"], qdq, [] if Path(ranges).is_file() else _calibration(graph, spec),
                          ranges=ranges if Path(ranges).is_file() else None,
                          tied=[tuple(p) for p in graph.get("tied") or []] or None)
            compiled = ort_qnn.compile_context_binary(
                qdq, Path(work, chip["name"]), name, soc_model=chip["soc_id"], vtcm_mb=chip["vtcm_mb"], fp16=False,
                block_quant=float_scale_blocks(onnx.load(str(qdq), load_external_data=False)))
            binaries[name] = compiled["ctx_model"]
            if not graph.get("target"):
                continue
            inputs, reference = load_evaluation(graph["evaluation"])
            metrics = check.measure_until_decided(compiled["ctx_model"], params["hooks"], name, params.get("data_dir"),
                                                  inputs, reference, load_labels(graph["evaluation"]), None)
            summary = check.summarize(metrics)
            summary["_float_score"] = metrics.get("float_score", {})
            if (metrics.get("repeats") or {}).get("repeats") is False:
                from ...emulator.repeats import describe as describe_repeats
                summary["unstable"] = describe_repeats(metrics["repeats"])
            found[name] = {"summary": clean(summary), "meets": meets(graph["target"], summary),
                           "samples": len(inputs), "bytes": Path(compiled["binary"]).stat().st_size,
                           "_summary": summary}
            print(f"as built: {name}: {values(graph['target'], summary)} on all {len(inputs)} samples: "
                  f"{'meets' if found[name]['meets'] else 'misses'} {describe(graph['target'])}", flush=True)
        missed = [n for n, r in found.items() if not r["meets"]]
        if missed:
            raise BuildError(f"{params['name']}: the proposal {params['new_name']}, built as the build builds it "
                             f"(quantize, compile for {chip['name']}, its context binary on the emulator, all "
                             "samples), misses: " + "; ".join(
                                 f"{n}: {values(_target(params, n), found[n]['_summary'])} against "
                                 f"{describe(_target(params, n))}" for n in missed)
                             + "; nothing is written: the search's numbers above are not what the build would give "
                             "(report it with this log)")
        for r in found.values():
            r.pop("_summary")
        if params.get("evaluate"):
            from . import tune_model_gate
            print("as built: the model's gate ([evaluate]) on these binaries", flush=True)
            model = tune_model_gate.evaluate(params, binaries)
            print(f"as built: the model: {tune_model_gate.describe(model)}", flush=True)
    return {"graphs": found, "model": model}


def comment_lines(found: dict, chip: dict) -> list[str]:
    """The proposal's comments on what its binaries gave, built as the build builds them."""
    if not found:
        return []
    return [f"# Built as the build builds it (quantize, compile for {chip['name']}, the context binary on the emulator, "
            "each graph's whole evaluation set): "
            + "; ".join(f"{g} {_numbers(r['summary'])} on {r['samples']} samples, {r['bytes'] / 1e6:.2f} MB"
                        for g, r in found.items())]


def _numbers(summary: dict) -> str:
    shown = {k: v for k, v in summary.items() if isinstance(v, float)}
    text = ", ".join(f"{k} = {v:.5g}" for k, v in shown.items())
    return text + (f" (does not repeat itself: {summary['unstable']})" if summary.get("unstable") else "")


def _target(params: dict, name: str):
    return next(g["target"] for g in params["graphs"] if g["name"] == name)


def _load_variant(params: dict, section: str, work: Path):
    """The proposed variant as the build loads it: model.toml with the section appended (what `python -m
    build_rules.tuning apply` writes), in a copy of the model folder whose other files are links."""
    from ...configuration.config import load_chips, load_model
    source = Path(params["model_toml"]).parent
    folder = work / "models" / source.name
    folder.mkdir(parents=True)
    for entry in source.iterdir():
        if entry.name != "model.toml":
            os.symlink(entry.resolve(), folder / entry.name)
    text = Path(params["model_toml"]).read_text().rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"
    (folder / "model.toml").write_text(text)
    model = load_model(folder, load_chips(Path("chips.toml")))
    return model.variants[params["new_name"]]


def _calibration(graph: dict, spec: QuantSpec) -> list[dict]:
    """The calibration samples, when the proposal calibrates otherwise than the ranges already computed."""
    from ...measuring.samples import read_input_list
    calibration = graph["calibration"]
    return read_input_list(calibration["input_list"], calibration["inputs"], spec.calibration_samples)


def _aimet(params: dict, graph: dict, spec: QuantSpec, path: Path) -> None:
    """An AIMET proposal: the aimet stage's quantize, as the ladder ran it."""
    from .. import aimet
    calibration = graph["calibration"]
    aimet.quantize({"name": f"{params['name']} as built", "onnx": graph["onnx"],
                    "input_list": calibration["input_list"], "inputs": calibration["inputs"],
                    "variant": spec.settings(), "htp_arch": calibration["htp_arch"], "progress": False,
                    "tied": graph.get("tied"),
                    "outputs": {"onnx": str(path), "encodings": str(path.with_suffix(".json")),
                                "float_onnx": str(path.with_suffix(".float.onnx"))}})
