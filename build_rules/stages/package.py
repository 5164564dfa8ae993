"""Stage 8, package: one manifest.json per (model, variant, chip) beside the context binaries.

It records what a device integrator needs to trust a binary: chip and arch, the SDK identity it
was compiled with (the device's QNN runtime must be the same or newer), checkpoint hashes,
quantization settings, measured metrics, tool versions and each binary's size and xxh3 digest.
Light work: runs inside doit, written atomically.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from ..plumbing.files import atomic_write_json
from ..build_state.hashing import file_digest


ORT_QNN_RUNTIME_NOTE = (
    "onnxruntime-qnn ships x86_64 QNN libraries only. On the device use QNN runtime libraries "
    "(libQnnHtp.so, libQnnHtpV<arch>Stub.so, libQnnSystem.so, libQnnHtpV<arch>Skel.so) from a QAIRT "
    "SDK at least as new as the build id above, and point ADSP_LIBRARY_PATH at the Skel's folder.")


def model_commit(folder: str) -> str | None:
    try:
        return subprocess.run(["git", "-C", folder, "describe", "--always", "--dirty"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def run(params: dict) -> dict:
    graphs = {}
    for graph, files in params["graphs"].items():
        check = json.loads(Path(files["check"]).read_text())
        if "parts" in files:  # a split graph: its parts' binaries in order, checked as a chain
            parts = [{"binary": Path(b).name, "ctx_model": Path(c).name, "bytes": Path(b).stat().st_size,
                      "xxh3_128": file_digest(b)} for b, c in zip(files["parts"], files["ctx_parts"])]
            entry = {"parts": parts, "bytes": sum(p["bytes"] for p in parts)}
        else:
            binary = Path(files["binary"])
            entry = {"binary": binary.name, "ctx_model": Path(files["ctx_model"]).name, "bytes": binary.stat().st_size,
                     "xxh3_128": file_digest(binary)}
        graphs[graph] = {
            **entry, "metrics": check["summary"], "gates": check.get("gates", []), "gated": check.get("gated", []),
            **({"worst_output": check["worst_output"]} if check.get("worst_output") else {}),
            **({"float_ops": check["float_ops"]} if check.get("float_ops") is not None else {}),
            **{k: check[k] for k in ("equal_to", "differs_from") if k in check},  # the check's equal-chip proof
        }
    warnings = not_smaller(params, graphs) + mostly_float(params, graphs)
    manifest = {
        "model": {**params["model"], "commit": model_commit(params["model_folder"])},
        "variant": params["variant"], "chip": params["chip"], "toolchain": params["toolchain"],
        "tools": params["tools"], "checkpoints": {p: file_digest(p) for p in params["checkpoints"]},
        "graphs": graphs, "runtime": params.get("runtime_note", ORT_QNN_RUNTIME_NOTE),
    }
    if params.get("evaluate"):
        manifest["evaluate"] = json.loads(Path(params["evaluate"]).read_text())
    if params.get("aimet"):  # quantizer = "aimet": per graph the QuantSim config, techniques, aimet-onnx version
        manifest["aimet"] = {g: json.loads(Path(path).read_text()) for g, path in params["aimet"].items()}
    if warnings:
        manifest["warnings"] = warnings
    atomic_write_json(params["outputs"]["manifest"], manifest)
    return {"bytes": sum(g["bytes"] for g in graphs.values()), **({"warnings": warnings} if warnings else {})}


def mostly_float(params: dict, graphs: dict) -> list[str]:
    """A quantized variant with more than a quarter of a graph's weights in float: one warning per such graph, naming
    the ops and the fix (toolchains/qnn_graph.mostly_float)."""
    from ..toolchains.qnn_graph import mostly_float as why
    where = f"package:{params['model']['name']}/{params['variant']['name']}@{params['chip']['name']}"
    return [f"{where}: {graph}: {why(entry.get('float_ops'))}" for graph, entry in graphs.items()
            if why(entry.get("float_ops"))]


def not_smaller(params: dict, graphs: dict) -> list[str]:
    """A quantized variant whose binary is not smaller than its fp16 sibling's on the same chip is not what its
    name says (an LSTM QNN runs in float, a Gather table kept at 16 bit): one warning per such graph, with what
    ran in float. Records the sibling's size in the graph's entry."""
    from ..toolchains.qnn_graph import describe
    sibling = params.get("fp16_sibling")
    if not sibling:
        return []
    found = []
    for graph, entry in graphs.items():
        binaries = sibling["binaries"][graph]  # a split graph: its parts' binaries (sizes summed, as entry["bytes"])
        fp16_bytes = sum(Path(b).stat().st_size for b in (binaries if isinstance(binaries, list) else [binaries]))
        entry["fp16_bytes"] = fp16_bytes
        if entry["bytes"] < fp16_bytes:
            continue
        why = describe(entry.get("float_ops")) or "no op ran in float: look for weights kept at 16 bit (docs/models.md)"
        what = f"{graph}.bin" if "binary" in entry else f"{graph}'s {len(entry['parts'])} parts"
        found.append(f"package:{params['model']['name']}/{params['variant']['name']}@{params['chip']['name']}: "
                     f"{what} ({entry['bytes'] / 1e6:.2f} MB) is not smaller than {sibling['variant']}'s "
                     f"({fp16_bytes / 1e6:.2f} MB): {why}")
    return found
