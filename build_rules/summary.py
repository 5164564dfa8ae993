"""doit's console output plus a short summary at the end: what ran, what was built, what was skipped.

Every task that runs also gets a line in out/.build-state/build.log (like ninja's .ninja_log): start
time, seconds, how it ended and its name, tab-separated, appended build after build. It says where a
build's time went: `python -m build_rules.summary` prints the seconds per stage of the last build that ran
something.
"""
from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

from doit.reporter import ConsoleReporter

from . import layout


class SummaryReporter(ConsoleReporter):
    desc = "console output with a build summary"

    def __init__(self, outstream, options):
        super().__init__(outstream, options)
        self.ran: list = []
        self.up_to_date = 0
        from .runner import CACHE_HITS
        self.hits_before = len(CACHE_HITS)  # tests run several builds in one process
        self.started: dict[str, float] = {}
        self.logged = False
        self.warnings: list[str] = []

    def execute_task(self, task):
        super().execute_task(task)
        self.started[task.name] = time.time()

    def add_success(self, task):
        if task.actions:
            self.ran.append(task)
            self.warnings += task.values.get("warnings", [])  # e.g. quantize: an output clamped by an activation
            from .runner import CACHE_HITS
            self._log(task, "restored" if task.name in CACHE_HITS[self.hits_before:] else "ran")

    def add_failure(self, task, fail):
        super().add_failure(task, fail)
        self._log(task, "failed")

    def _log(self, task, how: str) -> None:
        start = self.started.pop(task.name, None)
        if start is None:
            return
        try:
            with open(BUILD_LOG, "a", encoding="utf-8") as f:
                if not self.logged:  # one header line per build that ran something: "the last build" starts there
                    f.write(f"# build {time.strftime('%Y-%m-%d %H:%M:%S')} pid {os.getpid()}\n")
                    self.logged = True
                f.write(f"{start:.3f}\t{time.time() - start:.3f}\t{how}\t{task.name}\n")
        except OSError:
            pass  # the log is for people; a full disk fails the build elsewhere, with its own message

    def skip_uptodate(self, task):
        super().skip_uptodate(task)
        if task.actions:
            self.up_to_date += 1

    def complete_run(self):
        # Failures were written when they happened (add_failure); the stage's own output is in its log,
        # so doit's empty "<stderr>/<stdout>" blocks are left out.
        if self.runtime_errors:
            self.write("Execution aborted.\n" + "\n".join(self.runtime_errors) + "\n")
        failed = len(self.failures)
        from .runner import CACHE_HITS
        restored = len(CACHE_HITS) - self.hits_before
        self.write(f"summary: {len(self.ran)} task(s) ran"
                   + (f" ({restored} restored from the build cache)" if restored else "")
                   + f", {self.up_to_date} up to date" + (f", {failed} failed" if failed else "") + "\n")
        for task in self.ran:
            if task.name.startswith("package:"):
                self.write(f"  built {_describe(task.targets[0])}\n")
            elif task.name.startswith("dist:"):  # bundles; with [dist] multi_soc its size beside the per-chip sum
                from .dist import describe
                self.write("".join(f"  {line}\n" for t in task.targets if t.endswith("index.json") for line in describe(t)))
        for warning in self.warnings:
            self.write(f"  warning: {warning}\n")
        from .tasks import skipped_builds
        for note in skipped_builds():
            self.write(f"  note: {note}\n")


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
        parts.append(f"{graph} {info['bytes'] / 1e6:.2f} MB{gate_text}")
    evaluation = manifest.get("evaluate")
    if evaluation and evaluation.get("gate"):  # the model-level metric, e.g. WER of encoder + decoder
        metric = evaluation["gate"]["metric"]
        parts.append(f"model {metric} {evaluation['metrics'].get(metric, float('nan')):.4g}")
    return f"{Path(manifest_path).parent}: " + ", ".join(parts)


if __name__ == "__main__":
    _print_last_build(sys.argv[1] if len(sys.argv) > 1 else BUILD_LOG)
