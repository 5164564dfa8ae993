"""What QNN says when it rejects a graph, turned into messages that name node, op type, error code and the fix.

QNN's own words reach us in two places: the EP's op-support trace (node -> reason, e.g. "QNN LayerNorm on HTP only
supports normalization along the last axis.") and QNN's log, which onnxruntime prints only at verbose level
(`[V:onnxruntime:Default, ... QnnLogging]  <E> Failed to validate op ln with error 0xc26`, or `Failed to create tensor
for node: X ... error code: 7004` while composing the graph). ort_qnn re-runs a failed compile with that log on and
hands the lines here. KNOWN_REJECTIONS is the table of rejections this tool knows a fix for (docs/models.md lists it
too); a rejection it does not know is still named, with QNN's own words.
Standard library only.
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class KnownRejection:
    op_type: str  # the ONNX op type (or "*" for any)
    pattern: str  # a regex searched in the reason, the QNN log lines of the node, and its name
    fix: str
    weights: str | None = None  # only when the variant's weights are of this type


KNOWN_REJECTIONS = (
    KnownRejection("LayerNormalization", r"last axis",
                   "HTP normalises over the last axis only: transpose so the normalised axis is last (and back "
                   "after), or reshape it there"),
    KnownRejection("LayerNormalization", r"Failed to add node|0xc26",
                   "HTP's LayerNormalization takes no signed weights: keep its scale unsigned (this build's quantize "
                   "stage does)"),
    KnownRejection("*", r"GroupNormalization",
                   "quantized GroupNormalization is decomposed into ops HTP cannot place: build this graph as an "
                   "fp16 variant, or export the norm as Reshape + InstanceNormalization + Reshape"),
    KnownRejection("MeanVarianceNormalization", r"not supported",
                   "write it as LayerNormalization over the last axis (transpose first if needed), or as "
                   "(x - ReduceMean(x)) / Sqrt(ReduceMean((x - mean)^2) + eps)"),
    KnownRejection("Pad", r"dynamic|static",
                   "HTP pads with static pads and a static pad value: compute neither at run time (the simplify "
                   "stage already turns Constant nodes into initializers)"),
    KnownRejection("DequantizeLinear", r"7004|Failed to create tensor",
                   "the tensor is quantized at run time (it came from a Constant node or a computed constant): make "
                   "it an initializer; simplify does this for Constant nodes of the main graph"),
    KnownRejection("MatMul", r"0xc26|Failed to add node",
                   "a 16-bit x 16-bit MatMul needs HTP v73 or newer: use weights = \"uint8\" or activations = "
                   "\"uint8\" for v68/v69 chips", weights="uint16"),
)

_QNN_LINE = re.compile(r"QnnLogging\]\s*<([EW])>\s*(.*)|\[([EW]):onnxruntime:[^\]]*\]\s*(.*)")
_NODE_IN_LINE = (re.compile(r"Failed to validate op (\S+) with error (0x[0-9a-fA-F]+)"),
                 re.compile(r"for node:?\s*'?([^'\s,]+)'?.*?error code:?\s*(\d+)"),
                 re.compile(r"[Nn]ode '?([^'\s,]+)'?.*?(?:error|code)[: ]+(0x[0-9a-fA-F]+|\d+)"))


def qnn_log_lines(text: str) -> list[str]:
    """The error and warning lines of QNN's and onnxruntime's log (without timestamps), in order, once each."""
    lines = []
    for raw in text.splitlines():
        found = _QNN_LINE.search(raw)
        if found:
            line = f"<{found.group(1) or found.group(3)}> {(found.group(2) or found.group(4)).strip()}"
            if line not in lines:
                lines.append(line)
    return lines


def culprits(lines: list[str]) -> dict[str, str]:
    """node name (as QNN names it) -> error code, from QNN's error lines."""
    named = {}
    for line in lines:
        for pattern in _NODE_IN_LINE:
            found = pattern.search(line)
            if found:
                named.setdefault(found.group(1), found.group(2))
                break
    return named


_EP_NODE = re.compile(r"Node '([^']+)' OpType:(\w+)")


def ep_nodes(text: str, op_types: dict[str, str]) -> list[str]:
    """The ONNX nodes onnxruntime's own error names (`Node '/up1/ConvTranspose_token_43' OpType:ConvTranspose ...
    was not selected by that EP`: the layout transformer's copy of node /up1/ConvTranspose)."""
    found = []
    for name, _ in _EP_NODE.findall(text):
        node = onnx_node(re.sub(r"_token_\d+$", "", name), op_types)
        if node and node not in found:
            found.append(node)
    return found


def onnx_node(qnn_name: str, op_types: dict[str, str]) -> str | None:
    """The ONNX node a QNN op name stands for: the same name, or the name with a lowering suffix (`ln_2`)."""
    if qnn_name in op_types:
        return qnn_name
    base = re.sub(r"_\d+$", "", qnn_name)
    return base if base in op_types else None


def fix_for(op_type: str, node: str, evidence: str, weights: str | None) -> str | None:
    for known in KNOWN_REJECTIONS:
        if known.op_type not in ("*", op_type) or (known.weights and known.weights != weights):
            continue
        if re.search(known.pattern, f"{evidence} {node}"):
            return known.fix
    return None


def explain(graph_file: str, rejected: list[tuple[str, str]], reasons: dict[str, str], log: list[str],
            op_types: dict[str, str], weights: str | None = None, limit: int = 8) -> str:
    """One message for every node QNN refused: `QNN rejected node 'x' (Op): <reason / error code> -- fix: ...`.
    Graph-I/O Q/DQ neighbours of a refused node are counted, not listed (they fall with it)."""
    codes = {onnx_node(n, op_types) or n: code for n, code in culprits(log).items()}
    # Graph Q/DQ nodes fall with the node they wrap: count them unless QNN named them or nothing else is left.
    qdq = ("QuantizeLinear", "DequantizeLinear")
    named = [r for r in rejected if r[0] not in qdq or r[1] in codes]
    shown = named or rejected
    around = len(rejected) - len(shown)
    parts, fixes = [], []
    for op_type, node in shown[:limit]:
        evidence = " ".join(x for x in (reasons.get(node, ""), *[ln for ln in log if node in ln]) if x)
        what = reasons.get(node) or "refused by QNN"
        if node in codes:
            what += f" (QNN error {codes[node]})"
        parts.append(f"QNN rejected node '{node}' ({op_type}): {what}")
        fix = fix_for(op_type, node, evidence, weights)
        if fix and fix not in fixes:
            fixes.append(fix)
    # A node QNN's log names that the trace did not (a compose/finalize failure): name it too.
    for node, code in codes.items():
        if node not in {n for _, n in rejected}:
            op_type = op_types.get(node, "?")
            parts.append(f"QNN rejected node '{node}' ({op_type}): error {code}")
            fix = fix_for(op_type, node, " ".join(ln for ln in log if node in ln), weights)
            if fix and fix not in fixes:
                fixes.append(fix)
    if len(shown) > limit:
        parts.append(f"... and {len(shown) - limit} more node(s)")
    if around:
        parts.append(f"with {around} Quantize/DequantizeLinear node(s) around them")
    if not parts:
        errors = [ln for ln in log if ln.startswith("<E>")]
        parts.append("QNN gave no node: " + ("; ".join(errors[:3]) if errors else "see the compile log"))
    head = f"QNN HTP cannot run {len(rejected)} node(s) of {graph_file}" if rejected else graph_file
    text = f"{head}: " + "; ".join(parts)
    if fixes:
        text += " -- fix: " + "; ".join(fixes)
    return text
