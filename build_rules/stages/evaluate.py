"""Model-level evaluation: the evaluate hooks score all graphs working together (e.g.
greedy decoding with encoder + decoder -> WER), once on the float models (ONNX Runtime CPU) and once
per variant and chip on the compiled binaries (HTP emulator). The gate can be relative to float.

Two forms (docs/model-toml.md): evaluate_sample(run_graph, sample) per sample of evaluation_samples(), with
combine(results), runs the samples across the emulator's workers; evaluate(run_graph), the older form, runs them all
in one call, in this process.

The metrics are remembered with what they were measured from in evaluate.measure.json beside the report (not a
target): a re-run of a failed evaluation from the same binaries, hooks and data (`doit --continue`, or a plain
`doit` after a failure) judges the remembered numbers instead of running the emulator again, and a failure's
report stays there for the summary (build_rules/build_state/results.py).

Another chip than the reference (params["reference"]; docs/models.md, "Checks on several chips") whose graphs all
proved equal to the reference chip's in their checks takes the reference's evaluation instead of running the
emulator again, labelled "equal_to" in its report.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..build_state import layout, results
from ..measuring import gates
from ..plumbing import progress
from ..errors import BuildError
from ..plumbing.files import atomic_write_json
from ..measuring.samples import load_hooks

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

    from ..build_state.hashing import file_digest
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
    if remembered is not None and remembered.get("partial") and \
            gates.still_decided({"partial": remembered["partial"]}, params.get("gates", [])) is None:
        remembered = None  # stopped after k of N samples, and its gates changed: every sample is measured
    inherited = equal_reference(params) if remembered is None and params.get("reference") else None
    partial = None
    if remembered is not None:
        print(f"metrics from {memo} (measured from the same binaries, hooks and data): not run again", flush=True)
        metrics, graph_runs = remembered["metrics"], remembered.get("graph_runs", {})
        partial = remembered.get("partial")
    elif inherited is not None:
        metrics, graph_runs = inherited["metrics"], inherited["graph_runs"]
        key = None  # not this chip's own measurement: its memo never takes these numbers for one (results.py)
    else:
        metrics, graph_runs, partial = measure(params)
        atomic_write_json(memo, {"key": key, "metrics": metrics, "graph_runs": graph_runs,
                                 **({"partial": partial} if partial else {})})
    report = {"on": params["on"], "metrics": metrics, "gates": params.get("gates", [])}
    report["graph_runs"] = graph_runs  # the totals of the emulator runs' progress lines
    if inherited is not None:
        report["equal_to"] = inherited["equal_to"]
    unstable = _not_repeating(params)
    if unstable:  # its numbers are one draw of many: never judged as if they were the binary's
        report["gated"] = gates.results(report["gates"], metrics, float_metrics(params)) if report["gates"] else []
        message = f"{params['name']}: {unstable}"
        results.keep_failed(memo, report, message, key, metrics, graph_runs=graph_runs)
        raise BuildError(message)
    if report["gates"]:
        reference = float_metrics(params)
        try:
            if partial:  # an early verdict: the metrics of the first k samples, never judged as if of all N
                raise BuildError(f"{params['name']}: gate {gates.describe_early(partial, metrics)}")
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
            if partial:
                report["partial"] = partial
            results.keep_failed(memo, report, str(e), key, metrics, graph_runs=graph_runs,
                                **({"partial": partial} if partial else {}))
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


def float_metrics(params: dict) -> dict | None:
    """The float model's evaluation, the reference of relative gates (None when no gate is relative)."""
    if not gates.needs_float(params.get("gates", [])):
        return None
    return json.loads(Path(params["float_report"]).read_text())["metrics"]


def measure(params: dict) -> tuple[dict, dict, dict | None]:
    """(metrics, graph runs, the early verdict or None) of the evaluate hooks over the graphs, on the CPU or the HTP
    emulator. Only a per-sample hook with a bound() can stop early (docs/model-toml.md, "Early verdicts")."""
    hooks = load_hooks(params["hooks"], params.get("data_dir"), params.get("checkpoints"))
    if per_sample(hooks):
        return _evaluate_per_sample(params, hooks)
    if not hasattr(hooks, "evaluate"):
        raise BuildError(f"{params['hooks']}: model.toml has [evaluate] but the hooks have neither evaluate(run_graph) "
                         "nor evaluation_samples(), evaluate_sample(run_graph, sample) and combine(results)")
    # the old form: one call over every sample, in this process (it holds one emulator slot)
    with _slot(params):
        run_graph = progress.count_graph_runs(_graph_runner(params), params.get("float_report"))
        metrics = {k: float(v) for k, v in hooks.evaluate(run_graph).items()}
    return metrics, dict(run_graph.runs), None


PER_SAMPLE = ("evaluation_samples", "evaluate_sample", "combine")


def per_sample(hooks) -> bool:
    """The per-sample form: evaluation_samples() -> [picklable sample], evaluate_sample(run_graph, sample) -> dict,
    combine([dict, ...]) -> {metric: value}. A partial set names what is missing."""
    present = [name for name in PER_SAMPLE if hasattr(hooks, name)]
    if present and len(present) < len(PER_SAMPLE):
        missing = [name for name in PER_SAMPLE if name not in present]
        raise BuildError(f"{hooks.__file__}: the per-sample evaluate form needs {', '.join(PER_SAMPLE)}; "
                         f"{', '.join(missing)} missing (or remove {', '.join(present)} to use evaluate(run_graph))")
    return bool(present)


def _evaluate_per_sample(params: dict, hooks) -> tuple[dict, dict, dict | None]:
    """Each sample scored on its own, on the emulator across workers (each opens the graphs' binaries once), the
    results combined in sample order. With a bound(results, total) hook, the samples stop once those scored decide
    that a gate fails (early_verdicts.results_until_decided): the metrics are then those of the first k."""
    from ..emulator import emulator_runs
    from ..measuring import early_verdicts
    samples = list(hooks.evaluation_samples())
    early = None
    if params["on"] == "emulator":
        def bound(done: list, total: int) -> dict:  # the hook sees evaluate_sample's results only
            return hooks.bound([result for result, _ in done], total)
        with progress.counting("evaluation samples", len(samples)) as counter:
            runs = emulator_runs.iter_results("build_rules.stages.evaluate:open_scorer", (params,), samples,
                                              "evaluation samples", counter)
            scored, early = early_verdicts.results_until_decided(
                _results_of(runs), bound if hasattr(hooks, "bound") else None, params.get("gates", []),
                len(samples), float_metrics(params))
    else:  # the CPU: fast, and ONNX Runtime's CPU provider uses the cores itself
        score = open_scorer(params, hooks)
        scored = [score(sample) for sample in progress.track(samples, "evaluation samples")]
    graph_runs: dict[str, int] = {}
    for _, runs in scored:
        for graph, n in runs.items():
            graph_runs[graph] = graph_runs.get(graph, 0) + n
    metrics = {k: float(v) for k, v in hooks.combine([result for result, _ in scored]).items()}
    return metrics, graph_runs, early


def _not_repeating(params: dict) -> str:
    """Why the metrics are not the binaries' when a graph's binary did not repeat itself on the emulator (its record,
    repeats.py: found by its check or by these runs), else ""."""
    if params["on"] != "emulator":
        return ""
    from ..emulator import emulator_runs
    names = params["names"]
    for graph, ctx in params["graphs"].items():
        unstable = emulator_runs.repeat_record(ctx)["unstable"]
        if unstable is not None:
            return (f"graph {graph!r}'s binary does not repeat itself on the emulator (output {unstable['output']!r} "
                    f"differed by up to {unstable['spread']:.4g} between {unstable['runs']} runs of one sample): "
                    f"these metrics are one draw of many, so the evaluation fails; where it starts and a precision "
                    f"that repeats: doit check:{names['model']}/{graph}/{names['variant']}@{names['chip']}, then "
                    f"doit diagnose:{names['model']}/{graph}/{names['variant']}@{names['chip']}")
    return ""


def _results_of(runs):
    """The results of iter_results' (index, result) pairs; closing this closes it (the samples left never run)."""
    try:
        for _, result in runs:
            yield result
    finally:
        runs.close()


def open_scorer(params: dict, hooks=None):
    """sample -> (evaluate_sample's result, graph runs it made): what each emulator worker opens once."""
    if hooks is None:
        hooks = load_hooks(params["hooks"], params.get("data_dir"), params.get("checkpoints"))
    run = _graph_runner(params)

    def score(sample):
        runs: dict[str, int] = {}

        def run_graph(graph: str, feed: dict) -> dict:
            outputs = run(graph, feed)
            runs[graph] = runs.get(graph, 0) + 1
            return outputs

        return hooks.evaluate_sample(run_graph, sample), runs

    return score


def _graph_runner(params: dict):
    """run_graph(graph, feed) over the float models (CPU) or the binaries (emulator, through its output memo; a
    split graph's parts in order); each graph opened at its first run."""
    if params["on"] == "emulator":
        from ..emulator.emulator_runs import open_binary as opener
    else:
        opener = _cpu_runner
    runners: dict = {}

    def run_graph(graph: str, feed: dict) -> dict:
        if graph not in params["graphs"]:
            raise BuildError(f"{params['hooks']}: evaluate asked for graph {graph!r}; graphs: "
                             f"{', '.join(params['graphs'])}")
        if graph not in runners:
            runners[graph] = opener(params["graphs"][graph])
        return runners[graph](feed)

    return run_graph


def _slot(params: dict):
    import contextlib
    if params["on"] != "emulator":
        return contextlib.nullcontext()
    from ..emulator.emulator_runs import holding_slot
    return holding_slot()
