"""Where every output lives under out/. One place, so tasks, stages and tests agree.

out/<model>/float/<graph>.onnx, .sim.onnx, .io.json, .verify.json, .evaluation.npz   (no SDK involved)
out/<model>/calibration/<graph>/input_list.txt + NNNN.<input>.raw               (shared by all variants)
out/<model>/<variant>/<graph>.qdq.onnx                                          (per variant, any chip)
out/<model>/<variant>/<chip>/<graph>.bin, <graph>_ctx.onnx, <graph>.check.json, manifest.json
Logs sit beside the outputs, one per stage: <graph>.<stage>.log.
"""
from __future__ import annotations

OUT = "out"
RESERVED_VARIANT_NAMES = ("float", "calibration")


def model_dir(model: str) -> str:
    return f"{OUT}/{model}"


def float_file(model: str, graph: str, suffix: str) -> str:
    return f"{OUT}/{model}/float/{graph}{suffix}"


def calibration_dir(model: str, graph: str) -> str:
    return f"{OUT}/{model}/calibration/{graph}"


def raw_name(index: int, input_name: str) -> str:
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in input_name)
    return f"{index:04d}.{safe}.raw"


def variant_file(model: str, variant: str, graph: str, suffix: str) -> str:
    return f"{OUT}/{model}/{variant}/{graph}{suffix}"


def chip_dir(model: str, variant: str, chip: str) -> str:
    return f"{OUT}/{model}/{variant}/{chip}"


def chip_file(model: str, variant: str, chip: str, name: str) -> str:
    return f"{OUT}/{model}/{variant}/{chip}/{name}"
