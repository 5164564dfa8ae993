"""profile:<model>/<variant>@<device>: per graph, qnn-net-run on the phone's NPU with QNN's profiling on
(`--profiling_level basic`, `--perf_profile burst` by default), `--num_inferences` warm-up + N runs over the
evaluation inputs; the profile log (<output_dir>/qnn-profiling-data_0.log) is pulled and read back on the host with
the SDK's qnn-profile-viewer (`--input_log LOG --output profile.csv`). From the CSV's per-event rows (timings()):
context load, first inference, steady-state median and p90 after the warm-up, the accelerator's share, and at
`detailed` its cycles. For a model whose evaluate hook runs over audio, the real-time factor and first-output
latency from those medians (realtime.py).

CPU baseline (seed step 0): the float graph with ONNX Runtime's CPU execution provider on the phone's CPU
(cpu_baseline.py) when BUILD_RULES_CPU_RUNTIME names a CPU runtime folder; without one the result says that it was
not measured and how to measure it, rather than a number that was not measured.
"""
from __future__ import annotations

import csv
import statistics
import subprocess
import tempfile
from pathlib import Path

from ..errors import BuildError
from ..files import atomic_write_json, remove_quietly
from .errors import DeviceError
from .realtime import read_evaluation, realtime
from .session import open_phone, runtime_identity

PERF_PROFILES = ("low_balanced", "balanced", "default", "high_performance", "sustained_high_performance", "burst",
                 "low_power_saver", "power_saver", "high_power_saver", "extreme_power_saver", "system_settings")
PROFILING_LEVELS = ("basic", "detailed")


def run(params: dict):
    from doit.exceptions import TaskFailed
    try:
        profile(params)
    except (DeviceError, BuildError) as e:
        return TaskFailed(str(e) if str(e).startswith(params["name"]) else f"{params['name']}: {e}")
    return True


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return [{k.strip(): (v or "").strip() for k, v in row.items()} for row in csv.DictReader(f)]


def timings(rows: list[dict], warmup: int) -> dict:
    """Milliseconds from qnn-profile-viewer's CSV rows (Message, Time, Unit of Measurement, Timing Source, Event
    Identifier): the HTP backend's "QNN (load binary) time" (context load) and one "QNN (execute) time" per
    inference; "Accelerator (execute) time" per run, and its cycles at `detailed`."""
    def ms(row):
        scale = {"US": 1e-3, "MS": 1.0, "NS": 1e-6}.get(row["Unit of Measurement"].upper())
        return None if scale is None else float(row["Time"]) * scale

    def event(name):
        return [r for r in rows if r.get("Event Identifier") == name]

    load = [ms(r) for r in event("QNN (load binary) time")]
    runs = [ms(r) for r in event("QNN (execute) time")]
    accelerator = [ms(r) for r in event("Accelerator (execute) time")]
    cycles = [float(r["Time"]) for r in event("Accelerator (execute) time (cycles)")]
    if not load or not runs:
        raise DeviceError("qnn-profile-viewer's CSV has no 'QNN (load binary) time' / 'QNN (execute) time' rows "
                          "(profiling off on the phone?)")
    steady = runs[warmup:] or runs
    ordered = sorted(steady)
    per_op = {}  # at `detailed`: each op's cycles per run ("<op>:OpId_N (cycles)" rows of Message NODE)
    for row in rows:
        if row.get("Message") == "NODE" and row["Unit of Measurement"].upper() == "CYCLES":
            per_op.setdefault(row["Event Identifier"].removesuffix(" (cycles)"), []).append(float(row["Time"]))
    total = statistics.median(cycles[warmup:] or cycles) if cycles else None
    ops = sorted(((statistics.median(v[warmup:] or v), op) for op, v in per_op.items()), reverse=True)
    return {"top_ops": [{"op": op, "cycles": c, "share": c / total if total else None} for c, op in ops[:10]],
            "load_ms": load[0], "first_ms": runs[0], "median_ms": statistics.median(steady),
            "p90_ms": ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))],
            "runs": len(steady), "warmup": len(runs) - len(steady),
            "accelerator_median_ms": statistics.median(accelerator[warmup:] or accelerator) if accelerator else None,
            "accelerator_cycles_median": statistics.median(cycles[warmup:] or cycles) if cycles else None}


def _read_profile(where: str, viewer: Path, pulled: Path, warmup: int) -> dict:
    """The profile log qnn-net-run left in its output folder, read back on the host with qnn-profile-viewer."""
    log = pulled / "qnn-profiling-data_0.log"
    if not log.is_file():
        raise DeviceError(f"{where}: qnn-net-run on the phone wrote no qnn-profiling-data_0.log (profiling off?)")
    table = pulled / "profile.csv"
    done = subprocess.run([str(viewer), "--input_log", str(log), "--output", str(table)], capture_output=True,
                          text=True)
    if done.returncode != 0 or not table.is_file():
        raise DeviceError(f"{where}: qnn-profile-viewer failed on {log} (exit {done.returncode}): "
                          f"{(done.stderr or done.stdout).strip()[-600:]}")
    return {**timings(read_csv(table), warmup), "viewer_summary": done.stdout.strip().splitlines()[-12:]}


def summed(parts: dict) -> dict:
    """A split graph's latencies: its parts' in sequence. Each part runs in its own qnn-net-run, so the sum of the
    medians stands for the median of the sums (and the p90s' sum is an upper bound of the chain's p90)."""
    def total(key):
        values = [p.get(key) for p in parts.values()]
        return None if any(v is None for v in values) else sum(values)
    first = next(iter(parts.values()))
    return {key: total(key) for key in ("load_ms", "first_ms", "median_ms", "p90_ms", "accelerator_median_ms",
                                        "accelerator_cycles_median")} | {
        "runs": min(p["runs"] for p in parts.values()), "warmup": first["warmup"], "samples": first["samples"],
        "top_ops": [], "sum_of_parts": True}


def profile(params: dict) -> dict:
    from ..samples import load_evaluation
    from . import cpu_baseline, cpu_runtime, runtime
    from .on_phone import run_graph
    from .target import parts as read_parts
    if params["perf_profile"] not in PERF_PROFILES:
        raise BuildError(f"{params['name']}: perf profile {params['perf_profile']!r} is not one of "
                         f"{', '.join(PERF_PROFILES)} (BUILD_RULES_PERF_PROFILE)")
    if params["profiling_level"] not in PROFILING_LEVELS:
        raise BuildError(f"{params['name']}: profiling level {params['profiling_level']!r}: basic or detailed")
    result_path = Path(params["outputs"]["result"])
    cpu_root = cpu_runtime.folder()
    if cpu_root is not None:
        cpu_runtime.files(cpu_root, params["name"])  # a half-made folder fails before the phone is touched
    phone = open_phone(params)
    viewer = runtime.profile_viewer(phone.runtime_root, params["name"])
    remove_quietly(result_path)
    graphs = {}
    with tempfile.TemporaryDirectory(prefix="build-rules-profile-") as tmp:
        for graph, files in params["graphs"].items():
            parts = read_parts(params["name"], files["target"])
            inputs, _ = load_evaluation(files["evaluation"])
            # every inference of the input list at least once: a later part reads each sample's crossing tensors
            count = max(params["warmup"] + params["runs"], len(inputs)) if len(parts) > 1 else \
                params["warmup"] + params["runs"]
            _, runs = run_graph(phone, params, graph, parts, inputs, Path(tmp) / graph, "profile",
                                extra=("--perf_profile", params["perf_profile"], "--profiling_level",
                                       params["profiling_level"], "--num_inferences", str(count)),
                                final_outputs=False)
            timed = {run.part.name: {**_read_profile(params["name"], viewer, run.pulled, params["warmup"]),
                                     "samples": len(inputs)} for run in runs}
            graphs[graph] = timed[graph] if len(parts) == 1 else {**summed(timed), "parts": timed}
            pushed = runs[-1].pushed
            graphs[graph]["cpu"] = {"measured": False, "reason": cpu_runtime.NOT_SET} if cpu_root is None else \
                cpu_baseline.profile(phone, params, graph, files, Path(tmp) / graph / "cpu", cpu_root)
    record = {"device": params["device"]["name"], "phone_model": phone.product, "fingerprint": phone.fingerprint,
              "chip": params["chip"]["name"], "variant": params["variant"], "perf_profile": params["perf_profile"],
              "profiling_level": params["profiling_level"], "runtime": runtime_identity(phone, pushed),
              "graphs": graphs}
    audio = realtime(read_evaluation(params.get("float_evaluation")), {g: t["median_ms"] for g, t in graphs.items()})
    if audio is not None:
        record["realtime"] = audio
    atomic_write_json(result_path, record)
    for graph, t in graphs.items():
        for part, p in (t.get("parts") or {}).items():
            print(f"{params['name']} {part}: load {p['load_ms']:.2f} ms, median {p['median_ms']:.3f} ms", flush=True)
        print(f"{params['name']} {graph}: load {t['load_ms']:.2f} ms, first {t['first_ms']:.2f} ms, median "
              f"{t['median_ms']:.3f} ms, p90 {t['p90_ms']:.3f} ms over {t['runs']} runs ({params['perf_profile']})"
              + (f"; CPU median {t['cpu']['median_ms']:.3f} ms" if t["cpu"].get("measured") else ""), flush=True)
    if audio and audio.get("measured"):
        print(f"{params['name']}: real-time factor {audio['rtf']:.4g} ({audio['processing_ms']:.1f} ms over "
              f"{audio['audio_seconds']:.2f} s of audio), first output {audio['first_output_ms']:.2f} ms", flush=True)
    elif audio:
        print(f"{params['name']}: no real-time factor: {audio['reason']}", flush=True)
    return record

