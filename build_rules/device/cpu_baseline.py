"""The CPU baseline on the phone (seed guide step 0): the float ONNX graph (out/<model>/float/<graph>.sim.onnx) on the
phone's CPU with ONNX Runtime's CPU execution provider, through ort-cpu-run and the glibc loader pushed beside it
(cpu_runtime.py), so that profile shows NPU against CPU for every variant and power has a CPU path.

Pushed under REMOTE_ROOT: cpu/ (the runtime folder), float/<model>/<graph>.onnx, and the evaluation inputs in the
ONNX layout and the declared dtypes in inputs/<model>/<graph>/cpu/. The command (one adb shell):
  cd REMOTE_ROOT && cpu/ld-linux-aarch64.so.1 --library-path cpu cpu/ort-cpu-run --model ... --input_list ...
    --output_dir ... --input NAME=SHAPE:DTYPE ... --output NAME=SHAPE ... --num_inferences N --keep_num_outputs 1
Its timings.csv (load, one run per inference, microseconds) gives load, first, median and p90 as profile reports
them for the NPU.
"""
from __future__ import annotations

import shlex
import statistics
from pathlib import Path

from .adb import run_seconds
from .cpu_runtime import LOADER, RUNNER, files as runtime_files
from .devices import REMOTE_ROOT
from .errors import DeviceError
from .push import push_missing
from .target import safe

REMOTE_CPU = f"{REMOTE_ROOT}/cpu"
DTYPES = {"float32": "float32", "int32": "int32", "int64": "int64"}


def prepare(phone, params: dict, graph: str, files: dict, folder: Path, runtime: Path) -> dict:
    """Push the runtime, the float graph and its inputs; returns what command() needs."""
    import numpy as np

    from ..measuring.samples import load_evaluation
    inputs, reference = load_evaluation(files["evaluation"])
    specs = files["target"]["inputs"]
    remote_inputs = f"{REMOTE_ROOT}/inputs/{params['model']}/{graph}/cpu"
    folder.mkdir(parents=True, exist_ok=True)
    pushing = {f"{REMOTE_CPU}/{name}": path for name, path in runtime_files(runtime, params["name"]).items()}
    model = f"{REMOTE_ROOT}/float/{params['model']}/{graph}.onnx"
    pushing[model] = files["float_model"]
    lines = []
    for i, sample in enumerate(inputs):
        entries = []
        for name, spec in specs.items():
            dtype = DTYPES.get(spec["dtype"])
            if dtype is None:
                raise DeviceError(f"{params['name']}: input '{name}' of {graph} is {spec['dtype']}: ort-cpu-run "
                                  f"feeds {', '.join(DTYPES)}")
            path = folder / f"{i:04d}.{safe(name)}.raw"
            np.ascontiguousarray(np.asarray(sample[name], dtype=dtype)).tofile(path)
            pushing[f"{remote_inputs}/{path.name}"] = path
            entries.append(f"{name}:={remote_inputs}/{path.name}")
        lines.append(" ".join(entries))
    (folder / "input_list.txt").write_text("\n".join(lines) + "\n")
    pushing[f"{remote_inputs}/input_list.txt"] = folder / "input_list.txt"
    push_missing(phone.adb, pushing)
    tensors = [f"--input {name}={_dims(spec['shape'])}:{DTYPES[spec['dtype']]}" for name, spec in specs.items()]
    tensors += [f"--output {name}={_dims(reference[0][name].shape)}" for name in files["target"]["outputs"]]
    return {"model": model, "input_list": f"{remote_inputs}/input_list.txt", "tensors": tensors,
            "samples": len(inputs)}


def command(prepared: dict, output_dir: str, *extra: str) -> str:
    args = ["--model", prepared["model"], "--input_list", prepared["input_list"], "--output_dir", output_dir]
    return (f"rm -rf {shlex.quote(output_dir)} && cd {REMOTE_ROOT} && {REMOTE_CPU}/{LOADER} --library-path "
            f"{REMOTE_CPU} {REMOTE_CPU}/{RUNNER} " + " ".join(shlex.quote(a) for a in args) + " "
            + " ".join(prepared["tensors"]) + (" " + " ".join(shlex.quote(a) for a in extra) if extra else ""))


def profile(phone, params: dict, graph: str, files: dict, folder: Path, runtime: Path) -> dict:
    """load, first, median and p90 (ms) of the float graph on the phone's CPU."""
    prepared = prepare(phone, params, graph, files, folder / "inputs", runtime)
    output_dir = f"{REMOTE_ROOT}/cpu-profile/{params['model']}/{graph}"
    said = phone.adb.shell(command(prepared, output_dir, "--num_inferences", str(params["warmup"] + params["runs"]),
                                   "--keep_num_outputs", "1"), timeout=run_seconds())
    phone.adb.pull(f"{output_dir}/timings.csv", folder / "timings.csv")
    rows = [line.split(",") for line in (folder / "timings.csv").read_text().splitlines()[1:] if "," in line]
    load = [float(v) / 1000 for event, v in rows if event == "load"]
    runs = [float(v) / 1000 for event, v in rows if event == "run"]
    if not load or not runs:
        raise DeviceError(f"{params['name']}: ort-cpu-run's timings.csv for {graph} has no load/run rows")
    steady = runs[params["warmup"]:] or runs
    ordered = sorted(steady)
    version = said.strip().rsplit("ONNX Runtime ", 1)[-1].rstrip(")") if "ONNX Runtime " in said else None
    return {"measured": True, "runner": f"ort-cpu-run, ONNX Runtime {version} CPU execution provider, float graph",
            "load_ms": load[0], "first_ms": runs[0], "median_ms": statistics.median(steady),
            "p90_ms": ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))],
            "runs": len(steady), "warmup": len(runs) - len(steady), "samples": prepared["samples"]}


def _dims(shape) -> str:
    return "x".join(str(int(d)) for d in shape)

