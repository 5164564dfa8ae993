"""Progress of a long stage: `progress: 120/200 samples, 45 s elapsed` in the task's log and on the console.

A stage runs in its own process with stdout going to its log (runner.py), so doit prints nothing while an
emulator check or evaluate works for minutes. Here, on the stage side, a daemon thread prints the stage's
counters every INTERVAL seconds (the first line after half of it) for as long as the stage runs: a stage shorter
than that prints nothing. Stage code only says what it counts (track, count_graph_runs, watch); none of it prints.
On the doit side, follow() waits for the stage process and copies those lines from the log to the console as
they appear, each with the task's name (several tasks run at once under `doit -n 2`).

BUILD_RULES_PROGRESS_SECONDS sets the interval (default 20 s, so a line at least every 30 s even on a busy
machine; tests use a fraction of a second).
"""
from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time

from .env_settings import number

PREFIX = "progress: "
ENV = "BUILD_RULES_PROGRESS_SECONDS"
_STARTED = time.monotonic()  # imported when the stage process starts (stage_main), so: the stage's clock


def interval() -> float:
    """Seconds between a long stage's progress lines (BUILD_RULES_PROGRESS_SECONDS; a bad value once fell back to
    20 s silently, now it is the setting's line, checked when the build loads)."""
    return max(float(number(ENV, 20, least=0, what="a number of seconds >= 0 between progress lines")), 0.01)


class _Counter:
    def __init__(self, what: str, total, value=None, time_left: bool = False):
        self.what, self.total, self.done = what, total, 0
        self._value = value  # a function returning the count (watch), else `done` counts steps
        self.where = ""  # who runs them, when not this process alone: "2 emulator workers" (emulator_pool sets it)
        self.time_left, self.started = time_left, time.monotonic()

    def describe(self) -> str:
        done = self._value() if self._value else self.done
        total = self.total() if callable(self.total) else self.total
        text = f"{done}/{total} {self.what}" if total else f"{done} {self.what}"
        if self.time_left and total and 0 < done < total:  # its own pace so far, not other stages' medians
            text += f" (about {format_seconds((time.monotonic() - self.started) / done * (total - done))} left)"
        return f"{text} on {self.where}" if self.where else text


_counters: dict[str, _Counter] = {}  # slot -> counter, in registration order; printed together
_lock = threading.Lock()
_ticker: threading.Thread | None = None


def start() -> None:
    """Start the stage's reporting thread (stage_main does, for every stage)."""
    global _ticker
    with _lock:
        if _ticker is None:
            _ticker = threading.Thread(target=_report_until_exit, name="progress", daemon=True)
            _ticker.start()


def line() -> str:
    with _lock:
        counts = [c.describe() for c in _counters.values()]
    return PREFIX + ", ".join(counts + [f"{format_seconds(time.monotonic() - _STARTED)} elapsed"])


def _report_until_exit() -> None:
    wait = interval() / 2
    while True:
        time.sleep(wait)
        sys.stdout.write(line() + "\n")  # one write per line: the stage's own prints stay whole lines too
        sys.stdout.flush()
        wait = interval()


def track(items, what: str = "samples", total: int | None = None, slot: str | None = None):
    """Iterate over items, counting them (total: len(items) when it has one)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)
    counter = _register(slot or what, _Counter(what, total))
    try:
        for item in items:
            yield item
            counter.done += 1
    finally:
        _unregister(slot or what, counter)


@contextlib.contextmanager
def counting(what: str = "samples", total: int | None = None, slot: str | None = None):
    """A counter for the block: the caller adds to its .done as items complete, in whatever order (the emulator's
    workers finish samples out of order; emulator_runs counts each as it arrives)."""
    counter = _register(slot or what, _Counter(what, total))
    try:
        yield counter
    finally:
        _unregister(slot or what, counter)


class _GraphRuns:
    def __init__(self, expected: dict):
        self.runs: dict[str, int] = {}
        self.expected = expected

    def describe(self) -> str:
        counts = ", ".join(f"{g} {n}/{self.expected[g]}" if self.expected.get(g) else f"{g} {n}"
                           for g, n in list(self.runs.items()))
        return f"graph runs: {counts or 'none yet'}"


def count_graph_runs(run_graph, float_report: str | None = None):
    """run_graph(graph, feed) of an evaluate hook, counting runs per graph; its .runs go into the report. The
    float model's report (float_report) gives the totals: greedy decoding runs about as often on the emulator."""
    expected = {}
    if float_report:
        try:
            with open(float_report, encoding="utf-8") as f:
                expected = json.load(f).get("graph_runs") or {}
        except (OSError, ValueError, AttributeError):
            expected = {}
    counter = _register("graph runs", _GraphRuns(expected))

    def counted(graph, feed):
        result = run_graph(graph, feed)
        counter.runs[graph] = counter.runs.get(graph, 0) + 1
        return result
    counted.runs = counter.runs
    return counted


def watch(value, what: str, total=None, slot: str = "stage", time_left: bool = False) -> None:
    """Report value() (a count the stage keeps anyway) until another watch takes the slot or stop() ends it;
    time_left: with a total, the time the rest takes at the pace so far."""
    _register(slot, _Counter(what, total, value, time_left))


def stop(slot: str) -> None:
    """No more lines for this slot (its work is done: a tune's CPU ranking of one graph, before the next)."""
    with _lock:
        _counters.pop(slot, None)


def _register(slot: str, counter: _Counter) -> _Counter:
    with _lock:
        _counters.pop(slot, None)
        _counters[slot] = counter
    return counter


def _unregister(slot: str, counter: _Counter) -> None:
    with _lock:
        if _counters.get(slot) is counter:
            del _counters[slot]


def format_seconds(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, seconds = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


# --------------------------------------------------------------------------------------------------------------
# doit side: the runner waits for the stage process here


# Where follow() sends the lines: set by the build's reporter (summary.py) to its own locked console output.
console = None


# The stage processes doit is waiting for: an interrupt stops them all (interrupt.py), also those of worker threads.
_running: set = set()
_stopping = False


def stop_stages() -> None:
    global _stopping
    _stopping = True  # a stage a worker thread starts after this is stopped as it starts
    for proc in list(_running):
        try:
            proc.kill()
        except OSError:
            pass


def follow(proc, log: str, task: str) -> int:
    """Wait for the stage process; meanwhile copy its progress lines from its log to the console. Returns
    the exit code. On any exception (Ctrl-C) the stage is killed, as subprocess.call does."""
    poll = min(1.0, interval() / 2)
    position = 0
    _running.add(proc)
    if _stopping:
        proc.kill()
    try:
        while True:
            try:
                code = proc.wait(timeout=poll)
            except subprocess.TimeoutExpired:
                position = _forward(log, position, task)
                continue
            _forward(log, position, task)
            return code
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        _running.discard(proc)


def _forward(log: str, position: int, task: str) -> int:
    """Send the complete progress lines written to log since position; returns the new position."""
    try:
        with open(log, "rb") as f:
            f.seek(position)
            data = f.read()
    except OSError:
        return position
    end = data.rfind(b"\n") + 1  # a line the stage is still writing waits for the next poll
    sink = console
    if sink is not None:
        for raw in data[:end].splitlines():
            text = raw.decode("utf-8", "replace")
            if text.startswith(PREFIX):
                sink(f"   {task}: {text[len(PREFIX):]}\n")
    return position + end
