"""Where a graph's shapes break at the input shapes model.toml declares, and the input dims that would not.

A detector or segmenter with strides and a skip connection (a U-Net, DBNet, an FPN) takes only inputs whose spatial
dims its strides divide: at 500 wide, one side of an Add is 63 wide after five stride-2 layers and the upsampled other
side 64. ONNX's shape inference then gives up at that node, every output stays dynamic, and "pin the inputs" would
repeat the line the user already has. This names the node instead (simplify asks it when onnxsim fails or an output
stays dynamic). Loaded by the simplify worker only; onnx is imported inside.
"""
from __future__ import annotations

import math
import re

# Nodes whose `strides` attribute divides the spatial dims of what they read (ConvTranspose multiplies them).
DOWNSAMPLING_OPS = ("Conv", "MaxPool", "AveragePool", "LpPool", "QLinearConv", "ConvInteger")


def pinned(model, declared: dict):
    """A copy of the model with each declared input's shape written into it (what onnxsim is given)."""
    probe = type(model)()
    probe.CopyFrom(model)
    for value in probe.graph.input:
        if value.name in declared:
            shape = value.type.tensor_type.shape
            shape.ClearField("dim")
            for size in declared[value.name]["shape"]:
                shape.dim.add().dim_value = int(size)
    return probe


def shape_break(model, declared: dict, where: str) -> str:
    """'' or why the model's shapes break at the declared input shapes: the node ONNX's shape inference stops at, its
    op, the shapes of its inputs, and, when the model has strides the declared dims are no multiple of, the dims to
    declare instead. model: as loaded (the declared shapes are pinned here); where: model.toml and its graph table."""
    from onnx import shape_inference
    probe = pinned(model, declared)
    try:
        shape_inference.infer_shapes(probe, strict_mode=True)
        return ""
    except Exception as e:  # onnx.shape_inference.InferenceError
        found = re.search(r"\(op_type:([^,]+), node name: ([^)]*)\): (?:\[\w+\] )?(.+)", str(e))
    if not found:
        return ""
    op, name, reason = found.group(1), found.group(2), found.group(3).strip().rstrip(".")
    if "elem type" in reason:  # a type the graph declares wrong (an int64 output, ...): not a shape; simplify says it
        return ""
    node = next((n for n in probe.graph.node if n.name == name), None)
    if node is None:
        return ""
    shapes = known_shapes(probe)
    inputs = " and ".join(f"'{i}' {_shown(shapes.get(i))}" for i in node.input if i)
    message = f"node '{name}' ({op}) cannot take its inputs {inputs} (ONNX shape inference: {reason})"
    factor = stride_product(probe)
    declared_shapes = {n: list(s["shape"]) for n, s in declared.items()}
    suggestion = {n: _rounded(shape, factor) for n, shape in declared_shapes.items() if len(shape) > len(factor)}
    suggestion = {n: s for n, s in suggestion.items() if s != declared_shapes[n]}
    at = ", ".join(f"{n} {s}" for n, s in declared_shapes.items())
    if not suggestion:
        return f"{message} at the declared input shape(s) {at} -- the model's shapes break there: see the node"
    multiples = str(factor[0]) if len(set(factor)) == 1 else " x ".join(str(f) for f in factor)
    example = ", ".join(f"{n} = {{ shape = {s} }}" for n, s in suggestion.items())
    return (f"{message} at the declared input shape(s) {at}: this input needs dims that the model's strides divide "
            f"(multiples of {multiples} in its last {len(factor)} dims) -- declare e.g. {example} in {where} inputs")


def known_shapes(model) -> dict[str, list]:
    """Tensor -> shape (ints, or the dim's name / '?') as ONNX's shape inference (not strict) finds them."""
    from onnx import shape_inference
    inferred = shape_inference.infer_shapes(model)
    shapes = {i.name: list(i.dims) for i in inferred.graph.initializer}
    for value in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape"):
            shapes[value.name] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                                  for d in value.type.tensor_type.shape.dim]
    return shapes


def stride_product(model) -> tuple[int, ...]:
    """Per spatial axis, the largest product of downsampling strides on any path from an input: the dims the model
    needs its input's to be multiples of (32 for a backbone with five stride-2 stages). () without strides."""
    factor: dict[str, tuple[int, ...]] = {}
    for node in model.graph.node:  # ONNX graphs are topologically sorted
        before = [factor[i] for i in node.input if i in factor]
        current = tuple(max(axis) for axis in zip(*before)) if before else ()
        if node.op_type in DOWNSAMPLING_OPS:
            strides = next((list(a.ints) for a in node.attribute if a.name == "strides"), [])
            if strides and any(s > 1 for s in strides):
                base = current if len(current) == len(strides) else (1,) * len(strides)
                current = tuple(b * s for b, s in zip(base, strides))
        if current:
            for output in node.output:
                factor[output] = current
    found = [f for f in factor.values() if any(x > 1 for x in f)]
    if not found:
        return ()
    rank = max(len(f) for f in found)
    return tuple(max(f[i] for f in found if len(f) == rank) for i in range(rank))


def _rounded(shape: list, factor: tuple[int, ...]) -> list:
    """The shape with its last len(factor) dims rounded up to multiples of the factor."""
    if not factor:
        return list(shape)
    head, tail = list(shape[:-len(factor)]), list(shape[-len(factor):])
    return head + [int(math.ceil(d / f) * f) if isinstance(d, int) else d for d, f in zip(tail, factor)]


def _shown(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]" if shape is not None else "(shape unknown)"
