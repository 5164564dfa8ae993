"""The outer layer of `doit tune` (not a stage itself): before keeping tensors at 16 bit, try whole variants across
quantizers, techniques and bit widths, and keep the smallest binary that meets every graph's target.

Rungs, from a variant's own weights / per-channel / calibration:
  W4A16 aimet seq_mse | W4A16 LPBQ 64 ort | W4A16 LPBQ 64 aimet seq_mse | W4A16 LPBQ 64 ort with the fewest weights
  at int8 that meet (weight_bits.py: a per-layer search) | W8A8 ort | W8A8 aimet | W8A8 aimet seq_mse
  (aimet rungs need aimet-onnx)
They run only when the variant misses a target. A rung is quantized (onnxruntime from the shared ranges, AIMET
from the shared calibration files), compiled for the tuning chip (its size: the context binaries' bytes) and run on
the HTP emulator graph by graph, the graphs that missed first; the first rung that meets every target on the
tuning samples, then on the full evaluation set, is the result (rungs go by bit width, smallest first; the
measured sizes are reported beside the metrics). When none meets, the mixed-precision search
(tune.py, via precision.py) runs as before, and its size is shown beside W8A16's (every tensor at 16 bit), which
can be the smaller one (measured on MTCNN: a mixed w8a8 came out larger than w8a16).
"""
from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

from ...measuring import gates
from ...quantization.aimet_techniques import PARAMS as TECHNIQUE_PARAMS
from ...quantization.dtypes import TYPES
from ...plumbing.files import atomic_write_json, atomic_write_text, scratch_folder
from ...quantization.quant_spec import QuantSpec
from . import cpu_search, weight_bits
from ...emulator.repeats import CANDIDATE_SAMPLES
from .precision import Candidates, clean, measured_until_missed, meets, unstable_marked, values

# The weight type an AIMET rung uses for a variant's weights (dtypes.py: AIMET's HTP configs take signed <= 8 bit).
AIMET_WEIGHTS = {t.name: t.aimet_weight for t in TYPES if t.weight}
SEQ_MSE = {"quantizer": "aimet", "techniques": ("seq_mse",), "calibration_method": "minmax",
           "technique_params": {"seq_mse": dict(TECHNIQUE_PARAMS["seq_mse"])}}
ORT = {"quantizer": "ort", "techniques": (), "technique_params": {}}


def rungs(variant: QuantSpec) -> list[dict]:
    """The ladder for a variant's spec (one graph's: they differ only in overrides): {"name", "changes"}, the
    fields a rung changes in the variant's spec (Ladder.spec makes and validates it)."""
    eight = AIMET_WEIGHTS[variant.weights]
    w8 = variant.weights if variant.weights != "int4" else "uint8"
    return [{"name": "w4a16_aimet_seq_mse", "changes": {**SEQ_MSE, "weights": "int4", "activations": "uint16"}},
            # LPBQ (block_quant.py): int4 weights in blocks of 64, a little larger than per-channel int4
            {"name": "w4a16_lpbq_ort", "changes": {**ORT, "weights": "int4", "activations": "uint16", "block_size": 64}},
            {"name": "w4a16_lpbq_aimet_seq_mse",
             "changes": {**SEQ_MSE, "weights": "int4", "activations": "uint16", "block_size": 64}},
            # the LPBQ ort rung with the fewest weights at int8 (weight_bits.py), when it missed
            {"name": "w4a16_lpbq_ort_int8_layers", "per_layer_of": "w4a16_lpbq_ort",
             "changes": {**ORT, "weights": "int4", "activations": "uint16", "block_size": 64}},
            {"name": "w8a8_ort", "changes": {**ORT, "weights": w8, "activations": "uint8"}},
            {"name": "w8a8_aimet", "changes": {**SEQ_MSE, "techniques": (), "technique_params": {}, "weights": eight,
                                               "activations": "uint8"}},
            {"name": "w8a8_aimet_seq_mse", "changes": {**SEQ_MSE, "weights": eight, "activations": "uint8"}}]


def w8a16(variant: QuantSpec) -> dict:
    return {"name": "w8a16_ort", "changes": {**ORT, "weights": variant.weights if variant.weights != "int4" else "uint8",
                                             "activations": "uint16"}}


def rung_spec(rung: dict, variant: QuantSpec, graph: str | None = None) -> QuantSpec:
    """The rung's spec for one graph: the variant's (its overrides too) with the rung's fields; no blocks unless the
    rung has them; the weights a per-layer rung keeps at int8 for `graph` as weight overrides."""
    spec = variant.replace(**{"block_size": None, **rung["changes"]})
    eight = rung.get("weight_bits", {}).get(graph)
    return spec.replace(weight_overrides={**spec.weight_overrides, **{n: "int8" for n in eight}}) if eight else spec


def aimet_installed() -> bool:
    return importlib.util.find_spec("aimet_onnx") is not None


class Ladder:
    """Quantize, compile and measure whole-variant candidates for every graph of a tune task."""

    def __init__(self, params: dict):
        self.params = params
        self.work = scratch_folder(self, "tune-ladder-")
        self.candidates = {g["name"]: Candidates(g, params["chip"], params["samples"], params["hooks"],
                                                 params.get("data_dir"))
                           for g in params["graphs"] if g.get("target")}
        self.seconds = 0.0
        self._built: dict[tuple[str, str], dict] = {}
        self.as_built: dict[str, dict] = {}  # graph -> the variant's own build (as_is)
        # graph -> how its CPU QDQ model's numbers compare with the emulator's (cpu_search.Judge), from the variant as
        # built: a rung the CPU rules out beyond that difference is not measured on the emulator (nor made by SeqMSE)
        self.judges: dict = {}
        self.screened: dict = {}  # the last screen's CPU numbers (margin added), for the rung's record
        self.screen_samples: dict = {}  # graph -> the samples its margin was learnt on: the screens measure those
        self.cpu_screens = 0

    def _graph(self, name: str) -> dict:
        return next(g for g in self.params["graphs"] if g["name"] == name)

    def quantize(self, rung: dict, graph: dict) -> Path:
        spec = rung_spec(rung, QuantSpec.from_settings(graph["variant"]), graph["name"])
        problems = spec.problems()
        if problems:  # the same judgement as model.toml's (quant_spec.py): a rung that could not be a variant
            path, message = problems[0]
            raise ValueError(f"{'.'.join(path)}: {message}")
        folder = self.work / rung["name"]
        folder.mkdir(exist_ok=True)
        path = folder / f"{graph['name']}.qdq.onnx"
        if not spec.is_aimet:
            from ..quantize import write_qdq
            write_qdq(spec, graph["onnx"], path, [], ranges=graph["ranges"], tied=graph.get("tied"))
        else:
            from .. import aimet
            calibration = graph["calibration"]
            aimet.quantize({"name": f"{self.params['name']} {rung['name']}", "onnx": graph["onnx"],
                            "input_list": calibration["input_list"], "inputs": calibration["inputs"],
                            "variant": spec.settings(), "htp_arch": calibration["htp_arch"], "progress": False,
                            "tied": graph.get("tied"),
                            "outputs": {"onnx": str(path), "encodings": str(folder / f"{graph['name']}.json"),
                                        "float_onnx": str(folder / f"{graph['name']}.float.onnx")}})
        return path

    def size(self, path: Path, graph: str) -> int:
        from ...toolchains import ort_qnn
        chip = self.params["chip"]
        result = ort_qnn.compile_context_binary(path, path.parent / f"{graph}.ctx", graph, soc_model=chip["soc_id"],
                                                vtcm_mb=chip["vtcm_mb"], fp16=False)
        return Path(result["binary"]).stat().st_size

    def measure(self, path: Path, graph: str, full: bool) -> dict:
        """The graph's summary metrics for a QDQ model on the emulator (as Candidates.measure does for its own); a
        miss of the graph's target may stop early, with a partial summary (precision.measured_until_missed)."""
        c = self.candidates[graph]
        started = time.perf_counter()
        indices = list(range(len(c.inputs))) if full else c.subset
        reference = [c.reference[i] for i in indices]
        outputs, missed = measured_until_missed(c.iter_run(path, indices, None if full else CANDIDATE_SAMPLES),
                                                reference, self._graph(graph)["target"])
        summary = unstable_marked(missed, outputs) if missed is not None else \
            c.summary(indices, outputs, self._graph(graph)["target"], full)
        self.seconds += time.perf_counter() - started
        return summary

    def as_is(self) -> dict:
        """Each targeted graph's summary metrics for the variant exactly as model.toml has it (its 16-bit
        activations, blocks and weight overrides; not the mixed-precision search's 8-bit start), full set."""
        own = {"name": "as_built", "changes": {"block_size": QuantSpec.from_settings(
            self.params["graphs"][0]["variant"]).block_size}}
        found = {}
        for name in self.candidates:
            self.as_built[name] = built = self.build_graph(own, self._graph(name))
            if "error" in built:
                raise RuntimeError(f"{self.params['name']}: {name} as the variant has it: {built['error']}")
            found[name] = self.measure(Path(built["path"]), name, full=True)
            c, judge = self.candidates[name], cpu_search.Judge(None, self._graph(name)["target"])
            samples = cpu_search.on_samples(found[name], range(len(c.inputs)))
            judge.record("the variant as built", cpu_search.qdq_summary(c, built["path"], samples), found[name],
                         len(samples))
            self.judges[name] = judge
            self.screen_samples[name] = samples
        return found

    def ruled_out(self, rung: dict, graph: dict) -> str | None:
        """Why the CPU rules this rung out for `graph` before SeqMSE or the emulator (cpu_search.py), or None: an
        onnxruntime rung whose CPU QDQ model misses even with the largest CPU-to-emulator difference seen in its favour; an
        AIMET rung whose onnxruntime counterpart misses by more than SeqMSE recovers."""
        name, judge = graph["name"], self.judges.get(graph["name"])
        if judge is None or name not in self.candidates:
            return None
        # on the samples the margin was learnt on: a subset's cosine is not the full set's (R-Net's 16 tuning
        # samples gave W4A16 0.78 on the CPU where its first 122 gave 0.90 on the emulator)
        c, samples = self.candidates[name], self.screen_samples[name]
        if rung["changes"].get("quantizer") == "aimet":
            # AIMET's techniques change the weights only: the rung's activations with float weights bound what they
            # can reach; its onnxruntime counterpart, how far they would have to go
            counterpart = {**rung, "name": f"{rung['name']}_ort_counterpart", "changes": {**rung["changes"], **ORT}}
            path = self.quantize(counterpart, graph)
            self.cpu_screens += 2
            bound = judge.optimistic(cpu_search.qdq_summary(c, cpu_search.float_weights(path, graph["onnx"]),
                                                            samples))
            self.screened = {**bound, "samples": len(samples)}
            if not meets(graph["target"], bound):
                return (f"even with its weights in float (what no weight technique, SeqMSE or AdaRound, can beat) "
                        f"{values(graph['target'], bound)} on the CPU ({len(samples)} samples), the largest CPU-to-emulator difference "
                        "seen added in its favour")
            counterpart = judge.optimistic(cpu_search.qdq_summary(c, path, samples))
            self.screened = {**counterpart, "samples": len(samples)}
            return cpu_search.beyond_recovery(graph["target"], counterpart)
        built = self.build_graph(rung, graph)
        if "error" in built:
            return None  # try_rung reports it
        self.cpu_screens += 1
        summary = judge.optimistic(cpu_search.qdq_summary(c, built["path"], samples))
        self.screened = {**summary, "samples": len(samples)}
        if meets(graph["target"], summary):
            return None
        return (f"{values(graph['target'], summary)} on the CPU ({len(samples)} samples) with the largest CPU-to-emulator difference "
                "seen added in its favour: a miss beyond the margin")

    def build_graph(self, rung: dict, graph: dict) -> dict:
        """Quantize + compile one graph for a rung: {"path", "bytes"} or {"error"}; once per rung name and graph (the
        per-layer search compiles the 8-bit rung for its size, and that rung reuses the binary)."""
        key = (rung["name"], graph["name"])
        if key not in self._built:
            try:
                path = self.quantize(rung, graph)
                self._built[key] = {"path": str(path), "bytes": self.size(path, graph["name"])}
            except Exception as e:  # a rung that does not quantize or compile is reported, not fatal
                self._built[key] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
        return self._built[key]

    def try_rung(self, rung: dict, order: list[str]) -> bool:
        """Every graph in `order` meets its target with this rung (tuning samples, then the full set); a graph the
        CPU rules out first (ruled_out) is a miss without SeqMSE or the emulator."""
        for name in order:
            try:
                why = None if name in rung["graphs"] else self.ruled_out(rung, self._graph(name))
            except Exception as e:  # noqa: BLE001 -- a screen that cannot run decides nothing: the emulator measures
                print(f"ladder {rung['name']}: {name}: not screened on the CPU ({type(e).__name__}: {e})", flush=True)
                why = None
            if why:
                rung["graphs"][name] = {"ruled_out": why, "cpu": clean(self.screened)}
                made = self._built.get((rung["name"], name), {})  # an onnxruntime rung is built for its screen
                if "bytes" in made:
                    rung["graphs"][name]["bytes"] = made["bytes"]
                print(f"ladder {rung['name']}: {name}: ruled out on the CPU, not built nor measured on the emulator: "
                      f"{why}", flush=True)
                return False
        for full in (False, True):
            for name in order:
                graph = self._graph(name)
                built = rung["graphs"].get(name) or rung["graphs"].setdefault(name, self.build_graph(rung, graph))
                if "error" in built:
                    print(f"ladder {rung['name']}: {name}: {built['error']}", flush=True)
                    return False
                if name not in self.candidates:
                    continue  # no target: only its size counts
                summary = self.measure(Path(built["path"]), name, full)
                built["full" if full else "subset"] = clean(summary)
                metrics = gates.metrics(graph["target"])
                if not full and "partial" not in summary and any(m not in summary for m in metrics):
                    continue  # a task metric the score hook gives on the full set only: judged there
                ok = meets(graph["target"], summary)
                print(f"ladder {rung['name']}: {name} {built['bytes'] / 1e3:.1f} KB, {values(graph['target'], summary)} "
                      f"on {'all' if full else 'the tuning'} samples: {verdict(graph['target'], summary)}", flush=True)
                if not ok:
                    return False
        return True


def search(params: dict) -> dict:
    """Runs the ladder when the variant misses a target; returns {"rungs", "chosen" (a rung or None), "notes",
    "candidates" (tune reuses their measurements), "seconds"}. Rungs go smallest first by bit width (W4 before W8),
    and within a rung the graphs that missed first: a rung stops at its first miss, so only what is needed is
    quantized, compiled and measured; every built graph's binary size is recorded."""
    started = time.perf_counter()
    ladder = Ladder(params)
    found = {"rungs": [], "chosen": None, "notes": [], "ladder": ladder, "candidates": ladder.candidates}
    base = ladder.as_is()
    missed = [name for name, summary in base.items() if not meets(ladder._graph(name)["target"], summary)]
    for name, summary in base.items():
        target = ladder._graph(name)["target"]
        on = "" if "partial" in summary else " on all samples"  # else values() says after how many it stopped
        print(f"{params['variant']} as built: {name}: {values(target, summary)}{on}: {verdict(target, summary)}",
              flush=True)
    if not missed:
        found["notes"].append("the variant meets every target: no other variant tried")
        return found
    if not params.get("try_variants", True):
        found["notes"].append("[tuning] try_variants = false: no other variant tried")
        return found
    order = missed + [g["name"] for g in params["graphs"] if g["name"] not in missed]
    variant = QuantSpec.from_settings(params["graphs"][0]["variant"])
    for rung in rungs(variant):
        if rung.get("per_layer_of"):
            result = _per_layer(rung, found, ladder, variant, base, missed, order)
            if result is not None:
                found["rungs"].append(result)
                if result.pop("met"):
                    found["chosen"] = result
                    break
            continue
        if rung["changes"]["quantizer"] == "aimet" and not aimet_installed():
            from ...errors import AIMET_INSTALL
            found["notes"].append(f"{rung['name']}: skipped (aimet-onnx is not installed: {AIMET_INSTALL})")
            continue
        if _same_as_variant(rung, variant):
            found["notes"].append(f"{rung['name']}: the variant itself, which misses {', '.join(missed)}")
            continue
        result = {**rung, "graphs": {}}
        found["rungs"].append(result)
        if ladder.try_rung(result, order):
            found["chosen"] = result
            break
    for rung in found["rungs"]:
        rung["bytes"] = sum(g.get("bytes", 0) for g in rung["graphs"].values())
        for g in rung["graphs"].values():
            g.pop("path", None)
    found["seconds"] = round(time.perf_counter() - started, 1)
    return found


def _per_layer(rung: dict, found: dict, ladder: Ladder, variant: QuantSpec, base: dict, missed: list[str],
               order: list[str]) -> dict | None:
    """The per-layer weight-bit search from the whole rung it refines (tried above, or the variant itself)."""
    whole = next((r for r in found["rungs"] if r["name"] == rung["per_layer_of"]), None)
    if whole is None and _same_as_variant(rung, variant):  # the variant is that rung: measured as it is
        whole = {"name": rung["per_layer_of"], "changes": rung["changes"],
                 "graphs": {n: {**ladder.as_built[n], "full": clean(summary), "missed": n in missed}
                            for n, summary in base.items()}}
    if whole is None:
        found["notes"].append(f"{rung['name']}: not tried ({rung['per_layer_of']} was not tried)")
        return None
    errors = [g for g, r in whole["graphs"].items() if "error" in r]
    if errors:
        found["notes"].append(f"{rung['name']}: not tried ({rung['per_layer_of']} failed to build {errors[0]})")
        return None
    ceiling = next(r for r in rungs(variant) if r["name"] == "w8a8_ort")  # past its size, 8 bits is the smaller
    return weight_bits.search(ladder, whole, ceiling, order, lambda line: print(line, flush=True))


def missed(target, summary: dict) -> list[str]:
    """The metrics of `target` a measurement misses, each once: those whose gate failed, or for a measurement stopped
    early the ones its samples decided (the others were not judged, a score hook's not even measured); [] for a
    candidate that does not build."""
    partial = summary.get("partial")
    if partial:
        ranges = {m: tuple(r) for m, r in (summary.get("_ranges") or {}).items()}
        early = gates.early_failure(target, ranges, partial["samples"], partial["of"]) if ranges else None
        if early is not None:
            return list(dict.fromkeys(f["metric"] for f in early["failed"]))
        return list(dict.fromkeys(str(f).split(" ", 1)[0] for f in partial["failed"]))  # "cosine at most ..."
    if "not_built" in summary:
        return []
    found = gates.results(target, summary, summary.get("_float_score", {}))
    return list(dict.fromkeys(r["metric"] for r in found if r["passed"] is False))


def verdict(target, summary: dict) -> str:
    """'meets det_f1 and cosine', 'misses det_f1' (only the gates that missed), 'not built'."""
    if "not_built" in summary:
        return "misses: not built"
    failed = missed(target, summary)
    return f"misses {' and '.join(failed) or 'its target'}" if failed or not meets(target, summary) else \
        f"meets {' and '.join(gates.metrics(target))}"


def _same_as_variant(rung: dict, variant: QuantSpec) -> bool:
    return rung_spec(rung, variant) == variant


def _values(rung: dict, params: dict) -> str:
    parts = []
    for graph in params["graphs"]:
        target = graph.get("target")
        measured = rung["graphs"].get(graph["name"], {})
        summary = measured.get("full") or measured.get("subset")
        if target and summary:
            parts += [f"{graph['name']} {m} = {summary[m]:.5g}" for m in gates.metrics(target) if m in summary]
    return ", ".join(parts) or "not measured"

def mixed_size(found: dict, results: dict, params: dict) -> dict:
    """After the mixed-precision search: its binary size and W8A16's, measured the same way, for the comparison.
    Binary size is not monotonic in the 16-bit tensors (Whisper's run 11: a mix of 80 + 81 tensors built to 63234 KB,
    W8A16 to 62579 KB, run 8's mix of 110 + 59 to 62067 KB): a graph whose every candidate at 16 bit (measured, and
    meeting its target, as the search's upper end) builds smaller than its mix is proposed so (all_16_smaller:
    graph -> both sizes), and mixed_bytes is the proposal's."""
    ladder: Ladder = found["ladder"]
    mixed, full16 = 0, w8a16(QuantSpec.from_settings(params["graphs"][0]["variant"]))
    built16 = {**full16, "graphs": {g["name"]: ladder.build_graph(full16, g) for g in params["graphs"]}}
    if all("bytes" in g for g in built16["graphs"].values()):
        built16["bytes"] = sum(g["bytes"] for g in built16["graphs"].values())
    else:
        built16["error"] = next(g["error"] for g in built16["graphs"].values() if "error" in g)
    smaller = {}
    for graph in params["graphs"]:
        c = ladder.candidates.get(graph["name"])
        result = results.get(graph["name"], {})
        sixteen = result.get("sixteen_bit", [])
        path = ladder.work / "mixed" / f"{graph['name']}.qdq.onnx"
        path.parent.mkdir(exist_ok=True)
        if c is not None:
            c.quantize(set(sixteen), path)
        else:
            own = QuantSpec.from_settings(graph["variant"])
            path = Path(ladder.quantize({"name": "mixed", "changes": {**ORT, "weights": own.weights,
                                                                     "activations": own.activations}}, graph))
        size = ladder.size(path, graph["name"])
        if c is not None and sixteen and not set(c.candidates) <= set(sixteen) and \
                meets(result.get("target"), result.get("all_16bit") or {}):
            top = ladder.work / "mixed" / f"{graph['name']}.all16.qdq.onnx"
            top_size = ladder.size(c.quantize(set(c.candidates), top), graph["name"])
            if top_size < size:
                smaller[graph["name"]] = {"mixed_bytes": size, "all_16_bytes": top_size}
                size = top_size
        mixed += size
    for g in built16["graphs"].values():
        g.pop("path", None)
    return {"mixed_bytes": mixed, "w8a16": built16, **({"all_16_smaller": smaller} if smaller else {})}


def every_candidate(found: dict, graph: str, result: dict, sizes: dict) -> dict:
    """The graph's mixed-search `result` turned into its upper end: every candidate at 16 bit, with the numbers the
    search measured for it on the emulator; for a graph whose mix builds larger than that (mixed_size)."""
    c = found["ladder"].candidates[graph]
    tensors, state, inputs = c.listed(set(c.candidates), c.candidates)
    changed = {**result, "sixteen_bit": [*tensors, *state, *inputs], "state_tensors": len(state),
               "tuned": result["all_16bit"], "mix": {"sixteen_bit": len(result["sixteen_bit"]), **sizes}}
    changed.pop("graph_inputs_16", None)
    changed.pop("budget_spent", None)  # (a mix's search left groups untried: not what is proposed)
    return {**changed, **({"graph_inputs_16": inputs} if inputs else {})}


def toml_lines(found: dict, name: str, base_name: str, graphs: list[dict]) -> tuple[list[str], list[str]]:
    """(comment lines: every rung with its size and numbers; the variant section of a chosen rung, or [])."""
    lines = ["# Whole variants tried before keeping tensors at 16 bit (tuning chip; sizes: the graphs built):"]
    targets = {g.get("name"): g.get("target") for g in graphs}
    for rung in found["rungs"]:
        errors = [f"{g}: {r['error']}" for g, r in rung["graphs"].items() if "error" in r]
        if errors:
            lines.append(f"#   {rung['name']}: failed: {'; '.join(errors)}")
            continue
        ruled = [f"{g}: {r['ruled_out']}" for g, r in rung["graphs"].items() if "ruled_out" in r]
        if ruled:  # not built nor measured on the emulator
            size = f"{rung['bytes'] / 1e3:.1f} KB, " if rung.get("bytes") else ""
            lines.append(f"#   {rung['name']}: {size}ruled out on the CPU ({'; '.join(ruled)})")
            continue
        status = "chosen" if rung is found["chosen"] else "misses a target"
        if "probes" in rung:  # the per-layer search: what it chose, then what each probe kept at int8 and measured
            kept = ", ".join(f"{g} {len(n)} weights at int8" for g, n in rung["weight_bits"].items()) \
                if rung is found["chosen"] else ""  # what the section below holds (a probe may have had more)
            size = f", {rung['bytes'] / 1e3:.1f} KB" if kept and rung.get("bytes") else ""
            lines.append(f"#   {rung['name']}: {status}{': ' + kept + size if kept else ''}; probes: " + "; ".join(
                f"{p['graph']} top {p['int8']} at int8 {_probe(p, targets.get(p['graph']))}" for p in rung["probes"]))
            lines += [f"#     {g} at int8: {', '.join(n)}" for g, n in rung["weight_bits"].items() if n]
            continue
        values = ", ".join(f"{g} {k} {json.dumps(_short(m, targets.get(g)))}" for g, r in rung["graphs"].items()
                           for k, m in (("full", r.get("full")), ("subset", r.get("subset"))) if m) or "-"
        lines.append(f"#   {rung['name']}: {rung['bytes'] / 1e3:.1f} KB, {status} ({values})")
    lines += [f"#   {n}" for n in found.get("notes", [])]
    rung = found["chosen"]
    if rung is None:
        return lines, []
    base = QuantSpec.from_settings(graphs[0]["variant"])
    spec = rung_spec(rung, base)
    if not spec.inherits_from(base):  # a base with blocks: its block_size cannot be unset by inheriting
        lines.append(f"#   {rung['name']} is not written as a variant: [variants.{base_name}] has block_size = "
                     f"{base.block_size}, which a variant that inherits it cannot unset; copy the table and drop it")
        return lines, []
    section = [f"[variants.{name}]", f"inherits = {json.dumps(base_name)}", *spec.toml_lines(base), ""]
    for graph, nodes in rung.get("weight_bits", {}).items():  # the per-layer rung's int8 weights
        if nodes:
            pairs = ", ".join(f"{json.dumps(n)} = \"int8\"" for n in nodes)
            section += [f"[variants.{name}.graphs.{graph}]", f"weight_overrides = {{ {pairs} }}", ""]
    return lines, section


def w8a16_section(name: str, base_name: str, graphs: list[dict]) -> list[str]:
    """[variants.<name>] as W8A16 (w8a16()): what tune proposes when no mix of 8 and 16 bit it found is smaller."""
    base = QuantSpec.from_settings(graphs[0]["variant"])
    spec = rung_spec(w8a16(base), base)
    return [f"[variants.{name}]", f"inherits = {json.dumps(base_name)}", *spec.toml_lines(base), ""]


def _probe(probe: dict, target) -> str:
    if "error" in probe:
        return f"failed: {probe['error']}"
    if "ruled_out" in probe:
        return (f"{probe.get('bytes', 0) / 1e3:.1f} KB {json.dumps(_short(probe['cpu'], target))} on the CPU, "
                "ruled out there")
    measured = probe.get("full") or probe.get("subset") or {}
    return (f"{probe.get('bytes', 0) / 1e3:.1f} KB {json.dumps(_short(measured, target))} "
            f"{'meets' if probe['meets'] else 'misses'}")


def _short(summary: dict, target=None) -> dict:
    """A measurement as the comments give it: the target's metrics (what decides), cosine and SQNR beside them, and
    which of the target's metrics it missed ("misses")."""
    shown = [*gates.metrics(target), "cosine", "sqnr"] if target else ["cosine", "sqnr", "accuracy", "wer"]
    short = {k: round(summary[k], 5) for k in dict.fromkeys(shown)
             if isinstance(summary.get(k), (int, float)) and not isinstance(summary.get(k), bool)}
    failed = missed(target, summary) if target else []
    if failed:
        short["misses"] = " and ".join(failed)
    if summary.get("partial"):  # a miss decided before the last sample: the numbers of those measured
        short["stopped_after"] = f"{summary['partial']['samples']} of {summary['partial']['of']} samples"
    return short


def summary(found: dict, results: dict, params: dict) -> dict:
    """What tune's JSON and TOML get from the ladder when the mixed-precision search ran after it."""
    extra = {"ladder": {k: found.get(k) for k in ("rungs", "notes", "seconds")}}
    lines, _ = toml_lines(found, params["new_name"], params["variant"], params["graphs"])
    if found.get("ladder") is not None and any(r.get("sixteen_bit") for r in results.values()):
        sizes = mixed_size(found, results, params)
        extra.update(sizes)
        w16 = sizes["w8a16"]
        for graph, both in sizes.get("all_16_smaller", {}).items():
            lines.append(f"#   {graph}: every candidate at 16 bit builds smaller than its mix "
                         f"({both['all_16_bytes'] / 1e3:.1f} KB against {both['mixed_bytes'] / 1e3:.1f} KB): "
                         "proposed so (size is not monotonic in the 16-bit tensors)")
        lines.append(f"#   mixed precision below: {sizes['mixed_bytes'] / 1e3:.1f} KB; "
                     + (f"w8a16 (every tensor at 16 bit): {w16['bytes'] / 1e3:.1f} KB" if "bytes" in w16
                        else f"w8a16: {w16.get('error')}"))
    extra["ladder_comments"] = lines
    return extra


def write(params: dict, found: dict, started: float) -> dict:
    """A rung met every target: it is the tuned variant (no tensor kept at 16 bit)."""
    rung = found["chosen"]
    tuned = {"model": params["model"], "variant": params["variant"], "name": params["new_name"],
             "chip": params["chip"], "model_toml": params["model_toml"], "chosen": rung["name"],
             "ladder": {k: found.get(k) for k in ("rungs", "notes", "seconds")},
             "graphs": {g: {"target": next(x["target"] for x in params["graphs"] if x["name"] == g),
                            "tuned": r.get("full"), "bytes": r["bytes"], "sixteen_bit": []}
                        for g, r in rung["graphs"].items()},
             "seconds": round(time.perf_counter() - started, 1)}
    chip = params["chip"]
    comments, section = toml_lines(found, params["new_name"], params["variant"], params["graphs"])
    if section:  # the last step: the proposal built as the build builds it (tune_confirm.py)
        from . import tune_confirm
        from . import tune_model_gate
        built = tune_confirm.build_and_measure(params, "\n".join(section))
        tuned["as_built"], tuned["model_gate"] = built["graphs"], built["model"]
        if built["model"] is not None and not built["model"]["passed"]:
            raise tune_model_gate.Missed(f"{rung['name']} meets every graph's target but not the model's gate: "
                                         f"{tune_model_gate.describe(built['model'])}")
        comments += tune_confirm.comment_lines(tuned["as_built"], chip)
        comments += tune_model_gate.comment_lines(built["model"], [])
    atomic_write_json(params["outputs"]["json"], tuned)
    text = [f"# Found by `doit tune:{params['model']}/{params['variant']}`: the first rung of the ladder (fewest weight bits",
            f"# first) that meets every graph's target on the HTP emulator ({chip['name']}, soc {chip['soc_id']}), full evaluation set: "
            f"{rung['name']}, {rung['bytes'] / 1e3:.1f} KB.",
            "# Other chips can differ slightly: the gate still checks every chip when you build it.", *comments,
            f"# Keep it: python -m build_rules.tuning apply {params['final_outputs']['toml']}" if section else
            "# Nothing to apply: write that variant into model.toml by hand (above: why it is not written here).",
            "", *section]
    atomic_write_text(params["outputs"]["toml"], "\n".join(text))
    return {"chosen": rung["name"], "bytes": rung["bytes"]}
