"""Stage 5 (ort-qnn), quantize: float model + calibration raw files -> QDQ model for one variant.

Uses onnxruntime.quantization's QNN config; the calibration files are the shared ones of stage 4.
"""
from __future__ import annotations

from ..errors import BuildError
from .common import read_input_list

VERSION = 1


def run(params: dict) -> dict:
    from ..toolchains import ort_qnn

    v = params["variant"]
    samples = read_input_list(params["input_list"], params["inputs"], v["calibration_samples"])
    if len(samples) < v["calibration_samples"]:
        raise BuildError(f"{params['input_list']}: {len(samples)} calibration samples, "
                         f"variant {params['name']} needs {v['calibration_samples']}")
    try:
        ort_qnn.quantize(params["onnx"], params["outputs"]["onnx"], samples, activations=v["activations"],
                         weights=v["weights"], per_channel=v["per_channel"], method=v["calibration_method"],
                         overrides=v["overrides"])
    except ValueError as e:  # e.g. an override naming a tensor the model does not have
        raise BuildError(f"{params['name']}: {e}") from e
    return {}
