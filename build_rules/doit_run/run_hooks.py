"""What a `doit` run does at its start and end besides printing. doit offers a run no start or end hook but its
reporter's initialize and complete_run, so the console reporter (summary.py) calls these and prints what they say.

- start: remove the outputs of targets that left the build (a variant, chip, graph or model removed: target_set.py)
  and let the status checks that follow share their file stats (hashing.py);
- end: compile build_rules' bytecode after a build that ran something (bytecode.py), so the next load need not.
The build log (build_log.py) is written as each task ends.
"""
from __future__ import annotations

from ..build_state import hashing


def start(tasks: dict) -> tuple[list[str], list[str]]:
    """(outputs removed, warnings), before doit checks the first task."""
    from . import target_set
    from .project import project
    removed, warnings = [], []
    try:  # one stat when no variant, chip, graph or model left the build
        removed = target_set.prune(tasks, project().toolchain)
    except OSError as e:
        warnings.append(f"could not remove the outputs of targets no longer in the build: {e}")
    hashing.remember_stats()  # the status checks that follow (after the pruning) share their stats until a task runs
    return removed, warnings


def end(ran_something: bool) -> None:
    hashing.forget_stats()
    if ran_something:
        from .bytecode import compile_package
        compile_package()  # the next load (a no-op build, `doit list`) need not compile build_rules again
