"""Stage 7, check: run one chip's binary on the HTP emulator against the float model's outputs.

Metrics (cosine, SQNR, max abs per output, plus the model's score hook) go to <graph>.check.json;
a metric below the graph's gate fails the build with the metric, value and threshold. A failed check's report is
kept in the measurement memo <graph>.measure.json (build_rules/results.py), which the report, the summary and tune
read: check.json is a target, and the runner removes a failed task's targets.

Each variant is measured in full on one reference chip; another chip's check (params["reference"]) first runs its
binary and the reference's on a few evaluation samples, and equal outputs take the reference's metrics (prove_equal,
below; docs/models.md, "Checks on several chips"). A proof is kept in its own memo, <graph>.proof.json.

The runs stop once the samples so far decide that a gate fails (early verdicts: early_verdicts.py, gates.py); such
a measurement is kept marked partial and is never taken for one of every sample (remembered()).
"""
from __future__ import annotations

import json
from pathlib import Path

from .. import gates, layout, results
from ..errors import BuildError
from ..files import atomic_write_json
from ..samples import compare, load_evaluation, load_hooks, load_labels, score, worst

# The version of this stage's measurement memo (results.py): a new one re-measures, a task key's version
# (stage_table.py) does not have to.
MEASUREMENT_VERSION = 3  # 2: frame_cosine measured; worst output per metric in the report; 3: zero frames agree


def run(params: dict) -> dict:
    memo = layout.memo_file(params["final_outputs"]["report"])
    proof = None
    if params.get("reference"):  # another chip than the reference: equal outputs take the reference's metrics
        proof = prove_equal(params)
        if proof["equal"]:
            metrics, key = reference_metrics(params)
            return decide(params, metrics, key, proof)
    metrics, key = measurement(params["ctx_model"], params["evaluation"], params["hooks"], params["graph"],
                               params.get("data_dir"), memo, params["gates"])
    return decide(params, metrics, key, proof)


def measure(hooks_path: str, graph: str, data_dir, inputs: list[dict], reference: list[dict],
            outputs: list[dict], labels: list | None = None) -> dict:
    """Per-output cosine/SQNR/max abs against the float reference, plus the score hook's task metrics: of the
    binary's outputs and of the float model's (the reference of relative gates). A hook that takes float_outputs
    gets the float model's outputs both times (so an agreement metric of the float model with itself is its top)."""
    metrics = {"samples": len(inputs), "outputs": compare(reference, outputs, frames=True)}
    hooks = load_hooks(hooks_path, data_dir)
    if hasattr(hooks, "score"):
        where = f"{hooks_path}: score({graph!r})"
        metrics["score"] = score(hooks, graph, inputs, outputs, reference, labels, where)
        metrics["float_score"] = score(hooks, graph, inputs, reference, reference, labels, where)
    return metrics


def measurement_key(ctx_model: str | list, evaluation: str, hooks: str, data_dir) -> dict:
    """Everything a measurement depends on: the binary, the evaluation set, the hooks, the emulator's version."""
    from importlib.metadata import PackageNotFoundError, version

    from ..hashing import file_digest
    if isinstance(ctx_model, list):  # a split graph: its parts' binaries, in order (build_rules/chain.py)
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
    from ..hashing import file_digest
    return [file_digest(f) for f in sorted({Path(hooks), *Path(hooks).parent.glob("*.py")})]


def remembered(memo: str, key: dict, gate_list=None) -> dict | None:
    """The metrics kept in a measurement memo when they were measured from exactly `key`, else None. A measurement
    stopped early (metrics["partial"]) counts only while it still decides that `gate_list` fails: a relaxed gate
    measures again, and never takes the numbers of k samples for those of all N."""
    try:
        saved = json.loads(Path(memo).read_text())
        metrics = saved["metrics"] if saved.get("key") == key else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if metrics is not None and "partial" in metrics and gates.still_decided(metrics, gate_list) is None:
        return None
    return metrics


def measurement(ctx_model: str | list, evaluation: str, hooks: str, graph: str, data_dir, memo: str,
                gate_list=None) -> tuple[dict, dict]:
    """(metrics, key) of a context binary on the HTP emulator. `memo` (<graph>.measure.json beside the binary,
    not a build target) keeps the last measurement with its key: the report, and a check after a report, reuse it
    instead of running the emulator again. It is written before the gate is judged, so a binary that fails its
    gate still has its numbers for the report and the tuning tasks. One process measures a binary at a time (a lock
    beside the memo): another chip's check that needs this binary's numbers waits for them instead of measuring too.

    With `gate_list`, the runs stop as soon as the samples so far decide that a gate fails (early_verdicts.py):
    the metrics are then those of the k samples run, with "partial": {"samples": k, "of": N, "ranges", "failed"}."""
    from ..files import exclusive_lock
    key = measurement_key(ctx_model, evaluation, hooks, data_dir)
    with exclusive_lock(layout.lock_file(memo)):
        metrics = remembered(memo, key, gate_list)
        if metrics is not None:
            what = (f"a measurement stopped after {metrics['partial']['samples']} of {metrics['partial']['of']} "
                    "samples, which still decides the gates" if "partial" in metrics else "metrics")
            print(f"{what} from {memo} (measured from the same binary, evaluation set and hooks): the emulator "
                  "does not run again", flush=True)
            return metrics, key
        inputs, reference = load_evaluation(evaluation)
        metrics = measure_until_decided(ctx_model, hooks, graph, data_dir, inputs, reference, load_labels(evaluation),
                                        gate_list)
        atomic_write_json(memo, {"key": key, "metrics": metrics})
    return metrics, key


def measure_until_decided(ctx_model, hooks: str, graph: str, data_dir, inputs: list[dict], reference: list[dict],
                          labels, gate_list) -> dict:
    """measure() over every sample, or the comparison metrics of the first k when they decide that a gate fails
    (no score hook then: its task metrics are opaque, and a partial set may not suit it)."""
    from .. import emulator_runs
    from ..early_verdicts import run_until_decided
    outputs, early = run_until_decided(emulator_runs.iter_outputs(ctx_model, inputs), reference, gate_list)
    if early is None:
        return measure(hooks, graph, data_dir, inputs, reference, outputs, labels)
    metrics = {"samples": len(outputs), "outputs": compare(reference[:len(outputs)], outputs, frames=True),
               "partial": early}
    print(f"stopped: {gates.describe_early(early, summarize(metrics))}", flush=True)
    return metrics


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
    from ..hashing import file_digest
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
    ours, theirs = run(ctx, inputs), reference_outputs(reference, evaluation, inputs, run)
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

    from ..files import atomic_write_bytes, exclusive_lock
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
    from ..hashing import file_digest, text_digest
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
        if check.get("inputs") == key and "equal_to" not in check:
            print(f"metrics from {reference['check']}", flush=True)
            return {k: v for k, v in check.items() if k in ("samples", "outputs", "score", "float_score")}, key
    except (OSError, ValueError):
        pass
    if remembered(layout.memo_file(reference["check"]), key, params["gates"]) is None:
        print(f"{reference['chip']}'s binary has no measurement yet: measured here, once for both checks", flush=True)
    if measure_now is not None:
        return measure_now(), key
    return measurement(reference["ctx_model"], params["evaluation"], params["hooks"], params["graph"],
                       params.get("data_dir"), layout.memo_file(reference["check"]), params["gates"])


def run_binary(ctx_model: str | list, inputs: list[dict]) -> list[dict]:
    """A context binary's outputs on the HTP emulator; a split graph's parts in order (build_rules/chain.py)."""
    from .. import emulator_runs
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
            e = BuildError(f"{e}{_inherited(proof)}{diagnose_hint(params)}")
        results.keep_failed(layout.memo_file(params["final_outputs"]["report"]), report, str(e), key, metrics)
        raise e from None
    results.clear_failed(layout.memo_file(params["final_outputs"]["report"]))
    atomic_write_json(params["outputs"]["report"], report)
    return {"summary": summary}
