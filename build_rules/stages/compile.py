"""Stage 6 (ort-qnn), compile: one model -> one chip's QNN HTP context binary (+ EPContext ONNX).

Compiled from the model's bytes with a numeric soc_model, so the output does not depend on paths
and is byte-for-byte reproducible. Any op QNN HTP cannot run fails the build, naming op and node.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import BuildError
from ..plumbing.files import atomic_write_json


def rejection(model_path: str, error, names: dict | None = None) -> str:
    """The user's message for a graph QNN refused: each node with op type, QNN's reason or error code, and a fix.
    names: the task's model, graph and variant, for the model.toml line of a fix."""
    import onnx
    from ..toolchains import qnn_errors
    model = onnx.load(model_path, load_external_data=False)
    op_types = {n.name: n.op_type for n in model.graph.node if n.name}
    weights = _weight_type(model)
    nodes = getattr(error, "nodes", [])
    text = qnn_errors.explain(model_path, nodes, getattr(error, "reasons", {}), error.log, op_types, weights)
    text = text if nodes else f"{error}; {text.split(': ', 1)[1]}"
    named = [n for _, n in nodes] + qnn_errors.ep_nodes(str(error), op_types) + [
        qnn_errors.onnx_node(n, op_types) or n for n in qnn_errors.culprits(error.log)]
    return text + _int4_fix(model, list(dict.fromkeys(named)), names or {})


def _int4_fix(model, nodes: list[str], names: dict) -> str:
    """' -- the HTP refuses the int4 weight of ...' with the weight_overrides line that keeps each named node's int4
    weight at 8 bit, when the refused nodes read int4 weights (a weight the HTP takes at no int4 that quantize does not know of yet, or one a
    weight override asked int4 for); '' otherwise."""
    import onnx
    from ..quantization.block_quant import INT4_FALLBACK
    initializers = {i.name: i for i in model.graph.initializer}
    dequantized = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    int4 = []
    for node in model.graph.node:
        if node.name not in nodes or len(node.input) < 2:
            continue
        source = dequantized.get(node.input[1])  # the weight's DequantizeLinear reads the int4 initializer
        if source in initializers and initializers[source].data_type == onnx.TensorProto.INT4:
            int4.append(node.name)
    if not int4:
        return ""
    table = f"[variants.{names.get('variant', '<variant>')}.graphs.{names.get('graph', '<graph>')}]"
    line = "weight_overrides = { " + ", ".join(f'"{n}" = "{INT4_FALLBACK}"' for n in int4) + " }"
    toml = f"models/{names['model']}/model.toml" if names.get("model") else "model.toml"
    return (f" -- the HTP refuses the int4 weight of {', '.join(repr(n) for n in int4)}: keep it at 8 bit, add "
            f"`{table}` `{line}` to {toml} (or merge it into that table's weight_overrides)")


def _weight_type(model) -> str | None:
    """"int8", "uint8", "uint16", ... of the quantized weights (initializers feeding DequantizeLinear), if any."""
    import onnx
    initializers = {i.name: i.data_type for i in model.graph.initializer if len(i.dims) >= 1}
    types = {initializers[n.input[0]] for n in model.graph.node
             if n.op_type == "DequantizeLinear" and n.input[0] in initializers}
    names = {onnx.TensorProto.INT8: "int8", onnx.TensorProto.UINT8: "uint8", onnx.TensorProto.UINT16: "uint16",
             onnx.TensorProto.INT4: "int4"}
    found = [names[t] for t in types if t in names]
    return "int8" if "int8" in found else (found[0] if found else None)


def run(params: dict) -> dict:
    from ..toolchains import ort_qnn

    chip = params["chip"]
    out_dir = Path(params["outputs"]["binary"]).parent
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        result = ort_qnn.compile_context_binary(
            Path(params["onnx"]), out_dir, params["graph"], soc_model=chip["soc_id"], vtcm_mb=chip["vtcm_mb"],
            fp16=params["fp16"], block_quant=not params["fp16"] and _float_scale_blocks(params["onnx"]),
            here=True)  # (a stage process: it ends after this one compile)
    except (ort_qnn.UnsupportedOpsError, ort_qnn.QnnCompileError) as e:
        if e.log:
            print("QNN's log of the failed compile:\n" + "\n".join(e.log), flush=True)  # into <graph>.compile.log
        raise BuildError(f"{params['name']}: {rejection(params['onnx'], e, params.get('names'))}") from e
    target = result["target"]
    if target.get("soc_type") != chip["name"] or str(target.get("arch")) != str(chip["dsp_arch"][1:]):
        raise BuildError(f"{params['name']}: the binary says soc_type={target.get('soc_type')} "
                         f"arch={target.get('arch')}, expected {chip['name']} {chip['dsp_arch']}")
    values = {"seconds": round(result["seconds"], 3), "bytes": Path(result["binary"]).stat().st_size,
              "target": target}
    lpbq = _lpbq_check(params, result.get("weight_encodings"))
    if lpbq:
        values["lpbq"] = lpbq
    if "report" in params["outputs"]:  # what `doit report` reads: size and compile time of this binary
        report = {**values, "ops": result["ops"], "chip": chip["name"]}
        if result.get("float_ops") is not None:  # quantized: the ops QNN runs in float all the same
            report["float_ops"] = result["float_ops"]
        if lpbq:  # the summary says it (block_quant.describe)
            report["weight_encodings"] = result["weight_encodings"]
        atomic_write_json(params["outputs"]["report"], report)
    return values



def _float_scale_blocks(path: str) -> bool:
    """Whether the QDQ model has blocked Conv weights (float block scales): the EP needs its block option for them."""
    import onnx
    from ..quantization.block_quant import float_scale_blocks
    return float_scale_blocks(onnx.load(path, load_external_data=False))


def _lpbq_check(params: dict, encodings: dict | None) -> dict | None:
    """A QDQ model with block-quantized weights must compile to as many LPBQ weights on the HTP: fewer means the EP
    fell back (per-channel, blockwise in float, or the CPU) and the binary is not what the variant asks for."""
    import onnx
    from ..quantization.block_quant import LPBQ_ENCODING, ENCODINGS, blocked_weights
    expected = blocked_weights(onnx.load(params["onnx"], load_external_data=False))
    if not expected:
        return None
    found = (encodings or {}).get(ENCODINGS[LPBQ_ENCODING], 0)
    if found < expected:
        raise BuildError(f"{params['name']}: {params['onnx']} has {expected} block-quantized weight(s) but the "
                         f"compiled QNN graph runs {found} as LPBQ (its weights: {encodings}): onnxruntime-qnn did not "
                         "fuse the LPBQ pattern; see docs/block_quantization.md")
    return {"weights": found, "of": sum((encodings or {}).values())}
