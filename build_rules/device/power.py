"""power:<model>/<variant>@<device>: the model in a loop for a fixed time (BUILD_RULES_POWER_SECONDS, seed: 30-60
min) on the NPU, then on the CPU (the float graph through ort-cpu-run, when BUILD_RULES_CPU_RUNTIME is set:
cpu_baseline.py); the loop's CPU share from /proc/<pid>/stat every 2 s (utime + stime ticks over
wall time) and the battery's drain over the run.

The battery: `dumpsys battery unplug` makes Android behave as on battery for the run, and `dumpsys battery reset`
restores it afterwards, also on a failure or Ctrl-C (SIGINT/SIGTERM). `unplug` also freezes what `dumpsys battery`
reports, so the drain is read from the kernel's live counters, /sys/class/power_supply/battery/charge_counter (uAh)
and capacity (%). Many phones still charge over USB while "unplugged": hold the charger off (a USB power blocker or
wireless adb) for numbers that mean anything; the result lists what to hold fixed.

The loop's process on the phone is stopped on every way out but its own end (loop()), and a loop that ended much
sooner than asked fails with its log's error line (issue 37: a qnn-net-run that could not load its backend gave a
2.3 s row and a passed task; a Ctrl-C left it running on the phone). The duration is said when the task starts and
the time left while it runs (say(): through the build's console, as stage progress lines are).
"""
from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from ..errors import BuildError
from ..plumbing.files import atomic_write_json
from .devices import REMOTE_ROOT
from .errors import DeviceError
from .session import REMOTE_RUNTIME, net_run, open_phone, push_runtime_and

BATTERY = "/sys/class/power_supply/battery"
_sleep = time.sleep  # (tests interrupt the sampling loop here, as a Ctrl-C would)
HOLD_FIXED = ["screen off (or the same brightness)", "the same network state (airplane mode or not)",
              "USB charging physically off during the run", "the same starting temperature (let the phone cool)",
              "repeat the run: thermal state moves the numbers"]


def run(params: dict):
    from doit.exceptions import TaskFailed
    try:
        power(params)
    except (DeviceError, BuildError) as e:
        return TaskFailed(str(e) if str(e).startswith(params["name"]) else f"{params['name']}: {e}")
    return True


def cpu_ticks(stat_line: str) -> int:
    """utime + stime (fields 14 and 15 of /proc/<pid>/stat; the command name in parentheses may hold spaces)."""
    fields = stat_line[stat_line.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12])  # fields[0] is field 3 (state)


def battery(phone) -> dict:
    """The kernel's live counters and the phone's own clock (/proc/uptime), read in one command: the drain is over
    the phone's seconds between two reads, not the host's, which add adb's latency at each end (on a busy host one
    read came 0.6 s later than the other: a 4 s loop's drain read 16 % high)."""
    text = phone.shell(f"cat {BATTERY}/charge_counter {BATTERY}/capacity /proc/uptime")
    values = text.split()
    if len(values) < 3:
        raise DeviceError(f"{phone.name}: {BATTERY}/charge_counter, capacity and /proc/uptime gave {text!r}")
    return {"charge_counter_uah": int(values[0]), "level": int(values[1]), "time": float(values[2])}


def say(name: str, text: str) -> None:
    """A line on the console as it happens (doit keeps an action's own prints until it ends): through the build's
    console, as a stage's progress lines go (progress.py)."""
    from ..plumbing import progress
    if progress.console is not None:
        progress.console(f"   {name}: {text}\n")
    else:
        print(f"{name}: {text}", flush=True)


def loop(phone, command: str, seconds: float, every: float, path: str = "NPU", name: str = "power",
         later: float = 0.0) -> dict:
    """Start `command` in the background on the phone, sample its CPU ticks every `every` s until it ends. The
    remote process is stopped on every way out of here but its own end (a failure, Ctrl-C, SIGTERM), and a loop that
    ended much sooner than `seconds` fails with its log's last error line. `later`: seconds of loops still to come
    (the time left the progress lines give)."""
    log = f"{REMOTE_ROOT}/power.{path.lower()}.log"
    hz = int(phone.shell("getconf CLK_TCK").strip() or 100)  # before the loop: its seconds are for reading its CPU
    launched = time.monotonic()  # the loop starts after this and has ended by the read that finds it gone
    started = phone.shell(f"{command} > {log} 2>&1 & echo PID=$!")
    pid = int(started.split("PID=")[-1].split()[0])
    running = True
    try:
        result, running = _sample(phone, pid, hz, seconds, every, path, name, later)
    finally:
        if running:
            _stop(phone, pid, name)
    # Judged by what it lived at most: the last read that saw it alive can come a whole adb round trip before its
    # end (fresh32: on a busy host a 6 s loop was last seen at 5.1 s and failed here though it ran its 6 s).
    lived = result.pop("gone_at") - launched
    if lived < 0.9 * seconds:
        raise DeviceError(f"the {path} loop (pid {pid}, --duration {seconds:g}) ended within {lived:.1f} s of the "
                          f"{seconds:g} s asked: {_last_error(phone, log)} (its log: {log} on the phone); nothing "
                          "was recorded")
    return result


def _sample(phone, pid: int, hz: int, seconds: float, every: float, path: str, name: str,
            later: float) -> tuple[dict, bool]:
    """(the loop's numbers, whether it still runs); the CPU share from /proc/<pid>/stat, the battery around it."""
    from ..plumbing.progress import format_seconds, interval
    started = time.monotonic()
    before = battery(phone)
    samples, first, last, seen = [], None, None, None
    deadline = started + seconds + max(30.0, 0.1 * seconds)
    next_line = started + interval()
    while True:
        code, text = phone.shell_code(f"cat /proc/{pid}/stat")
        fields = text.strip()[text.strip().rfind(")") + 2:].split() if code == 0 and ")" in text else []
        if not fields or fields[0] in ("Z", "X"):
            gone_at = time.monotonic()
            break  # the loop ended
        now = time.monotonic()
        seen = now
        ticks = cpu_ticks(text.strip())
        if last is not None and now > last[1]:
            samples.append(round(100.0 * (ticks - last[0]) / hz / (now - last[1]), 1))
        first = first or (ticks, now)
        last = (ticks, now)
        if now > deadline:
            raise DeviceError(f"the {path} loop (pid {pid}) ran {now - started:.0f} s, past its {seconds:g} s: "
                              "stopped")
        if now >= next_line:
            left = max(seconds - (now - started), 0.0) + later
            say(name, f"{path} loop {format_seconds(now - started)} of {format_seconds(seconds)}, "
                      f"{format_seconds(left)} left" + (f", process CPU {samples[-1]:.0f} %" if samples else ""))
            next_line = now + interval()
        _sleep(every)
    after = battery(phone)
    hours = (after["time"] - before["time"]) / 3600
    cpu = (100.0 * (last[0] - first[0]) / hz / (last[1] - first[1])) if last and first and last[1] > first[1] else None
    return {"seconds": round(after["time"] - before["time"], 2), "alive_seconds": round((seen or started) - started, 2),
            "gone_at": gone_at, "cpu_percent_samples": samples, "cpu_percent_mean": cpu, "battery_before": before,
            "battery_after": after, "percent_per_hour": (before["level"] - after["level"]) / hours if hours else None,
            "mah_per_hour": ((before["charge_counter_uah"] - after["charge_counter_uah"]) / 1000 / hours
                             if hours else None)}, False


def _stop(phone, pid: int, name: str) -> None:
    """Stop the loop's process on the phone (kill sends SIGTERM; qnn-net-run and ort-cpu-run end on it)."""
    try:
        code, _ = phone.shell_code(f"kill {pid}", timeout=30)
    except DeviceError as e:
        say(name, f"could NOT stop the loop (pid {pid}) on the phone ({e}): run `adb -s {phone.serial} shell kill "
                  f"{pid}` when the phone is back")
        return
    say(name, f"stopped the loop (pid {pid}) on the phone" if code == 0 else f"the loop (pid {pid}) had ended")


def _last_error(phone, log: str) -> str:
    """The log's last error line (qnn-net-run's `[ ERROR ] ...`, `<E> ...`), else its last line."""
    try:
        code, text = phone.shell_code(f"cat {log}", timeout=30)
    except DeviceError as e:
        return f"its log could not be read ({e})"
    lines = [line.strip() for line in text.splitlines() if line.strip()] if code == 0 else []
    errors = [line for line in lines if "ERROR" in line or line.startswith("<E>") or "error" in line.lower()]
    return (errors or lines or ["the log is empty"])[-1]


def power(params: dict) -> dict:
    import tempfile

    from ..plumbing.progress import format_seconds
    from . import cpu_baseline, cpu_runtime, perf_config, runtime
    from ..measuring.samples import load_evaluation
    from .on_phone import remote_binary, remote_inputs
    from .target import parts as read_parts, write_inputs
    result_path = Path(params["outputs"]["result"])
    cpu_root = cpu_runtime.folder()
    if cpu_root is not None:
        cpu_runtime.files(cpu_root, params["name"])  # a half-made folder fails before the phone is touched
    phone = open_phone(params)
    (part,) = read_parts(params["name"], params["target"])  # an unsplit graph (tasks/device.py picks one)
    inputs, _ = load_evaluation(params["evaluation"])
    inputs_remote = remote_inputs(params, params["graph"], 0, part.name)
    version = runtime.identity(phone.runtime_root, {})["version"]
    with tempfile.TemporaryDirectory(prefix="build-rules-power-") as tmp:
        input_files = write_inputs(params["name"], part, inputs, Path(tmp), inputs_remote)
        binary_remote = remote_binary(params, part.name)
        # burst as profile asks for it: the backend extension config where the runtime takes it (--perf_profile is
        # deprecated for HTP there), else --perf_profile
        perf_flags, perf_files, perf_form = perf_config.request(version, "burst", phone.runtime_root,
                                                                Path(tmp) / "config", REMOTE_RUNTIME,
                                                                params["name"])
        push_runtime_and(phone, {binary_remote: part.binary, **input_files, **perf_files})
        cpu_command = None
        if cpu_root is not None:
            prepared = cpu_baseline.prepare(phone, params, params["graph"],
                                            {"evaluation": params["evaluation"], "target": params["target"],
                                             "float_model": params["float_model"]}, Path(tmp) / "cpu", cpu_root)
            cpu_command = _background(cpu_baseline.command(
                prepared, f"{REMOTE_ROOT}/cpu-power/{params['model']}/{params['graph']}", "--duration",
                f"{params['seconds']:g}", "--keep_num_outputs", "1"), cpu_baseline.REMOTE_CPU + "/" + cpu_runtime.LOADER)
    paths = ["NPU"] + (["CPU"] if cpu_command is not None else [])
    say(params["name"], f"{len(paths)} loop(s) ({', '.join(paths)}) of {format_seconds(params['seconds'])} each "
                        f"({params['seconds_from']}): about {format_seconds(len(paths) * params['seconds'])} on the "
                        "phone; Ctrl-C stops it and restores the battery state"
                        + ("" if cpu_command is not None else f"; the CPU path is not measured: {cpu_runtime.NOT_SET}"))
    command = _background(net_run(binary_remote, f"{inputs_remote}/input_list.txt",
                                  binary_remote.replace("/bin/", "/power/", 1)[:-len(".bin")], *perf_flags,
                                  "--duration", f"{params['seconds']:g}", "--keep_num_outputs", "1"),
                          f"{REMOTE_RUNTIME}/qnn-net-run")
    previous = signal.signal(signal.SIGTERM, _interrupt)
    failure = None
    try:
        phone.adb.shell("dumpsys battery unplug")
        npu = loop(phone.adb, command, params["seconds"], params["sample_seconds"], "NPU", params["name"],
                   later=params["seconds"] * (len(paths) - 1))
        cpu = {"measured": False, "reason": cpu_runtime.NOT_SET} if cpu_command is None else \
            {"measured": True, "runner": "ort-cpu-run (ONNX Runtime CPU execution provider, the float graph)",
             **loop(phone.adb, cpu_command, params["seconds"], params["sample_seconds"], "CPU", params["name"])}
    except DeviceError as e:
        failure = e
    finally:  # also on Ctrl-C / SIGTERM (KeyboardInterrupt passes through here)
        restored = _restore(phone.adb)
        signal.signal(signal.SIGTERM, previous)
    if failure is not None:
        if result_path.is_file():  # the last good result stays, marked as such (issue 37)
            from .results import mark_stale
            mark_stale(result_path, json.loads(result_path.read_text()), str(failure))
        raise DeviceError(f"{failure}; {restored}") from None
    record = {"device": params["device"]["name"], "phone_model": phone.product, "fingerprint": phone.fingerprint,
              "chip": params["chip"]["name"], "variant": params["variant"], "graph": params["graph"],
              "seconds_per_path": params["seconds"], "perf_profile": "burst", "perf_profile_form": perf_form, "npu": npu, "cpu": cpu, "hold_fixed": HOLD_FIXED}
    atomic_write_json(result_path, record)
    print(f"{params['name']}: NPU {npu['percent_per_hour']:.2f} %/h, {npu['mah_per_hour']:.1f} mAh/h, process CPU "
          f"{npu['cpu_percent_mean'] or 0:.1f} %; CPU path: "
          + (f"{cpu['percent_per_hour']:.2f} %/h, {cpu['mah_per_hour']:.1f} mAh/h, process CPU "
             f"{cpu['cpu_percent_mean'] or 0:.1f} %" if cpu.get("measured") else cpu["reason"])
          + "\nhold fixed: " + "; ".join(HOLD_FIXED), flush=True)
    return record


def _background(command: str, program: str) -> str:
    """One background command, so that $! is the program's pid (an '&&' list in the background is a subshell)."""
    return command.replace(" && ", "; ").replace(f"{program} ", f"nohup {program} ", 1)


def _restore(phone) -> str:
    try:
        phone.shell("dumpsys battery reset")
    except DeviceError as e:
        text = (f"the battery state was NOT restored ({e}): run `adb -s {phone.serial} shell dumpsys battery reset` "
                "when the phone is back")
    else:
        text = "the battery state was restored (dumpsys battery reset)"
    print(f"{phone.name}: {text}", flush=True)
    return text


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # SIGTERM like Ctrl-C: the finally restores the battery state
