"""LPBQ (low-power blockwise quantization) of weights for QNN HTP: int4 weights in blocks of `block_size` input
channels, each block with a 4-bit integer scale under one float scale per output channel (AIMET's grouped blockwise
quantization with decompressed_bw = 8). Measured facts behind every choice: docs/block_quantization.md.

- `BLOCK_SIZES`: the block sizes a variant may ask for (`block_size = 64` in [variants.<name>]): those that compiled
  and ran as LPBQ on the HTP emulator of onnxruntime-qnn 2.7.0.
- `apply_lpbq()` rewrites the QDQ model onnxruntime's quantizer wrote (per-channel int4 weights) so that every
  MatMul and Gemm whose input channels divide into blocks reads its weight through the LPBQ pattern the QNN EP fuses
  (uint8 block scales -> DequantizeLinear(per-channel float scale) -> blockwise int4 DequantizeLinear -> MatMul). A
  Gemm becomes MatMul + Add: the EP fuses LPBQ only into a MatMul (a Gemm's blocked weight fell to the CPU).
  A layer that cannot be blocked keeps its per-channel int4 weight; the result names each one and why.
  A 1x1 Conv2d is blocked too, as a blockwise DequantizeLinear with float block scales (the form the EP turns into
  LPBQ for a Conv with enable_block_quant_weight_optimization=1; `float_scale_blocks()` says a compile needs it).
- `compiled_weights()` reads from the QNN graph the compile really built which weights are LPBQ
  (QNN_QUANTIZATION_ENCODING_BLOCKWISE_EXPANSION), so the build can say the binary runs LPBQ, not a fallback.

Standard library at import (config and the summary import it); numpy and onnx inside the functions.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

BLOCK_SIZES = (16, 32, 64, 128)
BLOCK_WEIGHTS = ("int4",)  # LPBQ is int4 weights decompressed to 8 bit on the HTP
BLOCKED_OPS = ("MatMul", "Gemm")  # AIMET's op types; the ort path also blocks 1x1 Conv2d (_conv_lpbq)
SCALE_BITS = 4  # per-block integer scales in [1, 16]: decompressed_bw 8 - 4 weight bits (AIMET's lpbq_utils)
# The x86 HTP emulator of onnxruntime-qnn 2.7.0 crashes (SIGSEGV) running an LPBQ MatMul whose weight has 7, 8 or 9
# blocks of 64 or 128 per channel (measured: K = 448, 512, 576 at 64 and 896, 1024, 1152 at 128; 1-6, 10-12, 16 and 24
# blocks of 64, 5 and 10 of 128, and 8 or 9 blocks of 16 or 32 run). docs/block_quantization.md
_EMULATOR_CRASH_BLOCKS = range(7, 10)

# QnnTypes.h Qnn_QuantizationEncoding_t, as the EP's JSON graph dump writes them
ENCODINGS = {0: "per-tensor", 1: "per-channel", 2: "per-tensor (bitwidth)", 3: "per-channel (bitwidth)",
             5: "LPBQ", 11: "blockwise (float compute)"}
LPBQ_ENCODING = 5


def node_weight(node, initializers) -> str | None:
    """The weight a weight override sets: input 1 of a MatMul / Gemm / Conv, the table (input 0) of a Gather."""
    if node.op_type == "Gather":
        return node.input[0] if node.input and node.input[0] in initializers else None
    return node.input[1] if len(node.input) > 1 and node.input[1] in initializers else None


def weight_override_entries(model, overrides: dict[str, str] | None, per_channel: bool,
                            where) -> dict[str, tuple[str, int | None]]:
    """weight_overrides (node -> weight type) as onnxruntime's quantizer takes them: weight initializer -> (type,
    the per-channel axis or None). A Gather's table stays per-tensor, also where a MatMul reads it too (a tied
    embedding): the Gather's output would take per-channel parameters, whose DequantizeLinear QNN rejects. An unknown
    node raises ValueError naming it."""
    from ..errors import did_you_mean
    initializers = {i.name: len(i.dims) for i in model.graph.initializer}
    nodes = {n.name: n for n in model.graph.node if n.name}
    tables = {node_weight(n, initializers) for n in model.graph.node if n.op_type == "Gather"}
    found = {}
    for name, wtype in (overrides or {}).items():
        node = nodes.get(name)
        weight = node_weight(node, initializers) if node is not None else None
        if weight is None:
            known = [n for n, node in nodes.items() if node_weight(node, initializers)]
            hint = did_you_mean(name, known) or (f"; nodes with a weight: {', '.join(known[:12])}"
                                                 + (f" and {len(known) - 12} more" if len(known) > 12 else ""))
            raise ValueError(f"weight override names {name!r}, which is no node with a weight in {where} (after "
                             f"qnn_preprocess_model){hint}")
        axis = None
        if per_channel and weight not in tables:  # an override without an axis is per-tensor
            transposed = any(a.name == "transB" and a.i for a in node.attribute)
            axis = {"Conv": 0, "ConvTranspose": 1, "Gemm": 0 if transposed else 1}.get(
                node.op_type, initializers[weight] - 1)  # MatMul: [..., K, N]
        found[weight] = (wtype, axis)
    return found


# The convolutions whose int4 weight the HTP refuses (onnxruntime-qnn 2.7.0, QNN 2.51, SM8750, measured one layer at a
# time: bench/int4_convolutions.py; tests/test_densemap.py): a 2-D Conv or ConvTranspose whose int4 weight is per
# tensor (per_channel = false, or one output channel per group, as a DBNet head's last ConvTranspose to a one-channel
# map or a depthwise ConvTranspose has) is "not selected by that EP", and a 3-D Conv fails to finalize. Per-channel
# 2-D Conv / ConvTranspose (depthwise Conv included), 1-D Conv / ConvTranspose (per tensor too), MatMul and Gemm take
# int4.
INT4_CONVOLUTIONS = ("Conv", "ConvTranspose")
INT4_FALLBACK = "int8"  # what such a weight is quantized to instead


def int4_refused(model, per_channel: bool) -> dict[str, str]:
    """node -> why the HTP takes no int4 weight there, for the named Conv / ConvTranspose nodes of `model` (after
    qnn_preprocess_model) with a weight initializer: the quantize stage keeps those weights at INT4_FALLBACK."""
    initializers = {i.name: list(i.dims) for i in model.graph.initializer}
    found = {}
    for node in model.graph.node:
        weight = node_weight(node, initializers) if node.op_type in INT4_CONVOLUTIONS and node.name else None
        if weight is None:
            continue
        dims = initializers[weight]
        channels = dims[1] if node.op_type == "ConvTranspose" else dims[0]  # weight_override_entries' axis
        if len(dims) == 5:
            found[node.name] = "a 3-D convolution's int4 weight fails to finalize"
        elif len(dims) != 4:
            continue  # a 1-D convolution takes int4 weights, per tensor too
        elif not per_channel:
            found[node.name] = "int4 weights of a convolution only per channel (per_channel = false)"
        elif channels == 1:
            found[node.name] = "int4 weights of a convolution only per channel, and it has one output channel" + (
                " per group" if node.op_type == "ConvTranspose" and dims[1] == 1 and any(
                    a.name == "group" and a.i > 1 for a in node.attribute) else "")
    return found


WEIGHTED_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")


def weight_types(model) -> dict[str, str]:
    """node -> the type of the quantized weight it reads, as model.toml spells it ("int4", "int8", "uint8",
    "uint16"): the initializer of the DequantizeLinear feeding input 1 of a Conv, ConvTranspose, MatMul or Gemm of a
    QDQ model (LPBQ's block-scale DequantizeLinear reads its int4 weight the same way)."""
    from onnx import TensorProto
    initializers = {i.name: i.data_type for i in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    found = {}
    for node in model.graph.node:
        if node.op_type not in WEIGHTED_OPS or len(node.input) < 2:
            continue
        dq = producers.get(node.input[1])
        if dq is not None and dq.op_type == "DequantizeLinear" and dq.input[0] in initializers:
            found[node.name] = TensorProto.DataType.Name(initializers[dq.input[0]]).lower()
    return found


def check_block_size(value) -> str | None:
    """None if the HTP takes `value` as a block size, else what is wrong (config.py raises it naming the key)."""
    if isinstance(value, bool) or not isinstance(value, int) or value not in BLOCK_SIZES:
        return f"block size {value!r} is not one the HTP takes (allowed: {', '.join(map(str, BLOCK_SIZES))})"
    return None


def _int4_tensor(name: str, values):
    """An ONNX INT4 initializer from integer values in [-8, 7]: two per byte, the first in the low nibble (ONNX's
    packing). helper.make_tensor packs element by element in Python: minutes for Whisper's 20 M-weight embedding."""
    import numpy as np
    from onnx import TensorProto, helper
    flat = np.asarray(values, dtype=np.int8).ravel()
    nibbles = (flat & 0x0F).astype(np.uint8)
    if nibbles.size % 2:
        nibbles = np.append(nibbles, np.uint8(0))
    packed = nibbles[0::2] | (nibbles[1::2] << 4)
    return helper.make_tensor(name, TensorProto.INT4, list(np.shape(values)), packed.tobytes(), raw=True)


def lpbq_params(w, block: int):
    """w: float weight [K, N] (input channels first). Returns (int4 weight [K, N], uint8 block scales [K/block, N],
    float per-channel scales [N]) as AIMET's LPBQ computes them: per-block min-max scales, quantized to integers in
    [1, 2**SCALE_BITS] of a per-channel scale (the largest block scale / 2**SCALE_BITS)."""
    import numpy as np
    k, n = w.shape
    blocks = w.reshape(k // block, block, n).astype(np.float64)
    scale = np.maximum(np.abs(blocks).max(axis=1) / 7.0, 1e-12)  # symmetric int4: [-8, 7]
    per_channel = scale.max(axis=0) / 2 ** SCALE_BITS
    ints = np.clip(np.round(scale / per_channel), 1, 2 ** SCALE_BITS)
    q = np.clip(np.round(blocks / (ints * per_channel)[:, None, :]), -8, 7).astype(np.int8).reshape(k, n)
    return q, ints.astype(np.uint8), per_channel.astype(np.float32)


def why_unblockable(k: int, block_size: int) -> str | None:
    """Why a weight with k input channels cannot be blocked by block_size, or None."""
    if k % block_size:
        return f"{k} input channels are not a multiple of block_size {block_size}"
    if k // block_size in _EMULATOR_CRASH_BLOCKS and block_size >= 64:
        return (f"{k} input channels make {k // block_size} blocks of {block_size}, which crash the x86 HTP "
                "emulator (onnxruntime-qnn 2.7.0)")
    return None


def unblockable(float_model, block_size: int) -> dict[str, str]:
    """MatMul / Gemm nodes of a float model (onnx.ModelProto) whose constant weight cannot be blocked: node -> why.
    The aimet stage excludes them from AIMET's grouped blockwise quantization."""
    from onnx import helper
    shapes = {i.name: list(i.dims) for i in float_model.graph.initializer}
    found = {}
    for node in float_model.graph.node:
        if node.op_type not in BLOCKED_OPS or len(node.input) < 2 or node.input[1] not in shapes:
            continue
        dims = shapes[node.input[1]]
        transposed = node.op_type == "Gemm" and any(a.name == "transB" and helper.get_attribute_value(a)
                                                    for a in node.attribute)
        if len(dims) != 2:
            found[node.name] = f"its weight has {len(dims)} dimensions (2 needed)"
            continue
        reason = why_unblockable(dims[1] if transposed else dims[0], block_size)
        if reason:
            found[node.name] = reason
    return found


def matmul_for_blocked_gemms(qdq_model: Path) -> list[str]:
    """A QDQ model's Gemms whose weight is block-quantized (AIMET's LPBQ export) rewritten in place as MatMul + Add,
    which onnxruntime-qnn fuses into LPBQ (a Gemm it does not). Returns the Gemms rewritten."""
    import onnx
    from onnx import helper
    model = onnx.load(str(qdq_model))
    inits, producers, consumers = _graph_index(model)
    replaced, dropped, done = {}, set(), []
    for node in model.graph.node:
        if node.op_type != "Gemm" or len(node.input) < 2:
            continue
        dq = producers.get(node.input[1])
        if dq is None or dq.op_type != "DequantizeLinear" or not any(a.name == "block_size" for a in dq.attribute):
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        readers = consumers.get(node.output[0], [])
        if attrs.get("transB", 0):  # a torch Linear's [N, K] weight: the MatMul needs [K, N]
            _transpose_blocked_weight(dq, producers, inits, model)
            attrs["transB"] = 0
        if attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0 \
                or attrs.get("beta", 1.0) != 1.0 or len(readers) != 1 or readers[0].op_type != "QuantizeLinear":
            raise ValueError(f"{qdq_model}: Gemm {node.name!r} has a block-quantized weight but is no plain "
                             "Gemm(A, W, b) -> QuantizeLinear: it cannot become the MatMul the EP fuses into LPBQ")
        replaced[id(node)] = _gemm_as_matmul(node, node.input[1], readers[0], inits, producers, model, dropped)
        done.append(node.name)
    if done:
        _save_with_nodes(model, [m for n in model.graph.node if id(n) not in dropped for m in replaced.get(id(n), [n])],
                         Path(qdq_model))
    return done


def _transpose_blocked_weight(dq, producers: dict, inits: dict, model) -> None:
    """Turn an LPBQ weight [N, K] (blocks along axis 1, AIMET's export of a Gemm with transB) into [K, N] (blocks
    along axis 0): the int4 weight, its block zero points and integer block scales transposed, the axes swapped."""
    import numpy as np
    from onnx import TensorProto, numpy_helper
    scale_dq = producers.get(dq.input[1])
    if scale_dq is None or scale_dq.op_type != "DequantizeLinear" or dq.input[0] not in inits:
        raise ValueError(f"weight {dq.input[0]!r}: no LPBQ pattern (integer block scales -> DequantizeLinear)")
    for name in (dq.input[0], dq.input[2] if len(dq.input) > 2 else "", scale_dq.input[0]):
        if not name:
            continue
        old = inits[name]
        values = numpy_helper.to_array(old)
        if values.ndim != 2:
            raise ValueError(f"{name!r}: {values.ndim} dimensions, 2 expected")
        if old.data_type == TensorProto.INT4:  # written element by element (numpy has no int4)
            new = _int4_tensor(name, np.ascontiguousarray(values.T))
        else:
            new = numpy_helper.from_array(np.ascontiguousarray(values.T), name)
        model.graph.initializer.remove(old)
        model.graph.initializer.append(new)
        inits[name] = new
    for node, axis in ((dq, 0), (scale_dq, 1)):
        for attribute in node.attribute:
            if attribute.name == "axis":
                attribute.i = axis


def apply_lpbq(qdq_model: Path, float_model, block_size: int, keep: dict[str, str] | None = None) -> dict:
    """Rewrite `qdq_model` in place (atomically) to LPBQ weights; see the module doc.
    float_model: the float onnx.ModelProto the quantizer read (after qnn_preprocess_model): the weights' float values.
    keep: node -> reason, nodes left as they are (e.g. a weight override to int8).
    Returns {"block_size", "blocked": [node names], "per_channel": {node: why it was not blocked}}."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(qdq_model))
    _opset_21(model, qdq_model)
    floats = {i.name: i for i in float_model.graph.initializer}
    inits, producers, consumers = _graph_index(model)
    keep = dict(keep or {})
    blocked, per_channel = [], {}
    replaced: dict[int, list] = {}  # id(node) -> nodes in its place
    dropped: set[int] = set()
    for node in model.graph.node:
        if node.op_type not in (*BLOCKED_OPS, "Conv") or len(node.input) < 2:
            continue
        name = node.name or node.output[0]
        dq = producers.get(node.input[1])
        if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in inits:
            continue  # a weight that is no quantized initializer (a dynamic MatMul): nothing to block
        if name in keep:
            per_channel[name] = keep[name]
            continue
        if node.op_type == "Conv":
            why = _conv_lpbq(node, dq, floats, inits, consumers, block_size, model, replaced)
            if why:
                per_channel[name] = why
            else:
                blocked.append(name)
            continue
        zero = inits.get(dq.input[2]) if len(dq.input) > 2 else None
        shared = len(consumers.get(node.input[1], [])) > 1
        if not shared and (zero is None or zero.data_type != TensorProto.INT4):
            # (a shared weight gets its own copy from the float values: another node's override set its type)
            per_channel[name] = "its weight is not int4"
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "Gemm" and (attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0
                                       or attrs.get("beta", 1.0) != 1.0):
            per_channel[name] = "a Gemm with transA, alpha or beta"
            continue
        source = floats.get(dq.input[0].removesuffix("_quantized"))
        if source is None:
            per_channel[name] = "its float weight was not found"
            continue
        w = numpy_helper.to_array(source)
        if w.ndim != 2:
            per_channel[name] = f"its weight has {w.ndim} dimensions (2 needed)"
            continue
        if attrs.get("transB", 0):
            w = w.T
        reason = why_unblockable(w.shape[0], block_size)
        if reason:
            per_channel[name] = reason
            continue
        out_q = None
        if node.op_type == "Gemm":
            readers = consumers.get(node.output[0], [])
            out_q = readers[0] if len(readers) == 1 and readers[0].op_type == "QuantizeLinear" else None
            if out_q is None:
                per_channel[name] = "its output is not quantized"
                continue
        q, ints, scale = lpbq_params(w, block_size)
        base = f"{dq.input[0].removesuffix('_quantized')}_lpbq"
        model.graph.initializer.extend([
            _int4_tensor(f"{base}_q", q),
            numpy_helper.from_array(ints, f"{base}_block_scale"),
            numpy_helper.from_array(scale, f"{base}_channel_scale"),
            numpy_helper.from_array(np.zeros(scale.shape, np.uint8), f"{base}_channel_zero"),
            _int4_tensor(f"{base}_zero", np.zeros(ints.shape, np.int8))])
        scales = helper.make_node("DequantizeLinear", [f"{base}_block_scale", f"{base}_channel_scale",
                                                       f"{base}_channel_zero"], [f"{base}_scale"],
                                  name=f"{base}_scale_DequantizeLinear", axis=1)
        weight = helper.make_node("DequantizeLinear", [f"{base}_q", f"{base}_scale", f"{base}_zero"],
                                  [f"{base}_weight"], name=f"{base}_DequantizeLinear", axis=0, block_size=block_size)
        # a weight another node reads too (Whisper's token embedding: a Gather and the logits MatMul) stays as it
        # is for that node; this one gets its own LPBQ copy
        replaced[id(dq)] = [*replaced.get(id(dq), [dq] if shared else []), scales, weight]
        if node.op_type == "MatMul":
            node.input[1] = f"{base}_weight"
        else:
            replaced[id(node)] = _gemm_as_matmul(node, f"{base}_weight", out_q, inits, producers, model, dropped)
        blocked.append(name)
    nodes = []
    for node in model.graph.node:
        if id(node) in dropped:
            continue
        nodes.extend(replaced.get(id(node), [node]))
    _save_with_nodes(model, nodes, Path(qdq_model))
    return {"block_size": block_size, "blocked": blocked, "per_channel": per_channel}


def _conv_lpbq(conv, dq, floats: dict, inits: dict, consumers: dict, block_size: int, model,
               replaced: dict) -> str | None:
    """Block a Conv's per-channel int4 weight in place (replaced: id(node) -> the nodes in its place), or say why
    it stays per-channel. onnxruntime-qnn 2.7.0 runs LPBQ only in a 1x1 Conv2d, and only from a blockwise
    DequantizeLinear with float block scales [OC, IC/B, 1, 1] under enable_block_quant_weight_optimization=1: it
    fuses no integer-scale pattern into a Conv, refuses the [OC, IC/B, kh, kw] scales ONNX gives a larger kernel,
    computes wrong outputs on the emulator from [OC, IC/B, 1, 1] scales on one, and takes no blocks on a Conv1d
    (measured: docs/block_quantization.md)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    zero = inits.get(dq.input[2]) if len(dq.input) > 2 else None
    if zero is None or zero.data_type != TensorProto.INT4:
        return "its weight is not int4"
    if len(consumers.get(conv.input[1], [])) > 1:
        return "a weight shared by two nodes"
    source = floats.get(dq.input[0].removesuffix("_quantized"))
    if source is None:
        return "its float weight was not found"
    w = numpy_helper.to_array(source)
    group = next((helper.get_attribute_value(a) for a in conv.attribute if a.name == "group"), 1)
    if w.ndim != 4:
        return f"a Conv{w.ndim - 2}d (onnxruntime-qnn blocks only Conv2d weights)"
    if w.shape[2:] != (1, 1):
        return (f"a {w.shape[2]}x{w.shape[3]} kernel (onnxruntime-qnn 2.7.0 runs LPBQ correctly only in a 1x1 "
                "Conv2d)")
    if group != 1:
        return f"a grouped Conv (group {group})"
    reason = why_unblockable(w.shape[1], block_size)
    if reason:
        return reason
    oc, ic = w.shape[:2]
    q, ints, scale = lpbq_params(w.reshape(oc, ic).T, block_size)  # [IC, OC], [IC/B, OC], [OC]
    blocks = (ints.astype(np.float32) * scale).T.reshape(oc, ic // block_size, 1, 1)  # exact multiples: lossless
    base = f"{dq.input[0].removesuffix('_quantized')}_lpbq"
    model.graph.initializer.extend([
        _int4_tensor(f"{base}_q", np.ascontiguousarray(q.T).reshape(oc, ic, 1, 1)),
        numpy_helper.from_array(blocks.astype(np.float32), f"{base}_scale"),
        _int4_tensor(f"{base}_zero", np.zeros(blocks.shape, np.int8))])
    replaced[id(dq)] = [helper.make_node("DequantizeLinear", [f"{base}_q", f"{base}_scale", f"{base}_zero"],
                                         [dq.output[0]], name=f"{base}_DequantizeLinear", axis=1,
                                         block_size=block_size)]
    return None


def _opset_21(model, where) -> None:
    """DequantizeLinear's block_size needs opset 21. onnxruntime's quantizer moves a model to 21 for 16-bit
    activations, not for 8-bit ones (an LPBQ W4A8 variant, tune's 8-bit mixed-precision candidates): raise the
    import to 21 where that changes no op's meaning (19-21 add types and options, except GroupNormalization-21's
    scale shape and GridSample-20's mode names)."""
    opset = next((o for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None or opset.version >= 21:
        return
    if opset.version < 19 or any(n.op_type in ("GroupNormalization", "GridSample") for n in model.graph.node):
        raise ValueError(f"{where}: opset {opset.version}; DequantizeLinear's block_size needs opset 21 (export the "
                         "model at opset 19 or newer)")
    opset.version = 21


def float_scale_blocks(qdq_model) -> bool:
    """Whether a QDQ model (onnx.ModelProto) has a blockwise DequantizeLinear with float block scales (a blocked
    Conv): its compile needs enable_block_quant_weight_optimization=1, without which the EP runs that layer in
    float16 (QNN encoding 11)."""
    inits = {i.name for i in qdq_model.graph.initializer}
    return any(n.op_type == "DequantizeLinear" and n.input[1] in inits
               and any(a.name == "block_size" and a.i for a in n.attribute) for n in qdq_model.graph.node)


def _gemm_as_matmul(gemm, weight: str, out_q, inits: dict, producers: dict, model, dropped: set) -> list:
    """Gemm(A, W, b) -> Q -> ... as MatMul(A, W) -> Q/DQ -> Add(b) with the Gemm's output name. The MatMul output
    takes the Gemm output's quantization widened by the bias's largest magnitude; the bias becomes a per-tensor
    constant at the activation type (HTP's Add takes no int32 input)."""
    import numpy as np
    from onnx import helper, numpy_helper
    scale = float(numpy_helper.to_array(inits[out_q.input[1]]))
    zero_init = inits[out_q.input[2]]
    zero = numpy_helper.to_array(zero_init)
    info = np.iinfo(zero.dtype)
    bias = np.zeros(1, np.float32)
    if len(gemm.input) > 2 and gemm.input[2]:
        bias_dq = producers.get(gemm.input[2])
        if bias_dq is not None and bias_dq.op_type == "DequantizeLinear" and bias_dq.input[0] in inits:
            values = numpy_helper.to_array(inits[bias_dq.input[0]]).astype(np.float64)
            b_scale = numpy_helper.to_array(inits[bias_dq.input[1]]).astype(np.float64)
            b_zero = (numpy_helper.to_array(inits[bias_dq.input[2]]).astype(np.float64)
                      if len(bias_dq.input) > 2 and bias_dq.input[2] else 0.0)
            bias = ((values - b_zero) * b_scale).astype(np.float32)
            dropped.add(id(bias_dq))
        elif gemm.input[2] in inits:
            bias = numpy_helper.to_array(inits[gemm.input[2]]).astype(np.float32)
    span = float(np.abs(bias).max())
    low = scale * (info.min - float(zero)) - span
    high = scale * (info.max - float(zero)) + span
    mm_scale = (high - low) / (info.max - info.min)
    mm_zero = np.array(round(info.min - low / mm_scale), zero.dtype)
    out = gemm.output[0]
    name = gemm.name or out
    nodes = [helper.make_node("MatMul", [gemm.input[0], weight], [f"{out}_matmul"], name=f"{name}_MatMul")]
    model.graph.initializer.extend([numpy_helper.from_array(np.array(mm_scale, np.float32), f"{out}_matmul_scale"),
                                    numpy_helper.from_array(mm_zero, f"{out}_matmul_zero_point")])
    quant = [f"{out}_matmul_scale", f"{out}_matmul_zero_point"]
    nodes += [helper.make_node("QuantizeLinear", [f"{out}_matmul", *quant], [f"{out}_matmul_q"],
                               name=f"{name}_MatMul_QuantizeLinear"),
              helper.make_node("DequantizeLinear", [f"{out}_matmul_q", *quant], [f"{out}_matmul_dq"],
                               name=f"{name}_MatMul_DequantizeLinear")]
    if len(gemm.input) > 2 and gemm.input[2]:
        low_b, high_b = min(float(bias.min()), 0.0), max(float(bias.max()), 0.0)
        b_scale = (high_b - low_b) / (info.max - info.min) or 1e-8
        b_zero = round(info.min - low_b / b_scale)
        b_q = np.clip(np.round(bias / b_scale) + b_zero, info.min, info.max).astype(zero.dtype)
        model.graph.initializer.extend([numpy_helper.from_array(b_q, f"{name}_bias_q"),
                                        numpy_helper.from_array(np.array(b_scale, np.float32), f"{name}_bias_scale"),
                                        numpy_helper.from_array(np.array(b_zero, zero.dtype), f"{name}_bias_zero")])
        nodes += [helper.make_node("DequantizeLinear", [f"{name}_bias_q", f"{name}_bias_scale", f"{name}_bias_zero"],
                                   [f"{name}_bias"], name=f"{name}_bias_DequantizeLinear"),
                  helper.make_node("Add", [f"{out}_matmul_dq", f"{name}_bias"], [out], name=f"{name}_Add")]
    else:
        nodes.append(helper.make_node("Identity", [f"{out}_matmul_dq"], [out], name=f"{name}_Identity"))
    return nodes


def _save(model, path: Path) -> None:
    import onnx
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp.onnx", dir=path.parent)
    os.close(fd)
    try:
        onnx.save(model, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def blocked_weights(qdq_model) -> int:
    """How many weights of a QDQ model (onnx.ModelProto) are block-quantized (DequantizeLinear with block_size)."""
    return sum(1 for n in qdq_model.graph.node if n.op_type == "DequantizeLinear"
               and any(a.name == "block_size" and a.i for a in n.attribute))


def compiled_weights(dump: dict | None) -> dict | None:
    """Static fixed-point tensors of the compiled QNN graph (the EP's JSON dump) by quantization encoding:
    {"LPBQ": n, "per-channel (bitwidth)": n, ...}; None without a dump."""
    if not dump:
        return None
    counts: dict[str, int] = {}
    for tensor in dump.get("graph", {}).get("tensors", {}).values():
        params = tensor.get("quant_params") or {}
        data_type = tensor.get("data_type")
        if tensor.get("type") != 4 or data_type not in (0x0304, 0x0308):
            continue  # static signed 4- and 8-bit fixed-point tensors: the weights (not int32 biases)
        label = ENCODINGS.get(params.get("encoding"), f"encoding {params.get('encoding')}")
        counts[label] = counts.get(label, 0) + 1
    return dict(sorted(counts.items()))


def describe(info: dict | None) -> str:
    """'LPBQ 3 of 4 weights' for the summary; '' without LPBQ."""
    if not info or not info.get("LPBQ"):
        return ""
    return f"LPBQ {info['LPBQ']} of {sum(info.values())} weights"


def _graph_index(model) -> tuple[dict, dict, dict[str, list]]:
    """(initializers by name, the node making each tensor, the nodes reading each tensor) of a model's main graph."""
    consumers: dict[str, list] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    return ({i.name: i for i in model.graph.initializer}, {o: n for n in model.graph.node for o in n.output},
            consumers)


def _save_with_nodes(model, nodes: list, path: Path) -> None:
    """The model with `nodes` as its graph's nodes and the initializers no node reads any more dropped, saved."""
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    used = {i for n in model.graph.node for i in n.input}
    for init in [i for i in model.graph.initializer if i.name not in used]:
        model.graph.initializer.remove(init)
    _save(model, path)
