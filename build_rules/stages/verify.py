"""Stage 3, verify: ONNX Runtime (CPU) on the simplified graph against the source model on real inputs.

The source is the PyTorch module from the build hook, or the original ONNX file for ONNX-file
models (after the hooks' transform(model), if they have one: the model simplify started from). Also saves the evaluation inputs with the float reference outputs: every later check
compares the compiled binary against these, without importing torch again.
"""
from __future__ import annotations

from pathlib import Path

from ..measuring import gates
from ..errors import BuildError
from ..plumbing.files import atomic_write_json
from ..configuration.config import COMPARISON_METRICS
from ..measuring.samples import (build_module, check_sample, compare, label_arrays, load_hooks, save_arrays, score,
                       split_labels, transformed, worst)


def evaluation_samples(hooks, params) -> tuple[list[dict], list | None]:
    """(inputs, labels): evaluation_inputs() may return (inputs, label) pairs; labels is None without them."""
    graph, specs = params["graph"], params["inputs"]
    labels = None
    if hasattr(hooks, "evaluation_inputs"):
        source = "evaluation_inputs"
        samples, labels = split_labels(list(hooks.evaluation_inputs(graph)), f"{params['hooks']}: {source}({graph!r})")
    elif hasattr(hooks, "calibration_inputs"):
        samples = list(hooks.calibration_inputs(graph, params["default_evaluation_count"]))
        source = "calibration_inputs"
    else:
        raise BuildError(f"{params['hooks']}: needs evaluation_inputs(graph) or calibration_inputs(graph, count)")
    if not samples:
        raise BuildError(f"{params['hooks']}: {source}({graph!r}) returned no samples")
    return ([check_sample(s, specs, f"{params['hooks']}: {source}({graph!r}) sample {i}") for i, s in enumerate(samples)],
            labels)


def _run_onnx(path, samples):
    """path: a file, or an onnx.ModelProto (an ONNX-only model's source after its transform hook)."""
    import onnxruntime as ort
    try:
        session = ort.InferenceSession(path if isinstance(path, str) else path.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
    except ort.capi.onnxruntime_pybind11_state.NotImplemented as e:
        # An old source file (e.g. opset 6) that onnxruntime no longer has kernels for: onnx's reference evaluator
        # still runs it. Only the user's source takes this path; the simplified model always runs on onnxruntime.
        print(f"{path if isinstance(path, str) else 'the source'}: onnxruntime cannot run it ({e}); using onnx's "
              "reference evaluator", flush=True)
        from onnx.reference import ReferenceEvaluator
        evaluator = ReferenceEvaluator(path)
        return [dict(zip(evaluator.output_names, evaluator.run(None, s))) for s in samples]
    names = [o.name for o in session.get_outputs()]
    return [dict(zip(names, session.run(None, s))) for s in samples]


def _run_torch(hooks, params, samples, names: list[str]):
    """The module's outputs, named like the ONNX graph's (model.toml's `outputs`, or the exporter's names)."""
    import torch
    module = build_module(hooks, params)
    results = []
    with torch.no_grad():
        for s in samples:
            out = module(*(torch.from_numpy(s[n]) for n in params["inputs"]))
            out = out if isinstance(out, (tuple, list)) else (out,)
            if len(out) != len(names):
                raise BuildError(f"{params['name']}: build({params['graph']!r}) returns {len(out)} output(s), the ONNX "
                                 f"graph has {len(names)} ({', '.join(names)})")
            results.append({n: o.numpy() for n, o in zip(names, out)})
    return results


def _worst_sample(reference: list[dict], actual: list[dict]) -> str:
    """Which evaluation sample differs most: where to look for a branch the exporter traced one way."""
    import numpy as np
    errors = [max(float(np.max(np.abs(r[k].astype(np.float64) - a[k]))) if r[k].size else 0.0 for k in r)
              for r, a in zip(reference, actual)]
    i = int(np.argmax(errors))
    return f"largest difference in evaluation sample {i} of {len(errors)} (max abs {errors[i]:.3g})"


def _export_warnings(params: dict) -> str:
    """The export log's traced-branch warning, if any: the likely cause of a mismatch on some samples only."""
    log = Path(params["onnx"]).with_name(f"{params['graph']}.export.log")
    try:
        lines = [line for line in log.read_text().splitlines() if "traced a Python branch" in line]
    except OSError:
        return ""
    return f"; the export says: {lines[0].removeprefix('warning: ')}" if lines else ""


def _gated_metrics_returned(hooks, params: dict, samples: list[dict], outputs: list[dict], labels) -> dict:
    """The float model's task metrics (the score hook on the CPU's outputs); fails when a gate names a metric it does
    not return, with check's message (gates.not_measured), before any binary is compiled or run on the emulator."""
    graph = params["graph"]
    found = score(hooks, graph, samples, outputs, outputs, labels, f"{params['hooks']}: score({graph!r})") \
        if hasattr(hooks, "score") else {}
    measured = [*COMPARISON_METRICS, *found]
    missing = [gates.not_measured(m, measured) for m in params["gate_metrics"] if m not in measured]
    if missing:
        raise BuildError(f"{params['name']}: {params['model_toml']} [graphs.{graph}.gate]: {'; '.join(missing)} "
                         "(the float model's score on the CPU, before any binary is built)")
    return found


def run(params: dict) -> dict:
    import numpy as np

    hooks = load_hooks(params["hooks"], params.get("data_dir"), params.get("checkpoints"))
    samples, labels = evaluation_samples(hooks, params)
    where = f"{params['hooks']}: evaluation_inputs({params['graph']!r})"
    label_entries = {} if labels is None else label_arrays(labels, where)  # checked before the slow part
    onnx_outputs = _run_onnx(params["onnx"], samples)
    if params.get("source_onnx"):
        source = params["source_onnx"]
        if hasattr(hooks, "transform"):  # compare with the model simplify started from
            import onnx
            source = transformed(hooks, onnx.load(source), params["hooks"])
        source_outputs = _run_onnx(source, samples)
    else:
        source_outputs = _run_torch(hooks, params, samples, list(onnx_outputs[0]))
    metrics = compare(source_outputs, onnx_outputs, frames=True)
    threshold = params["verify"]
    value = worst(metrics, threshold["metric"])
    report = {"samples": len(samples), "metrics": metrics, "threshold": threshold, "value": value}
    if not gates.passes(threshold, value):
        bound, relation = gates.bound(threshold)
        raise BuildError(f"{params['name']}: ONNX Runtime vs source {threshold['metric']} = {value:.3g}, "
                         f"allowed {relation} {bound:g} (per output: {metrics}); "
                         f"{_worst_sample(source_outputs, onnx_outputs)}{_export_warnings(params)}")
    if params.get("gate_metrics"):
        report["float_score"] = _gated_metrics_returned(hooks, params, samples, onnx_outputs, labels)
    atomic_write_json(params["outputs"]["report"], report)
    arrays = {}
    for i, (sample, reference) in enumerate(zip(samples, onnx_outputs)):
        arrays.update({f"{i}/input/{k}": v for k, v in sample.items()})
        arrays.update({f"{i}/output/{k}": v for k, v in reference.items()})
    save_arrays(params["outputs"]["evaluation"], {"count": np.array(len(samples)), **arrays, **label_entries})
    return {"value": value}
