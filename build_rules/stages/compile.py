"""Stage 6 (ort-qnn), compile: one model -> one chip's QNN HTP context binary (+ EPContext ONNX).

Compiled from the model's bytes with a numeric soc_model, so the output does not depend on paths
and is byte-for-byte reproducible. Any op QNN HTP cannot run fails the build, naming op and node.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import BuildError
from ..files import atomic_write_json

VERSION = 1


def run(params: dict) -> dict:
    from ..toolchains import ort_qnn

    chip = params["chip"]
    out_dir = Path(params["outputs"]["binary"]).parent
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        result = ort_qnn.compile_context_binary(
            Path(params["onnx"]), out_dir, params["graph"], soc_model=chip["soc_id"], vtcm_mb=chip["vtcm_mb"],
            fp16=params["fp16"])
    except ort_qnn.UnsupportedOpsError as e:
        raise BuildError(f"{params['name']}: {e}") from e
    target = result["target"]
    if target.get("soc_type") != chip["name"] or str(target.get("arch")) != str(chip["dsp_arch"][1:]):
        raise BuildError(f"{params['name']}: the binary says soc_type={target.get('soc_type')} "
                         f"arch={target.get('arch')}, expected {chip['name']} {chip['dsp_arch']}")
    values = {"seconds": round(result["seconds"], 3), "bytes": Path(result["binary"]).stat().st_size,
              "target": target}
    if "report" in params["outputs"]:  # what `doit report` reads: size and compile time of this binary
        atomic_write_json(params["outputs"]["report"], {**values, "ops": result["ops"], "chip": chip["name"]})
    return values
