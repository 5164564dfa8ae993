"""Stage 5 (ort-qnn), quantize: float model + calibration ranges -> QDQ model for one variant.

Uses onnxruntime.quantization's QNN config. The ranges come from the calibration_stats stage (one
calibration pass per float model, method and sample count), so this stage never runs the calibration
pass itself: a change that does not touch the ranges (weight bits, activation bits, overrides) costs
only the quantization. Without ranges (params["ranges"] absent) it calibrates from the raw files.
"""
from __future__ import annotations

from ..errors import BuildError
from .common import read_input_list

VERSION = 1


def run(params: dict) -> dict:
    from ..toolchains import ort_qnn

    v = params["variant"]
    samples = []
    if not params.get("ranges"):
        samples = read_input_list(params["input_list"], params["inputs"], v["calibration_samples"])
        if len(samples) < v["calibration_samples"]:
            raise BuildError(f"{params['input_list']}: {len(samples)} calibration samples, "
                             f"variant {params['name']} needs {v['calibration_samples']}")
    else:
        print(f"reusing calibration ranges {params['ranges']} (no calibration pass)", flush=True)
    try:
        ort_qnn.quantize(params["onnx"], params["outputs"]["onnx"], samples, activations=v["activations"],
                         weights=v["weights"], per_channel=v["per_channel"], method=v["calibration_method"],
                         overrides=v["overrides"], node_overrides=v.get("node_overrides"),
                         ranges=params.get("ranges"))
    except ValueError as e:  # e.g. an override naming a tensor the model does not have
        raise BuildError(f"{params['name']}: {e}") from e
    return {"calibration": "reused" if params.get("ranges") else "ran"}
