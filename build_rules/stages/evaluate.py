"""Model-level evaluation: the evaluate(run_graph) hook scores all graphs working together (e.g.
greedy decoding with encoder + decoder -> WER), once on the float models (ONNX Runtime CPU) and once
per variant and chip on the compiled binaries (HTP emulator). The gate can be relative to float.
"""
from __future__ import annotations

import json

from .. import progress
from ..errors import BuildError
from ..files import atomic_write_json
from .common import load_hooks


def _cpu_runner(path: str):
    import onnxruntime as ort
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return lambda feed: dict(zip(names, session.run(names, feed)))


def run(params: dict) -> dict:
    hooks = load_hooks(params["hooks"], params.get("data_dir"), params.get("checkpoints"))
    if not hasattr(hooks, "evaluate"):
        raise BuildError(f"{params['hooks']}: model.toml has [evaluate] but the hooks have no evaluate(run_graph)")
    if params["on"] == "emulator":
        from ..toolchains import ort_qnn
        runners = {g: ort_qnn.open_context_binary(p) for g, p in params["graphs"].items()}
    else:
        runners = {g: _cpu_runner(p) for g, p in params["graphs"].items()}

    def run_graph(graph: str, feed: dict) -> dict:
        if graph not in runners:
            raise BuildError(f"{params['hooks']}: evaluate asked for graph {graph!r}; graphs: {', '.join(runners)}")
        return runners[graph](feed)

    run_graph = progress.count_graph_runs(run_graph, params.get("float_report"))
    metrics = {k: float(v) for k, v in hooks.evaluate(run_graph).items()}
    report = {"on": params["on"], "metrics": metrics, "gate": params.get("gate")}
    report["graph_runs"] = run_graph.runs  # the totals of the emulator runs' progress lines
    gate = params.get("gate")
    if gate:
        metric = gate["metric"]
        if metric not in metrics:
            raise BuildError(f"{params['name']}: gate metric '{metric}' not returned by evaluate() "
                             f"(it returned {', '.join(metrics)})")
        value = metrics[metric]
        bound, relation = _bound(gate, params.get("float_report"))
        report["bound"] = bound
        if (relation == ">=" and value < bound) or (relation == "<=" and value > bound):
            raise BuildError(f"{params['name']}: gate failed: {metric} = {value:.4f}, needs {relation} {bound:.4f} "
                             f"({_describe(gate)})")
    atomic_write_json(params["outputs"]["report"], report)
    return {"metrics": metrics}


def _bound(gate: dict, float_report: str | None) -> tuple[float, str]:
    """The bound the value must meet and how: absolute, or the float model's value plus the allowed change."""
    if "min" in gate:
        return gate["min"], ">="
    if "max" in gate:
        return gate["max"], "<="
    reference = json.loads(open(float_report).read())["metrics"][gate["metric"]]
    if "max_increase" in gate:
        return reference + gate["max_increase"], "<="
    return reference - gate["max_decrease"], ">="


def _describe(gate: dict) -> str:
    for key in ("max_increase", "max_decrease"):
        if key in gate:
            return f"float model's value {'+' if key == 'max_increase' else '-'} {gate[key]:g}"
    return "absolute bound"
