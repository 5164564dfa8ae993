"""When Python's cyclic garbage collector runs in a doit process: not while doit loads and checks the tasks.

Loading the build file and checking every task allocates ~300 container objects a task (task dicts, doit Tasks, task
keys, state entries), all alive until the process ends: no collection can free any of them, yet each young one is
traversed by collections as they pile up, and the collection at interpreter exit walks them all again. In a no-op
`doit` on 30 model folders (960 tasks) that was ~45 ms of collections during the load and ~110 ms at exit, a quarter
of its time (bench/load_profile.py, docs/benchmarks.md).

So: after the imports, the objects made so far move to the permanent generation (gc.freeze) and collection pauses;
it resumes, with the load's objects frozen too, when the first task starts (a build), and at exit everything is
frozen first so the last collection has nothing to walk. A no-op and `doit list` never collect.

Freezing makes whatever is alive then permanent, garbage included, so it happens in the first load of a process only:
a process that loads the build file many times (the tests' in-process runs) pauses and resumes collection each time
without freezing again, and resumes it after each run.
"""
from __future__ import annotations

import atexit
import gc
import os

_loads = 0


def pause() -> None:
    """After the build file's imports: freeze what they made (first load only) and pause collection."""
    global _loads
    _loads += 1
    if _loads == 1:
        gc.freeze()
        atexit.register(gc.freeze)  # runs before the collection at interpreter exit, which then walks nothing
        os.register_at_fork(after_in_child=gc.enable)  # `doit -n N -P process` workers collect as usual
    gc.disable()


def resume() -> None:
    """A task is about to run, or the run is over: collect as usual from here on (the first load's objects frozen)."""
    if not gc.isenabled():
        if _loads == 1:
            gc.freeze()
        gc.enable()
