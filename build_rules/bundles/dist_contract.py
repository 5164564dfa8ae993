"""The I/O contract of a built binary, as a device bundle states it: dtype, scale and offset of every input and
output (QNN's real = scale x (q + offset)), read from the built artifacts (a _ctx.onnx model or a qairt manifest),
and the fixed-point conversions and bare-binary model `dist verify` runs it with. dist.py (bundles), dist_parts.py
(split graphs and shared contexts) and stages/dist.py read it; it reads none of them.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

# ONNX element type of a tensor -> QNN data type, for tensors the app passes unquantized.
PLAIN_DTYPES = {1: "FLOAT_32", 10: "FLOAT_16", 6: "INT_32", 7: "INT_64", 2: "UINT_8", 3: "INT_8", 4: "UINT_16",
                5: "INT_16", 12: "UINT_32", 9: "BOOL_8"}
# ONNX element type of a QuantizeLinear output / DequantizeLinear input -> QNN fixed-point type.
FIXED_DTYPES = {2: "UFIXED_POINT_8", 3: "SFIXED_POINT_8", 4: "UFIXED_POINT_16", 5: "SFIXED_POINT_16"}
# QNN type -> numpy dtype of the app's buffer.
NUMPY_DTYPES = {"UFIXED_POINT_8": "uint8", "SFIXED_POINT_8": "int8", "UFIXED_POINT_16": "uint16",
                "SFIXED_POINT_16": "int16", "FLOAT_32": "float32", "FLOAT_16": "float16", "INT_32": "int32",
                "INT_64": "int64", "UINT_8": "uint8", "INT_8": "int8", "UINT_16": "uint16", "INT_16": "int16",
                "UINT_32": "uint32", "BOOL_8": "bool"}


class DistError(Exception):
    """A bundle is not what its index says, or a build output a bundle needs is missing; names file and field."""


def sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# --- reading the I/O contract from built artifacts ---------------------------------------------------------

def contract_from_ctx(ctx_model: str | os.PathLike) -> dict:
    """The I/O contract of an ort-qnn context binary, read from its EPContext model: graph inputs quantized by a
    QuantizeLinear outside the EPContext node reach the binary as that node's fixed-point type with its scale and
    zero point; the others (e.g. an input that feeds a layout op) reach it as they are. The same for outputs and
    DequantizeLinear. Returns {"inputs": [...], "outputs": [...], "qnn_graph": name, "ep_context": attributes}."""
    import onnx
    from onnx import numpy_helper

    ctx_model = Path(ctx_model)
    model = onnx.load(str(ctx_model), load_external_data=False)
    graph = model.graph
    ep_nodes = [n for n in graph.node if n.op_type == "EPContext"]
    if len(ep_nodes) != 1:
        raise DistError(f"{ctx_model}: expected one EPContext node, found {len(ep_nodes)}")
    ep = ep_nodes[0]
    initializers = {t.name: t for t in graph.initializer}
    types = {v.name: v.type.tensor_type for v in [*graph.input, *graph.output, *graph.value_info]}

    def constant(name: str, node) -> "object":
        if name not in initializers:
            raise DistError(f"{ctx_model}: {node.op_type} '{node.name}' takes {name!r}, which is not an initializer")
        return numpy_helper.to_array(initializers[name])

    def scale_offset(node, elem_type_of: str) -> tuple[str, float, int]:
        scale = constant(node.input[1], node)
        if scale.size != 1:
            raise DistError(f"{ctx_model}: {node.op_type} '{node.name}' is per-channel ({scale.size} scales); "
                            "graph I/O of a context binary takes one scale")
        if len(node.input) > 2 and node.input[2]:
            zero_point = constant(node.input[2], node)
            elem = onnx.helper.np_dtype_to_tensor_dtype(zero_point.dtype)
            zero = int(zero_point.reshape(-1)[0])
        else:
            elem, zero = types[elem_type_of].elem_type if elem_type_of in types else 2, 0
        if elem not in FIXED_DTYPES:
            raise DistError(f"{ctx_model}: {node.op_type} '{node.name}' has no QNN fixed-point type "
                            f"(ONNX element type {elem})")
        return FIXED_DTYPES[elem], float(scale.reshape(-1)[0]), -zero

    consumers, producers = {}, {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
        for name in node.output:
            producers[name] = node

    def shape(value) -> list[int]:
        dims = [d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim]
        if any(d is None for d in dims):
            raise DistError(f"{ctx_model}: graph I/O '{value.name}' has a dynamic dim {dims}")
        return dims

    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in ep.attribute}
    attributes = {k: v.decode() if isinstance(v, bytes) else v for k, v in attributes.items()}
    # The EP renames some binary tensors (EPContext I/O name -> QNN tensor name); the others keep the EPContext name
    # (measured on FCB records: "features_QuantizeLinear_Output=features", but P-Net's "QuantizeLinear_token_62_out0"
    # after a Transpose was pushed through its output DQ).
    renamed = dict(item.split("=", 1) for item in str(attributes.get("io_name_overrides", "")).split(";") if "=" in item)
    graph_inputs = {v.name: v for v in graph.input if v.name not in initializers}
    graph_outputs = {v.name: v for v in graph.output}

    # In the EPContext node's order, which is the binary's: a QNN C API app addresses tensors by position.
    inputs = []
    for ep_name in ep.input:
        node = producers.get(ep_name)
        if node is not None and node.op_type == "QuantizeLinear" and node.input[0] in graph_inputs:
            value = graph_inputs[node.input[0]]
            dtype, scale, offset = scale_offset(node, ep_name)
        elif ep_name in graph_inputs:
            value = graph_inputs[ep_name]
            dtype, scale, offset = _plain(value, ctx_model), None, None
        elif node is not None and node.op_type == "Identity" and node.input[0] in graph_inputs:
            value = graph_inputs[node.input[0]]  # a weight-shared context's graph keeps its prefixed name inside
            dtype, scale, offset = _plain(value, ctx_model), None, None
        else:
            raise DistError(f"{ctx_model}: EPContext input '{ep_name}' comes from "
                            f"{node.op_type if node else 'nowhere'}; only a graph input or its QuantizeLinear may")
        inputs.append({"name": value.name, "qnn_name": renamed.get(ep_name, ep_name), "shape": shape(value),
                       "dtype": dtype, "scale": scale, "offset": offset, "layout": None})
    outputs = []
    for ep_name in ep.output:
        dq = next((n for n in consumers.get(ep_name, []) if n.op_type == "DequantizeLinear"
                   and n.output[0] in graph_outputs), None)
        if dq is not None:
            value = graph_outputs[dq.output[0]]
            dtype, scale, offset = scale_offset(dq, ep_name)
        elif ep_name in graph_outputs:
            value = graph_outputs[ep_name]
            dtype, scale, offset = _plain(value, ctx_model), None, None
        elif any(n.op_type == "Identity" and n.output[0] in graph_outputs for n in consumers.get(ep_name, [])):
            identity = next(n for n in consumers[ep_name] if n.op_type == "Identity" and n.output[0] in graph_outputs)
            value = graph_outputs[identity.output[0]]
            dtype, scale, offset = _plain(value, ctx_model), None, None
        else:
            raise DistError(f"{ctx_model}: EPContext output '{ep_name}' reaches no graph output (only a "
                            "DequantizeLinear may sit between them)")
        outputs.append({"name": value.name, "qnn_name": renamed.get(ep_name, ep_name), "shape": shape(value),
                        "dtype": dtype, "scale": scale, "offset": offset, "layout": None})
    for side, found, declared in (("input", inputs, graph_inputs), ("output", outputs, graph_outputs)):
        missing = set(declared) - {t["name"] for t in found}
        if missing:
            raise DistError(f"{ctx_model}: graph {side}(s) {sorted(missing)} do not reach the EPContext node")
    return {"inputs": inputs, "outputs": outputs, "qnn_graph": attributes.get("partition_name", ep.name),
            "ep_context": attributes, "ep_node": ep.name}


def _plain(value, ctx_model: Path) -> str:
    elem = value.type.tensor_type.elem_type
    if elem not in PLAIN_DTYPES:
        raise DistError(f"{ctx_model}: graph I/O '{value.name}' has ONNX element type {elem}, which has no QNN type")
    return PLAIN_DTYPES[elem]


def contract_from_manifest(manifest_path: str | os.PathLike, graph: str) -> dict:
    """qairt: the package stage's manifest.json records the binary's I/O contract as graphs.<graph>.io."""
    manifest = json.loads(Path(manifest_path).read_text())
    io_contract = manifest.get("graphs", {}).get(graph, {}).get("io")
    if not isinstance(io_contract, dict) or not {"inputs", "outputs"} <= set(io_contract):
        raise DistError(f"{manifest_path}: no I/O contract for graph '{graph}' (field graphs.{graph}.io with "
                        "inputs and outputs): this package stage does not record it; rebuild the package with a "
                        "build_rules whose qairt package stage writes it")
    for side in ("inputs", "outputs"):
        for tensor in io_contract[side]:
            missing = {"name", "shape", "dtype", "scale", "offset", "layout"} - set(tensor)
            if missing:
                raise DistError(f"{manifest_path}: graphs.{graph}.io.{side} entry {tensor.get('name')!r} lacks "
                                f"{', '.join(sorted(missing))}")
    return {"inputs": io_contract["inputs"], "outputs": io_contract["outputs"]}


class _EmulatorRefused(DistError):
    """The emulator could not load a binary at all (not a contract mismatch)."""


def quantize(value, tensor: dict):
    """A float input as the binary takes it: QNN's q = round(real / scale) - offset, clamped (as ONNX
    QuantizeLinear rounds: half to even, in float32); unquantized tensors in their own dtype."""
    import numpy as np
    dtype = np.dtype(NUMPY_DTYPES[tensor["dtype"]])
    if tensor["scale"] is None:
        return np.ascontiguousarray(value.astype(dtype))
    info = np.iinfo(dtype)
    scaled = np.rint(value.astype(np.float32) / np.float32(tensor["scale"])) - np.float32(tensor["offset"])
    return np.ascontiguousarray(np.clip(scaled, info.min, info.max).astype(dtype))


def dequantize(value, tensor: dict):
    import numpy as np
    if tensor["scale"] is None:
        return np.asarray(value, dtype=np.float64)
    real = np.float32(tensor["scale"]) * (value.astype(np.float32) + np.float32(tensor["offset"]))
    return real.astype(np.float64)


def _bare_binary_model(ctx_path: Path, binary: Path, contract: dict, folder: Path) -> Path:
    """An EPContext model around the binary alone: its I/O typed by the index's contract, no Q/DQ nodes. It sits in
    `folder` with a link to the binary (EPContext paths are relative to the model)."""
    import onnx
    from onnx import helper

    source = contract_from_ctx(ctx_path)
    attrs = source["ep_context"]
    onnx_types = {"float32": onnx.TensorProto.FLOAT, "float16": onnx.TensorProto.FLOAT16,
                  "int32": onnx.TensorProto.INT32, "int64": onnx.TensorProto.INT64, "uint8": onnx.TensorProto.UINT8,
                  "int8": onnx.TensorProto.INT8, "uint16": onnx.TensorProto.UINT16, "int16": onnx.TensorProto.INT16,
                  "uint32": onnx.TensorProto.UINT32, "bool": onnx.TensorProto.BOOL}

    def value(tensor):
        return helper.make_tensor_value_info(tensor["name"], onnx_types[NUMPY_DTYPES[tensor["dtype"]]],
                                             tensor["shape"])

    link = folder / binary.name
    try:
        os.symlink(binary.resolve(), link)
    except OSError:
        link.write_bytes(binary.read_bytes())
    # In the binary's order: the EP hands EPContext I/O to the binary by position (measured: P-Net's outputs,
    # named otherwise in the binary, arrive right).
    node = helper.make_node(
        "EPContext", [t["name"] for t in contract["inputs"]], [t["name"] for t in contract["outputs"]],
        name=source["ep_node"], domain="com.microsoft", main_context=1, embed_mode=0, ep_cache_context=binary.name,
        source=attrs.get("source", "QNNExecutionProvider"), ep_sdk_version=attrs.get("ep_sdk_version", ""),
        partition_name=attrs.get("partition_name", source["ep_node"]),
        **({"is_multi_soc_ep_context": attrs["is_multi_soc_ep_context"]} if "is_multi_soc_ep_context" in attrs else {}))
    graph = helper.make_graph([node], "bare_context_binary", [value(t) for t in contract["inputs"]],
                              [value(t) for t in contract["outputs"]])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = onnx.load(str(ctx_path), load_external_data=False).ir_version
    path = folder / "bare_ctx.onnx"
    onnx.save(model, str(path))
    return path
