"""The machine-wide limit on HTP emulator sessions, like make's jobserver: N slot files, each held with flock.

Every emulator job (emulator_runs.py) holds one slot while its session runs: a worker process for its lifetime, or
the stage process itself when it runs the samples alone. The slots live in a per-user directory shared by every
doit task and stage process on the machine, so `doit -n 4` on two models still runs at most N sessions at once.
The kernel drops a flock when its process dies (even kill -9), so a slot is never leaked.

N is BUILD_RULES_EMULATOR_WORKERS, by default the cores this process may use: one session's ~12 threads spin, and
one session per core measured best (docs/benchmarks.md, "Emulator sessions and cores"). A job waits for a slot and
holds no other lock while it waits, and every holder is running samples, so every waiter gets one eventually.
A light leaf module: no numpy, no onnxruntime.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import random
import tempfile
import time
from pathlib import Path

from ..plumbing.env_settings import number

ENV = "BUILD_RULES_EMULATOR_WORKERS"
_POLL_SECONDS = 0.1

_held: int | None = None  # the slot this process holds (a worker, or a stage running its samples itself)
_session_seconds = 0.0  # emulator sessions' seconds this stage process ran (its own, and its workers': count_seconds)
_session_count = 0  # and how many sessions those were


def cores() -> list[int]:
    """The cores this process may run on (its affinity: a taskset or a container's cpuset counts)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def limit() -> int:
    """How many emulator sessions may run at once on this machine."""
    here = len(cores())
    return number(ENV, here, whole=True, least=1, what="a whole number of emulator workers >= 1",
                  default_said=f"{here} (one per core here)")


def directory() -> Path:
    """Per user, per machine: every repo and every doit of this user share the slots."""
    return Path(tempfile.gettempdir()) / f"build_rules-{os.getuid()}" / "emulator-slots"


def held() -> int | None:
    return _held


def count_seconds(seconds: float) -> None:
    """Add a session's seconds (a worker's, from ready to stopped) to what this process reports (session_seconds)."""
    global _session_seconds, _session_count
    _session_seconds += max(seconds, 0.0)
    _session_count += 1


def session_seconds() -> float:
    """Seconds of emulator sessions this process ran, summed over them: the slot-seconds its task takes of the
    machine's `limit()` slots (the build log keeps them; plan.py divides the emulator work left by the slots)."""
    return _session_seconds


def session_count() -> int:
    """How many sessions session_seconds() sums (a job run here is one; on workers, one per worker)."""
    return _session_count


@contextlib.contextmanager
def slot(waiting=None, pin: bool = False):
    """Hold one slot for the block (waits for one). In a process that holds one already, a nested job uses it.
    waiting(n): called once if no slot is free at first. pin: run this process (and the threads it starts from
    now on) on one core, the slot's, so sessions do not share cores."""
    global _held
    if _held is not None:
        yield _held
        return
    n = limit()
    folder = directory()
    folder.mkdir(parents=True, exist_ok=True)
    told = False
    while True:
        for index in random.sample(range(n), n):  # in any order: waiters do not all queue on slot 0
            fd = os.open(folder / f"slot-{index}", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                    raise
                continue
            began = time.monotonic()
            before = cores() if pin else None
            try:
                _held = index
                if pin:
                    os.sched_setaffinity(0, {before[index % len(before)]})
                yield index
            finally:
                _held = None
                count_seconds(time.monotonic() - began)
                os.close(fd)  # drops the lock
                if before is not None:  # (a stage running samples itself goes on with its other work on all cores)
                    os.sched_setaffinity(0, set(before))
            return
        if not told and waiting is not None:
            waiting(n)
            told = True
        time.sleep(_POLL_SECONDS)
