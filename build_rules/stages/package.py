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

from ..files import atomic_write_json
from ..hashing import file_digest

VERSION = 1

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
            **entry, "metrics": check["summary"], "gate": check.get("gate"),
            **({"worst_output": check["worst_output"]} if check.get("worst_output") else {}),
        }
    manifest = {
        "model": {**params["model"], "commit": model_commit(params["model_folder"])},
        "variant": params["variant"], "chip": params["chip"], "toolchain": params["toolchain"],
        "tools": params["tools"], "checkpoints": {p: file_digest(p) for p in params["checkpoints"]},
        "graphs": graphs, "runtime": params.get("runtime_note", ORT_QNN_RUNTIME_NOTE),
    }
    if params.get("evaluate"):
        manifest["evaluate"] = json.loads(Path(params["evaluate"]).read_text())
    atomic_write_json(params["outputs"]["manifest"], manifest)
    return {"bytes": sum(g["bytes"] for g in graphs.values())}
