"""Stage 5 (fp16 variants), fp16_lint: where a float model cannot be represented in fp16, named by node.

HTP runs an fp16 variant's whole graph in fp16 (research/ort-qnn.md §2: `relaxed_precision_flag`), so a value
above fp16's largest finite number (65504) becomes inf, and one below its smallest normal (6.1e-05; smaller ones
are subnormal or 0, and a DSP flushes subnormals) becomes 0. Two kinds of findings:
- constants: a float constant above 65504 (an attention mask filled with -1e9 or finfo.min), and an epsilon below
  the smallest normal that a Max or Clip puts under a Log, a division, a Reciprocal or a negative Pow: in fp16 the
  floor is 0, and `log10(max(1e-12, |X|^2))` gives -inf on silent frames;
- computed ranges: the float model run on the CPU over real inputs, every intermediate tensor exposed: a tensor
  that reaches beyond 65504 (first where it starts, not everything after it), and the input of a Log or division
  that takes values below the smallest normal.
The stage (fp16_lint:<model>/<graph>/<variant>, once per fp16 variant and graph, for every chip) writes
<variant>/<graph>.fp16_lint.json and puts its findings in the build summary (`{"warnings": [...]}`); diagnose explains
an fp16 drop with them. It is not part of compile: new evaluation data re-runs the lint, never a binary. ONNX and onnxruntime are imported inside the functions (the stage process has them).
"""
from __future__ import annotations

import math

FP16_MAX = 65504.0
FP16_MIN_NORMAL = 2.0 ** -14  # 6.1035e-05
# Ops whose result blows up when an input is 0: (op type, which input).
SENSITIVE = {"Log": 0, "Div": 1, "Reciprocal": 0, "Pow": 0}
# Ops between a floor and its Log/division that keep a 0 a 0 (or near it): followed from a Max/Clip.
PASS_THROUGH = {"Sqrt", "Mul", "Reshape", "Transpose", "Unsqueeze", "Squeeze", "Cast", "Identity", "Abs", "Expand",
                "Slice", "Concat", "Flatten", "ReduceMean", "ReduceSum"}
MAX_REPORTED = 5  # findings of one kind listed by name; the rest are counted



def run(params: dict) -> dict:
    """The float model on a few evaluation inputs: the findings as JSON, and as warnings for the build summary."""
    from ..plumbing.files import atomic_write_json
    from ..measuring.samples import load_evaluation
    from ..measuring.samples import evenly_spaced
    inputs, _ = load_evaluation(params["evaluation"])
    samples = [inputs[i] for i in evenly_spaced(len(inputs), 8)]
    findings = lint(params["onnx"], samples)
    atomic_write_json(params["outputs"]["report"], {"samples": len(samples), "findings": findings})
    warnings = [f"{params['where']} (fp16): {f['message']}" for f in findings]
    for warning in warnings:
        print(f"warning: {warning}", flush=True)
    return {"warnings": warnings} if warnings else {}

def lint(model_path: str, samples: list[dict] | None = None) -> list[dict]:
    """Findings for an fp16 build of the float model at model_path, each {"node", "op_type", "tensor", "kind",
    "value", "message"} (the message names node, op and the fix); with samples ({input: array}), also from the
    tensors' ranges on them."""
    import onnx
    model = onnx.load(str(model_path))
    found = constant_findings(model)
    if samples:
        found += range_findings(model, samples, {f["node"] for f in found})
    return found


def _constants(model) -> dict:
    import numpy as np
    from onnx import numpy_helper
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value":
                    values[node.output[0]] = numpy_helper.to_array(a.t)
                elif a.name == "value_float":
                    values[node.output[0]] = np.array(a.f, dtype=np.float32)
    return {k: v for k, v in values.items() if v.dtype.kind == "f"}


def _consumers(model) -> dict:
    consumers = {}
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, i))
    return consumers


def _sensitive_reader(node, index: int, constants: dict) -> bool:
    if node.op_type not in SENSITIVE or SENSITIVE[node.op_type] != index:
        return False
    if node.op_type == "Pow":  # x ** e blows up at 0 only for a negative exponent
        exponent = constants.get(node.input[1]) if len(node.input) > 1 else None
        return exponent is not None and float(exponent.min()) < 0
    return True


def _blows_up_after(tensor: str, consumers: dict, constants: dict, depth: int = 4):
    """The first Log/division/... that `tensor` reaches through ops that keep a 0 a 0, or None."""
    for node, index in consumers.get(tensor, []):
        if _sensitive_reader(node, index, constants):
            return node
        if depth and node.op_type in PASS_THROUGH:
            found = _blows_up_after(node.output[0], consumers, constants, depth - 1)
            if found is not None:
                return found
    return None


def _name(node) -> str:
    return f"'{node.name or node.output[0]}' ({node.op_type})"


def constant_findings(model) -> list[dict]:
    import numpy as np
    constants = _constants(model)
    consumers = _consumers(model)
    found = []
    for node in model.graph.node:
        floors = []
        if node.op_type == "Max":
            floors = [constants[i] for i in node.input if i in constants]
        elif node.op_type == "Clip" and len(node.input) > 1 and node.input[1] in constants:
            floors = [constants[node.input[1]]]
        for floor in floors:
            value = float(np.max(np.abs(floor))) if floor.size else 0.0
            if not 0 < value < FP16_MIN_NORMAL:
                continue
            reader = _blows_up_after(node.output[0], consumers, constants)
            if reader is None:
                continue
            found.append({"node": node.name or node.output[0], "op_type": node.op_type, "tensor": node.output[0],
                          "kind": "epsilon", "value": value, "message": (
                f"node {_name(node)} floors its input at {value:g} before {_name(reader)}: {value:g} is below "
                f"fp16's smallest normal {FP16_MIN_NORMAL:.3g}, so in fp16 the floor is 0 and {reader.op_type} gets 0 "
                f"(inf/-inf) wherever the input is that small. Fix: a larger epsilon in the export (at least "
                f"{FP16_MIN_NORMAL:.3g}, e.g. 1e-4; ort-qnn runs an fp16 variant's whole graph in fp16, so no "
                "single tensor can stay fp32)")})
    big = []
    for name, value in constants.items():
        finite = value[np.isfinite(value)]
        if finite.size and float(np.max(np.abs(finite))) > FP16_MAX:
            readers = [n for n, _ in consumers.get(name, [])]
            if readers:
                big.append((name, float(finite[np.argmax(np.abs(finite))]), readers[0]))
    for name, value, reader in big[:MAX_REPORTED]:
        found.append({"node": reader.name or reader.output[0], "op_type": reader.op_type, "tensor": name,
                      "kind": "constant_overflow", "value": value, "message": (
            f"constant '{name}' holds {value:g} (read by node {_name(reader)}), beyond fp16's largest finite value "
            f"{FP16_MAX:g}: it is inf in fp16. Fix: a value within fp16 in the export (for a mask fill, -1e4 or "
            "-100 rather than -1e9 or finfo.min; see docs/models.md)")})
    if len(big) > MAX_REPORTED:
        found.append({"node": "", "op_type": "", "tensor": "", "kind": "constant_overflow", "value": None,
                      "message": f"and {len(big) - MAX_REPORTED} more constant(s) beyond fp16's range"})
    return found


def float_tensors(model) -> list[str]:
    """The model's intermediate and output tensors of a float type, in graph order (shape inference gives types)."""
    import onnx
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type
             for v in [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input]}
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE)
    initializers = {i.name for i in model.graph.initializer}
    names = []
    for node in model.graph.node:
        if node.op_type == "Constant":
            continue
        for out in node.output:
            if out and out not in initializers and types.get(out) in floats and out not in names:
                names.append(out)
    return names


def run_exposed(model, tensors: list[str], samples: list[dict]):
    """Yield {tensor: array} per sample from the float model on the CPU with `tensors` exposed as outputs."""
    import onnx
    import onnxruntime as ort
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    have = {o.name for o in exposed.graph.output}
    for name in tensors:
        if name not in have:
            exposed.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    session = ort.InferenceSession(exposed.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    for sample in samples:
        yield dict(zip(names, session.run(names, sample)))


def tensor_ranges(model, samples: list[dict]) -> dict[str, dict]:
    """tensor -> {"max_abs", "min_abs_nonzero"} over the samples, for every float tensor of the float model
    (graph inputs included)."""
    import numpy as np
    tensors = float_tensors(model)
    ranges: dict[str, dict] = {}

    def add(name, array):
        a = np.abs(np.asarray(array, dtype=np.float64))
        finite = a[np.isfinite(a)]
        nonzero = finite[finite > 0]
        r = ranges.setdefault(name, {"max_abs": 0.0, "min_abs_nonzero": math.inf})
        if finite.size:
            r["max_abs"] = max(r["max_abs"], float(finite.max()))
        if nonzero.size:
            r["min_abs_nonzero"] = min(r["min_abs_nonzero"], float(nonzero.min()))

    for sample, values in zip(samples, run_exposed(model, tensors, samples)):
        for name, array in sample.items():
            if np.asarray(array).dtype.kind == "f":
                add(name, array)
        for name, array in values.items():
            add(name, array)
    return ranges


def range_findings(model, samples: list[dict], known_nodes: set = frozenset()) -> list[dict]:
    ranges = tensor_ranges(model, samples)
    constants = _constants(model)
    producers = {o: n for n in model.graph.node for o in n.output}
    over = lambda t: ranges.get(t, {}).get("max_abs", 0.0) > FP16_MAX  # noqa: E731
    overflows, underflows = [], []
    for node in model.graph.node:
        for out in node.output:
            # Where an overflow starts: this tensor is beyond fp16, none of the node's inputs is.
            if over(out) and not any(over(i) for i in node.input):
                overflows.append({"node": node.name or out, "op_type": node.op_type, "tensor": out,
                                  "kind": "overflow", "value": ranges[out]["max_abs"], "message": (
                    f"tensor '{out}' (output of node {_name(node)}) reaches {ranges[out]['max_abs']:.4g} on the "
                    f"evaluation inputs, beyond fp16's largest finite value {FP16_MAX:g}: inf in fp16. Fix: keep "
                    "it in range in the export (scale before the op, e.g. normalise the input, or divide before "
                    "squaring), or a quantized variant")})
        for index, name in enumerate(node.input):
            if not _sensitive_reader(node, index, constants) or name in constants:
                continue
            low = ranges.get(name, {}).get("min_abs_nonzero", math.inf)
            if low >= FP16_MIN_NORMAL:
                continue
            source = producers.get(name)
            if source is not None and (source.name or source.output[0]) in known_nodes:
                continue  # the epsilon finding names it already
            underflows.append({"node": node.name or node.output[0], "op_type": node.op_type, "tensor": name,
                               "kind": "underflow", "value": low, "message": (
                f"node {_name(node)} reads '{name}', which goes down to {low:.3g} on the evaluation inputs: below "
                f"fp16's smallest normal {FP16_MIN_NORMAL:.3g} it is 0 in fp16, and {node.op_type} gives inf there. "
                f"Fix: floor it in the export with an epsilon of at least {FP16_MIN_NORMAL:.3g} (e.g. "
                "max(x, 1e-4)), or a quantized variant")})
    found = []
    for kind, items in (("overflow", overflows), ("underflow", underflows)):
        found += items[:MAX_REPORTED]
        if len(items) > MAX_REPORTED:
            found.append({"node": "", "op_type": "", "tensor": "", "kind": kind, "value": None,
                          "message": f"and {len(items) - MAX_REPORTED} more tensor(s) with an fp16 {kind}"})
    return found
