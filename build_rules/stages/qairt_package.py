"""Stage 8 (qairt), package: per model, variant and chip, the context binaries with the device runtime libraries
of the SDK that made them (runtime/) and manifest.json.

The manifest records the SDK version, build id and HTP backend build id (a phone must run QNN libraries of that
same SDK), the flow, the chip, checkpoint hashes, quantization settings, converter warnings, check metrics (or
"not run"), each binary's I/O contract (graphs.<graph>.io: names, shapes, QNN data types, scale/offset, layout, read
from <graph>_net.json or the DLC flow's <graph>.info.json) and how to load the binaries. runtime/ holds libQnnHtp,
libQnnSystem and this chip's arch's Stub and Skel only: no libQnnHtpPrepare.so (~85 MB), which prepares graphs on
the device; a context binary is prepared already (docs/qairt.md). Light work: runs inside doit; libraries are
hard-linked from the SDK where possible.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from ..errors import BuildError
from ..plumbing.files import atomic_write_json, remove_quietly
from ..build_state.hashing import file_digest
from .package import model_commit


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
    from ..toolchains.qairt_outputs import ContractError, read_io_contract

    missing = [path for path in params["runtime_libs"].values() if not Path(path).is_file()]
    if missing:
        raise BuildError(f"package: the QAIRT SDK at {params['sdk']} "
                         f"has no {', '.join(missing)} (device runtime libraries for {params['chip']['dsp_arch']})")
    graphs = {}
    for graph, files in params["graphs"].items():
        binary = Path(files["binary"])
        check = json.loads(Path(files["check"]).read_text())
        warnings = [w for stage in ("convert", "quantize") if stage in files
                    for w in json.loads(Path(files[stage]).read_text()).get("quantization_warnings", [])]
        try:
            io = read_io_contract(files["io"])
        except ContractError as e:
            raise BuildError(f"package: {e}") from None
        graphs[graph] = {
            "binary": binary.name, "bytes": binary.stat().st_size, "xxh3_128": file_digest(binary),
            "metrics": check.get("summary", {}), "check": check.get("status", "ran"),
            "check_note": check.get("reason"), "gates": check.get("gates", []),
            "gated": check.get("gated", []), "io": io,
            "quantization_warnings": warnings,
            **{k: check[k] for k in ("equal_to", "differs_from") if k in check},  # the check's equal-chip proof
            "model_libs": {target: os.path.relpath(path, binary.parent)
                           for target, path in files.get("model_libs", {}).items()},
        }
    runtime_targets = params["outputs"]["runtime"]
    for name, source in params["runtime_libs"].items():
        _install(Path(source), Path(runtime_targets[name]))
    runtime_dir = Path(params["outputs"]["manifest"]).parent / "runtime"
    toolchain = params["toolchain"]
    manifest = {
        "model": {**params["model"], "commit": model_commit(params["model_folder"])},
        "variant": params["variant"], "chip": params["chip"], "toolchain": toolchain,
        "sdk_version": toolchain["sdk_version"], "sdk_build_id": toolchain.get("sdk_build_id"),
        "qairt_flow": toolchain["flow"], "tools": params["tools"],
        "checkpoints": {p: file_digest(p) for p in params["checkpoints"]}, "graphs": graphs,
        "runtime_libraries": {name: f"runtime/{name}" for name in params["runtime_libs"]},
        "runtime": runtime_note(params["chip"]["dsp_arch"], runtime_dir.name),
    }
    if params.get("aimet"):  # quantizer = "aimet": per graph the QuantSim config, techniques, aimet-onnx version
        manifest["aimet"] = {g: json.loads(Path(path).read_text()) for g, path in params["aimet"].items()}
    atomic_write_json(params["outputs"]["manifest"], manifest)
    return {"bytes": sum(g["bytes"] for g in graphs.values())}
