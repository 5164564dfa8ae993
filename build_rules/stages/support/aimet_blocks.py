"""The aimet stage's LPBQ and per-layer weight bits (docs/block_quantization.md): AIMET's grouped blockwise
quantization (set_grouped_blockwise_quantization_for_weights: int4 in blocks, 8-bit decompressed) on the MatMul and
Gemm weights that can be blocked, and each weight override as that weight quantizer's bit width."""
from __future__ import annotations

from ...errors import BuildError

WEIGHT_BITS = {"int8": 8, "int4": 4}  # AIMET quantizes weights symmetrically: signed types only


def set_weight_precisions(sim, model, spec) -> dict:
    """Apply to a QuantizationSimModel before its encodings are computed. model: the float onnx.ModelProto the sim
    was made from. Returns {"block_size", "blocked", "per_channel": {node: why}} (the aimet report keeps it)."""
    from ...quantization import block_quant
    initializers = {i.name for i in model.graph.initializer}
    weights = {n.name: block_quant.node_weight(n, initializers) for n in model.graph.node}
    overrides = dict(spec.weight_overrides)  # quant_spec.QuantSpec
    for node, wtype in overrides.items():
        if node not in weights or weights[node] not in sim.qc_quantize_op_dict:
            known = [n for n, w in weights.items() if w in sim.qc_quantize_op_dict]
            from ...errors import did_you_mean
            raise BuildError(f"weight override names {node!r}, which is no node with a quantized weight "
                             f"(after qnn_preprocess_model){did_you_mean(node, known)}: fix weight_overrides")
        if wtype not in WEIGHT_BITS:
            raise BuildError(f"weight override of {node!r}: {wtype!r}; with quantizer = \"aimet\" expected one of "
                             f"{', '.join(map(repr, WEIGHT_BITS))}")
        sim.qc_quantize_op_dict[weights[node]].set_bitwidth(WEIGHT_BITS[wtype])
        print(f"weight override: {node} -> {wtype}", flush=True)
    block = spec.block_size
    if not block:
        return {"weight_overrides": overrides}
    excluded = block_quant.unblockable(model, block)
    excluded.update({n: f"weight override to {t}" for n, t in overrides.items() if t not in block_quant.BLOCK_WEIGHTS})
    from aimet_onnx.quantsim import set_grouped_blockwise_quantization_for_weights
    set_grouped_blockwise_quantization_for_weights(sim, op_types=block_quant.BLOCKED_OPS, bitwidth=4,
                                                   decompressed_bw=4 + block_quant.SCALE_BITS, block_size=block,
                                                   nodes_to_exclude=sorted(excluded))
    blocked = [n.name for n in model.graph.node if n.op_type in block_quant.BLOCKED_OPS and n.name not in excluded
               and weights.get(n.name) in sim.qc_quantize_op_dict]
    print(f"LPBQ (block_size {block}): {len(blocked)} layer(s) blocked: {', '.join(blocked) or 'none'}", flush=True)
    for node, why in excluded.items():
        print(f"  {node}: per-channel ({why})", flush=True)
    return {"block_size": block, "blocked": blocked, "per_channel": excluded}
