"""Do the x86 HTP emulator's cycle counts predict phone latency? (issue 29 item 6)

For MobileNet-v2, ResNet-18 and ResNet-50 (randomly initialised: weights do not change latency; written out here in
plain torch, the layer shapes of torchvision's), fp16, per chip: compile with onnxruntime-qnn, run the context binary
on the emulator with QNN's detailed profiling and take the median "Accelerator (execute) time (cycles)" of 3 runs;
then fit one constant per chip (ms per cycle) against AI Hub's published qnn_dlc float latencies
(qualcomm/ai-hub-models v0.47.0, qai_hub_models/models/<name>/perf.yaml) and print each model's prediction error.

    PYTHONPATH=$PWD python3 bench/cycles_vs_aihub.py [--chips SM8750,SM8650] [--runs 3]
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
import tempfile
import time
from pathlib import Path

# AI Hub perf.yaml (v0.47.0), precision "float", runtime qnn_dlc, inference_time_milliseconds
AI_HUB_MS = {"SM8750": {"mobilenet_v2": 0.459, "resnet18": 0.711, "resnet50": 1.259},   # Samsung Galaxy S25
             "SM8650": {"mobilenet_v2": 0.605, "resnet18": 0.916, "resnet50": 1.598}}   # Samsung Galaxy S24
SOC = {"SM8750": 69, "SM8650": 57}
# AI Hub lists w8a16 (qnn_dlc) for MobileNet-v2 only
AI_HUB_W8A16_MS = {"SM8750": {"mobilenet_v2": 0.384}, "SM8650": {"mobilenet_v2": 0.573}}


def models():
    import torch
    from torch import nn

    def conv_bn(i, o, k, s, groups=1, act=nn.ReLU):
        layers = [nn.Conv2d(i, o, k, s, k // 2, groups=groups, bias=False), nn.BatchNorm2d(o)]
        return nn.Sequential(*layers, act()) if act else nn.Sequential(*layers)

    class Basic(nn.Module):
        def __init__(self, i, o, s):
            super().__init__()
            self.body = nn.Sequential(conv_bn(i, o, 3, s), conv_bn(o, o, 3, 1, act=None))
            self.skip = conv_bn(i, o, 1, s, act=None) if s != 1 or i != o else nn.Identity()

        def forward(self, x):
            return torch.relu(self.body(x) + self.skip(x))

    class Bottleneck(nn.Module):
        def __init__(self, i, mid, s):
            super().__init__()
            o = mid * 4
            self.body = nn.Sequential(conv_bn(i, mid, 1, 1), conv_bn(mid, mid, 3, s), conv_bn(mid, o, 1, 1, act=None))
            self.skip = conv_bn(i, o, 1, s, act=None) if s != 1 or i != o else nn.Identity()

        def forward(self, x):
            return torch.relu(self.body(x) + self.skip(x))

    def resnet(block, counts, widths, expansion):
        layers, i = [conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1)], 64
        for n, (count, width) in enumerate(zip(counts, widths)):
            for b in range(count):
                layers.append(block(i, width, 2 if b == 0 and n > 0 else 1))
                i = width * expansion
        return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(i, 1000))

    class Inverted(nn.Module):
        def __init__(self, i, o, s, t):
            super().__init__()
            h = i * t
            self.use_skip = s == 1 and i == o
            layers = ([conv_bn(i, h, 1, 1, act=nn.ReLU6)] if t != 1 else []) + [
                conv_bn(h, h, 3, s, groups=h, act=nn.ReLU6), conv_bn(h, o, 1, 1, act=None)]
            self.body = nn.Sequential(*layers)

        def forward(self, x):
            return x + self.body(x) if self.use_skip else self.body(x)

    def mobilenet_v2():
        layers, i = [conv_bn(3, 32, 3, 2, act=nn.ReLU6)], 32
        for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                           (6, 320, 1, 1)):
            for b in range(n):
                layers.append(Inverted(i, c, s if b == 0 else 1, t))
                i = c
        return nn.Sequential(*layers, conv_bn(i, 1280, 1, 1, act=nn.ReLU6), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                             nn.Linear(1280, 1000))

    return {"mobilenet_v2": mobilenet_v2(), "resnet18": resnet(Basic, (2, 2, 2, 2), (64, 128, 256, 512), 1),
            "resnet50": resnet(Bottleneck, (3, 4, 6, 3), (64, 128, 256, 512), 4)}


def _simplify(path: Path) -> None:
    """onnxsim, as the build's simplify stage: the exporter leaves the folded batch norms' biases as Constant nodes,
    whose int32 DequantizeLinear the HTP does not run once quantized."""
    import onnx
    import onnxsim
    model, ok = onnxsim.simplify(onnx.load(str(path)))
    assert ok, path
    onnx.save(model, str(path))


def cycles(ctx: Path, runs: int) -> float:
    import numpy as np

    from build_rules.toolchains import ort_qnn
    ort = ort_qnn._ort()
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    counted = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            profile = Path(tmp) / "profile.csv"
            options = ort_qnn._qnn_session_options(ort, {"backend_type": "htp", "profiling_level": "detailed",
                                                         "profiling_file_path": str(profile)})
            session = ort.InferenceSession(str(ctx), sess_options=options)
            session.run(None, {session.get_inputs()[0].name: x})
            del session
            rows = list(csv.DictReader(profile.open()))
        counted.append(next(float(r["Time"]) for r in rows
                            if r["Event Identifier"] == "Accelerator (execute) time (cycles)"))
    return statistics.median(counted)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chips", default="SM8750,SM8650")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--w8a16", action="store_true",
                        help="also MobileNet-v2 at w8a16 (onnxruntime's recipe, int8 per-channel weights, 4 random "
                             "calibration inputs), predicted with the chip's fp16 constant")
    args = parser.parse_args()
    import torch

    from build_rules.toolchains import ort_qnn
    chips = args.chips.split(",")
    counts = {}
    with tempfile.TemporaryDirectory(prefix="cycles-") as tmp:
        tmp = Path(tmp)
        for name, module in models().items():
            torch.manual_seed(0)
            onnx_path = tmp / f"{name}.onnx"
            torch.onnx.export(module.eval(), (torch.zeros(1, 3, 224, 224),), str(onnx_path), dynamo=False,
                              opset_version=17, input_names=["image"], output_names=["logits"])
            _simplify(onnx_path)
            for chip in chips:
                started = time.perf_counter()
                made = ort_qnn.compile_context_binary(onnx_path, tmp / chip, name, soc_model=SOC[chip], vtcm_mb=8,
                                                      fp16=True)
                counts[(name, chip)] = cycles(Path(made["ctx_model"]), args.runs)
                print(f"{name} {chip}: {counts[(name, chip)] / 1e6:.2f} M cycles "
                      f"({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
            if args.w8a16 and name in AI_HUB_W8A16_MS[chips[0]]:
                import numpy as np
                rng = np.random.default_rng(1)
                qdq = tmp / f"{name}.w8a16.onnx"
                ort_qnn.quantize(onnx_path, qdq, [{"image": rng.standard_normal((1, 3, 224, 224)).astype(np.float32)}
                                                  for _ in range(4)], activations="uint16", weights="int8",
                                 per_channel=True)
                for chip in chips:
                    made = ort_qnn.compile_context_binary(qdq, tmp / f"{chip}-w8a16", name, soc_model=SOC[chip],
                                                          vtcm_mb=8, fp16=False)
                    counts[(name + "@w8a16", chip)] = cycles(Path(made["ctx_model"]), args.runs)
                    print(f"{name} w8a16 {chip}: {counts[(name + '@w8a16', chip)] / 1e6:.2f} M cycles",
                          file=sys.stderr, flush=True)
    print("| chip | model | emulator cycles (M) | AI Hub qnn_dlc float (ms) | ms per M cycles | predicted (ms) | error |")
    print("|---|---|---|---|---|---|---|")
    for chip in chips:
        ratios = {m: AI_HUB_MS[chip][m] / (counts[(m, chip)] / 1e6) for m in AI_HUB_MS[chip]}
        constant = statistics.median(ratios.values())  # one constant per chip
        for m, ms in AI_HUB_MS[chip].items():
            predicted = constant * counts[(m, chip)] / 1e6
            print(f"| {chip} | {m} | {counts[(m, chip)] / 1e6:.2f} | {ms} | {ratios[m]:.4f} | {predicted:.3f} | "
                  f"{100 * (predicted / ms - 1):+.0f} % |")
        for m, ms in (AI_HUB_W8A16_MS[chip].items() if args.w8a16 else ()):
            n = counts[(m + "@w8a16", chip)] / 1e6
            print(f"| {chip} | {m} w8a16 (AI Hub qnn_dlc w8a16) | {n:.2f} | {ms} | {ms / n:.4f} | {constant * n:.3f} | "
                  f"{100 * (constant * n / ms - 1):+.0f} % |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
