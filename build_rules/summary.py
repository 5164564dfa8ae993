"""doit's console output: `[k/N]` and the time left on each started task, the progress lines of long stages,
one line for a no-op, and a short summary at the end: what ran, what was built, what was skipped, how long.

Up-to-date tasks are listed one per line (`-- name`) only with `doit -v 1` (or 2); a no-op prints one line,
as ninja's "no work to do". Output is plain lines, one per started task, on a terminal or not (CI logs).

Every task that runs also gets a line in out/.build-state/build.log (like ninja's .ninja_log): start
time, seconds, how it ended and its name, tab-separated, appended build after build. It says where a
build's time went: `python -m build_rules.summary` prints the seconds per stage of the last build that ran
something; the next build estimates its time left from it (build_rules/plan.py).
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

from doit.reporter import ConsoleReporter

from . import layout
from .project import skipped_builds


class SummaryReporter(ConsoleReporter):
    desc = "console output with [k/N], the time left and a build summary"

    def __init__(self, outstream, options):
        super().__init__(outstream, options)
        self.began = time.time()
        self.ran: list = []
        self.up_to_date = 0
        from .runner import CACHE_HITS
        self.hits_before = len(CACHE_HITS)  # tests run several builds in one process
        self.started: dict[str, float] = {}
        self.seconds: dict[str, float] = {}  # this run's tasks
        self.logged = False
        self.warnings: list[str] = []
        self.verbose = False  # doit -v 1 or 2: list the up-to-date tasks too
        # doit -n N -P thread calls execute_task from its worker threads, everything else from the main thread.
        self.lock = threading.RLock()
        self.decided: dict[str, bool] = {}  # what doit decided so far: True started, False up to date
        self.plan = None
        self.tasks, self.selected, self.runner = {}, [], None

    def write(self, text):
        with self.lock:
            self.outstream.write(text)
            self.outstream.flush()  # a line as it happens, also into a pipe (CI logs)

    def initialize(self, tasks, selected_tasks):
        # doit hands reporters the tasks, not its runner; the runner (dep_manager for the status check that
        # counts N, always_execute, num_process for the time left) is the caller: Runner.run_all (doit 0.37).
        caller = sys._getframe(1).f_locals.get("self")
        self.runner = caller if hasattr(caller, "dep_manager") else None
        self.tasks, self.selected = tasks, list(selected_tasks)
        from . import progress
        progress.console = self.write  # before doit -P process forks its workers

    def execute_task(self, task):
        from .plan import Plan, counted
        with self.lock:  # holds other tasks' starts while the plan is made: it must see no work begun
            now = time.time()
            if not counted(task):  # a group, or a hidden task: doit prints no line for it either
                if task.actions:
                    self.started[task.name] = now
                return
            self.decided[task.name] = True
            if self.plan is None:
                self.plan = Plan(self.tasks, self.selected, self.runner, self.decided, read_build_log())
                left = self.plan.time_left(self.started, now)
                self.write(f"{len(self.plan.to_run)} task(s) to run"
                           + (f", about {_duration(left)} by {BUILD_LOG}" if left is not None else "") + "\n")
            self.started[task.name] = now
            k, n = self.plan.start(task.name)
            left = self.plan.time_left(self.started, now)
            suffix = f"  ({_duration(left)} left)" if left is not None and left >= 1 else ""  # none: no build log yet
            self.write(f".  [{k}/{n}] {task.title()}{suffix}\n")

    def add_success(self, task):
        if task.actions:
            self.ran.append(task)
            self.warnings += task.values.get("warnings", [])  # e.g. quantize: an output clamped by an activation
            from .runner import CACHE_HITS
            self._log(task, "restored" if task.name in CACHE_HITS[self.hits_before:] else "ran")

    def add_failure(self, task, fail):
        from doit.exceptions import UnmetDependency
        if isinstance(fail, UnmetDependency):  # doit --continue: a task that needs a failed one (one line, no block)
            self.failures.append({"task": task, "exception": fail})
            if task.actions:
                self.write(f"   not run: {task.name} (it needs {', '.join(fail.message.split())}, which failed)\n")
            return
        super().add_failure(task, fail)
        self._log(task, "failed")

    def _log(self, task, how: str) -> None:
        with self.lock:
            start = self.started.pop(task.name, None)
        if start is None:
            return
        seconds = time.time() - start
        self.seconds[task.name] = seconds
        try:
            with open(BUILD_LOG, "a", encoding="utf-8") as f:
                if not self.logged:  # one header line per build that ran something: "the last build" starts there
                    f.write(f"# build {time.strftime('%Y-%m-%d %H:%M:%S')} pid {os.getpid()}\n")
                    self.logged = True
                f.write(f"{start:.3f}\t{seconds:.3f}\t{how}\t{task.name}\n")
        except OSError:
            pass  # the log is for people; a full disk fails the build elsewhere, with its own message

    def skip_uptodate(self, task):
        with self.lock:
            self.decided[task.name] = False
            if self.plan is not None:
                self.plan.skip(task.name)
            if task.actions:
                self.up_to_date += 1
        if (task.verbosity or 0) >= 1:
            self.verbose = True
            super().skip_uptodate(task)

    def complete_run(self):
        # Failures were written when they happened (add_failure); the stage's own output is in its log,
        # so doit's empty "<stderr>/<stdout>" blocks are left out.
        if self.runtime_errors:
            self.write("Execution aborted.\n" + "\n".join(self.runtime_errors) + "\n")
        from doit.exceptions import UnmetDependency
        failed = sum(not isinstance(f["exception"], UnmetDependency) for f in self.failures)
        # doit --continue: the tasks that need a failed one end as UnmetDependency (groups too: not counted)
        blocked = sum(isinstance(f["exception"], UnmetDependency) and bool(f["task"].actions) for f in self.failures)
        from .runner import CACHE_HITS
        restored = len(CACHE_HITS) - self.hits_before
        no_work = not (self.ran or self.failures or self.runtime_errors)
        self.write(f"summary: {len(self.ran)} task(s) ran"
                   + (f" ({restored} restored from the build cache)" if restored else "")
                   + f", {self.up_to_date} up to date" + (f", {failed} failed" if failed else "")
                   + (f", {blocked} not run (they need a failed task)" if blocked else "")
                   + ("; no work to do" if no_work else "") + "\n")
        if no_work and not self.verbose:
            return  # one line, as ninja's "no work to do" (the notes were shown when the build ran)
        not_run = self._not_run() if failed else 0
        if not_run:
            self.write(f"  stopped at the first failure: {not_run} planned task(s) not run; `doit --continue` "
                       "builds everything that does not need the failed task\n")
        for task in sorted(self.ran, key=lambda t: t.name):  # by model, variant and chip, not finish order
            if task.name.startswith("package:"):
                self.write(f"  built {_describe(task.targets[0])}\n")
            elif task.name.startswith("dist:"):  # bundles; with [dist] multi_soc its size beside the per-chip sum
                from .dist import describe
                self.write("".join(f"  {line}\n" for t in task.targets if t.endswith("index.json") for line in describe(t)))
        for warning in self.warnings:
            self.write(f"  warning: {warning}\n")
        for note in skipped_builds():
            self.write(f"  note: {note}\n")
        if self.seconds:
            slowest = sorted(self.seconds.items(), key=lambda kv: -kv[1])[:3]
            self.write(f"  wall time {_duration(time.time() - self.began)}; slowest: "
                       + ", ".join(f"{name} {_duration(s)}" for name, s in slowest) + "\n")
        if self.ran:
            from .bytecode import compile_package
            compile_package()  # the next load (a no-op build, `doit list`) need not compile build_rules again


    def _not_run(self) -> int:
        """Planned tasks that never started because doit stopped at a failure (0 under --continue)."""
        if self.plan is None or getattr(self.runner, "continue_", False):
            return 0
        return len(self.plan.to_run - self.plan.started)


def _duration(seconds: float) -> str:
    from .progress import format_seconds
    return format_seconds(seconds)


BUILD_LOG = f"{layout.OUT}/.build-state/build.log"


def read_build_log(path: str = BUILD_LOG, last_build: bool = False) -> list[tuple[float, float, str, str]]:
    """(start, seconds, how, task) of every task line, or of the last build's; a torn last line (a
    killed build) is skipped."""
    rows = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.startswith("#"):
                    if last_build:
                        rows = []
                    continue
                parts = line.rstrip("\n").split("\t")
                try:
                    rows.append((float(parts[0]), float(parts[1]), parts[2], parts[3]))
                except (ValueError, IndexError):
                    continue
    except FileNotFoundError:
        pass
    return rows


def seconds_per_stage(rows) -> dict[str, tuple[int, float]]:
    """stage -> (tasks, seconds)."""
    totals: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for _, seconds, _, task in rows:
        total = totals[task.split(":", 1)[0]]
        total[0] += 1
        total[1] += seconds
    return {stage: (n, s) for stage, (n, s) in totals.items()}


def _print_last_build(path: str = BUILD_LOG) -> None:
    rows = read_build_log(path, last_build=True)
    if not rows:
        sys.exit(f"{path}: no build recorded yet")
    print("| stage | tasks | seconds |\n|---|---|---|")
    for stage, (n, seconds) in sorted(seconds_per_stage(rows).items(), key=lambda kv: -kv[1][1]):
        print(f"| {stage} | {n} | {seconds:.1f} |")


def _describe(manifest_path: str) -> str:
    try:
        manifest = json.loads(Path(manifest_path).read_text())
    except (OSError, ValueError):
        return manifest_path
    parts = []
    for graph, info in manifest["graphs"].items():
        gate = info.get("gate")
        gate_text = ""
        if info.get("check") == "not run":  # qairt without qnn-net-run: no metric was measured
            gate_text = " (check not run)"
        elif gate:
            metric = gate["metric"]
            gate_text = f" {metric} {info['metrics'].get(metric, float('nan')):.4g}"
            if metric in info.get("worst_output", {}):  # several outputs: the one that sets the value
                gate_text += f" (worst: {info['worst_output'][metric]})"
        pieces = f" in {len(info['parts'])} parts" if info.get("parts") else ""  # a split graph
        parts.append(f"{graph} {info['bytes'] / 1e6:.2f} MB{pieces}{gate_text}")
    evaluation = manifest.get("evaluate")
    if evaluation and evaluation.get("gate"):  # the model-level metric, e.g. WER of encoder + decoder
        metric = evaluation["gate"]["metric"]
        parts.append(f"model {metric} {evaluation['metrics'].get(metric, float('nan')):.4g}")
    return f"{Path(manifest_path).parent}: " + ", ".join(parts)


if __name__ == "__main__":
    _print_last_build(sys.argv[1] if len(sys.argv) > 1 else BUILD_LOG)
