"""Stage 2, simplify + check: onnxsim -> <graph>.sim.onnx, plus an I/O summary and op inventory.

QNN HTP runs static graphs only and has no int64: every graph input and output must have fixed
dims and a supported dtype, otherwise the build stops here naming the tensor.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from ..errors import BuildError
from ..files import atomic_write_json

VERSION = 1


def _tensor_info(value) -> dict:
    import onnx
    t = value.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]
    return {"name": value.name, "shape": dims, "dtype": onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name}


def run(params: dict) -> dict:
    import numpy as np
    import onnx
    import onnxsim

    source = params["onnx"]
    try:
        model = onnx.load(source)
        onnx.checker.check_model(model)
    except Exception as e:
        raise BuildError(f"{source}: not a valid ONNX model: {e}") from e
    declared = params["inputs"]  # name -> {shape, dtype}; pins dynamic dims of ONNX-file models
    graph_inputs = [i.name for i in model.graph.input
                    if i.name not in {init.name for init in model.graph.initializer}]
    unknown = [n for n in declared if n not in graph_inputs]
    if unknown:
        raise BuildError(f"{source}: declared input(s) {', '.join(unknown)} not in the model "
                         f"(its inputs: {', '.join(graph_inputs)})")
    try:
        simplified, ok = onnxsim.simplify(
            model, overwrite_input_shapes={n: s["shape"] for n, s in declared.items()} or None)
    except Exception as e:
        raise BuildError(f"{source}: onnxsim failed: {e}") from e
    if not ok:
        raise BuildError(f"{source}: onnxsim could not validate the simplified model")
    # onnxsim writes metadata_props that crash onnxruntime's qnn_preprocess_model.
    del simplified.metadata_props[:]

    inputs = [_tensor_info(v) for v in simplified.graph.input
              if v.name not in {init.name for init in simplified.graph.initializer}]
    outputs = [_tensor_info(v) for v in simplified.graph.output]
    problems = []
    for kind, tensors in (("input", inputs), ("output", outputs)):
        for t in tensors:
            if not t["shape"] or not all(isinstance(d, int) and d > 0 for d in t["shape"]):
                problems.append(f"{kind} '{t['name']}' has a dynamic shape {t['shape']}")
            if t["dtype"] == "int64":
                problems.append(f"{kind} '{t['name']}' is int64 (QNN HTP has no int64: use int32)")
    if problems:
        hint = "fix the export (static shapes, int32), or declare fixed shapes under [graphs.<name>.inputs]"
        raise BuildError(f"{source}: " + "; ".join(problems) + f" -- {hint}")
    expected_outputs = params["output_names"]
    if expected_outputs and [o["name"] for o in outputs] != expected_outputs:
        raise BuildError(f"{source}: outputs are {[o['name'] for o in outputs]}, model.toml says {expected_outputs}")

    out = Path(params["outputs"]["onnx"])
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(simplified, str(out))
    ops = Counter(node.op_type for node in simplified.graph.node)
    atomic_write_json(params["outputs"]["io"], {
        "inputs": inputs, "outputs": outputs, "opset": max(o.version for o in simplified.opset_import),
        "ops": dict(sorted(ops.items())), "nodes": len(simplified.graph.node),
        "parameters": int(sum(int(np.prod(i.dims)) for i in simplified.graph.initializer)),
    })
    return {"nodes": len(simplified.graph.node)}
