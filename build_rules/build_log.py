"""out/.build-state/build.log, as ninja's .ninja_log: a line for every task that ran, appended build after build.

Each line is tab-separated: start time (epoch seconds), seconds, how it ended (ran, restored from the build cache,
failed), the task's name and, for a task that ran the HTP emulator, a fifth column: its emulator sessions' seconds,
summed (a check on 2 workers for 60 s: about 120; emulator_slots.session_seconds); a `# build <date> pid <pid>` line opens each build that ran something, so "the last
build" is what follows the last such line. It says where a build's time went (`python -m build_rules.build_log`
prints the seconds per stage of the last build), and the next build estimates its time left from it (plan.py).
"""
from __future__ import annotations

import os
import sys
import time
from collections import defaultdict

from .build_state.state import BUILD_LOG


class BuildLog:
    """The log's writer for one build: the header goes in before its first line."""

    def __init__(self, path: str = BUILD_LOG):
        self.path = path
        self.opened = False

    def add(self, start: float, seconds: float, how: str, task: str, emulator_seconds: float = 0.0) -> None:
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                if not self.opened:  # one header line per build that ran something: "the last build" starts there
                    f.write(f"# build {time.strftime('%Y-%m-%d %H:%M:%S')} pid {os.getpid()}\n")
                    self.opened = True
                emulator = f"\t{emulator_seconds:.3f}" if emulator_seconds else ""
                f.write(f"{start:.3f}\t{seconds:.3f}\t{how}\t{task}{emulator}\n")
        except OSError:
            pass  # the log is for people; a full disk fails the build elsewhere, with its own message


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


def emulator_seconds(path: str = BUILD_LOG) -> dict[str, float]:
    """task -> its emulator sessions' seconds the last time it ran (tasks that ran no session are absent)."""
    seconds: dict[str, float] = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if line.startswith("#") or len(parts) < 4 or parts[2] != "ran":
                    continue
                try:
                    seconds[parts[3]] = float(parts[4]) if len(parts) > 4 else 0.0
                except ValueError:
                    continue
    except FileNotFoundError:
        pass
    return {task: s for task, s in seconds.items() if s}


def seconds_per_stage(rows) -> dict[str, tuple[int, float]]:
    """stage -> (tasks, seconds)."""
    totals: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for _, seconds, _, task in rows:
        total = totals[task.split(":", 1)[0]]
        total[0] += 1
        total[1] += seconds
    return {stage: (n, s) for stage, (n, s) in totals.items()}


def print_last_build(path: str = BUILD_LOG) -> None:
    rows = read_build_log(path, last_build=True)
    if not rows:
        sys.exit(f"{path}: no build recorded yet")
    print("| stage | tasks | seconds |\n|---|---|---|")
    for stage, (n, seconds) in sorted(seconds_per_stage(rows).items(), key=lambda kv: -kv[1][1]):
        print(f"| {stage} | {n} | {seconds:.1f} |")


if __name__ == "__main__":
    print_last_build(sys.argv[1] if len(sys.argv) > 1 else BUILD_LOG)
