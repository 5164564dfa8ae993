"""The last known result of a check or an evaluation, passed or failed.

A check (or evaluate) that passes writes its report, a target (<graph>.check.json, evaluate.json). One that fails
must fail its task, and the runner removes a failed task's targets, so that an old report never passes for the
result of this run. Its numbers are kept in the measurement memo beside the report instead (layout.memo_file:
<graph>.measure.json, evaluate.measure.json, not targets), under "failed": the report the stage would have written
plus the gate's message. The memo's key (what was measured: binary, evaluation set, hooks, emulator version) lets a
re-run of the failed task (a plain `doit` or `doit --continue`) take the numbers from it instead of running the
emulator again.

`last(report)` is what the build summary, the report stage and tune read: the report when it exists (the last run
passed, or was restored from the build cache), else the memo's failure, else None. Standard library only: the
summary reads it inside doit.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..plumbing.files import atomic_write_json
from .layout import memo_file


def keep_failed(memo: str, report: dict, message: str, key, metrics: dict, **remembered) -> None:
    """Record a failed check or evaluation in its memo (written in place: the stage's staging folder is dropped),
    with the measurement (key, metrics and what else the stage remembers) it was judged on."""
    atomic_write_json(memo, {"key": key, "metrics": metrics, **remembered, "failed": {**report, "error": message}})


def clear_failed(memo: str) -> None:
    """A check that passes now (e.g. after a relaxed gate, from the same measurement) leaves no failure behind."""
    try:
        saved = json.loads(Path(memo).read_text())
    except (OSError, ValueError):
        return
    if isinstance(saved, dict) and "failed" in saved:
        saved.pop("failed")
        atomic_write_json(memo, saved)


def last(report_path: str) -> dict | None:
    """The last result of a check or evaluation: its report with "passed": True (None for a check that could not
    run, e.g. qairt without qnn-net-run), or the failed report with "passed": False and "error", or None (never
    judged)."""
    try:
        report = json.loads(Path(report_path).read_text())
    except FileNotFoundError:
        report = None
    except (OSError, ValueError):
        return None
    if isinstance(report, dict):
        return {**report, "passed": None if report.get("status") == "not run" else True}
    try:
        failed = json.loads(Path(memo_file(report_path)).read_text()).get("failed")
    except (OSError, ValueError, AttributeError):
        return None
    return {**failed, "passed": False} if isinstance(failed, dict) else None
