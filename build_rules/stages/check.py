"""Stage 7, check: run one chip's binary on the HTP emulator against the float model's outputs.

Metrics (cosine, SQNR, max abs per output, plus the model's score hook) go to <graph>.check.json;
a metric below the graph's gate fails the build with the metric, value and threshold. A failed check's report is
kept in the measurement memo <graph>.measure.json (build_rules/build_state/results.py), which the report, the summary and tune
read: check.json is a target, and the runner removes a failed task's targets.

Each variant is measured in full on one reference chip; another chip's check (params["reference"]) first runs its
binary and the reference's on a few evaluation samples, and equal outputs take the reference's metrics (prove_equal,
below; docs/models.md, "Checks on several chips"). A proof is kept in its own memo, <graph>.proof.json.

The runs stop once the samples so far decide that a gate fails (early verdicts: early_verdicts.py, gates.py); such
a measurement is kept marked partial and is never taken for one of every sample (remembered()).

A binary that does not repeat itself (the emulator door runs its first samples twice: repeats.py) is measured on
every run it made, its numbers are the worst run's, and its check fails naming the instability, where it starts
(stages/support/instability.py) and the diagnose task that finds a precision that repeats.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..build_state import layout, results
from ..emulator import repeats
from ..measuring import gates
from ..errors import BuildError
from ..plumbing.files import atomic_write_json
from ..measuring.samples import compare, load_evaluation, load_hooks, load_labels, score, worst

# The version of this stage's measurement memo (results.py): a new one re-measures, a task key's version
# (stage_table.py) does not have to.
MEASUREMENT_VERSION = 4  # 2: frame_cosine measured; worst output per metric in the report; 3: zero frames agree;
# 4: whether the binary repeats itself ("repeats"), a non-repeating one's numbers the worst of its runs


def run(params: dict) -> dict:
    memo = layout.memo_file(params["final_outputs"]["report"])
    proof = None
    if params.get("reference"):  # another chip than the reference: equal outputs take the reference's metrics
        proof = prove_equal(params)
        if proof["equal"]:
            metrics, key = reference_metrics(params)
            return decide(params, metrics, key, proof)
    metrics, key = measurement(params["ctx_model"], params["evaluation"], params["hooks"], params["graph"],
                               params.get("data_dir"), memo, params["gates"], concat_entries(params))
    return decide(params, metrics, key, proof)


def concat_entries(params: dict) -> list[dict]:
    """The graph outputs made by a Concat of differently ranged inputs, from the quantize stage's report
    (params["concats"], <graph>.quantize.json; stages/support/concat_slices.py): the check measures them slice by
    slice too. [] without one (fp16, AIMET, qairt)."""
    if not params.get("concats"):
        return []
    from .support.concat_slices import sliced
    return sliced(json.loads(Path(params["concats"]).read_text()).get("concats", []))


def measure(hooks_path: str, graph: str, data_dir, inputs: list[dict], reference: list[dict],
            outputs: list[dict], labels: list | None = None, concats: list[dict] | None = None) -> dict:
    """Per-output cosine/SQNR/max abs against the float reference, plus the score hook's task metrics: of the
    binary's outputs and of the float model's (the reference of relative gates). A hook that takes float_outputs
    gets the float model's outputs both times (so an agreement metric of the float model with itself is its top).
    concats (concat_entries()): the same numbers per slice of each output made by a Concat, under "slices"."""
    metrics = {"samples": len(inputs), "outputs": compare(reference, outputs, frames=True)}
    _add_slices(metrics, reference, outputs, concats)
    hooks = load_hooks(hooks_path, data_dir)
    if hasattr(hooks, "score"):
        where = f"{hooks_path}: score({graph!r})"
        metrics["score"] = score(hooks, graph, inputs, outputs, reference, labels, where)
        metrics["float_score"] = score(hooks, graph, inputs, reference, reference, labels, where)
    return metrics


def measurement_key(ctx_model: str | list, evaluation: str, hooks: str, data_dir) -> dict:
    """Everything a measurement depends on: the binary, the evaluation set, the hooks, the emulator's version."""
    from importlib.metadata import PackageNotFoundError, version

    from ..build_state.hashing import file_digest
    if isinstance(ctx_model, list):  # a split graph: its parts' binaries, in order (build_rules/emulator/chain.py)
        key = {"version": MEASUREMENT_VERSION, "ctx_model": [file_digest(p) for p in ctx_model],
               "binary": [file_digest(str(p).replace("_ctx.onnx", ".bin")) for p in ctx_model]}
    else:
        binary = str(ctx_model).replace("_ctx.onnx", ".bin")
        key = {"version": MEASUREMENT_VERSION, "ctx_model": file_digest(ctx_model), "binary": file_digest(binary)}
    key.update({"evaluation": file_digest(evaluation), "hooks": hooks_digest(hooks)})
    if data_dir and Path(data_dir, "data.json").is_file():
        key["data"] = file_digest(Path(data_dir, "data.json"))
    for package in ("onnxruntime", "onnxruntime-qnn"):
        try:
            key[package] = version(package)
        except PackageNotFoundError:
            key[package] = None
    return key


def hooks_digest(hooks: str) -> list[str]:
    """Digests of the hooks file and the Python files beside it (hooks import helpers by path)."""
    from ..build_state.hashing import file_digest
    return [file_digest(f) for f in sorted({Path(hooks), *Path(hooks).parent.glob("*.py")})]


def remembered(memo: str, key: dict, gate_list=None, concats: list[dict] | None = None) -> dict | None:
    """The metrics kept in a measurement memo when they were measured from exactly `key`, else None. A measurement
    stopped early (metrics["partial"]) counts only while it still decides that `gate_list` fails: a relaxed gate
    measures again, and never takes the numbers of k samples for those of all N. With `concats`, only one that
    measured those slices."""
    try:
        saved = json.loads(Path(memo).read_text())
        metrics = saved["metrics"] if saved.get("key") == key else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if metrics is not None and not has_slices(metrics, concats):
        return None
    if metrics is not None and "partial" in metrics and gates.still_decided(metrics, gate_list) is None:
        return None
    return metrics


def measurement(ctx_model: str | list, evaluation: str, hooks: str, graph: str, data_dir, memo: str,
                gate_list=None, concats: list[dict] | None = None) -> tuple[dict, dict]:
    """(metrics, key) of a context binary on the HTP emulator. `memo` (<graph>.measure.json beside the binary,
    not a build target) keeps the last measurement with its key: the report, and a check after a report, reuse it
    instead of running the emulator again. It is written before the gate is judged, so a binary that fails its
    gate still has its numbers for the report and the tuning tasks. One process measures a binary at a time (a lock
    beside the memo): another chip's check that needs this binary's numbers waits for them instead of measuring too.

    With `gate_list`, the runs stop as soon as the samples so far decide that a gate fails (early_verdicts.py):
    the metrics are then those of the k samples run, with "partial": {"samples": k, "of": N, "ranges", "failed"}.
    concats: the outputs to measure slice by slice too (concat_entries())."""
    from ..plumbing.files import exclusive_lock
    key = measurement_key(ctx_model, evaluation, hooks, data_dir)
    with exclusive_lock(layout.lock_file(memo)):
        metrics = remembered(memo, key, gate_list, concats)
        if metrics is not None:
            what = (f"a measurement stopped after {metrics['partial']['samples']} of {metrics['partial']['of']} "
                    "samples, which still decides the gates" if "partial" in metrics else "metrics")
            print(f"{what} from {memo} (measured from the same binary, evaluation set and hooks): the emulator "
                  "does not run again", flush=True)
            return metrics, key
        inputs, reference = load_evaluation(evaluation)
        metrics = measure_until_decided(ctx_model, hooks, graph, data_dir, inputs, reference, load_labels(evaluation),
                                        gate_list, concats)
        atomic_write_json(memo, {"key": key, "metrics": metrics})
    return metrics, key


def measure_until_decided(ctx_model, hooks: str, graph: str, data_dir, inputs: list[dict], reference: list[dict],
                          labels, gate_list, concats: list[dict] | None = None) -> dict:
    """measure() over every sample, or the comparison metrics of the first k when they decide that a gate fails
    (no score hook then: its task metrics are opaque, and a partial set may not suit it)."""
    from ..emulator import emulator_runs
    from ..measuring.early_verdicts import run_until_decided
    outputs, early = run_until_decided(emulator_runs.iter_outputs(ctx_model, inputs), reference, gate_list)
    found = repeats_found(ctx_model, outputs)
    if found.get("repeats") is False and any(not o.others for o in outputs):
        # it stopped repeating after some samples ran once (or came from the memo): every sample again, each twice
        outputs = emulator_runs.run_outputs(ctx_model, inputs[:len(outputs)])
        found = repeats_found(ctx_model, outputs)
    runs = found.get("runs", 1) if found.get("repeats") is False else 1
    if early is None:
        per_run = [measure(hooks, graph, data_dir, inputs, reference, [o.run(r) for o in outputs], labels, concats)
                   for r in range(runs)]
        metrics = worst_of_runs(per_run, gate_list)
    else:
        per_run = [{"samples": len(outputs), "outputs": compare(reference[:len(outputs)],
                                                                [o.run(r) for o in outputs], frames=True)}
                   for r in range(runs)]
        metrics = {**worst_of_runs(per_run, gate_list), "partial": early}
        _add_slices(metrics, reference[:len(outputs)], outputs, concats)
        print(f"stopped: {gates.describe_early(early, summarize(metrics))}", flush=True)
    metrics["repeats"] = found
    if runs > 1:
        metrics["runs"] = [summarize(m) for m in per_run]
        print(f"the binary does not repeat itself: {repeats.describe(found)}; its numbers are the worst of its "
              f"{runs} runs", flush=True)
    return metrics


def repeats_found(ctx_model, outputs: list) -> dict:
    """Whether the binary repeated itself, as repeats.shown() gives it for these outputs; where no sample ran twice
    (all from the memo), what the binary's record says: {"repeats": True, "samples": n} or, with none checked,
    {"repeats": None} (BUILD_RULES_REPEAT_SAMPLES=0)."""
    from ..emulator import emulator_runs
    found = repeats.shown(outputs)
    if found is not None:
        return found
    record = emulator_runs.repeat_record(ctx_model)
    if record["unstable"] is not None:  # (found by another stage since: every sample of this one came from before)
        return {"repeats": False, "samples": 0, "runs": record["unstable"]["runs"],
                "spread": {record["unstable"]["output"]: record["unstable"]["spread"]}, "varying_samples": 0,
                "first": {"sample": None, **{k: record["unstable"][k] for k in ("output", "spread")}}}
    return {"repeats": True, "samples": record["equal"], "runs": 2} if record["equal"] else {"repeats": None}


WORSE = {"cosine": min, "sqnr": min, "frame_cosine": min, "max_abs": max}


def worst_of_runs(per_run: list[dict], gate_list) -> dict:
    """measure() of each run (one run each sample: the first, the second, ...) as one: every output's comparison
    metric at its worst run, each task metric at the run its gate finds worst (two-sided: farthest from the float
    model's value; the first run's where no gate reads it). One run: its metrics as they are."""
    if len(per_run) == 1:
        return per_run[0]
    first = per_run[0]
    worst = {k: v for k, v in first.items() if k not in ("outputs", "score")}
    worst["outputs"] = {name: {metric: WORSE.get(metric, min)(run["outputs"][name][metric] for run in per_run)
                               for metric in values}
                        for name, values in first["outputs"].items()}
    if "score" in first:
        score = dict(first["score"])
        for gate in gates.as_list(gate_list):
            metric = gate["metric"]
            if metric not in score:
                continue
            found = [run["score"][metric] for run in per_run]
            better = gates.higher_is_better(gate)
            if better is None:  # max_change: the run farthest from the float model's value
                center = first.get("float_score", {}).get(metric, found[0])
                score[metric] = max(found, key=lambda v: abs(v - center))
            else:
                score[metric] = min(found) if better else max(found)
        worst["score"] = score
    return worst


def _add_slices(metrics: dict, reference: list[dict], outputs: list[dict], concats: list[dict] | None) -> None:
    """metrics["slices"]: per output made by a Concat of differently ranged inputs, each input's slice against float
    (the whole output's SQNR hides a crushed one: issue 44, a YOLO box/score output); printed into the log."""
    if not concats:
        return
    from .support.concat_slices import slice_metrics
    metrics["slices"] = slice_metrics(reference, outputs, concats)
    for name, found in metrics["slices"].items():
        print(f"output {name!r} per slice of '{found['node']}' (axis {found['axis']}): " + "; ".join(
            f"'{p['input']}' {p['start']}:{p['stop']} SQNR {p['sqnr']:.1f} dB, cosine {p['cosine']:.5f}, max abs "
            f"{p['max_abs']:.4g}" for p in found["slices"]), flush=True)


def has_slices(metrics: dict, concats: list[dict] | None) -> bool:
    """The metrics hold the per-slice numbers of `concats` (the same outputs cut the same way), or none are asked."""
    if not concats:
        return True
    held = metrics.get("slices") or {}
    return all(e["output"] in held and held[e["output"]]["axis"] == e["slices"]["axis"]
               and [[p["start"], p["stop"]] for p in held[e["output"]]["slices"]] == e["slices"]["bounds"]
               for e in concats)


# --- another chip than the reference: equal outputs, equal metrics ---------------------------------------------
# QNN compiles one graph into the same HTP ops for every chip of these generations (measured: bit-identical metrics
# on all five chips for MTCNN, NSNet2, a YOLOX-style detector, a CNN classifier). So one chip's binary is measured in
# full and each other chip's runs a few evaluation samples: outputs equal bit for bit take the reference's metrics
# (labelled "equal to <chip> on N samples"); any difference gets the full check of its own.

def prove_equal(params: dict, run=None) -> dict:
    """{"equal", "chip", "samples", ...}: this binary's outputs against the reference chip's on the first
    params["reference"]["samples"] evaluation samples; where they differ, the first sample and output that does.
    run(binary, inputs) -> outputs runs a binary (params["ctx_model"], the reference's "ctx_model"): the HTP
    emulator by default; qairt's check passes its qnn-net-run runner (stages/qairt_check.py)."""
    reference = params["reference"]
    inputs, _ = load_evaluation(params["evaluation"], limit=reference["samples"])
    ctx = params["ctx_model"]
    # A proof depends on the two binaries and the samples only (not on the gates, the hooks or whether the check
    # passed): its own memo, <graph>.proof.json beside this chip's report, keyed by them. A gate edit re-judges the
    # check without running a sample again.
    memo = layout.proof_memo(params["final_outputs"]["report"])
    found = remembered_proof(memo, ctx, reference["ctx_model"], params["evaluation"], len(inputs))
    if found is not None:
        print(f"proof from {memo} (the same binaries and samples): "
              + (f"equal to {reference['chip']}'s outputs" if found["equal"] else
                 f"differs from {reference['chip']}'s: a full check of this binary"), flush=True)
        return found
    made_from = _proof_key(ctx, reference["ctx_model"], params["evaluation"], len(inputs))
    proof = {"chip": reference["chip"], "samples": len(inputs), "binary": made_from[0]}
    found = _compare_outputs(proof, ctx, inputs, reference, params["evaluation"], run or run_binary)
    atomic_write_json(memo, {"made_from": made_from, "proof": found})
    return found


def _proof_key(ctx: str | list, reference_ctx: str | list, evaluation: str, samples: int) -> list:
    """What a proof is made from: this binary's digest(s), and the reference's outputs' (_proof_made_from)."""
    from ..build_state.hashing import file_digest
    binary = [file_digest(str(p).replace("_ctx.onnx", ".bin")) for p in ctx] if isinstance(ctx, list) \
        else file_digest(str(ctx).replace("_ctx.onnx", ".bin"))
    return [binary, _proof_made_from(reference_ctx, evaluation, samples)]


def remembered_proof(memo: str, ctx: str | list, reference_ctx: str | list, evaluation: str,
                     samples: int | None = None) -> dict | None:
    """The proof kept in `memo` (<graph>.proof.json) when it was made from these very binaries and samples (the
    count it compared when `samples` is None), else None. Evaluate reads it too: all graphs equal, it inherits."""
    try:
        saved = json.loads(Path(memo).read_text())
        found = saved["proof"]
        count = found["samples"] if samples is None else samples
        return found if saved["made_from"] == _proof_key(ctx, reference_ctx, evaluation, count) else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _compare_outputs(proof: dict, ctx, inputs: list[dict], reference: dict, evaluation: str, run) -> dict:
    import numpy as np
    print(f"proof: this binary against {reference['chip']}'s on {len(inputs)} evaluation sample(s)", flush=True)
    emulated = run is run_binary  # (qairt's qnn-net-run runner keeps no record of repeating)
    if emulated:
        from ..emulator import emulator_runs
        unstable = emulator_runs.repeat_record(reference["ctx_model"])["unstable"]
        if unstable is not None:  # equal bytes prove nothing against a binary that gives other bytes each run
            print(f"proof: {reference['chip']}'s binary does not repeat itself (output {unstable['output']!r} differed "
                  f"by up to {unstable['spread']:.4g} between runs of one sample): no proof by equal outputs, a full "
                  "check of this binary", flush=True)
            return {**proof, "equal": False, "unstable": "reference", "output": unstable["output"],
                    "max_abs": unstable["spread"]}
    ours, theirs = run(ctx, inputs), reference_outputs(reference, evaluation, inputs, run)
    found = repeats.shown(ours) if emulated else None
    if found and found["repeats"] is False:
        print(f"proof: this binary does not repeat itself ({repeats.describe(found)}): no proof by equal outputs, "
              "a full check of this binary", flush=True)
        return {**proof, "equal": False, "unstable": "this", "sample": found["first"]["sample"],
                "output": found["first"]["output"], "max_abs": found["first"]["spread"]}
    for index, (mine, other) in enumerate(zip(ours, theirs)):
        for name in sorted(set(mine) | set(other)):
            a, b = mine.get(name), other.get(name)
            if a is not None and b is not None and a.dtype == b.dtype and a.shape == b.shape \
                    and a.tobytes() == b.tobytes():
                continue
            gap = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) \
                if a is not None and b is not None and a.shape == b.shape and a.size else None
            print(f"proof: output {name!r} of sample {index} differs from {reference['chip']}'s (max abs {gap}): "
                  "a full check of this binary", flush=True)
            return {**proof, "equal": False, "sample": index, "output": name, "max_abs": gap}
    print(f"proof: equal to {reference['chip']}'s outputs, bit for bit: its metrics, no full check", flush=True)
    return {**proof, "equal": True}


def reference_outputs(reference: dict, evaluation: str, inputs: list[dict], run=None) -> list[dict]:
    """The reference binary's outputs on the proof samples, kept beside its memo (<graph>.proof.npz, with what they
    were made from): the first other chip's check runs them, the next ones read them."""
    import io

    import numpy as np

    from ..plumbing.files import atomic_write_bytes, exclusive_lock
    ctx = reference["ctx_model"]
    made_from = _proof_made_from(ctx, evaluation, len(inputs))
    path = layout.proof_file(reference["check"])
    with exclusive_lock(layout.lock_file(path)):
        try:
            with np.load(path) as saved:
                if str(saved["made_from"]) == made_from:
                    outputs = [{} for _ in inputs]
                    for name in saved.files:
                        if "/" in name:
                            index, output = name.split("/", 1)
                            outputs[int(index)][output] = saved[name]
                    print(f"{reference['chip']}'s outputs on the proof samples from {path}", flush=True)
                    return outputs
        except (OSError, ValueError, KeyError):
            pass
        outputs = (run or run_binary)(ctx, inputs)
        buffer = io.BytesIO()
        np.savez(buffer, made_from=np.array(made_from),
                 **{f"{i}/{name}": value for i, sample in enumerate(outputs) for name, value in sample.items()})
        atomic_write_bytes(path, buffer.getvalue())
    return outputs


def _proof_made_from(ctx: str | list, evaluation: str, samples: int) -> str:
    """What the reference's outputs on the proof samples are made from: its binaries, the evaluation set, the count."""
    from ..build_state.hashing import file_digest, text_digest
    files = ctx if isinstance(ctx, list) else [ctx]
    return text_digest(json.dumps([[file_digest(p) for p in files],
                                   [file_digest(str(p).replace("_ctx.onnx", ".bin")) for p in files],
                                   file_digest(evaluation), samples]))


def reference_metrics(params: dict, measure_now=None) -> tuple[dict, dict]:
    """(metrics, key) of the reference chip's binary: from its check report or memo when they were measured from it,
    else measured now (under the memo's lock: its own check, if running, measures once for both; qairt's check
    passes measure_now() -> metrics, its qnn-net-run measurement)."""
    reference = params["reference"]
    key = measurement_key(reference["ctx_model"], params["evaluation"], params["hooks"], params.get("data_dir"))
    try:
        check = json.loads(Path(reference["check"]).read_text())
        if check.get("inputs") == key and "equal_to" not in check and has_slices(check, concat_entries(params)):
            print(f"metrics from {reference['check']}", flush=True)
            return {k: v for k, v in check.items() if k in ("samples", "outputs", "score", "float_score", "slices")}, key
    except (OSError, ValueError):
        pass
    if remembered(layout.memo_file(reference["check"]), key, params["gates"], concat_entries(params)) is None:
        print(f"{reference['chip']}'s binary has no measurement yet: measured here, once for both checks", flush=True)
    if measure_now is not None:
        return measure_now(), key
    return measurement(reference["ctx_model"], params["evaluation"], params["hooks"], params["graph"],
                       params.get("data_dir"), layout.memo_file(reference["check"]), params["gates"],
                       concat_entries(params))


def run_binary(ctx_model: str | list, inputs: list[dict]) -> list[dict]:
    """A context binary's outputs on the HTP emulator; a split graph's parts in order (build_rules/emulator/chain.py)."""
    from ..emulator import emulator_runs
    return emulator_runs.run_outputs(ctx_model, inputs)


def _inherited(proof: dict | None) -> str:
    if not proof or not proof["equal"]:
        return ""
    return (f" (the metrics of {proof['chip']}'s binary: this chip's outputs equal its on {proof['samples']} "
            "samples, bit for bit)")


def diagnose_hint(params: dict) -> str:
    """Where to look next (ort-qnn: its check runs the binary's _ctx.onnx; qairt has no diagnose task)."""
    if "ctx_model" not in params or ":" not in params.get("name", "") or isinstance(params["ctx_model"], list):
        return ""  # (a split graph's parts have no diagnose task: diagnose compiles one whole graph)
    return (f"; to see which tensor it starts at: doit diagnose:{params['name'].split(':', 1)[1]} "
            "(HTP emulator vs CPU QDQ vs float, tensor by tensor)")


def crushed_hint(metrics: dict, params: dict) -> str:
    """A failed gate's words on an output whose whole-tensor numbers hide a crushed slice (concat_slices.py)."""
    from .support.concat_slices import crushed, describe_crushed
    log = str(params.get("concats", "")).replace(".quantize.json", ".quantize.log")  # the warning, with the lines
    found = [describe_crushed(name, metrics["outputs"][name], cut, log)
             for name, cut in (metrics.get("slices") or {}).items()
             if name in metrics["outputs"] and crushed(metrics["outputs"][name], cut["slices"])]
    return "".join(f"; {f}" for f in found)


COMPARED = ("cosine", "sqnr", "max_abs", "frame_cosine")


def summarize(metrics: dict) -> dict:
    """The worst value of each comparison metric over the outputs, and the task metrics."""
    summary = {m: worst(metrics["outputs"], m) for m in COMPARED if all(m in o for o in metrics["outputs"].values())}
    summary.update(metrics.get("score", {}))
    return summary


def worst_outputs(metrics: dict) -> dict:
    """Comparison metric -> the output with the worst value (a graph with several outputs: which one to look at)."""
    per_output = metrics["outputs"]
    if len(per_output) < 2:
        return {}
    return {m: (max if m == "max_abs" else min)(per_output, key=lambda o: per_output[o][m])
            for m in COMPARED if all(m in o for o in per_output.values())}


def does_not_repeat(params: dict, metrics: dict, gated: list[dict]) -> str:
    """The failure of a binary that gave other outputs on another run: the spread, where it starts (located now on
    the variant's model with its tensors exposed), what its worst run gives the gates, and where to find a fix."""
    found = metrics["repeats"]
    runs = len(metrics.get("runs") or []) or found["runs"]
    failed = [g["failure"] for g in gated if g["passed"] is False]
    on_worst = (f"on the worst of its {runs} runs {'; '.join(failed)}" if failed else
                f"its gates pass on each of its {runs} runs, but another run may give other numbers")
    located = ""
    if params.get("locate"):
        try:
            located = f"; {locate(params)}"
        except Exception as e:  # noqa: BLE001 -- a diagnostic: the failure stands without it
            located = f"; where it starts could not be located ({type(e).__name__}: {str(e).strip()[:200]})"
    fix = (f"; `doit diagnose:{params['name'].split(':', 1)[1]}` tries precisions until one repeats itself"
           if diagnose_hint(params) else "")
    return (f"{params['name']}: the binary does not repeat itself on the emulator: {repeats.describe(found)}{located}; "
            f"{on_worst}; a verdict on one run would be chance, so the check fails{fix} (docs/building.md, "
            '"A binary that does not repeat itself")')


def locate(params: dict) -> str:
    """Where a non-repeating binary's differences start: diagnose's exposed model, run on the first evaluation sample
    (stages/support/instability.py)."""
    from .diagnose import MAX_TENSORS, Graph
    from .support import instability
    where = params["locate"]
    graph = Graph.load(where["onnx"], where["qdq"])
    tensors, _ = graph.choose(MAX_TENSORS)
    inputs, _ = load_evaluation(params["evaluation"], limit=1)
    found = instability.locate(graph, tensors, inputs[0], where["chip"], fp16=where["qdq"] is None)
    print(f"located: {instability.where(found)}", flush=True)
    return instability.where(found)


def decide(params: dict, metrics: dict, key: dict | None = None, proof: dict | None = None) -> dict:
    """The report (<graph>.check.json) and the gate. `proof`: how this chip's outputs compared with the reference
    chip's (prove_equal); when equal, `metrics` and `key` are the reference binary's."""
    summary = summarize(metrics)
    report = {"samples": metrics["samples"], "summary": summary, **{k: v for k, v in metrics.items() if k != "samples"},
              "worst_output": worst_outputs(metrics), "gates": params["gates"]}
    if key is not None:
        report["inputs"] = key
    if proof is not None:
        report["equal_to" if proof["equal"] else "differs_from"] = {k: v for k, v in proof.items() if k != "equal"}
    if params.get("compile_report"):  # what the binary runs in float (a quantized variant), from its compile
        ctx = params["ctx_model"]
        compiled = [json.loads(Path(str(p).replace("_ctx.onnx", ".compile.json")).read_text()).get("float_ops")
                    for p in (ctx if isinstance(ctx, list) else [ctx])]
        if isinstance(ctx, list):  # a split graph: its parts' together
            from ..toolchains.qnn_graph import combine
            report["float_ops"] = combine(compiled)
        else:
            report["float_ops"] = compiled[0]
    if (metrics.get("repeats") or {}).get("repeats") is False:  # never judged as if one run were the answer
        report["gated"] = gates.results(params["gates"], summary, metrics.get("float_score"))
        message = does_not_repeat(params, metrics, report["gated"])
        results.keep_failed(layout.memo_file(params["final_outputs"]["report"]), report, message, key, metrics)
        raise BuildError(message)
    try:
        early = gates.still_decided(metrics, params["gates"]) if "partial" in metrics else None
        if early is not None:  # stopped after k of N samples: the gates it decided, on the numbers of the k
            raise BuildError(f"{params['name']}: gate {gates.describe_early(early, summary)}")
        if "partial" in metrics:  # never judged as if all samples were measured (measurement() re-measures first)
            raise BuildError(f"{params['name']}: the measurement stopped after {metrics['partial']['samples']} of "
                             f"{metrics['partial']['of']} samples no longer decides the gates: run the check again")
        report["gated"] = gates.judge(params["name"], params["gates"], summary, metrics.get("float_score"))
    except BuildError as e:  # the numbers stay in the memo, marked failed (each gate's verdict too); the task fails
        report["gated"] = gates.results(params["gates"], summary, metrics.get("float_score"), metrics.get("partial"))
        if early is not None or any(g["passed"] is False for g in report["gated"]):  # missed, not unjudgeable
            e = BuildError(f"{e}{_inherited(proof)}{crushed_hint(metrics, params)}{diagnose_hint(params)}")
        results.keep_failed(layout.memo_file(params["final_outputs"]["report"]), report, str(e), key, metrics)
        raise e from None
    results.clear_failed(layout.memo_file(params["final_outputs"]["report"]))
    atomic_write_json(params["outputs"]["report"], report)
    return {"summary": summary}
