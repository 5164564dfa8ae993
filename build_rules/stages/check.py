"""Stage 7, check: run one chip's binary on the HTP emulator against the float model's outputs.

Metrics (cosine, SQNR, max abs per output, plus the model's score hook) go to <graph>.check.json;
a metric below the graph's gate fails the build with the metric, value and threshold. A failed check's report is
kept in the measurement memo <graph>.measure.json (build_rules/results.py), which the report, the summary and tune
read: check.json is a target, and the runner removes a failed task's targets.
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
MEASUREMENT_VERSION = 2  # 2: frame_cosine measured; worst output per metric in the report


def run(params: dict) -> dict:
    memo = layout.memo_file(params["final_outputs"]["report"])
    metrics, key = measurement(params["ctx_model"], params["evaluation"], params["hooks"], params["graph"],
                               params.get("data_dir"), memo)
    return decide(params, metrics, key)


def judge(params: dict, inputs: list[dict], reference: list[dict], outputs: list[dict]) -> dict:
    """Metrics of the binary's outputs against the float reference, the gates, and the report (both toolchains)."""
    return decide(params, measure(params["hooks"], params["graph"], params.get("data_dir"), inputs, reference, outputs,
                                  load_labels(params["evaluation"])))


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


def measurement(ctx_model: str | list, evaluation: str, hooks: str, graph: str, data_dir, memo: str) -> tuple[dict, dict]:
    """(metrics, key) of a context binary on the HTP emulator. `memo` (<graph>.measure.json beside the binary,
    not a build target) keeps the last measurement with its key: the report, and a check after a report, reuse it
    instead of running the emulator again. It is written before the gate is judged, so a binary that fails its
    gate still has its numbers for the report and the tuning tasks."""
    key = measurement_key(ctx_model, evaluation, hooks, data_dir)
    try:
        saved = json.loads(Path(memo).read_text())
        if saved.get("key") == key:
            print(f"metrics from {memo} (measured from the same binary, evaluation set and hooks): the emulator "
                  "does not run again", flush=True)
            return saved["metrics"], key
    except (OSError, ValueError, KeyError):
        pass
    from ..toolchains import ort_qnn
    inputs, reference = load_evaluation(evaluation)
    if isinstance(ctx_model, list):  # a split graph: the parts in order, gated like the whole graph
        from .. import chain
        outputs = chain.run_on_emulator(ctx_model, inputs)
    else:
        outputs = ort_qnn.run_context_binary(ctx_model, inputs)
    metrics = measure(hooks, graph, data_dir, inputs, reference, outputs, load_labels(evaluation))
    atomic_write_json(memo, {"key": key, "metrics": metrics})
    return metrics, key


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


def decide(params: dict, metrics: dict, key: dict | None = None) -> dict:
    """The report (<graph>.check.json) and the gate."""
    summary = summarize(metrics)
    report = {"samples": metrics["samples"], "summary": summary, **{k: v for k, v in metrics.items() if k != "samples"},
              "worst_output": worst_outputs(metrics), "gates": params["gates"]}
    if key is not None:
        report["inputs"] = key
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
        report["gated"] = gates.judge(params["name"], params["gates"], summary, metrics.get("float_score"))
    except BuildError as e:  # the numbers stay in the memo, marked failed (each gate's verdict too); the task fails
        report["gated"] = gates.results(params["gates"], summary, metrics.get("float_score"))
        if any(g["passed"] is False for g in report["gated"]):  # a gate missed, not one that could not be judged
            e = BuildError(f"{e}{diagnose_hint(params)}")
        results.keep_failed(layout.memo_file(params["final_outputs"]["report"]), report, str(e), key, metrics)
        raise e from None
    results.clear_failed(layout.memo_file(params["final_outputs"]["report"]))
    atomic_write_json(params["outputs"]["report"], report)
    return {"summary": summary}
