"""What this run will execute (the N of `[k/N]`) and how long that took last time (the time left).

doit decides whether a task is up to date only when it reaches it, because the tasks before it may rebuild its
inputs. So N is worked out once, when the first task starts (a no-op starts none and pays nothing): for every task
of the selection that doit has not decided yet, in dependency order, it runs if doit's own status check
(dep_manager.get_status, the judgement doit itself makes next) says so, or if a task that makes one of its file_dep
runs. That is an upper bound: an input rebuilt with the same bytes leaves its consumers up to date, and when doit
then skips one of them, N goes down by one (k counts the tasks started; a task skipped after the last start leaves
that line one short of N). The check is safe to make early: it changes nothing doit keeps, and no task has begun
its work when it runs (the reporter holds every other task's start until it is done; under `-P process` a worker
may have, but the tasks reading that task's outputs are counted anyway), so it sees the files doit's own check will
see.

The time left is the sum over the tasks still to run of their seconds in out/.build-state/build.log (the last
time each ran; a task never seen counts as the median of its stage (or of the kind its task names, see Plan.kind):
the estimate says how many; one of a kind never seen is left out, and named: Plan.unknown),
minus what the running ones have done, divided by the number of jobs. A task whose outputs the local build cache
holds (see cache_hits) counts as its last restore from the cache, a fraction of a second, not as its work. A check
that runs again on inputs its measurement memo was made from (a new gate, a failed check judged again: see
remembered) re-judges the saved numbers without the emulator: it counts as REMEMBERED_SECONDS, not as its last
measurement. Parallel work inside one task (emulator workers) shows in the seconds the log has for it; doit's own
jobs divide the sum in one place, Plan.time_left. The emulator is the other bound: the log keeps each task's emulator
sessions' seconds (a check on 2 workers for 60 s: ~120), and every task on the machine shares its emulator slots
(emulator_slots.py), so the work left cannot end before those seconds over the slots, however many jobs doit runs:
two such checks under `doit -n 2` with 2 slots take ~120 s, not the 60 s their wall times over 2 jobs would say.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

from doit.dependency import UptodateCalculator

from ..measuring import gates


class Plan:
    """dep_manager: doit's (doit.Globals.dep_manager, which doit sets for its run); None counts tasks as they start.
    doit hands reporters neither its runner nor its options, so two of them are seen as the run goes: `-a` (a task
    starts that the status check finds up to date: every task runs, see start) and `-n` (workers())."""

    def __init__(self, tasks: dict, selected: list[str], dep_manager, decided: dict[str, bool], log_rows,
                 emulator_seconds: dict[str, float] | None = None):
        self.tasks, self.selected, self.decided, self.dep_manager = tasks, selected, decided, dep_manager
        self.always = False
        self.to_run = predict(tasks, selected, _status_check(dep_manager, tasks), decided)
        # after the status checks: under -P thread the first worker reports its task while doit starts the others
        self.jobs = workers()
        self.started: set[str] = set()
        self.seconds, self.restore_seconds = last_seconds(log_rows)
        self.emulator = emulator_seconds or {}  # task -> its emulator sessions' seconds, last time it ran
        self.slots = emulator_slots_here()
        self.hits = cache_hits(tasks, self.to_run) if self.seconds or self.restore_seconds else set()
        self.remembered = remembered(tasks, self.to_run) - self.hits if self.seconds or self.restore_seconds else set()

    def start(self, name: str) -> tuple[int, int]:
        """[k/N] of a task that starts now."""
        if name not in self.to_run and not self.always and self.dep_manager is not None and \
                not _status_check(self.dep_manager, self.tasks)(self.tasks[name]):
            # doit starts a task its own check finds up to date only under `doit -a`: then every task runs
            self.always = True
            self.to_run |= predict(self.tasks, self.selected, lambda task: True,
                                   {n: True for n, run in self.decided.items() if run})
            self.hits = set()  # -a re-runs the stages themselves
            self.remembered = set()
        self.jobs = max(self.jobs, workers())
        self.started.add(name)
        self.to_run.add(name)  # a task the plan thought up to date (an uptodate that changed meanwhile)
        return len(self.started), len(self.to_run)

    def skip(self, name: str) -> None:
        """doit found a task up to date after all (an input rebuilt with the same bytes)."""
        if name not in self.started:
            self.to_run.discard(name)

    def time_left(self, running: dict[str, float], now: float | None = None) -> float | None:
        """Seconds until the planned tasks are done (None: no build recorded yet). running: name -> start time."""
        if not (self.seconds or self.restore_seconds):
            return None
        now = time.time() if now is None else now
        left = [self.estimate(n) for n in self.to_run if n not in self.started and not self.unknown(n)]
        left += [max(self.estimate(n) - (now - t0), 0.0) for n, t0 in running.items()
                 if n in self.to_run and not self.unknown(n)]
        if not left:  # nothing left, or only tasks of a kind never run here: no number rather than a wrong one
            return None if self.not_estimated(running) else 0.0
        emulator = sum(self.emulator_estimate(n) for n in self.to_run if n not in self.started)
        emulator += sum(self.emulator_estimate(n) * max(1 - (now - t0) / max(self.estimate(n), 1e-9), 0.0)
                        for n, t0 in running.items() if n in self.to_run)
        by_slots = emulator / self.slots if self.slots else 0.0
        return max(sum(left) / min(self.jobs, len(left)), by_slots, max(left))

    def emulator_estimate(self, name: str) -> float:
        """A task's emulator sessions' seconds: its last run's, or the median of its kind's (0: none, or no emulator
        run this time: a build-cache copy, or numbers judged again)."""
        if name in self.remembered or name in self.hits:
            return 0.0
        if name in self.seconds:
            return self.emulator.get(name, 0.0)
        kind = self.kind(name)
        same_kind = [self.emulator.get(n, 0.0) for n in self.seconds if self.kind(n) == kind]
        return statistics.median(same_kind) if same_kind else 0.0

    def guessed(self, running: dict[str, float]) -> int:
        """How many of the tasks left (not started, or running) never ran here: their time is another task's of
        their kind."""
        left = [n for n in self.to_run if n not in self.started] + [n for n in running if n in self.to_run]
        return sum(n not in self.hits and n not in self.remembered and n not in self.seconds and not self.unknown(n)
                   for n in left)

    def unknown(self, name: str) -> bool:
        """A task that never ran here, of a kind none of whose tasks ran here either: nothing says how long it takes
        (every task's median said 'about 3.3 s' for a first tune of 5 min 42 s), so the time left leaves it out and
        says so (not_estimated)."""
        if name in self.seconds or name in self.hits or name in self.remembered:
            return False
        kind = self.kind(name)
        return not any(self.kind(n) == kind for n in self.seconds)

    def not_estimated(self, running: dict[str, float]) -> list[str]:
        """The tasks left (not started, or running) that the time left does not count (unknown), in name order."""
        left = {n for n in self.to_run if n not in self.started} | {n for n in running if n in self.to_run}
        return sorted(n for n in left if self.unknown(n))

    def estimate(self, name: str) -> float:
        if name in self.remembered:  # re-judges the numbers its memo keeps: no emulator run
            return min(self.seconds.get(name, REMEMBERED_SECONDS), REMEMBERED_SECONDS)
        if name in self.hits:  # a copy from the build cache: the last restore's time, or a typical one
            if name in self.restore_seconds:
                return self.restore_seconds[name]
            return statistics.median(self.restore_seconds.values()) if self.restore_seconds else RESTORE_SECONDS
        if name in self.seconds:
            return self.seconds[name]
        kind = self.kind(name)
        same_kind = [s for n, s in self.seconds.items() if self.kind(n) == kind]
        return statistics.median(same_kind) if same_kind else 0.0  # (unknown: not counted)

    def kind(self, name: str) -> str:
        """What a never-run task is timed like: its stage, or the kind its task dict names in meta["estimate_as"]
        (another chip's check that proves its outputs equal to the reference chip's takes seconds, not minutes)."""
        meta = getattr(self.tasks.get(name), "meta", None) or {}
        return meta.get("estimate_as") or name.split(":", 1)[0]


RESTORE_SECONDS = 0.05  # a restore when the build log has none yet (copying a few files)
REMEMBERED_SECONDS = 1.0  # a check judging its memo's numbers: a stage process that reads them (measured 0.3-0.9 s)


def remembered(tasks: dict, to_run: set[str]) -> set[str]:
    """The planned checks whose numbers are remembered: none of their inputs is made again in this run, and their
    measurement memo (meta["memo"], stages/check.py) was measured from the binaries, evaluation set and hooks they
    have now; another chip's check (meta["proof"]) needs its proof memo made from its binary as it is, and then
    takes the reference's numbers when the proof found them equal (else its own memo counts). They run again for a new gate or key, and judge the saved numbers in a second. (A new
    measurement version, which only a new build_rules brings, is not seen here: that first estimate is low.)"""
    from ..build_state.hashing import stat_cache
    producer = {target: task.name for task in tasks.values() for target in task.targets}
    found = set()
    for name in to_run:
        task = tasks[name]
        meta = getattr(task, "meta", None) or {}
        if not meta.get("memo") or any(producer.get(f) in to_run for f in task.file_dep):
            continue  # no memo, or an input made again (its bytes may differ: measured again)
        try:
            current = {stat_cache().digest(f, os.stat(f)) for f in task.file_dep}
        except OSError:
            continue
        if meta.get("proof"):  # another chip's check: an equal proof of this binary takes the reference's numbers
            proof = _read(meta["proof"]).get("proof")
            made_from = _read(meta["proof"]).get("made_from")
            if isinstance(made_from, list) and made_from and isinstance(proof, dict) \
                    and _digests({"binary": made_from[0]}) <= current:
                if proof.get("equal"):
                    found.add(name)
                    continue
            else:
                continue  # no proof of this binary yet: it runs
        saved = _read(meta["memo"])
        made_from = _digests(saved.get("key"))
        metrics = saved.get("metrics")
        if isinstance(metrics, dict) and "partial" in metrics and gates.still_decided(metrics, meta.get("gates", [])) \
                is None:
            continue  # stopped after k of N samples, and the gates it decided changed: every sample is measured
        if made_from and made_from <= current:
            found.add(name)
    return found


def _read(path: str) -> dict:
    try:
        saved = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def _digests(key) -> set[str]:
    """The file digests a measurement key names (stages/check.py measurement_key: the binaries, the evaluation set,
    the hooks files, the data stage's record)."""
    if not isinstance(key, dict):
        return set()
    found = set()
    for field in ("ctx_model", "binary", "evaluation", "hooks", "data"):
        value = key.get(field)
        found.update(v for v in (value if isinstance(value, list) else [value]) if isinstance(v, str))
    return found


def last_seconds(rows) -> tuple[dict[str, float], dict[str, float]]:
    """(task -> seconds of the last time it ran, else failed; task -> seconds of its last restore from the cache)."""
    ran, failed, restored = {}, {}, {}
    for _, seconds, how, task in rows:
        {"ran": ran, "restored": restored}.get(how, failed)[task] = seconds
    return {**failed, **ran}, restored


def cache_hits(tasks: dict, to_run: set[str]) -> set[str]:
    """The planned tasks whose outputs the local build cache holds for the inputs they will have: files already in
    place, or the stored outputs of another hit (the cache entry records their digests). A miss makes its readers
    unknown, so they count as work; the remote tier is not asked (no network while planning)."""
    from ..cache import cache_root, entry_key
    from ..build_state.hashing import stat_cache
    root = cache_root()
    if root is None or not root.is_dir():
        return set()
    producer = {target: task.name for task in tasks.values() for target in task.targets}
    digests: dict[str, str] = {}  # target -> its digest once a hit restored it
    verdict: dict[str, bool] = {}

    def hit(name: str) -> bool:
        if name in verdict:
            return verdict[name]
        verdict[name] = False
        action = next((a for a in tasks[name].actions if (getattr(a, "kwargs", None) or {}).get("cache_key")), None)
        if action is None:
            return False
        inputs = []
        for path in action.kwargs.get("file_dep", ()):
            made_by = producer.get(path)
            if made_by in to_run:
                if not hit(made_by) or path not in digests:
                    return False
                inputs.append(digests[path])
                continue
            try:
                inputs.append(stat_cache().digest(path, os.stat(path)))
            except OSError:
                return False
        key = action.kwargs["cache_key"]
        entry = entry_key(key if isinstance(key, str) else key.digest, inputs)
        try:
            stored = json.loads((root / entry[:2] / entry / "entry.json").read_text()).get("digests") or []
        except (OSError, ValueError):
            return False
        targets = action.args[2]
        if len(stored) != len(targets):
            return False
        digests.update(zip(targets, stored))
        verdict[name] = True
        return True

    return {name for name in to_run if hit(name)}


def counted(task) -> bool:
    """The tasks doit prints a line for when they start: with actions, not hidden."""
    return bool(task.actions) and not task.name.startswith("_")


def predict(tasks: dict, selected: list[str], runs_by_itself, decided: dict[str, bool]) -> set[str]:
    """Names of the counted tasks that will run: decided ones as doit decided, the rest as above."""
    producer = {target: task.name for task in tasks.values() for target in task.targets}
    runs: dict[str, bool] = {}
    expanded = set()
    stack = [(name, False) for name in reversed(selected)]
    while stack:  # depth-first, each task after the tasks it depends on
        name, ready = stack.pop()
        if name in runs or name not in tasks or (not ready and name in expanded):  # done, unknown, or a cycle
            continue
        task = tasks[name]
        deps = list(task.task_dep) + list(task.setup_tasks)
        if not ready:
            expanded.add(name)
            stack.append((name, True))
            stack.extend((d, False) for d in reversed(deps) if d not in runs)
            continue
        if name in decided:
            runs[name] = decided[name]
        elif any(runs.get(producer.get(f), False) for f in task.file_dep):
            runs[name] = True
        else:
            runs[name] = counted(task) and runs_by_itself(task)
    return {name for name, run in runs.items() if run and counted(tasks[name])}


class SetupsCurrent(UptodateCalculator):
    """doit uptodate of a task whose inputs its setup tasks make (the report: the compiles). doit runs setup tasks
    only when the task itself is to run, and a setup task that fails under --continue does not keep it from running
    (doit 0.37 checks a task's failed dependencies before its setup tasks run, not after): so the task is up to date
    only while none of its setup tasks, nor anything they need, would run (predict, the status check that counts N).
    doit hands it its dependency manager and every task (UptodateCalculator.setup)."""

    def __init__(self, names: list[str]):
        super().__init__()
        self.names = list(names)
        self.dep_manager = None

    def setup(self, dep_manager, tasks_dict):
        super().setup(dep_manager, tasks_dict)
        self.dep_manager = dep_manager

    def __call__(self) -> bool:
        if not self.names:
            return True
        if self.dep_manager is None:  # (doit calls setup() before asking)
            return False
        return not predict(self.tasks_dict, self.names, _status_check(self.dep_manager, self.tasks_dict), {})


def _status_check(dep_manager, tasks: dict):
    def runs_by_itself(task) -> bool:
        if dep_manager is None:
            return False  # no doit state: N counts the tasks as they start
        try:
            if dep_manager.status_is_ignore(task):
                return False
            return dep_manager.get_status(task, tasks).status != "up-to-date"
        except Exception:  # doit reports the error itself when it checks the task
            return True
    return runs_by_itself


def emulator_slots_here() -> int:
    """The machine's emulator slots the work left shares; 0 (no bound) when a Ray cluster runs the binaries, or the
    setting is invalid (the first stage that runs the emulator says so)."""
    from ..emulator import emulator_ray, emulator_slots
    if emulator_ray.configured():
        return 0
    try:
        return emulator_slots.limit()
    except ValueError:
        return 0


def workers() -> int:
    """How many tasks doit runs at once (`doit -n N`): its worker processes (-P process) or threads (-P thread),
    which it starts before the first task; 1 without -n."""
    import multiprocessing
    import threading

    from doit.runner import MThreadRunner
    threads = sum(isinstance(t, MThreadRunner.DaemonThread) for t in threading.enumerate())
    return max(len(multiprocessing.active_children()), threads, 1)
