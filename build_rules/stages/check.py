"""Stage 7, check: run one chip's binary on the HTP emulator against the float model's outputs.

Metrics (cosine, SQNR, max abs per output, plus the model's score hook) go to <graph>.check.json;
a metric below the graph's gate fails the build with the metric, value and threshold.
"""
from __future__ import annotations

from ..errors import BuildError
from ..files import atomic_write_json
from .common import compare, load_evaluation, load_hooks, worst

VERSION = 1


def run(params: dict) -> dict:
    from ..toolchains import ort_qnn

    inputs, reference = load_evaluation(params["evaluation"])
    outputs = ort_qnn.run_context_binary(params["ctx_model"], inputs)
    return judge(params, inputs, reference, outputs)


def judge(params: dict, inputs: list[dict], reference: list[dict], outputs: list[dict]) -> dict:
    """Metrics of the binary's outputs against the float reference, the gate, and the report (both toolchains)."""
    metrics = {"outputs": compare(reference, outputs)}
    hooks = load_hooks(params["hooks"], params.get("data_dir"))
    if hasattr(hooks, "score"):
        metrics["score"] = {k: float(v) for k, v in hooks.score(params["graph"], inputs, outputs).items()}
        reference_score = {k: float(v) for k, v in hooks.score(params["graph"], inputs, reference).items()}
        metrics["float_score"] = reference_score
    summary = {m: worst(metrics["outputs"], m) for m in ("cosine", "sqnr", "max_abs")}
    summary.update(metrics.get("score", {}))
    report = {"samples": len(inputs), "summary": summary, **metrics, "gate": params["gate"]}
    gate = params["gate"]
    if gate:
        metric = gate["metric"]
        if metric not in summary:
            raise BuildError(f"{params['name']}: gate metric '{metric}' was not measured "
                             f"(measured: {', '.join(summary)}); a task metric needs a score() hook")
        value = summary[metric]
        if "min" in gate and value < gate["min"]:
            raise BuildError(f"{params['name']}: gate failed: {metric} = {value:.4f}, "
                             f"needs >= {gate['min']:g} (short by {gate['min'] - value:.4f})")
        if "max" in gate and value > gate["max"]:
            raise BuildError(f"{params['name']}: gate failed: {metric} = {value:.4g}, "
                             f"needs <= {gate['max']:g} (over by {value - gate['max']:.4g})")
    atomic_write_json(params["outputs"]["report"], report)
    return {"summary": summary}
