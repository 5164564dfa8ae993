"""Stage 5 (ort-qnn), quantize: float model + calibration ranges -> QDQ model for one variant.

Uses onnxruntime.quantization's QNN config. The ranges come from the calibration_stats stage (one
calibration pass per float model, method and sample count), so this stage never runs the calibration
pass itself: a change that does not touch the ranges (weight bits, activation bits, overrides) costs
only the quantization. Without ranges (params["ranges"] absent) it calibrates from the raw files.
"""
from __future__ import annotations

from ..errors import BuildError
from ..quantization.quant_spec import QuantSpec
from ..measuring.samples import read_input_list
from .simplify import BIAS_OPS


def run(params: dict) -> dict:
    spec = QuantSpec.from_settings(params["variant"])
    samples = []
    if not params.get("ranges"):
        samples = read_input_list(params["input_list"], params["inputs"], spec.calibration_samples)
        if len(samples) < spec.calibration_samples:
            raise BuildError(f"{params['input_list']}: {len(samples)} calibration samples, "
                             f"variant {params['name']} needs {spec.calibration_samples}")
    else:
        print(f"reusing calibration ranges {params['ranges']} (no calibration pass)", flush=True)
    try:
        values = write_qdq(spec, params["onnx"], params["outputs"]["onnx"], samples, ranges=params.get("ranges"),
                           tied=[tuple(pair) for pair in params.get("tied") or []])
    except ValueError as e:  # e.g. an override naming a tensor the model does not have
        where = ""
        if "override" in str(e):  # name the key to fix
            names = params["names"]
            keys = "weight_overrides" if "weight override" in str(e) else "overrides / node_overrides"
            where = f" (fix {keys} of [variants.{names['variant']}] in models/{names['model']}/model.toml)"
        raise BuildError(f"{params['name']}: {e}{where}") from e
    values["calibration"] = "reused" if params.get("ranges") else "ran"
    if values.get("int4_kept"):  # the variant says what it is: these weights are not int4
        note = int4_note(params["name"], values["int4_kept"])
        print(f"note: {note}", flush=True)
        values["notes"] = [note]
    check_quantized(params["outputs"]["onnx"], params["onnx"], params["name"], params["final_outputs"]["onnx"])
    warnings = [f"{params['name']}: {w}" for w in narrowed_outputs(params["outputs"]["onnx"], params.get("ranges"))]
    if "report" in params["outputs"]:  # Concats whose narrow inputs the shared scale crushes (a YOLO box/score output)
        warnings += [f"{params['name']}: {w}" for w in concat_report(params, spec)]
    for warning in warnings:
        print(f"warning: {warning}", flush=True)
    if warnings:
        values["warnings"] = warnings  # the build summary repeats them
    return values


def concat_report(params: dict, spec: QuantSpec) -> list[str]:
    """Write <graph>.quantize.json: each Concat of differently ranged inputs (stages/support/concat_slices.py), what
    the check splits a graph output by, and the fix; return the warnings for those whose narrow inputs are crushed."""
    import json

    from ..plumbing.files import atomic_write_text
    from .support import concat_slices
    found = concat_slices.find(params["outputs"]["onnx"], params.get("ranges"))
    atomic_write_text(params["outputs"]["report"], json.dumps({"concats": found}, indent=1) + "\n")
    names = params.get("names") or dict(zip(("model", "graph", "variant"), params["name"].split(":", 1)[1].split("/")))
    where = params.get("model_toml") or f"models/{names['model']}/model.toml"
    return [concat_slices.warning(e, names, where, spec.overrides) for e in found if e["narrow"]]


def write_qdq(spec: QuantSpec, float_onnx, output, samples: list, *, ranges=None, tied=None,
              extra_outputs=None) -> dict:
    """The QDQ model of `spec` with onnxruntime's QNN recipe (and LPBQ blocks when it has a block_size): the one
    place a spec becomes the toolchain's arguments (this stage, tune's ladder and the mixed-precision search call
    it). Returns {"lpbq": ...} for a blocked spec, else {}."""
    from ..toolchains import ort_qnn
    kept = ort_qnn.quantize(float_onnx, output, samples, activations=spec.activations, weights=spec.weights,
                            per_channel=spec.per_channel, method=spec.calibration_method, overrides=spec.overrides,
                            node_overrides=spec.node_overrides or None, ranges=ranges, tied=tied,
                            extra_outputs=extra_outputs, weight_overrides=spec.weight_overrides or None)
    values = {"int4_kept": kept} if kept else {}  # weights the HTP takes at no int4, at 8 bit (block_quant.py)
    if spec.block_size:
        values["lpbq"] = lpbq(float_onnx, output, spec, kept)
    return values


def int4_note(name: str, kept: dict[str, str]) -> str:
    """The summary's note on weights kept at 8 bit in an int4 variant: which, and why (the variant is not all int4)."""
    from ..quantization.block_quant import INT4_FALLBACK
    reasons = {}
    for node, why in kept.items():
        reasons.setdefault(why, []).append(node)
    return (f"{name}: {len(kept)} weight(s) kept at {INT4_FALLBACK}, not int4 (the HTP refuses them at int4): "
            + "; ".join(f"{', '.join(nodes)} ({why})" for why, nodes in reasons.items())
            + "; the other weights are int4")


def lpbq(float_onnx, output, spec: QuantSpec, kept: dict[str, str] | None = None) -> dict:
    """Block-quantize the weights of the QDQ model just written (block_quant.apply_lpbq) and say which layers kept
    per-channel weights, and why. kept: weights the quantizer kept at 8 bit (not int4, so not blocked)."""
    from ..quantization import block_quant
    from ..toolchains import ort_qnn
    keep = {node: f"weight override to {wtype}" for node, wtype in spec.weight_overrides.items()
            if wtype not in block_quant.BLOCK_WEIGHTS}
    keep.update({node: f"{block_quant.INT4_FALLBACK}: {why}" for node, why in (kept or {}).items()})
    result = block_quant.apply_lpbq(output, ort_qnn.preprocessed_model(float_onnx), spec.block_size, keep)
    print(f"LPBQ (block_size {spec.block_size}): {len(result['blocked'])} layer(s) blocked: "
          f"{', '.join(result['blocked']) or 'none'}", flush=True)
    for node, why in result["per_channel"].items():
        print(f"  {node}: per-channel ({why})", flush=True)
    return result


def narrowed_outputs(qdq_model: str, ranges: str | None) -> list[str]:
    """Graph outputs whose quantized range is narrower than their calibrated float range. The QDQ quantizer gives
    a tensor that feeds a Relu or Clip the range of that activation's output; when the tensor is also a graph
    output (a recurrent state, say), its negative values are clamped on the NPU while every float check passes."""
    if not ranges:
        return []
    import json

    import numpy as np
    import onnx
    from onnx import numpy_helper
    calibrated = json.loads(open(ranges).read()).get("data", {})
    model = onnx.load(qdq_model, load_external_data=False)
    initializers = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    outputs = {o.name for o in model.graph.output}
    consumers = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    found = []
    for node in model.graph.node:
        if node.op_type != "DequantizeLinear" or node.output[0] not in outputs or node.output[0] not in calibrated:
            continue
        scale, zero = (initializers.get(n) for n in node.input[1:3])
        if scale is None or zero is None or scale.size != 1:
            continue
        info = np.iinfo(zero.dtype)
        low, high = float(scale) * (info.min - float(zero)), float(scale) * (info.max - float(zero))
        entry = calibrated[node.output[0]]
        float_low, float_high = float(entry["lowest"]["data"][0]), float(entry["highest"]["data"][0])
        step = float(scale)
        if float_low < low - step or float_high > high + step:
            readers = sorted({c.op_type for c in consumers.get(node.output[0], [])})
            found.append(f"output '{node.output[0]}' is quantized to [{low:.4g}, {high:.4g}] but its calibrated range "
                         f"is [{float_low:.4g}, {float_high:.4g}] (it also feeds {', '.join(readers) or 'another op'}, "
                         "whose range it was given): values outside are clamped on the NPU. Fix: return a tensor "
                         "that no op reads, e.g. torch.stack([h, c]) or torch.stack([state]) (a `* 1` or .clone() "
                         "is optimised away)")
    return found


def check_quantized(qdq_model: str, float_model: str, name: str, target: str,
                    quantizer: tuple[str, str] = ("onnxruntime's quantizer", "onnxruntime")) -> None:
    """The QDQ model must load: onnx's checker and onnxruntime's CPU EP, which resolves every node's types
    and shapes. onnxruntime's quantizer can write a model that does not (see simplify.unshare_biases); the compiler
    would then fail with the same words and no node to blame. Fails naming the tensor and the cause when found.
    quantizer: who wrote the model and where to report it (the aimet stage checks AIMET's export the same way)."""
    import onnx
    import onnxruntime as ort
    problem = None
    try:
        # Not strict shape inference: it refuses shapes an exporter left in value_info (PP-OCR's classifier: its
        # batch dim -1 beside the pinned 1), which onnxruntime and QNN accept. The CPU EP's load is the judge.
        onnx.checker.check_model(onnx.load(qdq_model, load_external_data=False))
    except Exception as e:
        problem = f"onnx's checker refuses it: {_first_line(e)}"
    if problem is None:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # loading checks types; no more
        options.log_severity_level = 3
        try:
            ort.InferenceSession(qdq_model, options, providers=["CPUExecutionProvider"])
        except Exception as e:
            problem = f"onnxruntime's CPU EP refuses it: {_first_line(e)}"
    if problem is None:
        return
    cause = renamed_tensors(float_model, qdq_model)
    raise BuildError(f"{name}: {quantizer[0]} wrote an invalid QDQ model ({target} is not written): "
                     f"{problem}" + (f"; cause: {cause}" if cause else
                                     f"; the float model {float_model} loads, so the quantizer broke it: patch the "
                                     "graph (a transform(model) hook for an ONNX-only model), use an fp16 variant "
                                     f"(not quantized), or report it to {quantizer[1]} with that file"))


def _first_line(error: Exception) -> str:
    import re
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    text = text.split(" failed:", 1)[-1].strip()  # onnxruntime's "Load model from <staged path> failed:"
    return re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)


def renamed_tensors(float_model: str, qdq_model: str) -> str:
    """An initializer the quantizer added (a shared bias's copy <bias><n>, or its <copy>_quantized) under the name
    of an activation of the float model: which, whose copy, and the fix; '' if there is none."""
    import onnx
    source = onnx.load(float_model, load_external_data=False)
    qdq = onnx.load(qdq_model, load_external_data=False)
    initializers = {i.name for i in source.graph.initializer}
    producers = {o: n for n in source.graph.node for o in n.output}
    for init in qdq.graph.initializer:
        base = init.name.removesuffix("_quantized")  # a weight's or bias's values; an activation gets Q/DQ nodes
        if init.name in initializers or base not in producers:
            continue
        original = next((base[:k] for k in range(len(base) - 1, 0, -1)
                         if base[k:].isdigit() and base[:k] in initializers), None)
        node = producers[base]
        if original is None:
            what = f"added an initializer '{base}'"
        else:
            readers = [n.name or n.output[0] for n in source.graph.node if n.input[2:3] == [original]]
            what = (f"copied bias '{original}' (shared by {len(readers)} nodes: {', '.join(readers[:4])}"
                    f"{' ...' if len(readers) > 4 else ''}) as '{base}'")
        return (f"the quantizer {what}, which is already the output of node '{node.name or base}' ({node.op_type}): "
                "the nodes reading that output now read the initializer -- fix: give each node its "
                f"own copy of '{original or base}' (the simplify stage does it for biases of {', '.join(BIAS_OPS)}), "
                "or rename that output, e.g. in a transform(model) hook for an ONNX-only model")
    return ""
