"""Concats whose inputs span very different ranges (issue 44): one scale for the concatenated tensor crushes the
values of its narrow inputs. A YOLOv8 export's output0 joins boxes in pixels (0..320) and class scores (0..1): at
8 bit its step is ~1.25, more than the whole range of a score, while the cosine and SQNR of the whole tensor, which
the boxes dominate, barely move (measured on tests/models/detector, docs/diagnose.md).

Used by three stages, each in its own words:
- quantize finds such Concats in the QDQ model it wrote (find()), warns with the model.toml lines that fix it
  (warning()) and records them in <graph>.quantize.json;
- check splits a graph output made by one into its slices and measures each against float (slice_metrics());
- diagnose splits every concatenated tensor it measures (stages/diagnose.py; its advice: stages/support/diagnosis.py).
The QDQ model is read with Qdq below: tensor names as the float model has them (the names overrides take).
"""
from __future__ import annotations

# A narrow input whose calibrated range spans fewer than this many steps of the concatenated tensor's scale is
# crushed. Measured on tests/models/detector (CPU, 14 images): its class scores (0..1) quantized alone with a step of
# 1/N gave det_f1 0.75 at N = 1 (the 8-bit output's step is 1.25: 0.8 steps), 0.92 at 8, 0.95 at 16 (score slice
# 24.6 dB), 0.97 at 32, 0.99 at 128. Below 16 steps a slice keeps under 4 bits; an ordinary 8-bit tensor has 255.
MIN_STEPS = 16
# Inputs whose range widths differ by this factor or more are "differently ranged": the check and diagnose show
# such a tensor slice by slice even where no slice is crushed (e.g. the fixed variant: the slices show the fix).
WIDE = 16.0
# Ops that move values without changing them: a narrow input made by a Sigmoid and a Reshape is the Sigmoid's output
# (its override covers the Reshape, which the quantizer gives its input's scale), and a graph output may be the
# concatenated tensor reshaped or transposed.
LAYOUT_OPS = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity")
DROP_DB = 6.0  # a slice this much below the whole tensor (and below its input) is crushed, not merely weaker


class Qdq:
    """A QDQ model's graph read in float terms: which float tensor a node's input is (through the DQ and Q before
    it), how a tensor is quantized (the Q after it), and the layout ops around a tensor."""

    def __init__(self, model):
        self.model = model
        self.producers = {o: n for n in model.graph.node for o in n.output}
        self.consumers: dict = {}
        for node in model.graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.initializers = {i.name: i for i in model.graph.initializer}
        self.outputs = {o.name for o in model.graph.output}

    def array(self, name: str):
        from onnx import numpy_helper
        return numpy_helper.to_array(self.initializers[name]) if name in self.initializers else None

    def float_name(self, name: str) -> str | None:
        """The float tensor a node reads as `name` (a DQ's output: the tensor its Q quantized); None for a constant."""
        for _ in range(8):  # a DQ after a Q, or after a convert between 8 and 16 bit (DQ, Q, DQ, Q)
            node = self.producers.get(name)
            if node is None or node.op_type != "DequantizeLinear":
                break
            if node.input[0] in self.initializers:
                return None
            q = self.producers.get(node.input[0])
            if q is None or q.op_type != "QuantizeLinear":
                break
            name = q.input[0]
        return self.renamed(name)

    def renamed(self, name: str) -> str:
        """The quantizer renames a graph output's producer output to <output>_QuantizeLinear_Input."""
        suffix = "_QuantizeLinear_Input"
        return name[:-len(suffix)] if name.endswith(suffix) and name[:-len(suffix)] in self.outputs else name

    def quantized(self, name: str):
        """(scale, zero point) of the QuantizeLinear that reads node output `name` (one scale), else None."""
        for node in self.consumers.get(name, []):
            if node.op_type == "QuantizeLinear" and len(node.input) == 3:
                scale, zero = self.array(node.input[1]), self.array(node.input[2])
                if scale is not None and zero is not None and scale.size == 1:
                    return float(scale.reshape(())), zero.reshape(())
        return None

    def readers(self, name: str) -> list:
        """The nodes that read node output `name`, through its Q and DQ."""
        found = []
        for node in self.consumers.get(name, []):
            if node.op_type == "QuantizeLinear":
                for dq in self.consumers.get(node.output[0], []):
                    if dq.op_type == "DequantizeLinear":
                        found += self.readers(dq.output[0])  # (a convert between 8 and 16 bit: Q, DQ again)
            else:
                found.append(node)
        return found

    def source(self, name: str) -> str:
        """The float tensor `name` is a relayout of (back through LAYOUT_OPS): the tensor an override names."""
        for _ in range(64):
            node = self.producers.get(name if name in self.producers else f"{name}_QuantizeLinear_Input")
            if node is None or node.op_type not in LAYOUT_OPS:
                return name
            before = self.float_name(node.input[0])
            if before is None:
                return name
            name = before
        return name

    def output_path(self, name: str) -> list | None:
        """The layout ops from node output `name` to a graph output ([] when it is one), else None."""
        if self.renamed(name) in self.outputs:
            return []
        for node in self.readers(name):
            if node.op_type in LAYOUT_OPS and node.output:
                rest = self.output_path(node.output[0])
                if rest is not None:
                    return [node] + rest
        return None


def find(qdq_model: str, ranges: str | None = None) -> list[dict]:
    """Each quantized Concat of the QDQ model whose inputs differ in range by WIDE or more, or whose narrow inputs
    get fewer than MIN_STEPS steps of its scale; in graph order. Input ranges are the calibrated ones (the
    calibration_stats file), else the range each input is quantized to. Each: {"node", "tensor" (the Concat's output),
    "axis", "type", "bits", "step", "inputs": [{"tensor", "source", "range", "steps", "size"}], "narrow": [tensors],
    "output" (the graph output it is, or becomes through layout ops; None), "slices" ({"axis", "bounds"} in that
    output's shape, or None), "fix": {"overrides": [tensors at 16 bit]} or {"export": reason}}."""
    import json
    from pathlib import Path

    import numpy as np
    import onnx
    model = onnx.load(str(qdq_model), load_external_data=False)
    calibrated = json.loads(Path(ranges).read_text()).get("data", {}) if ranges else {}
    qdq = Qdq(model)
    shapes = None
    found = []
    for node in model.graph.node:
        if node.op_type != "Concat":
            continue
        quantized = qdq.quantized(node.output[0])
        if quantized is None:
            continue
        scale, zero = quantized
        inputs = []
        for name in node.input:
            tensor = qdq.float_name(name)
            span = _range(calibrated.get(tensor) if tensor else None) or _dq_range(qdq, name)
            inputs.append({"tensor": tensor or name, "source": qdq.source(tensor) if tensor else None,
                           "range": list(span) if span else None,
                           "steps": (span[1] - span[0]) / scale if span and scale > 0 else None})
        widths = [i["range"][1] - i["range"][0] for i in inputs if i["range"] and i["range"][1] > i["range"][0]]
        narrow = [i["tensor"] for i in inputs if i["source"] and i["steps"] is not None and 0 < i["steps"] < MIN_STEPS]
        if not narrow and (len(widths) < 2 or max(widths) < WIDE * min(widths)):
            continue
        if shapes is None:
            shapes = _shapes(model)
        cut = layout(qdq, node, shapes)
        for i, size in zip(inputs, cut["sizes"]):
            i["size"] = size
        entry = {"node": node.name or node.output[0], "tensor": qdq.renamed(node.output[0]), "axis": cut["axis"],
                 "type": str(zero.dtype), "bits": 8 * zero.dtype.itemsize, "step": scale, "inputs": inputs,
                 "narrow": narrow, "output": cut["output"], "slices": cut["slices"]}
        if narrow:
            info = np.iinfo(zero.dtype)
            entry["fix"] = fix(entry, [i for i in inputs if i["tensor"] in narrow], int(info.max) - int(info.min))
        found.append(entry)
    return found


def layout(qdq: Qdq, node, shapes: dict) -> dict:
    """Where a Concat's inputs are: {"axis" (non-negative), "sizes" (each input's along it; None where unknown),
    "output" (the graph output it is, or becomes through layout ops; None), "slices" ({"axis", "bounds"} of each
    input in that output, or None)}. shapes: _shapes(qdq.model)."""
    axis = _attribute(node, "axis", 0)
    tensor = qdq.renamed(node.output[0])
    dims = shapes.get(node.output[0]) or shapes.get(tensor) or []
    axis = axis + len(dims) if axis < 0 else axis
    sizes = []
    for name in node.input:
        own = shapes.get(name) or shapes.get(qdq.float_name(name) or name)  # (a com.microsoft DQ's output: no shape)
        sizes.append(int(own[axis]) if own and axis < len(own) and isinstance(own[axis], int) else None)
    found = {"axis": axis, "sizes": sizes, "output": None, "slices": None}
    path = qdq.output_path(node.output[0])
    if path is not None:
        found["output"] = qdq.renamed(path[-1].output[0]) if path else tensor
        if None not in sizes and dims:
            found["slices"] = _slices(qdq, path, dims, axis, sizes)
    return found


def fix(entry: dict, narrow: list[dict], levels: int) -> dict:
    """What fixes crushed inputs: the concatenated tensor (and the graph output it becomes) and each narrow input's
    source at 16 bit, when 16 bit gives them MIN_STEPS steps; else the export (separate outputs, closer ranges)."""
    at16 = min(i["steps"] for i in narrow) * (65535 / levels)
    if entry["bits"] >= 16 or at16 < MIN_STEPS:
        return {"export": f"{'at' if entry['bits'] >= 16 else 'even at'} 16 bit the narrow input(s) get "
                          f"{at16:.3g} steps"}
    tensors = [entry["tensor"]] + ([entry["output"]] if entry["output"] and entry["output"] != entry["tensor"] else [])
    return {"overrides": list(dict.fromkeys(tensors + [i["source"] for i in narrow]))}


def overrides_toml(variant: str, graph: str, own: dict, tensors: list[str]) -> str:
    """The model.toml lines that keep `tensors` at 16 bit in one graph of a variant, merged with `own` (the graph's
    overrides)."""
    merged = dict(own)
    merged.update({t: "uint16" for t in tensors})
    body = ", ".join(f'"{t}" = "{q}"' for t, q in merged.items())
    return f"[variants.{variant}.graphs.{graph}]\noverrides = {{ {body} }}"


EXPORT_FIX = ("return the narrow input(s) as graph outputs of their own in the export (e.g. boxes and scores apart), "
              "or bring the ranges together before the Concat (e.g. boxes divided by the frame size, 0..1)")


def warning(entry: dict, names: dict, model_toml: str, own: dict) -> str:
    """The quantize stage's warning for one entry of find() with narrow inputs: the graph, the Concat, each input's
    range and steps, the step, and the model.toml lines that fix it (or the export's fix)."""
    narrow = [i for i in entry["inputs"] if i["tensor"] in entry["narrow"]]
    becomes = (f" (graph output '{entry['output']}')" if entry["output"] and entry["output"] != entry["tensor"] else
               " (a graph output)" if entry["output"] else "")
    they = len(narrow) > 1
    text = (f"graph '{names['graph']}': node '{entry['node']}' (Concat) joins inputs of very different ranges into "
            f"'{entry['tensor']}'{becomes}, quantized to {entry['type']} with a step of {entry['step']:.4g}: "
            + ", ".join(f"'{i['tensor']}' {_span(i)}" for i in entry["inputs"])
            + f". The narrow input{'s' if they else ''} {', '.join(repr(i['tensor']) for i in narrow)} "
            f"span{'' if they else 's'} fewer than {MIN_STEPS} steps and lose{'' if they else 's'} "
            f"{'their' if they else 'its'} values, while the cosine and SQNR of the whole tensor, which the wide "
            "input dominates, barely move (a YOLO export's boxes and class scores in one output; docs/diagnose.md).")
    if "overrides" in entry["fix"]:
        return (text + f" Fix: keep the concatenated tensor and the narrow input{'s' if they else ''} at 16 bit, in "
                f"{model_toml}:\n" + overrides_toml(names["variant"], names["graph"], own, entry["fix"]["overrides"]))
    return text + f" Fix: {entry['fix']['export']}: {EXPORT_FIX}."


def _span(i: dict) -> str:
    if not i["range"]:
        return "(a constant)"
    steps = i["steps"]
    return (f"[{i['range'][0]:.4g}, {i['range'][1]:.4g}] ({steps:.3g} steps)" if steps is not None else
            f"[{i['range'][0]:.4g}, {i['range'][1]:.4g}]")


# --- per slice: the check's numbers -------------------------------------------------------------------------------

def sliced(entries: list[dict]) -> list[dict]:
    """The entries of find() that a check can split: graph outputs with slices along one axis."""
    return [e for e in entries if e.get("output") and e.get("slices")]


def slice_metrics(reference: list[dict], actual: list[dict], entries: list[dict]) -> dict:
    """Per graph output made by a Concat of differently ranged inputs (sliced(entries)): cosine/SQNR/max abs of each
    input's slice against the float model's, over all samples, beside that input's range and steps."""
    import numpy as np

    from ...measuring.samples import compare
    found = {}
    for e in sliced(entries):
        name, cut = e["output"], e["slices"]
        if not reference or name not in reference[0]:
            continue
        parts = []
        for i, (start, stop) in zip(e["inputs"], cut["bounds"]):
            def part(sample, start=start, stop=stop):
                return {name: np.take(sample[name], np.arange(start, stop), axis=cut["axis"])}
            numbers = compare([part(r) for r in reference], [part(a) for a in actual])[name]
            parts.append({"input": i["tensor"], "start": start, "stop": stop, "range": i["range"],
                          "steps": i["steps"], **numbers})
        found[name] = {"node": e["node"], "tensor": e["tensor"], "axis": cut["axis"], "type": e["type"],
                       "step": e["step"], "slices": parts, "fix": e.get("fix")}
    return found


def crushed(whole: dict, parts: list[dict]) -> list[dict]:
    """The slices of narrow inputs (fewer than MIN_STEPS steps of the tensor's scale) at least DROP_DB below the
    whole tensor's SQNR: what one SQNR over the tensor hides. (A slice of a resolved input may be lower than the whole
    for what happened before the Concat: the fixed detector's score slice is 19.0 dB where output0 is 32.7 dB.)"""
    return [p for p in parts if p.get("steps") is not None and p["steps"] < MIN_STEPS
            and p["sqnr"] < whole["sqnr"] - DROP_DB]


def describe_crushed(name: str, whole: dict, found: dict, log: str) -> str:
    """A failed check's words on an output whose slice is crushed: which slice, its numbers, and the fix."""
    worst = min(crushed(whole, found["slices"]), key=lambda p: p["sqnr"])
    what = (f"output '{name}' hides a crushed slice: '{worst['input']}' ({worst['start']}:{worst['stop']} on axis "
            f"{found['axis']}, {worst['steps']:.3g} steps of its {found['type']} scale) is at {worst['sqnr']:.1f} dB "
            f"SQNR (cosine {worst['cosine']:.4f}) against float, where the whole output is at {whole['sqnr']:.1f} dB "
            f"(cosine {whole['cosine']:.5f})")
    fix_ = found.get("fix") or {}
    if "overrides" in fix_:
        return (what + f"; fix: keep {', '.join(repr(t) for t in fix_['overrides'])} at 16 bit (the model.toml lines: "
                f"{log})")
    return what + f"; fix: {EXPORT_FIX} ({log})"


# --- the graph around a Concat --------------------------------------------------------------------------------

def _range(entry) -> tuple[float, float] | None:
    try:
        return float(entry["lowest"]["data"][0]), float(entry["highest"]["data"][0])
    except (TypeError, KeyError, IndexError, ValueError):
        return None


def _dq_range(qdq: Qdq, name: str) -> tuple[float, float] | None:
    """The range the DQ that makes `name` covers; None for a constant or an unquantized input."""
    import numpy as np
    node = qdq.producers.get(name)
    if node is None or node.op_type != "DequantizeLinear" or node.input[0] in qdq.initializers:
        return None
    scale, zero = qdq.array(node.input[1]), qdq.array(node.input[2]) if len(node.input) > 2 else None
    if scale is None or zero is None or scale.size != 1:
        return None
    info = np.iinfo(zero.dtype)
    return float(scale) * (info.min - float(zero)), float(scale) * (info.max - float(zero))


def _attribute(node, name: str, default):
    import onnx
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _shapes(model) -> dict:
    """Tensor name -> its static dims (ints; a symbolic dim as its name), by onnx's shape inference."""
    import onnx
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # a model onnx cannot infer (a contrib op): no slices, the warning still stands
        inferred = model
    shapes = {}
    for v in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        t = v.type.tensor_type
        if t.HasField("shape"):
            shapes[v.name] = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in t.shape.dim]
    return shapes


def _slices(qdq: Qdq, path: list, shape: list, axis: int, sizes: list[int]) -> dict | None:
    """Where each input's values are in the graph output the Concat becomes through `path` (layout ops): an array of
    input ids taken through the same ops. {"axis", "bounds": [[start, stop], ...]} when each input is one run along
    one axis of the output, else None."""
    import numpy as np
    if any(not isinstance(d, int) for d in shape) or sum(sizes) != shape[axis]:
        return None
    ids = np.repeat(np.arange(len(sizes)), sizes).reshape([-1 if k == axis else 1 for k in range(len(shape))])
    ids = np.broadcast_to(ids, shape)
    try:
        for node in path:
            ids = _relayout(qdq, node, ids)
    except (ValueError, KeyError, TypeError, IndexError):
        return None
    for a in range(ids.ndim):
        others = tuple(k for k in range(ids.ndim) if k != a)
        low, high = ids.min(axis=others) if others else ids, ids.max(axis=others) if others else ids
        if (low == high).all() and (np.diff(low) >= 0).all() and len(np.unique(low)) == len(sizes):
            bounds = [[int(np.argmax(low == k)), int(len(low) - np.argmax(low[::-1] == k))] for k in range(len(sizes))]
            return {"axis": a, "bounds": bounds}
    return None


def _relayout(qdq: Qdq, node, array):
    """`array` through one layout op, as onnxruntime computes it."""
    import numpy as np
    op = node.op_type
    if op == "Identity":
        return array
    if op == "Transpose":
        return np.transpose(array, _attribute(node, "perm", None))
    if op == "Flatten":
        axis = _attribute(node, "axis", 1)
        axis = axis + array.ndim if axis < 0 else axis
        return array.reshape(int(np.prod(array.shape[:axis])), -1)
    if op == "Reshape":
        shape = [int(d) for d in qdq.array(node.input[1])]
        if not _attribute(node, "allowzero", 0):
            shape = [array.shape[k] if d == 0 else d for k, d in enumerate(shape)]
        return array.reshape(shape)
    axes = _attribute(node, "axes", None)
    if axes is None and len(node.input) > 1 and node.input[1]:
        axes = [int(a) for a in qdq.array(node.input[1])]
    if op == "Squeeze":
        return np.squeeze(array, axis=tuple(axes) if axes is not None else None)
    if op == "Unsqueeze":
        rank = array.ndim + len(axes)
        return np.expand_dims(array, tuple(a + rank if a < 0 else a for a in axes))
    raise ValueError(op)
