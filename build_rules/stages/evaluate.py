"""Model-level evaluation: the evaluate(run_graph) hook scores all graphs working together (e.g.
greedy decoding with encoder + decoder -> WER), once on the float models (ONNX Runtime CPU) and once
per variant and chip on the compiled binaries (HTP emulator). The gate can be relative to float.
"""
from __future__ import annotations

import json

from .. import gates, progress
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
        from .. import chain
        from ..toolchains import ort_qnn
        # a split graph is its parts' binaries, run in order
        runners = {g: chain.open_on_emulator(p) if isinstance(p, list) else ort_qnn.open_context_binary(p)
                   for g, p in params["graphs"].items()}
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
        reference = json.loads(open(params["float_report"]).read())["metrics"] if gates.is_relative(gate) else None
        gates.judge(params["name"], gate, metrics, reference)
        report["bound"] = gates.bound(gate, (reference or {}).get(gate["metric"]))[0]
    atomic_write_json(params["outputs"]["report"], report)
    return {"metrics": metrics}
