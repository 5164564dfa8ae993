"""Which weighted layers the HTP takes at int4 (block_quant.int4_refused rests on this): each layer alone, exported,
quantized with the build's onnxruntime recipe (uint16 activations) at int4 per channel, int4 per tensor and int8 per
channel, compiled for SM8750 with onnxruntime-qnn; prints OK or the first words of the failure.

  PYTHONPATH=. python bench/int4_convolutions.py [case ...]

Measured with onnxruntime-qnn 2.7.0 (QNN 2.51): a 2-D Conv / ConvTranspose fails at int4 per tensor, and per channel
with one output channel (per group); Conv3d fails to finalize at int4; 1-D convolutions, MatMul / Gemm and
per-channel 2-D convolutions compile. A grouped ConvTranspose (groups 2) fails in onnxruntime's quantizer at any bit
width; PReLU fails at int8 too (neither is an int4 matter).
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np


def cases():
    from torch import nn
    return {
        "conv3x3": (nn.Conv2d(8, 8, 3, padding=1), (1, 8, 16, 16)),
        "conv_1_out": (nn.Conv2d(8, 1, 3, padding=1), (1, 8, 16, 16)),
        "depthwise": (nn.Conv2d(8, 8, 3, padding=1, groups=8), (1, 8, 16, 16)),
        "grouped": (nn.Conv2d(8, 8, 3, padding=1, groups=2), (1, 8, 16, 16)),
        "conv_transpose": (nn.ConvTranspose2d(8, 8, 2, stride=2), (1, 8, 16, 16)),
        "conv_transpose_1_out": (nn.ConvTranspose2d(8, 1, 2, stride=2), (1, 8, 16, 16)),
        "conv_transpose_depthwise": (nn.ConvTranspose2d(8, 8, 2, stride=2, groups=8), (1, 8, 16, 16)),
        "conv1d": (nn.Conv1d(8, 8, 3, padding=1), (1, 8, 16)),
        "conv1d_1_out": (nn.Conv1d(8, 1, 3, padding=1), (1, 8, 16)),
        "conv_transpose1d": (nn.ConvTranspose1d(8, 8, 2, stride=2), (1, 8, 16)),
        "conv3d": (nn.Conv3d(4, 4, 3, padding=1), (1, 4, 4, 8, 8)),
        "linear": (nn.Linear(16, 8), (1, 4, 16)),
    }


def attempt(module, shape, weights: str, per_channel: bool) -> str:
    with tempfile.TemporaryDirectory(prefix="int4-") as tmp:
        return _attempt(Path(tmp), module, shape, weights, per_channel)


def _attempt(folder: Path, module, shape, weights: str, per_channel: bool) -> str:
    import re

    import torch

    from build_rules.toolchains import ort_qnn
    torch.onnx.export(module.eval(), (torch.randn(shape),), folder / "m.onnx", input_names=["x"], output_names=["y"],
                      dynamo=False, opset_version=17)
    calibration = [{"x": np.random.default_rng(i).standard_normal(shape).astype(np.float32)} for i in range(4)]
    try:
        # weight_overrides naming the layer keep quantize's own int8 choice (block_quant.int4_refused) out of it
        node = next(n.name for n in __import__("onnx").load(str(folder / "m.onnx")).graph.node
                    if n.op_type in ("Conv", "ConvTranspose", "MatMul", "Gemm"))
        ort_qnn.quantize(folder / "m.onnx", folder / "q.onnx", calibration, activations="uint16", weights=weights,
                         per_channel=per_channel, weight_overrides={node: weights})
        ort_qnn.compile_context_binary(folder / "q.onnx", folder / "out", "g", soc_model=69, vtcm_mb=8, fp16=False)
        return "OK"
    except Exception as e:  # onnxruntime's and QNN's own exception types
        return "FAIL " + re.sub(r"^.*?\[ONNXRuntimeError\] : \d+ : \w+ : ", "", " ".join(str(e).split()))[:100]


def main(names: list[str]) -> None:
    import torch
    torch.manual_seed(0)
    table = cases()
    for name in names or list(table):
        module, shape = table[name]
        for weights, per_channel in (("int4", True), ("int4", False), ("int8", True)):
            print(f"{name:26} {weights} {'per channel' if per_channel else 'per tensor '}: "
                  f"{attempt(module, shape, weights, per_channel)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
