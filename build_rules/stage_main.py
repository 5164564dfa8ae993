"""Entry point of a stage process: python -m build_rules.stage_main <stage> <staging folder>.

Reads params.json from the staging folder, calls build_rules.stages.<stage>.run(params) and writes
result.json: {"values": {...}} on success, {"error": "..."} for a BuildError (a message meant for
the user; no traceback). Any other exception prints its traceback to the log and exits non-zero.
"""
import errno
import importlib
import json
import sys
from pathlib import Path

from .emulator import emulator_slots
from .plumbing import progress
from .errors import BuildError


def main(stage: str, staging: str) -> int:
    folder = Path(staging)
    params = json.loads((folder / "params.json").read_text())
    progress.start()  # a line in the log (and on the console) every ~20 s while the stage runs
    module = importlib.import_module(f"build_rules.stages.{stage}")
    try:
        values = module.run(params) or {}
    except BuildError as e:
        return _fail(folder, str(e))
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        return _fail(folder, f"{params.get('name', stage)}: no space left on device while writing "
                             f"{e.filename or 'an output'} ({e.strerror}); free space under {folder.parent} "
                             "and run doit again")
    seconds = emulator_slots.session_seconds()
    if seconds:  # the slot-seconds this task took of the machine's emulator slots: the build log keeps them (plan.py)
        values = dict(values, emulator_seconds=round(seconds, 3))
    (folder / "result.json").write_text(json.dumps({"values": values}))
    return 0


def _fail(folder: Path, message: str) -> int:
    print(f"error: {message}", flush=True)
    try:
        (folder / "result.json").write_text(json.dumps({"error": message}))
    except OSError:
        pass  # the disk may be full: the runner falls back to the exit code and the log
    return 2


def _end(code: int) -> None:
    """Ends the stage process without tearing its interpreter down: the atexit handlers run (the scratch folders'
    weakref.finalize, logging's flush) and stdio is flushed, as at any exit; then the process ends. The teardown
    (every module's objects released, a last collection) is what a process that ends anyway need not do: in a child
    of the torch fork server it was ~0.16 s of CPU, most of a small export's or verify's (docs/benchmarks.md)."""
    import atexit
    import os
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    _end(main(*sys.argv[1:]))
