"""Stage 8 (qairt), package: per model, variant and chip, the context binaries with the device runtime libraries
of the SDK that made them (runtime/) and manifest.json.

The manifest records the SDK version and HTP build id (a phone must run QNN libraries of that same SDK), the
chip, checkpoint hashes, quantization settings, converter warnings, check metrics (or "not run") and how to
load the binaries. Light work: runs inside doit; libraries are hard-linked from the SDK where possible.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from ..errors import BuildError
from ..files import atomic_write_json, remove_quietly
from ..hashing import file_digest
from .package import model_commit

VERSION = 1


def runtime_note(dsp_arch: str, runtime_dir: str) -> str:
    arch = dsp_arch.upper()
    return (f"Load <graph>.bin with QNN runtime libraries of this same SDK ({runtime_dir}/): libQnnHtp.so, "
            f"libQnnHtp{arch}Stub.so and libQnnSystem.so next to your app's native libraries, "
            f"libQnnHtp{arch}Skel.so where the DSP can load it: set ADSP_LIBRARY_PATH to its folder, e.g. "
            f"export ADSP_LIBRARY_PATH=\"/data/local/tmp/model;$ADSP_LIBRARY_PATH\" (the separator is ';'), or "
            "call sherpa-onnx's prependAdspLibraryPath(dir). The binary runs only on a "
            f"{dsp_arch} Hexagon NPU.")


def _install(source: Path, target: Path) -> None:
    """Hard link (same file system) or copy, via a temp name: the target appears complete or not at all."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    remove_quietly(tmp)
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copy2(source, tmp)
    os.replace(tmp, target)


def run(params: dict) -> dict:
    missing = [path for path in params["runtime_libs"].values() if not Path(path).is_file()]
    if missing:
        raise BuildError(f"package: the QAIRT SDK at {params['sdk']} "
                         f"has no {', '.join(missing)} (device runtime libraries for {params['chip']['dsp_arch']})")
    runtime_targets = params["outputs"]["runtime"]
    for name, source in params["runtime_libs"].items():
        _install(Path(source), Path(runtime_targets[name]))
    graphs = {}
    for graph, files in params["graphs"].items():
        binary = Path(files["binary"])
        check = json.loads(Path(files["check"]).read_text())
        convert = json.loads(Path(files["convert"]).read_text())
        graphs[graph] = {
            "binary": binary.name, "bytes": binary.stat().st_size, "xxh3_128": file_digest(binary),
            "metrics": check.get("summary", {}), "check": check.get("status", "ran"),
            "check_note": check.get("reason"), "gate": check.get("gate"),
            "quantization_warnings": convert.get("quantization_warnings", []),
            "model_libs": {target: os.path.relpath(path, binary.parent)
                           for target, path in files["model_libs"].items()},
        }
    runtime_dir = Path(params["outputs"]["manifest"]).parent / "runtime"
    manifest = {
        "model": {**params["model"], "commit": model_commit(params["model_folder"])},
        "variant": params["variant"], "chip": params["chip"], "toolchain": params["toolchain"],
        "sdk_version": params["toolchain"]["sdk_version"], "tools": params["tools"],
        "checkpoints": {p: file_digest(p) for p in params["checkpoints"]}, "graphs": graphs,
        "runtime_libraries": {name: f"runtime/{name}" for name in params["runtime_libs"]},
        "runtime": runtime_note(params["chip"]["dsp_arch"], runtime_dir.name),
    }
    atomic_write_json(params["outputs"]["manifest"], manifest)
    return {"bytes": sum(g["bytes"] for g in graphs.values())}
