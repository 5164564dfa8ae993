"""Which ops of a quantized variant run in float on QNN HTP: read from the QNN graph the compile really built.

A QDQ model can have Quantize/DequantizeLinear around an op that QNN HTP has no quantized kernel for. The QNN EP
then keeps those Q/DQ as ops of their own inside the binary and runs the op in float (fp16 on HTP). Measured here
on a 3-layer nn.LSTM (hidden 256): the QDQ recipe puts Q/DQ around each ONNX LSTM (its weights at the activation
type), yet the w8a16 and w8a8 binaries were 3.50 MB each against fp16's 3.47 MB, with fp16's SQNR (27.8 dB) and not
the CPU QDQ model's (48.8 dB): the LSTMs ran in float. Only the compiled graph tells; the QDQ model does not.

The compile stage has onnxruntime-qnn write that graph as JSON (provider option dump_json_qnn_graph, the converter's
_net.json format: nodes with their QNN op type, tensors with their QNN data type; it leaves the binary's bytes as
they are) and keeps what `float_ops()` makes of it in <graph>.compile.json; check, package, report, the summary and
the bundle index repeat it. `describe()` is the one text for it. Standard library only at import (the summary
imports it).
"""
from __future__ import annotations

import json
from pathlib import Path

# QnnTypes.h: data types are 0x00xx int, 0x01xx uint, 0x02xx float (FLOAT_16 0x0216, FLOAT_32 0x0232), 0x03xx
# sfixed, 0x04xx ufixed, 0x05xx bool.
_FLOAT_FAMILY = 0x0200
# QNN ops that only convert or move data: a float one is no float computation (e.g. a Transpose on a float graph
# input, which the quantizer leaves before the first Q).
NOT_COMPUTE = frozenset({"Quantize", "Dequantize", "Cast", "Convert", "Reshape", "Transpose", "StridedSlice", "Pack",
                         "UnPack", "Concat", "Split", "ExpandDims", "Squeeze"})
LISTED = 20  # node names kept in the report (the counts cover all)


def read_dump(folder: Path) -> dict | None:
    """The graph JSON the EP wrote into `folder` (one graph per compile; *_tensor_log.json is another file)."""
    found = [p for p in sorted(Path(folder).glob("*.json")) if not p.name.endswith("_tensor_log.json")]
    if not found:
        return None
    return json.loads(found[0].read_text(encoding="utf-8"))


def float_ops(model, dump: dict | None) -> dict:
    """What ran in float, in ONNX terms: {"count": ONNX nodes, "op_types": {op type: count}, "nodes": [first names],
    "weights": parameters of all nodes, "float_weights": of the float ones, "weights_share", "qnn_ops": {QNN op type:
    count}}. `model` is the onnx.ModelProto that was compiled; QNN nodes are named after its nodes (or their output
    tensors), so each QNN node maps back to the ONNX node with the longest name its own name starts with."""
    if dump is None:
        return {"error": "onnxruntime-qnn wrote no QNN graph JSON (dump_json_qnn_graph): float ops unknown"}
    graph = dump.get("graph", {})
    tensors, nodes = graph.get("tensors", {}), graph.get("nodes", {})
    by_name = {n.name: n for n in model.graph.node if n.name}
    by_output = {o: n.name for n in model.graph.node for o in n.output if o and n.name}

    def source(qnn_name: str) -> str | None:
        for table, name_of in ((by_name, lambda k: k), (by_output, by_output.get)):
            for end in range(len(qnn_name), 0, -1):
                if qnn_name[:end] in table:
                    return name_of(qnn_name[:end])
        return None

    float_nodes: dict[str, str] = {}
    qnn_ops: dict[str, int] = {}
    for qnn_name, node in nodes.items():
        if node.get("type") in NOT_COMPUTE:
            continue
        types = [tensors.get(o, {}).get("data_type") for o in node.get("output_names", [])]
        if not any(isinstance(t, int) and t & 0xFF00 == _FLOAT_FAMILY for t in types):
            continue
        qnn_ops[node["type"]] = qnn_ops.get(node["type"], 0) + 1
        name = source(qnn_name)
        if name is not None and by_name[name].op_type not in ("QuantizeLinear", "DequantizeLinear"):
            float_nodes[name] = by_name[name].op_type
    weights = _weights(model)
    total = sum(weights.values())
    in_float = sum(weights.get(n, 0) for n in float_nodes)
    op_types: dict[str, int] = {}
    for op_type in float_nodes.values():
        op_types[op_type] = op_types.get(op_type, 0) + 1
    order = [n.name for n in model.graph.node if n.name in float_nodes]
    return {"count": len(float_nodes), "op_types": dict(sorted(op_types.items(), key=lambda kv: (-kv[1], kv[0]))),
            "nodes": order[:LISTED], "weights": total, "float_weights": in_float,
            "weights_share": round(in_float / total, 4) if total else 0.0,
            "qnn_ops": dict(sorted(qnn_ops.items(), key=lambda kv: (-kv[1], kv[0])))}


def combine(infos: list) -> dict | None:
    """The float_ops of a split graph's parts as one graph's: counts and weights summed, nodes in part order. None
    when no part has any (fp16); the first error when a part's are unknown. A weight two parts read counts twice."""
    known = [i for i in infos if i is not None]
    if not known:
        return None
    errors = [i for i in known if i.get("error")]
    if errors:
        return errors[0]
    op_types: dict[str, int] = {}
    qnn_ops: dict[str, int] = {}
    for info in known:
        for table, total in ((info["op_types"], op_types), (info.get("qnn_ops", {}), qnn_ops)):
            for op, n in table.items():
                total[op] = total.get(op, 0) + n
    weights = sum(i["weights"] for i in known)
    in_float = sum(i["float_weights"] for i in known)
    return {"count": sum(i["count"] for i in known),
            "op_types": dict(sorted(op_types.items(), key=lambda kv: (-kv[1], kv[0]))),
            "nodes": [n for i in known for n in i["nodes"]][:LISTED], "weights": weights, "float_weights": in_float,
            "weights_share": round(in_float / weights, 4) if weights else 0.0,
            "qnn_ops": dict(sorted(qnn_ops.items(), key=lambda kv: (-kv[1], kv[0])))}


def _weights(model) -> dict[str, int]:
    """Parameters per ONNX node: its initializer inputs (floats, or quantized ones behind a DequantizeLinear)."""
    sizes = {}
    for init in model.graph.initializer:
        count = 1
        for d in init.dims:
            count *= d
        sizes[init.name] = count
    dequantized = {n.output[0]: n.input[0] for n in model.graph.node
                   if n.op_type == "DequantizeLinear" and n.input and n.input[0] in sizes}
    weights = {}
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") or not node.name:
            continue
        count = sum(sizes[dequantized.get(i, i)] for i in node.input if dequantized.get(i, i) in sizes)
        if count:
            weights[node.name] = count
    return weights


def describe(info: dict | None) -> str:
    """'3 LSTM ran in float (98.9 % of the weights)'; '' when nothing did (or nothing is known)."""
    if not info or info.get("error") or not info.get("count"):
        return ""
    ops = ", ".join(f"{n} {op}" for op, n in info["op_types"].items())
    return f"{ops} ran in float ({100 * info['weights_share']:.1f} % of the weights)"


# A quantized variant that keeps more than this share of its weights in float is mostly float: it is warned about.
MOSTLY_FLOAT = 0.25
RECURRENT_FIX = ("QNN HTP has no quantized LSTM, GRU or RNN: export the recurrence as cells, one step a graph with "
                 "the state as inputs and outputs (docs/models.md, \"Recurrent layers as cells\"; an ONNX-only model "
                 "too), or build fp16")


def mostly_float(info: dict | None) -> str:
    """'' or why a quantized graph is mostly float: '2 GRU ran in float (71.6 % of the weights): more than a quarter
    of its weights are not quantized; <the fix>'."""
    if not info or info.get("error") or info.get("weights_share", 0.0) <= MOSTLY_FLOAT:
        return ""
    recurrent = any(op in ("LSTM", "GRU", "RNN") for op in info.get("op_types", {}))
    fix = RECURRENT_FIX if recurrent else ("see which nodes in its float_ops and docs/models.md, \"A variant must be "
                                           "what it says\"")
    return f"{describe(info)}: more than {MOSTLY_FLOAT:.0%} of its weights are not quantized; {fix}"
