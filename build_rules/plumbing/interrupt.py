"""Ctrl-C and SIGTERM: the build stops, keeps what finished, and says so in one line instead of a traceback.

doit saves its state only when a Python exception unwinds it (build_rules' journal keeps each finished task
anyway). Ctrl-C raises KeyboardInterrupt; SIGTERM (CI timeouts, `kill`) would end the process without one, so it
raises the same. Either also stops the running stage processes: under `doit -n N -P thread` they belong to worker
threads the exception never reaches, and would go on computing after doit is gone. The reporter (summary.py)
prints the line; sys.excepthook keeps Python's KeyboardInterrupt traceback off the console.
"""
from __future__ import annotations

import signal
import sys

received: str | None = None  # "SIGTERM" or "Ctrl-C", once one arrived during this build
reported = False  # the reporter has printed the line


def install() -> None:
    """Once per build, from doit_config (the main thread). A handler someone else installed is left alone."""
    global received, reported
    received, reported = None, False
    progress = sys.modules.get(f"{__package__}.progress")  # not imported for `doit list`
    if progress is not None:
        progress._stopping = False  # tests run several builds in one process
    for signum in (signal.SIGTERM, signal.SIGINT):
        current = signal.getsignal(signum)
        if current in (signal.SIG_DFL, signal.default_int_handler, None) or current is _interrupt:
            signal.signal(signum, _interrupt)
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = _excepthook


def _interrupt(signum, frame):
    global received
    if received is None:
        received = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
    from . import progress
    progress.stop_stages()
    raise KeyboardInterrupt(received)


def _excepthook(kind, value, traceback) -> None:
    if issubclass(kind, KeyboardInterrupt):
        if not reported:  # interrupted before any task started (e.g. while doit loaded the tasks)
            print(f"interrupted ({received or 'Ctrl-C'})", file=sys.stderr)
        return
    sys.__excepthook__(kind, value, traceback)
