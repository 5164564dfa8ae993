"""Stage 1, export: checkpoint(s) + the model's build hook -> <graph>.onnx (static shapes, batch 1).

Two exporters, chosen per graph (`export = { exporter = ..., opset = ... }` in model.toml): "dynamo", the
torch.export-based exporter torch recommends (needs onnxscript), and "torchscript", the older tracer. Each
exports what the other cannot (TorchScript has no aten::rms_norm; torch.export refuses data-dependent Python
branches), so a failure names the op and suggests the other one. torch is imported here, in the stage process,
never when the build file loads.
"""
from __future__ import annotations

import re
from pathlib import Path

from ..errors import BuildError
from ..measuring.samples import build_module, load_hooks

TORCHSCRIPT_OPSET = 17  # what the examples were verified with; dynamo's default comes from torch


def run(params: dict) -> dict:
    hooks = load_hooks(params["hooks"], params.get("data_dir"), params.get("checkpoints"))
    if hasattr(hooks, "transform"):  # it would never run: simplify applies it to ONNX-only models only
        raise BuildError(f"{params['hooks']}: transform(model) is a hook of ONNX-only models ([model] onnx = ... in "
                         f"{params['model_toml']}); change the module in build() instead")
    import numpy as np
    import torch

    module = build_module(hooks, params)
    inputs = params["inputs"]
    # Zeros are enough to trace a static graph; real data is used by verify.
    example = tuple(torch.from_numpy(np.zeros(s["shape"], dtype=s["dtype"])) for s in inputs.values())
    target = Path(params["outputs"]["onnx"])  # in the private staging folder: the runner publishes it
    target.parent.mkdir(parents=True, exist_ok=True)
    settings = params["export"]
    exporter = settings["exporter"]
    options = {"input_names": list(inputs), "output_names": params["output_names"] or None}
    if exporter == "dynamo":
        _need_onnxscript(params)
        # One self-contained file (no .onnx.data beside it): the file is the stage's target and the next stage's dep.
        options.update(dynamo=True, external_data=False, opset_version=settings["opset"])
    else:
        options.update(dynamo=False, opset_version=settings["opset"] or TORCHSCRIPT_OPSET)
    print(f"exporting {params['graph']} with the {exporter} exporter, opset {options['opset_version'] or 'default'}",
          flush=True)
    import warnings
    try:
        with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", torch.jit.TracerWarning)
            torch.onnx.export(module, example, str(target), **options)
    except Exception as e:
        raise BuildError(export_failure(params, exporter, e)) from e
    values = {"exporter": exporter}
    branches = traced_branches(caught)
    if branches:  # the trace kept one side of a Python `if` on a tensor: say which input chose it
        values["warnings"] = [f"{params['name']}: the torchscript exporter traced a Python branch on a tensor value "
                              f"({', '.join(branches)}) with all-zero inputs: the ONNX graph always takes the branch "
                              "zeros took; verify compares it with the module on your evaluation inputs, which should "
                              "include inputs that take the other branch"]
        print(f"warning: {values['warnings'][0]}", flush=True)
    for w in caught:
        print(f"{w.category.__name__}: {w.filename}:{w.lineno}: {w.message}", flush=True)  # into the stage log
    return values


def traced_branches(caught) -> list[str]:
    """file:line of each TracerWarning about a tensor turned into a Python bool (an `if` on a tensor value)."""
    return sorted({f"{Path(w.filename).name}:{w.lineno}" for w in caught
                   if "Python boolean" in str(w.message)})


def _need_onnxscript(params: dict) -> None:
    import importlib.util
    if importlib.util.find_spec("onnxscript") is None:
        raise BuildError(f"{params['name']}: the dynamo exporter needs onnxscript: pip install onnxscript "
                         f"(in the `export` extra), or set export = {{ exporter = \"torchscript\" }} for this graph "
                         f"in {params['model_toml']}")


def export_failure(params: dict, exporter: str, error: Exception) -> str:
    """What failed, where, and what to try: the graph, the exporter, the op (or the line of forward()), the other
    exporter. The raw exception text follows, cut to its first lines (torch's are pages long)."""
    text = str(error)
    other = "torchscript" if exporter == "dynamo" else "dynamo"
    op = failing_op(text)
    culprit = f" at op {op}" if op else ""
    line = _failing_line(text)
    if line:
        culprit += f" ({line})"
    summary = _first_lines(text)
    hint = ""
    if "data-dependent" in text:  # torch.export cannot branch on tensor values
        hint = " (a Python branch on tensor values: torchscript traces the branch all-zero inputs take"
        if re.search(r"mask|attention|transformer", text, re.I):
            hint += "; nn.TransformerEncoder and nn.MultiheadAttention inspect the mask unless you pass is_causal=False"
        hint += ")"
    return (f"{params['name']}: the {exporter} exporter failed on graph '{params['graph']}'{culprit}: "
            f"{type(error).__name__}: {summary} -- try the other exporter: export = {{ exporter = \"{other}\" }} under "
            f"[graphs.{params['graph']}] in {params['model_toml']}, or rewrite that part of the module{hint}")


def failing_op(text: str) -> str | None:
    """The aten/prim op an exporter error names: "operator 'aten::rms_norm'", "operator unsafe_chunk",
    "No ONNX function found for <OpOverload(op='aten.foo', ...)>"."""
    for pattern in (r"OpOverload\(op='([\w.:]+)'", r"operator '?((?:aten|prim|onnx)::\w+)",
                    r"\b((?:aten|prim)::\w+)", r"\b(aten\.\w+(?:\.\w+)?)", r"operator (\w+)"):
        found = re.search(pattern, text)
        if found:
            return found.group(1)
    return None


def _failing_line(text: str) -> str | None:
    """torch.export's 'The following call raised this error:' names the line of forward() it could not trace."""
    found = re.search(r'The following call raised this error:\s*\n\s*File "([^"]+)", line (\d+), in (\w+)\n\s*(.+)', text)
    if not found:
        return None
    return f"{Path(found.group(1)).name}:{found.group(2)} in {found.group(3)}: {found.group(4).strip()}"


def _first_lines(text: str, count: int = 3) -> str:
    clean = re.sub(r"\x1b\[[0-9;]*m", "", text)  # torch colours its messages
    summary = re.search(r"## Exception summary\s*\n+(.+)", clean)
    lines = [summary.group(1)] if summary else [ln for ln in clean.splitlines() if ln.strip()][:count]
    return " ".join(ln.strip() for ln in lines)[:600]
