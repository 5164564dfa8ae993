"""Model-level evaluation: the evaluate(run_graph) hook scores all graphs working together (e.g.
greedy decoding with encoder + decoder -> WER), once on the float models (ONNX Runtime CPU) and once
per variant and chip on the compiled binaries (HTP emulator). The gate can be relative to float.

The metrics are remembered with what they were measured from in evaluate.measure.json beside the report (not a
target): a re-run of a failed evaluation from the same binaries, hooks and data (`doit --continue`, or a plain
`doit` after a failure) judges the remembered numbers instead of running the emulator again, and a failure's
report stays there for the summary (build_rules/results.py).

Another chip than the reference (params["reference"]; docs/models.md, "Checks on several chips") whose graphs all
proved equal to the reference chip's in their checks takes the reference's evaluation instead of running the
emulator again, labelled "equal_to" in its report.
"""
from __future__ import annotations

import json
from pathlib import Path

from .. import gates, layout, progress, results
from ..errors import BuildError
from ..files import atomic_write_json
from ..samples import load_hooks

# The version of this stage's measurement memo (results.py): a new one re-measures, a task key's version
# (stage_table.py) does not have to.
MEASUREMENT_VERSION = 1


def _cpu_runner(path: str):
    import onnxruntime as ort
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return lambda feed: dict(zip(names, session.run(names, feed)))


def measurement_key(params: dict) -> dict:
    """What an evaluation's metrics depend on: the graphs' files (a context model and its binary), the hooks and
    the Python files beside them, the model's data, the runtime's version."""
    from importlib.metadata import PackageNotFoundError, version

    from ..hashing import file_digest
    from .check import hooks_digest
    files = {}
    for graph, paths in sorted(params["graphs"].items()):
        files[graph] = []
        for path in paths if isinstance(paths, list) else [paths]:  # a split graph: each part's files, in order
            files[graph].append(file_digest(path))
            binary = Path(str(path).replace("_ctx.onnx", ".bin"))
            if str(path).endswith("_ctx.onnx") and binary.is_file():
                files[graph].append(file_digest(binary))
    key = {"version": MEASUREMENT_VERSION, "on": params["on"], "graphs": files, "hooks": hooks_digest(params["hooks"])}
    if params.get("data_dir") and Path(params["data_dir"], "data.json").is_file():
        key["data"] = file_digest(Path(params["data_dir"], "data.json"))
    for package in ("onnxruntime", "onnxruntime-qnn"):
        try:
            key[package] = version(package)
        except PackageNotFoundError:
            key[package] = None
    return key


def run(params: dict) -> dict:
    memo = layout.memo_file(params["final_outputs"]["report"])
    key = measurement_key(params)
    try:
        saved = json.loads(Path(memo).read_text())
        remembered = saved if saved.get("key") == key else None
    except (OSError, ValueError, AttributeError):
        remembered = None
    inherited = equal_reference(params) if remembered is None and params.get("reference") else None
    if remembered is not None:
        print(f"metrics from {memo} (measured from the same binaries, hooks and data): not run again", flush=True)
        metrics, graph_runs = remembered["metrics"], remembered.get("graph_runs", {})
    elif inherited is not None:
        metrics, graph_runs = inherited["metrics"], inherited["graph_runs"]
        key = None  # not this chip's own measurement: its memo never takes these numbers for one (results.py)
    else:
        metrics, graph_runs = _evaluate(params)
        atomic_write_json(memo, {"key": key, "metrics": metrics, "graph_runs": graph_runs})
    report = {"on": params["on"], "metrics": metrics, "gates": params.get("gates", [])}
    report["graph_runs"] = graph_runs  # the totals of the emulator runs' progress lines
    if inherited is not None:
        report["equal_to"] = inherited["equal_to"]
    if report["gates"]:
        needs_float = gates.needs_float(report["gates"])
        reference = json.loads(open(params["float_report"]).read())["metrics"] if needs_float else None
        try:
            report["gated"] = gates.judge(params["name"], report["gates"], metrics, reference)
        except BuildError as e:  # the numbers stay in the memo, marked failed (each gate's verdict too)
            report["gated"] = gates.results(report["gates"], metrics, reference)
            if params["on"] == "emulator" and any(g["passed"] is False for g in report["gated"]):
                names = params["names"]
                whole = [g for g, p in params["graphs"].items() if not isinstance(p, list)]  # split: no diagnose
                if whole:
                    e = BuildError(f"{e}; to see which graph and tensor it starts at: " + ", ".join(
                        f"doit diagnose:{names['model']}/{g}/{names['variant']}@{names['chip']}" for g in whole))
            if inherited is not None:
                e = BuildError(f"{e} (the metrics of {inherited['equal_to']['chip']}'s binaries: this chip's "
                               f"outputs equal theirs on {inherited['equal_to']['samples']} samples)")
            results.keep_failed(memo, report, str(e), key, metrics, graph_runs=graph_runs)
            raise e from None
    results.clear_failed(memo)
    atomic_write_json(params["outputs"]["report"], report)
    return {"metrics": metrics}


def equal_reference(params: dict) -> dict | None:
    """{"metrics", "graph_runs", "equal_to"} of the reference chip's evaluation when every graph's check proved this
    chip's binaries equal to the reference's (their proof memos, made from these very binaries) and the reference's
    evaluation was measured from its current binaries, hooks and data; else None (this chip is evaluated itself)."""
    from .check import remembered_proof
    reference = params["reference"]
    proofs = {}
    for graph, ctx in params["graphs"].items():
        proof = remembered_proof(reference["proofs"][graph], ctx, reference["graphs"][graph],
                                 reference["evaluations"][graph])
        if proof is None or not proof["equal"]:
            why = "no proof of" if proof is None else "a proof of unequal"
            print(f"{graph}: {why} outputs against {reference['chip']}'s binary: evaluated on this chip's binaries",
                  flush=True)
            return None
        proofs[graph] = {k: v for k, v in proof.items() if k != "equal"}
    key = measurement_key({**params, "graphs": reference["graphs"]})
    try:
        saved = json.loads(Path(layout.memo_file(reference["report"])).read_text())
    except (OSError, ValueError):
        saved = None
    if not isinstance(saved, dict) or saved.get("key") != key:
        print(f"{reference['chip']}'s evaluation was not measured from its current binaries: evaluated on this "
              "chip's binaries", flush=True)
        return None
    samples = min(p["samples"] for p in proofs.values())
    print(f"every graph's outputs equal {reference['chip']}'s on {samples} samples, bit for bit: its evaluation, "
          "the emulator does not run", flush=True)
    return {"metrics": saved["metrics"], "graph_runs": saved.get("graph_runs", {}),
            "equal_to": {"chip": reference["chip"], "samples": samples, "graphs": proofs}}


def _evaluate(params: dict) -> tuple[dict, dict]:
    """(metrics, graph runs) of the evaluate hook over the graphs, on the CPU or the HTP emulator."""
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
    return metrics, dict(run_graph.runs)
