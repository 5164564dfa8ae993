"""Reading what the QAIRT tools write and print: a graph's I/O contract, and the failures in their logs.

The I/O contract (names, shapes, QNN data types, scale/offset, layout of each graph input and output) comes from
  - <graph>_net.json, written by qnn-onnx-converter (model-lib flow): graph.tensors, type 0 = input (APP_WRITE),
    1 = output (APP_READ), numeric data_type, quant_params.scale_offset, axis_format (what onnxruntime's
    tools/qnn/gen_qnn_ctx_onnx_model.py reads), or
  - the JSON of qnn-context-binary-utility --context_binary <bin> --json_file <json> (DLC flow, which has no
    _net.json): info.graphs[].info.graphInputs/graphOutputs[].info with dataType names, dimensions and
    quantizeParams.scaleOffset.
Scale and offset follow QNN: real = scale * (q + offset), so offset = -zero_point; null for non-fixed-point types.

Log scanning: a failure names the culprit as `QNN rejected node '<node>' (<op type>): <text>` with a fix. Only
the fatal lines count; `- WARNING - ...` lines never fail a build (they often say "not supported").
Standard library only (the package stage runs inside doit).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

# Qnn_DataType_t (QnnTypes.h) -> its name without the QNN_DATATYPE_ prefix.
DATA_TYPES = {0x0008: "INT_8", 0x0016: "INT_16", 0x0032: "INT_32", 0x0064: "INT_64",
              0x0108: "UINT_8", 0x0116: "UINT_16", 0x0132: "UINT_32", 0x0164: "UINT_64",
              0x0216: "FLOAT_16", 0x0232: "FLOAT_32", 0x0264: "FLOAT_64",
              0x0304: "SFIXED_POINT_4", 0x0308: "SFIXED_POINT_8", 0x0316: "SFIXED_POINT_16", 0x0332: "SFIXED_POINT_32",
              0x0404: "UFIXED_POINT_4", 0x0408: "UFIXED_POINT_8", 0x0416: "UFIXED_POINT_16", 0x0432: "UFIXED_POINT_32",
              0x0508: "BOOL_8", 0x0608: "STRING"}
_INPUT, _OUTPUT = 0, 1  # Qnn_TensorType_t: QNN_TENSOR_TYPE_APP_WRITE, QNN_TENSOR_TYPE_APP_READ
_DEFINED, _SCALE_OFFSET = 1, 0  # QNN_DEFINITION_DEFINED, QNN_QUANTIZATION_ENCODING_SCALE_OFFSET


class ContractError(ValueError):
    """The file is not an I/O contract this module can read; the message says what is missing."""


def read_io_contract(path: str | Path, graph_name: str | None = None) -> dict:
    """{"inputs": [...], "outputs": [...]} in graph order, each {"name", "shape", "dtype", "scale", "offset",
    "layout"}, from a _net.json or a qnn-context-binary-utility JSON (the first graph: one graph per binary; or the
    graph named graph_name, in a weight-shared context holding several)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ContractError(f"{path}: cannot read it as JSON: {e}") from None
    if isinstance(data.get("graph"), dict) and "tensors" in data["graph"]:
        return _from_net_json(data["graph"]["tensors"], path)
    graphs = (data.get("info") or {}).get("graphs") if isinstance(data.get("info"), dict) else None
    if graphs:
        infos = [g.get("info", g) for g in graphs]
        info = next((i for i in infos if i.get("graphName") == graph_name), None) if graph_name else infos[0]
        if info is None:
            raise ContractError(f"{path}: no graph {graph_name!r} (it has {[i.get('graphName') for i in infos]})")
        return {"inputs": [_from_binary_info(t.get("info", t), path) for t in info.get("graphInputs", [])],
                "outputs": [_from_binary_info(t.get("info", t), path) for t in info.get("graphOutputs", [])]}
    raise ContractError(f"{path}: neither a _net.json (graph.tensors) nor a qnn-context-binary-utility dump "
                        "(info.graphs)")


def binary_graph_names(path: str | Path) -> list[str]:
    """The graph names in a qnn-context-binary-utility dump (an HTP config applies only to the graphs it names)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return [g.get("info", g)["graphName"] for g in data["info"]["graphs"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ContractError(f"{path}: no graph names in it ({e})") from None


def _dtype_name(code, path: Path, name: str) -> str:
    if isinstance(code, str):
        return code.removeprefix("QNN_DATATYPE_")
    if code in DATA_TYPES:
        return DATA_TYPES[code]
    raise ContractError(f"{path}: tensor '{name}' has unknown QNN data type {code!r}")


def _entry(name: str, dims, dtype: str, scale_offset: dict | None, layout) -> dict:
    fixed = "FIXED_POINT" in dtype
    return {"name": name, "shape": [int(d) for d in dims], "dtype": dtype,
            "scale": float(scale_offset["scale"]) if fixed and scale_offset else None,
            "offset": int(scale_offset["offset"]) if fixed and scale_offset else None,
            "layout": layout if layout and layout != "NOT_YET_DEFINED" else None}


def _from_net_json(tensors: dict, path: Path) -> dict:
    contract = {"inputs": [], "outputs": []}
    for name, t in tensors.items():
        if t.get("type") not in (_INPUT, _OUTPUT):
            continue
        if "dims" not in t or "data_type" not in t:
            raise ContractError(f"{path}: tensor '{name}' has no dims or data_type")
        quant = t.get("quant_params") or {}
        scale_offset = quant.get("scale_offset") if quant.get("definition") == _DEFINED and \
            quant.get("encoding") == _SCALE_OFFSET else None
        contract["inputs" if t["type"] == _INPUT else "outputs"].append(
            _entry(name, t["dims"], _dtype_name(t["data_type"], path, name), scale_offset, t.get("axis_format")))
    return contract


def _from_binary_info(t: dict, path: Path) -> dict:
    name = t.get("name")
    if not name or "dimensions" not in t or "dataType" not in t:
        raise ContractError(f"{path}: a graph tensor has no name, dimensions or dataType: {t}")
    quant = t.get("quantizeParams") or {}
    encoding = str(quant.get("quantizationEncoding", "SCALE_OFFSET"))
    scale_offset = quant.get("scaleOffset") if encoding.endswith("SCALE_OFFSET") and \
        not encoding.endswith("AXIS_SCALE_OFFSET") else None
    return _entry(name, t["dimensions"], _dtype_name(t["dataType"], path, name), scale_offset, None)


def find_tensor(entries: list[dict], onnx_name: str) -> dict | None:
    """An ONNX tensor's entry: by its name, or as qnn-onnx-converter sanitises names in the .cpp."""
    from .qairt import qnn_tensor_name
    by_name = {e["name"]: e for e in entries}
    return by_name.get(onnx_name) or by_name.get(qnn_tensor_name(onnx_name))


def input_problems(contract: dict, inputs: dict, flow: str) -> list[str]:
    """How the converted graph's inputs differ from the data this build writes for them (calibration samples,
    check inputs): their dims (channel-last where qnn-onnx-converter makes them so, the ONNX order in the DLC
    flow), and, for positional calibration lists, their order (the ONNX input order)."""
    from .qairt import qnn_permutation
    problems, found = [], []
    for name, spec in inputs.items():
        entry = find_tensor(contract["inputs"], name)
        if entry is None:
            problems.append(f"input '{name}' is not an input of the converted graph (its inputs: "
                            f"{', '.join(e['name'] for e in contract['inputs']) or 'none'})")
            continue
        found.append(entry["name"])
        permutation = qnn_permutation(spec, flow)
        expected = [spec["shape"][i] for i in permutation] if permutation else list(spec["shape"])
        if entry["shape"] != expected:
            how = (f"transposed by {list(permutation)} from the ONNX shape {list(spec['shape'])}" if permutation
                   else "the ONNX shape")
            problems.append(f"input '{name}' is {entry['shape']}"
                            + (f" ({entry['layout']})" if entry.get("layout") else "")
                            + f" in the converted graph, but its data is written as {expected} ({how})")
    order = [e["name"] for e in contract["inputs"] if e["name"] in found]
    if not problems and order != found:
        problems.append(f"the converted graph takes its inputs in the order {order}, but the calibration samples "
                        f"list them in the ONNX order {found}")
    return problems


# --------------------------------------------------------------------------------------------------------------
# logs

# `ERROR - Node image_QuantizeLinear: 'No translation registered for op type onnx_dynamicquantizelinear.'`
# (microsoft/onnxruntime#25334), or as a traceback's `KeyError: 'No translation registered for op type onnx_einsum.'`
_NO_TRANSLATION = re.compile(r"(?:Node (?P<node>\S+?):\s*)?['\"]?(?P<text>No translation registered for op type "
                             r"(?P<op>[A-Za-z0-9_]+))")
_QUANT_WARNING = re.compile(r"\bWARNING\b.*(quantiz|encoding|calibrat|bitwidth|overflow|clip)", re.I)
# qnn-context-binary-generator (HTP op validation), e.g.
#   <E> None of the combinations match the provided case
#   <E> QnnBackend_validateOpConfig failed 3110
#   <E> Failed to validate op features.1.conv.0.0 with error 0xc26
#   [ ERROR ] graph.addNode(QNN_OPCONFIG_VERSION_1, "<node>", "qti.aisw", "MatMul", ...)   (model-lib flow only)
_VALIDATE = re.compile(r"Failed to validate op (?P<node>\S+) with error (?P<code>0x[0-9A-Fa-f]+)")
_ADD_NODE = re.compile(r"addNode\(\s*QNN_OPCONFIG_VERSION_\d+\s*,\s*\"(?P<node>[^\"]+)\"\s*,\s*\"[^\"]*\"\s*,"
                       r"\s*\"(?P<type>[^\"]+)\"")
_DETAIL = re.compile(r"<E>\s*(?P<text>.+?)\s*$")
_NOT_A_REASON = re.compile(r"QnnBackend_validateOpConfig failed|Failed to validate op|validating node")


def scan_converter_log(text: str) -> dict:
    """{"rejected": [{"node": str|None, "op": "onnx_<op>", "text": ...}], "quantization_warnings": [lines]}."""
    rejected, warnings = [], []
    for line in text.splitlines():
        match = _NO_TRANSLATION.search(line)
        if match:
            found = {"node": match.group("node"), "op": match.group("op"), "text": match.group("text")}
            if found not in rejected:
                rejected.append(found)
        elif _QUANT_WARNING.search(line):  # from "WARNING" on: no timestamp, so manifests stay reproducible
            warnings.append(line[_QUANT_WARNING.search(line).start():].strip())
    return {"rejected": rejected, "quantization_warnings": warnings}


def scan_context_binary_log(text: str) -> list[dict]:
    """The nodes HTP refused: [{"node", "op_type" (from the addNode line, else None), "text", "code"}]."""
    rejected, details = [], []
    for line in text.splitlines():
        match = _VALIDATE.search(line)
        if match:
            rejected.append({"node": match.group("node"), "op_type": None, "code": match.group("code"),
                             "text": "; ".join(dict.fromkeys(details)) or "HTP op validation failed"})
            details = []
            continue
        match = _ADD_NODE.search(line)
        if match:
            for r in rejected:
                if r["node"] == match.group("node") and r["op_type"] is None:
                    r["op_type"] = match.group("type")
            continue
        detail = _DETAIL.search(line)
        if detail and not _NOT_A_REASON.search(line):
            details.append(detail.group("text"))
    return rejected


def onnx_op_type(op: str, ops_by_type: dict[str, str]) -> str:
    """ONNX's spelling of a converter op name like `onnx_dynamicquantizelinear` (ops_by_type: lower -> type)."""
    bare = op[len("onnx_"):] if op.startswith("onnx_") else op
    return ops_by_type.get(bare.lower(), bare)


def rejection_message(node: str, op_type: str, text: str, fix: str) -> str:
    """The one form every toolchain uses for an op QNN refused (the ort-qnn compile errors use it too)."""
    return f"QNN rejected node '{node}' ({op_type}): {text}. Fix: {fix}"


def htp_fix(text: str, dsp_arch: str) -> str:
    """What to do about a node HTP refused, from the generator's reason."""
    newer = re.search(r"expected >= (\d\d)\b", text)
    if newer:
        return (f"this op needs HTP v{newer.group(1)} or newer at these bit widths and the chip is {dsp_arch}: "
                "build this chip with 8-bit activations (a w8a8 variant), or keep 16 bit only where needed "
                "(overrides)")
    if "None of the combinations match" in text:
        return ("HTP has no kernel for this op with these input/output data types: change its precision "
                "(the variant's activations/weights, or an override of its tensors) or replace the op in the export")
    return ("the HTP backend cannot run this node as converted: check it against the QNN HTP op definitions "
            "(docs/QNN/OpDef in the SDK), then change the export or the variant's precision")
