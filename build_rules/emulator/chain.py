"""Running a split graph: its parts in order, each fed from the graph's inputs and the outputs of the parts before.

A split graph ([graphs.X] split, stages/split.py) is a list of models, one per part; every tensor crossing a cut is
an output of one part and an input of a later one, under the same name. `open_chain` turns such a list into one
function feed -> outputs, so check, evaluate and `dist verify` run a split graph as they run a whole one. On the HTP
emulator the parts are the chip's <graph>.part<k>_ctx.onnx (fixed-point at the cut inside each binary, float between
the ctx models: the same values, since both sides of a cut use one scale/offset); on the CPU the float parts.
"""
from __future__ import annotations

from pathlib import Path


def open_chain(parts: list, open_part) -> "callable":
    """parts: paths in order; open_part(path) -> (feed -> {name: array}, input names). Returns feed -> outputs of the
    whole graph (the parts' outputs that no later part reads)."""
    runners = [open_part(Path(p)) for p in parts]
    later_inputs = []
    for k in range(len(runners)):
        later_inputs.append({name for _, inputs in runners[k + 1:] for name in inputs})

    def run(feed: dict) -> dict:
        available = dict(feed)
        results = {}
        for k, (part, inputs) in enumerate(runners):
            missing = [n for n in inputs if n not in available]
            if missing:
                raise KeyError(f"part {k + 1} of the chain ({parts[k]}) needs {missing}, which neither the feed nor "
                               "an earlier part gives")
            outputs = part({n: available[n] for n in inputs})
            available.update(outputs)
            results.update({n: v for n, v in outputs.items() if n not in later_inputs[k]})
        return results

    return run


def _emulator_part(path: Path):
    import onnx

    from ..toolchains import ort_qnn
    model = onnx.load(str(path), load_external_data=False)
    initializers = {i.name for i in model.graph.initializer}
    return ort_qnn.open_context_binary(path), [i.name for i in model.graph.input if i.name not in initializers]


def _cpu_part(path: Path, optimize: bool = True):
    import onnxruntime as ort
    options = ort.SessionOptions()
    if not optimize:  # ONNX Runtime fuses Q/DQ patterns by how many nodes read a weight, which a cut can change
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return (lambda feed: dict(zip(names, session.run(names, feed)))), [i.name for i in session.get_inputs()]


def open_on_emulator(ctx_models: list):
    """A split graph's chip binaries (their _ctx.onnx, in order) on the x86 HTP emulator."""
    return open_chain(ctx_models, _emulator_part)


def open_on_cpu(onnx_models: list, optimize: bool = True):
    """A split graph's float (or QDQ) parts on ONNX Runtime's CPU execution provider. optimize=False: without graph
    optimizations, so the chain computes bit for bit what the whole graph computes (with them, a weight two parts
    read, like a tied embedding, is fused differently in each: measured 0.15 on Whisper's logits, w8a16)."""
    return open_chain(onnx_models, lambda path: _cpu_part(path, optimize))
