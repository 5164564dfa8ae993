"""Stage 4b (ort-qnn), calibration_stats: the costly calibration pass, once per float model, method and sample count.

Runs the float model (as quantize prepares it) over the shared calibration raw files and writes every
activation tensor's range (onnxruntime.quantization's TensorsData JSON). Every variant with that method
and sample count quantizes from these ranges without calibrating again: changing weight bits, per-channel,
activation bits or an override re-runs quantize (seconds), never this stage. The ranges do not depend on
the activation type (the QDQ models are byte-identical to calibrating inside quantize; see ort_qnn.calibration_ranges).
"""
from __future__ import annotations

from ..errors import BuildError
from ..measuring.samples import read_input_list


def run(params: dict) -> dict:
    from ..toolchains import ort_qnn

    samples = read_input_list(params["input_list"], params["inputs"], params["samples"])
    if len(samples) < params["samples"]:
        raise BuildError(f"{params['input_list']}: {len(samples)} calibration samples, "
                         f"{params['name']} needs {params['samples']}")
    print(f"calibrating {params['onnx']} with {len(samples)} samples ({params['method']})", flush=True)
    return ort_qnn.calibration_ranges(params["onnx"], params["outputs"]["ranges"], samples, method=params["method"])
