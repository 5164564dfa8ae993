"""profile:<model>/<variant>@<device>: per graph, qnn-net-run on the phone's NPU with QNN's profiling on
(`--profiling_level basic` by default), `--num_inferences` warm-up + N runs over the evaluation inputs, with the
inputs and outputs an app hands the binary: `--use_native_input_files --use_native_output_files`, raw files in the
binary's own types (ort-qnn contracts; a qairt binary, whose contract has no encodings here, runs float32 I/O, and the
result says which). The HTP performance profile (burst by default) goes by the runtime's version (perf_config.py):
the backend extension config (`--config_file`) or `--perf_profile`. qnn-net-run runs under toybox's
`/system/bin/time -v`, whose "Max RSS (KiB)" is the process's peak memory. The profile log
(<output_dir>/qnn-profiling-data_0.log) is pulled, read back on the host with the SDK's qnn-profile-viewer
(`--input_log LOG --output profile.csv`) and kept beside the result with its CSV (profile.<device>/), so the viewer
can open it again. From the CSV's per-event rows (timings()): context load (cold: the first qnn-net-run after the
push; warm: a second one-inference run), first inference, steady-state median, p90, min and max after the warm-up,
the accelerator's share, and at `detailed` its cycles per op. The thermal state (thermal.py) is read before and
after every run, and a run whose p90 is far above its median, or that ended throttled, is flagged.
BUILD_RULES_PROFILE_COOLDOWN waits that many seconds between runs (graphs and the CPU baseline) to let the phone cool.
For a model whose evaluate hook runs over audio, the real-time factor and first-output latency from those medians
(realtime.py).

CPU baseline (seed step 0): the float graph with ONNX Runtime's CPU execution provider on the phone's CPU
(cpu_baseline.py) when BUILD_RULES_CPU_RUNTIME names a CPU runtime folder; without one the result says that it was
not measured and how to measure it, rather than a number that was not measured.
"""
from __future__ import annotations

import contextlib
import csv
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from ..errors import BuildError
from ..plumbing.files import atomic_write_json
from . import thermal
from .errors import DeviceError
from .realtime import read_evaluation, realtime
from .session import REMOTE_RUNTIME, net_run, open_phone, runtime_identity

PERF_PROFILES = ("low_balanced", "balanced", "default", "high_performance", "sustained_high_performance", "burst",
                 "low_power_saver", "power_saver", "high_power_saver", "extreme_power_saver", "system_settings")
PROFILING_LEVELS = ("basic", "detailed")
COOLDOWN_ENV = "BUILD_RULES_PROFILE_COOLDOWN"
SPREAD_ENV = "BUILD_RULES_PROFILE_SPREAD"
PEAK_MEMORY = "/system/bin/time -v"  # toybox time (the shell's own `time` keyword takes no -v): "Max RSS (KiB): N"
_sleep = time.sleep  # (tests shorten the cool-down here)


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
    accelerator_ms = statistics.median(accelerator[warmup:] or accelerator) if accelerator else None
    # per layer (AI Hub's per-layer times): each op's cycles and its share of the accelerator's time, as microseconds
    layers = [{"op": op, "cycles": c, "share": c / total if total else None,
               "us": 1000 * accelerator_ms * c / total if total and accelerator_ms else None} for c, op in ops]
    return {"top_ops": layers[:10], "layers": layers,
            "load_ms": load[0], "first_ms": runs[0], "median_ms": statistics.median(steady),
            "p90_ms": ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))],
            "min_ms": ordered[0], "max_ms": ordered[-1],
            "throughput_per_s": 1000 / statistics.median(steady) if statistics.median(steady) else None,
            "runs": len(steady), "warmup": len(runs) - len(steady),
            "accelerator_median_ms": accelerator_ms,
            "accelerator_cycles_median": statistics.median(cycles[warmup:] or cycles) if cycles else None}


def _read_profile(where: str, viewer: Path, pulled: Path, warmup: int, keep: Path | None = None,
                  named: Path | None = None) -> dict:
    """The profile log qnn-net-run left in its output folder, read back on the host with qnn-profile-viewer; `keep`:
    where the log and its CSV are written (<keep>.qnn-profiling-data_0.log, <keep>.profile.csv); `named`: where the
    record says they are (the folder they move to once the run succeeded; default `keep`)."""
    log = pulled / "qnn-profiling-data_0.log"
    if not log.is_file():
        raise DeviceError(f"{where}: qnn-net-run on the phone wrote no qnn-profiling-data_0.log (profiling off?)")
    table = pulled / "profile.csv"
    done = subprocess.run([str(viewer), "--input_log", str(log), "--output", str(table)], capture_output=True,
                          text=True)
    if done.returncode != 0 or not table.is_file():
        raise DeviceError(f"{where}: qnn-profile-viewer failed on {log} (exit {done.returncode}): "
                          f"{(done.stderr or done.stdout).strip()[-600:]}")
    kept = {}
    if keep is not None:
        keep.parent.mkdir(parents=True, exist_ok=True)
        for source, suffix in ((log, ".qnn-profiling-data_0.log"), (table, ".profile.csv")):
            shutil.copyfile(source, f"{keep}{suffix}")
        named = named or keep
        kept = {"log": f"{named}.qnn-profiling-data_0.log", "csv": f"{named}.profile.csv"}
    return {**timings(read_csv(table), warmup), "viewer_summary": done.stdout.strip().splitlines()[-12:], **kept}


def memory_wrapper(phone) -> tuple[str, str | None]:
    """(the wrapper for qnn-net-run, why there is none): toybox's time, if this phone's has -v and its Max RSS line."""
    code, said = phone.adb.shell_code(f"{PEAK_MEMORY} echo")
    if code == 0 and peak_memory_kib(said) is not None:
        return PEAK_MEMORY, None
    return "", f"no peak memory: `{PEAK_MEMORY} echo` gave exit {code}: {said.strip()[:160]}"


def peak_memory_kib(said: str) -> int | None:
    """toybox `time -v`'s "Max RSS (KiB): N" (the qnn-net-run process's peak resident memory)."""
    found = re.search(r"Max RSS \(KiB\):\s*(\d+)", said or "")
    return int(found.group(1)) if found else None


IO_NATIVE = "native: the binary's own input/output types (--use_native_input_files --use_native_output_files)"
IO_FLOAT = "float32: quantized and dequantized by qnn-net-run on the phone's CPU (no encodings in the contract)"


def _warm_load(phone, params: dict, viewer: Path, run, perf_flags: tuple, native: bool) -> float:
    """The context's load time on a second qnn-net-run of the same part (one inference): the binary and the runtime
    were just loaded, as an app that opens the model again sees it (AI Hub's warm load)."""
    output_dir = f"{run.output_dir}-warm"
    io = ("--use_native_input_files", "--use_native_output_files") if native else ()
    phone.adb.shell(net_run(run.binary, run.input_list, output_dir, *perf_flags, "--profiling_level", "basic",
                            "--num_inferences", "1", "--keep_num_outputs", "1", *io))
    pulled = run.pulled.with_name(run.pulled.name + "-warm")
    phone.adb.pull(output_dir, pulled)
    return _read_profile(params["name"], viewer, pulled, 0)["load_ms"]


def _seconds_or_ratio(where: str, name: str, default: float) -> float:
    value = os.environ.get(name) or ""
    try:
        number = float(value) if value else default
    except ValueError:
        number = -1.0
    if number < 0:
        raise BuildError(f"{where}: {name}={value!r}: give a number >= 0 (unset: {default:g})")
    return number


def _saved(result_path: Path) -> dict | None:
    """The last good result (not one a failed run marked stale already: that one keeps its first reason)."""
    import json
    try:
        saved = json.loads(result_path.read_text())
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) and "stale" not in saved else None


def _last_seconds(result_path: Path) -> str:
    """How long the last profile of this variant on this phone took, with what it ran ('' when none)."""
    import json
    try:
        last = json.loads(result_path.read_text())
    except (OSError, ValueError):
        return ""
    if not last.get("seconds"):
        return ""
    from ..plumbing.progress import format_seconds
    runs = {t.get("runs") for t in (last.get("graphs") or {}).values()}
    return f"; the last profile here took {format_seconds(last['seconds'])} ({'/'.join(map(str, runs))} runs)"


class _Clock:
    """What the task will run, said up front, and how far it is after each run (the console's line for this task
    shows the build log's time, which knows nothing of runs, graphs or the CPU baseline)."""

    def __init__(self, params: dict, cooldown: float, cpu: bool, last: str = ""):
        self.params, self.cooldown, self.started, self.steps = params, cooldown, time.monotonic(), 0
        graphs = len(params["graphs"])
        self.total = graphs * (2 if cpu else 1)
        self.say(f"{graphs} graph(s) x ({params['warmup']} warm-up + {params['runs']} runs) on the NPU, a warm-load "
                 "run per binary" + (", the CPU baseline per graph" if cpu else "")
                 + (f"; a {cooldown:g} s cool-down before every run after the first ({COOLDOWN_ENV})" if cooldown
                    else "") + last)

    def say(self, text: str) -> None:
        from ..plumbing import progress
        line = f"   {self.params['name']}: {text}\n"
        (progress.console or (lambda t: print(t, end="", flush=True)))(line)

    def cool(self, phone) -> None:
        if self.cooldown and self.steps:
            self.say(f"cool-down {self.cooldown:g} s ({thermal.describe(thermal.read(phone.adb))})")
            _sleep(self.cooldown)

    def done(self, what: str) -> None:
        from ..plumbing.progress import format_seconds
        self.steps += 1
        elapsed = time.monotonic() - self.started
        left = elapsed / self.steps * (self.total - self.steps)
        self.say(f"{what} done ({self.steps}/{self.total}), {format_seconds(elapsed)} elapsed"
                 + (f", about {format_seconds(left)} left" if self.steps < self.total else ""))


def summed(parts: dict) -> dict:
    """A split graph's latencies: its parts' in sequence. Each part runs in its own qnn-net-run, so the sum of the
    medians stands for the median of the sums (and the p90s' sum is an upper bound of the chain's p90)."""
    def total(key):
        values = [p.get(key) for p in parts.values()]
        return None if any(v is None for v in values) else sum(values)
    first = next(iter(parts.values()))
    median = total("median_ms")
    return {key: total(key) for key in ("load_ms", "warm_load_ms", "first_ms", "median_ms", "p90_ms", "min_ms",
                                        "max_ms", "accelerator_median_ms", "accelerator_cycles_median")} | {
        "peak_memory_kib": max((p.get("peak_memory_kib") or 0 for p in parts.values()), default=0) or None,
        "throughput_per_s": 1000 / median if median else None,
        "runs": min(p["runs"] for p in parts.values()), "warmup": first["warmup"], "samples": first["samples"],
        "top_ops": [], "sum_of_parts": True}


def profile(params: dict) -> dict:
    from ..measuring.samples import load_evaluation
    from . import cpu_baseline, cpu_runtime, perf_config, runtime
    from .on_phone import run_graph
    from .target import native_io, parts as read_parts
    if params["perf_profile"] not in PERF_PROFILES:
        raise BuildError(f"{params['name']}: perf profile {params['perf_profile']!r} is not one of "
                         f"{', '.join(PERF_PROFILES)} (BUILD_RULES_PERF_PROFILE)")
    if params["profiling_level"] not in PROFILING_LEVELS:
        raise BuildError(f"{params['name']}: profiling level {params['profiling_level']!r}: basic or detailed")
    result_path = Path(params["outputs"]["result"])
    spread = _seconds_or_ratio(params["name"], SPREAD_ENV, thermal.NOISY_SPREAD)  # before the phone is touched
    cooldown = _seconds_or_ratio(params["name"], COOLDOWN_ENV, 0.0)
    cpu_root = cpu_runtime.folder()
    if cpu_root is not None:
        cpu_runtime.files(cpu_root, params["name"])  # a half-made folder fails before the phone is touched
    phone = open_phone(params)
    viewer = runtime.profile_viewer(phone.runtime_root, params["name"])
    version = runtime.identity(phone.runtime_root, {})["version"]
    wrapper, no_memory = memory_wrapper(phone)
    last_time = _last_seconds(result_path)
    previous = _saved(result_path)  # the last good result stays until this run's replaces it, marked stale if it fails
    kept = result_path.with_suffix("")  # profile.<device>/: each part's raw profile log and CSV
    logs = kept.with_name(kept.name + ".new")  # this run's, in kept's place once the result is written
    shutil.rmtree(logs, ignore_errors=True)
    graphs, clock = {}, _Clock(params, cooldown, cpu_root is not None, last_time)
    try:
        with tempfile.TemporaryDirectory(prefix="build-rules-profile-") as tmp:
            perf_flags, perf_files, perf_form = perf_config.request(version, params["perf_profile"], phone.runtime_root,
                                                                    Path(tmp) / "config", REMOTE_RUNTIME, params["name"])
            for graph, files in params["graphs"].items():
                parts = read_parts(params["name"], files["target"])
                native = native_io(parts)
                inputs, _ = load_evaluation(files["evaluation"])
                # every inference of the input list at least once: a later part reads each sample's crossing tensors
                count = max(params["warmup"] + params["runs"], len(inputs)) if len(parts) > 1 else \
                    params["warmup"] + params["runs"]
                readings = {}

                @contextlib.contextmanager
                def read_thermal(run):
                    before = thermal.read(phone.adb)
                    yield
                    readings[run.part.name] = {"before": before, "after": thermal.read(phone.adb)}
                clock.cool(phone)
                _, runs = run_graph(phone, params, graph, parts, inputs, Path(tmp) / graph, "profile",
                                    extra=(*perf_flags, "--profiling_level", params["profiling_level"],
                                           "--num_inferences", str(count)),
                                    final_outputs=False, native=native, more_files=perf_files, around=read_thermal,
                                    wrapper=wrapper)
                timed = {}
                for run in runs:
                    timed[run.part.name] = {**_read_profile(params["name"], viewer, run.pulled, params["warmup"],
                                                            logs / run.part.name, kept / run.part.name),
                                            "warm_load_ms": _warm_load(phone, params, viewer, run, perf_flags, native),
                                            "peak_memory_kib": peak_memory_kib(run.said), "samples": len(inputs),
                                            "thermal": readings.get(run.part.name)}
                graphs[graph] = timed[graph] if len(parts) == 1 else {**summed(timed), "parts": timed}
                start, end = readings.get(parts[0].name) or {}, readings.get(parts[-1].name) or {}
                graphs[graph].update(io=IO_NATIVE if native else IO_FLOAT, thermal={
                    "before": start.get("before") or {}, "after": end.get("after") or {}})
                graphs[graph]["flags"] = thermal.judge(graphs[graph]["median_ms"], graphs[graph]["p90_ms"],
                                                       graphs[graph]["thermal"]["before"],
                                                       graphs[graph]["thermal"]["after"], spread)
                pushed = runs[-1].pushed
                clock.done(graph)
                if cpu_root is None:
                    graphs[graph]["cpu"] = {"measured": False, "reason": cpu_runtime.NOT_SET}
                else:
                    clock.cool(phone)
                    before = thermal.read(phone.adb)
                    cpu = cpu_baseline.profile(phone, params, graph, files, Path(tmp) / graph / "cpu", cpu_root)
                    cpu["thermal"] = {"before": before, "after": thermal.read(phone.adb)}
                    cpu["flags"] = thermal.judge(cpu["median_ms"], cpu["p90_ms"], before, cpu["thermal"]["after"], spread)
                    graphs[graph]["cpu"] = cpu
                    clock.done(f"{graph} CPU baseline")
    except (DeviceError, BuildError) as e:
        shutil.rmtree(logs, ignore_errors=True)
        if previous is not None:  # another run's numbers: kept, marked as not this one's (issue 37)
            from .results import mark_stale
            mark_stale(result_path, previous, str(e))
        raise
    record = {"device": params["device"]["name"], "phone_model": phone.product, "fingerprint": phone.fingerprint,
              "chip": params["chip"]["name"], "variant": params["variant"], "perf_profile": params["perf_profile"],
              "perf_profile_form": perf_form, "profiling_level": params["profiling_level"],
              "runtime": runtime_identity(phone, pushed), "cooldown_seconds": cooldown, "spread_limit": spread,
              "logs": str(kept), "peak_memory": no_memory or f"max RSS of qnn-net-run ({PEAK_MEMORY})",
              "seconds": round(time.monotonic() - clock.started, 1), "graphs": graphs}
    audio = realtime(read_evaluation(params.get("float_evaluation")), {g: t["median_ms"] for g, t in graphs.items()})
    if audio is not None:
        record["realtime"] = audio
    shutil.rmtree(kept, ignore_errors=True)
    if logs.is_dir():
        logs.rename(kept)
    atomic_write_json(result_path, record)
    for graph, t in graphs.items():
        for part, p in (t.get("parts") or {}).items():
            print(f"{params['name']} {part}: load {p['load_ms']:.2f} ms, median {p['median_ms']:.3f} ms", flush=True)
        print(f"{params['name']} {graph}: load {t['load_ms']:.2f} ms, first {t['first_ms']:.2f} ms, median "
              f"{t['median_ms']:.3f} ms, p90 {t['p90_ms']:.3f} ms over {t['runs']} runs ({params['perf_profile']})"
              + (f"; CPU median {t['cpu']['median_ms']:.3f} ms" if t["cpu"].get("measured") else "")
              + "".join(f"; {flag}" for flag in t["flags"]), flush=True)
    if audio and audio.get("measured"):
        print(f"{params['name']}: real-time factor {audio['rtf']:.4g} ({audio['processing_ms']:.1f} ms over "
              f"{audio['audio_seconds']:.2f} s of audio), first output {audio['first_output_ms']:.2f} ms", flush=True)
    elif audio:
        print(f"{params['name']}: no real-time factor: {audio['reason']}", flush=True)
    return record

