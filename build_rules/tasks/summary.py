"""doit's console output: `[k/N]` and the time left on each started task, the progress lines of long stages,
one line for a no-op, and a short summary at the end: what ran, what was built, what was skipped, how long.

Up-to-date tasks are listed one per line (`-- name`) only with `doit -v 1` (or 2); a no-op prints one line,
as ninja's "no work to do". Output is plain lines, one per started task, on a terminal or not (CI logs).
What a run does besides printing (pruning, bytecode) is run_hooks.py's; each task's line in the build log is
build_log.py's.
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from doit.reporter import ConsoleReporter

from ..build_state import hashing, layout
from ..doit_run import collector, run_hooks
from ..plumbing import interrupt
from ..build_log import BuildLog, emulator_seconds, read_build_log
from ..doit_run.project import skipped_builds
from ..stage_table import STAGES
from ..build_state.state import BUILD_LOG


class SummaryReporter(ConsoleReporter):
    desc = "console output with [k/N], the time left and a build summary"

    def __init__(self, outstream, options):
        super().__init__(outstream, options)
        self.began = time.time()
        self.ran: list = []
        self.up_to_date = 0
        from ..runner import CACHE_HITS
        self.hits_before = len(CACHE_HITS)  # tests run several builds in one process
        self.started: dict[str, float] = {}
        self.seconds: dict[str, float] = {}  # this run's tasks
        self.build_log = BuildLog()
        self.warnings: list[str] = []
        self.notes: list[str] = []
        self.verbose = False  # doit -v 1 or 2: list the up-to-date tasks too
        # doit -n N -P thread calls execute_task from its worker threads, everything else from the main thread.
        self.lock = threading.RLock()
        self.decided: dict[str, bool] = {}  # what doit decided so far: True started, False up to date
        self.plan = None
        self.planning = False  # a worker thread is making the plan (skip_uptodate)
        self.held_lines: list = []  # up-to-date tasks to list (doit -v 1) when the plan is made
        self.tasks, self.selected = {}, []
        self.removed: list[str] = []  # outputs of targets that left the build (target_set.py)
        self.phone_lines: list[str] = []  # a line per device task that ran (device/console.py)

    def write(self, text):
        with self.lock:
            self.outstream.write(text)
            self.outstream.flush()  # a line as it happens, also into a pipe (CI logs)

    def initialize(self, tasks, selected_tasks):
        self.tasks, self.selected = tasks, list(selected_tasks)
        from ..plumbing import progress
        progress.console = self.write  # before doit -P process forks its workers
        self.removed, warnings = run_hooks.start(tasks)
        self.warnings += warnings

    def execute_task(self, task):
        from ..doit_run.plan import Plan, counted
        with self.lock:  # holds other tasks' starts while the plan is made: it must see no work begun
            hashing.forget_stats()  # files change from here on
            if interrupt.received:  # Ctrl-C / SIGTERM: nothing more to say but the one line
                return
            collector.resume()  # a build: the checks are over for the tasks it starts now (collector.py)
            now = time.time()
            if not counted(task):  # a group, or a hidden task: doit prints no line for it either
                if task.actions:
                    self.started[task.name] = now
                return
            self.decided[task.name] = True
            if self.plan is None:
                from doit import Globals  # doit's dependency manager for this run: the status check that counts N
                self.planning = True
                self.plan = Plan(self.tasks, self.selected, Globals.dep_manager, self.decided, read_build_log(),
                                 emulator_seconds())
                self.planning = False
                for skipped in self.held_lines:
                    super().skip_uptodate(skipped)
                self.held_lines = []
                self.write(_toolchain_line() + "\n")  # once a build, before its first task line
                self.write(f"{len(self.plan.to_run)} task(s) to run{self._estimate(now)}\n")
            self.started[task.name] = now
            k, n = self.plan.start(task.name)
            left = self.plan.time_left(self.started, now)
            suffix = ""  # none: no build log yet, or less than a second
            if left is not None and left >= 1:
                guessed = self.plan.guessed(self.started)
                unknown = len(self.plan.not_estimated(self.started))
                suffix = f"  ({_duration(left)} left" + (f", {guessed} guessed from other tasks" if guessed else "") \
                    + (f", {unknown} not counted" if unknown else "") + ")"
            self.write(f".  [{k}/{n}] {task.title()}{suffix}\n")

    def _estimate(self, now: float) -> str:
        """', about 2 min 06 s by <build log>' and what that rests on: cache hits, tasks timed by others, and the
        tasks of a kind never run here, which it does not count (' (tune:m/v never ran here, nor any tune task: no
        estimate for it)')."""
        left = self.plan.time_left(self.started, now)
        unknown = self.plan.not_estimated(self.started) if self.plan.seconds or self.plan.restore_seconds else []
        kinds = sorted({self.plan.kind(n).split(" (")[0] for n in unknown})
        named = ", ".join(kinds[:4]) + (f" and {len(kinds) - 4} more" if len(kinds) > 4 else "")
        never = "" if not unknown else \
            f"{unknown[0]} never ran here, nor any {kinds[0]} task: no estimate for it" if len(unknown) == 1 else \
            f"{len(unknown)} tasks of stages that never ran here ({named}): no estimate for them"
        if left is None:
            return f" ({never})" if never else ""
        hits, guessed = len(self.plan.hits), self.plan.guessed(self.started)
        judged = len(self.plan.remembered)
        basis = ([f"{hits} in the build cache"] if hits else []) + \
            ([f"{judged} judged again on remembered numbers, without the emulator"] if judged else []) + \
            ([f"{guessed} never ran here: each counted as the median of its stage"] if guessed else []) + \
            ([never] if never else [])
        return f", about {_duration(left)} by {BUILD_LOG}" + (f" ({'; '.join(basis)})" if basis else "")

    def add_success(self, task):
        if task.actions:
            self.ran.append(task)
            self.warnings += task.values.get("warnings", [])  # e.g. quantize: an output clamped by an activation
            self.notes += task.values.get("notes", [])  # e.g. quantize: int4 weights the HTP refuses, kept at 8 bit
            self.phone_lines += task.values.get("phone_summary", [])  # device_check, profile, power
            from ..runner import CACHE_HITS
            restored = task.name in CACHE_HITS[self.hits_before:]
            self._log(task, "restored" if restored else "ran",
                      0.0 if restored else task.values.get("emulator_seconds", 0.0))

    def add_failure(self, task, fail):
        from doit.exceptions import UnmetDependency
        if interrupt.received:  # a stage the interrupt stopped (a worker thread's, under -P thread)
            return
        if isinstance(fail, UnmetDependency):  # doit --continue: a task that needs a failed one (one line, no block)
            self.failures.append({"task": task, "exception": fail})
            if task.actions:
                self.write(f"   not run: {task.name} (it needs {', '.join(fail.message.split())}, which failed)\n")
            return
        super().add_failure(task, fail)
        self._log(task, "failed")

    def _log(self, task, how: str, emulator_seconds: float = 0.0) -> None:
        with self.lock:
            start = self.started.pop(task.name, None)
        if start is None:
            return
        seconds = time.time() - start
        self.seconds[task.name] = seconds
        self.build_log.add(start, seconds, how, task.name, emulator_seconds)

    def skip_uptodate(self, task):
        if self.planning:
            # `doit -n N -P thread`: a worker started its task and makes the plan while doit's main thread checks
            # the next tasks and starts the other workers, which the plan counts (plan.workers); waiting here would
            # hold them back. The plan's own status check decides this task as doit did.
            self.decided[task.name] = False
            if task._actions:
                self.up_to_date += 1
            if (task.verbosity or 0) >= 1:
                self.verbose = True
                self.held_lines.append(task)  # its `-- name` line once the plan is made (writing takes the lock)
            return
        else:
            with self.lock:
                self.decided[task.name] = False
                if self.plan is not None:
                    self.plan.skip(task.name)
                if task._actions:  # (not task.actions: doit would make the action objects a no-op never uses)
                    self.up_to_date += 1
        if (task.verbosity or 0) >= 1:
            self.verbose = True
            super().skip_uptodate(task)

    def complete_run(self):
        run_hooks.end(bool(self.ran))
        collector.resume()  # for in-process runs; a process exits next
        if interrupt.received:
            self._interrupted()
            return
        # Failures were written when they happened (add_failure); the stage's own output is in its log,
        # so doit's empty "<stderr>/<stdout>" blocks are left out.
        if self.runtime_errors:
            self.write("Execution aborted.\n" + "\n".join(self.runtime_errors) + "\n")
        from doit.exceptions import UnmetDependency
        failed = sum(not isinstance(f["exception"], UnmetDependency) for f in self.failures)
        # doit --continue: the tasks that need a failed one end as UnmetDependency (groups too: not counted)
        blocked = sum(isinstance(f["exception"], UnmetDependency) and bool(f["task"].actions) for f in self.failures)
        from ..runner import CACHE_HITS
        restored = len(CACHE_HITS) - self.hits_before
        no_work = not (self.ran or self.failures or self.runtime_errors)
        self.write(f"summary: {len(self.ran)} task(s) ran"
                   + (f" ({restored} restored from the build cache)" if restored else "")
                   + f", {self.up_to_date} up to date" + (f", {failed} failed" if failed else "")
                   + (f", {blocked} not run (they need a failed task)" if blocked else "")
                   + ("; no work to do" if no_work else "") + "\n")
        if self.removed:
            from ..doit_run.target_set import describe
            self.write(f"  removed {sum(not p.endswith('/') for p in self.removed)} output(s) of targets no longer in "
                       f"models/ or chips.toml: {describe(self.removed)}\n")
        if no_work and not self.verbose:
            return  # one line, as ninja's "no work to do" (the notes were shown when the build ran)
        not_run = self._not_run() if failed else 0
        if not_run:
            self.write(f"  {self._stopped(not_run)}\n")
        for line in self._results():
            self.write(f"  {line}\n")
        for line in self.phone_lines:
            self.write(f"  {'phone':<11} {line}\n")
        for task in sorted(self.ran, key=lambda t: t.name):
            if task.name.startswith("report:"):  # where to read it
                pages = [t for t in task.targets if t.endswith((".md", ".png"))]
                self.write(f"  {'report':<11} {' and '.join(pages)}\n" if pages else "")
            if task.name.startswith("dist:"):  # bundles; with [dist] multi_soc its size beside the per-chip sum
                from ..dist import describe
                self.write("".join(f"  {line}\n" for t in task.targets if t.endswith("index.json") for line in describe(t)))
        for warning in dict.fromkeys(self.warnings):  # once: an fp16 lint finding is the same for every chip
            self.write(f"  warning: {warning}\n")
        for note in [*dict.fromkeys(self.notes), *skipped_builds()]:
            self.write(f"  note: {note}\n")
        if self.seconds:
            slowest = sorted(self.seconds.items(), key=lambda kv: -kv[1])[:3]
            self.write(f"  wall time {_duration(time.time() - self.began)}; slowest: "
                       + ", ".join(f"{name} {_duration(s)}" for name, s in slowest) + "\n")


    def _interrupted(self) -> None:
        """One line for Ctrl-C / SIGTERM (interrupt.py): what finished is kept, what was running stopped."""
        with self.lock:
            stopped = sorted(n for n in self.started if self.plan is not None and n in self.plan.started)
            interrupt.reported = True
            self.write(f"interrupted ({interrupt.received}): {len(self.ran)} task(s) finished and kept"
                       + (f", stopped {', '.join(stopped)}" if stopped else "")
                       + "; `doit` again goes on from there\n")

    def _results(self) -> list[str]:
        """Every variant x chip of the models this run worked on, with its last known result and what this run did
        with it (built now, up to date, failed now, not run now, or from an earlier build). Reads small JSON files
        only: the manifests, and the check and evaluate reports (or a failure's memo: build_rules/build_state/results.py)."""
        from doit.exceptions import UnmetDependency

        from ..doit_run.project import project, variant_builds
        worked_on = {t.name.split(":", 1)[-1].split("/", 1)[0].split("@", 1)[0]
                     for t in [*self.ran, *(f["task"] for f in self.failures)]
                     if ":" in t.name and t.name.split(":", 1)[0] not in TUNING_STAGES + DEVICE_STAGES}
        failed = {f["task"].name for f in self.failures if not isinstance(f["exception"], UnmetDependency)}
        blocked = {f["task"].name for f in self.failures if isinstance(f["exception"], UnmetDependency)}
        ran = {t.name for t in self.ran}
        lines = []
        for model in project().models:
            if model.name not in worked_on:
                continue
            never: dict[str, list[str]] = {}  # variant -> chips never built, not touched now: one line per variant
            for variant, chip in variant_builds(model):
                pair = f"{model.name}/{variant.name}@{chip.name}"
                package = f"package:{pair}"
                failed_here = sorted(n for n in failed if _of_pair(n, model.name, variant.name, chip.name))
                # e.g. `doit check:<target>`: the pair's checks ran, its package did not (its manifest may be older)
                of_pair = [n for n in ran if _of_pair(n, model.name, variant.name, chip.name)]
                # (only the stages that make or judge the pair's binary: a diagnose compiles binaries of its own)
                ran_here = [] if package in ran else [n for n in of_pair if n.split(":", 1)[0] in VARIANT_STAGES]
                checked_now = any(n.startswith(("check:", "evaluate:")) for n in ran_here)
                if failed_here:
                    state = "FAILED now"
                elif package in ran:
                    state = "built now"
                elif ran_here:
                    state = "checked now" if checked_now else "compiled now"
                elif any(n.startswith("diagnose:") for n in of_pair):
                    state = "diagnosed now"
                elif package in blocked:
                    state = "not run now"
                elif self.decided.get(package) is False:
                    state = "up to date"
                else:
                    state = "earlier"
                described = describe_pair(model, variant.name, chip.name, failed_here, fresh_checks=bool(ran_here))
                if described is None and state == "earlier":
                    never.setdefault(variant.name, []).append(chip.name)
                    continue
                described = described or f"{layout.chip_dir(model.name, variant.name, chip.name)}: not built yet"
                lines.append(f"{state:<11} {described}")
            lines += [f"{'not built':<11} {layout.model_dir(model.name)}/{variant}/: {', '.join(chips)}"
                      for variant, chips in never.items()]
        return lines

    def _stopped(self, not_run: int) -> str:
        """The failure that stopped the build (without --continue) and what it kept from running: 'stopped at the
        first failure, compile:m/g/w4a16@SM8750 (its message above): 43 planned task(s) not run, of variants fp16,
        w8a16 too; ...'."""
        from doit.exceptions import UnmetDependency
        first = next(f["task"].name for f in self.failures if not isinstance(f["exception"], UnmetDependency))
        waiting = self.plan.to_run - self.plan.started - {f["task"].name for f in self.failures}
        variants = sorted({_variant_of(name) for name in waiting if name.split(":", 1)[0] in VARIANT_STAGES}
                          - {_variant_of(first)})
        others = f", of variant(s) {', '.join(variants)} too" if variants else ""
        return (f"stopped at the first failure, {first} (its message above): {not_run} planned task(s) not run"
                f"{others}; `{self._continue_command()}` builds everything that does not need the failed task")

    def _continue_command(self) -> str:
        """The run again with --continue, in the form doit takes: its options before the task names (`doit dist
        --continue` is refused: 'option --continue not recognized'). The default tasks (plain `doit`) need no name."""
        import shlex

        from ..doit_run.project import project
        named = [] if self.selected == [m.name for m in project().models] else self.selected
        return " ".join(["doit", "--continue", *(shlex.quote(name) for name in named)])

    def _not_run(self) -> int:
        """Planned tasks that never started because doit stopped at a failure. Under --continue doit reports every
        one it does not run (a task that needs the failed one, as not run), so none is left over."""
        if self.plan is None:
            return 0
        reported = {f["task"].name for f in self.failures}
        return len(self.plan.to_run - self.plan.started - reported)


def _toolchain_line() -> str:
    from .. import toolchains
    from ..doit_run.project import project
    return toolchains.line(project().toolchain, project().toolchain_why)


def _duration(seconds: float) -> str:
    from ..plumbing.progress import format_seconds
    return format_seconds(seconds)


TUNING_STAGES = ("report", "sensitivity", "tune")  # they build no binary: the summary lists no results for them
# stages whose tasks are named <model>/.../<variant>[@<chip>]: a stopped build names the variants they were of
VARIANT_STAGES = ("size", "quantize", "aimet", "fp16_lint", "compile", "check", "evaluate", "package")


def _variant_of(task: str) -> str | None:
    """The variant of a task named <stage>:<model>/.../<variant>[@<chip>] (quantize, compile, check, package, ...)."""
    parts = task.split(":", 1)[-1].split("/")
    return parts[-1].split("@", 1)[0] if len(parts) > 1 else None


# the phone stages (tasks/device.py): their own `phone` lines, not the model's emulator results
DEVICE_STAGES = tuple(s.name for s in STAGES if any(g.startswith("device:") for g in s.generators.values()))


def _of_pair(task: str, model: str, variant: str, chip: str) -> bool:
    """Whether a task (compile:m/g/v@c, check:..., evaluate:m/v@c, package:m/v@c) works on this variant x chip."""
    name = task.split(":", 1)[-1]
    return name.startswith(f"{model}/") and name.endswith(f"{variant}@{chip}") and \
        name[:-len(f"{variant}@{chip}")].endswith("/")


def describe_pair(model, variant: str, chip: str, failed_tasks: list[str] = (), fresh_checks: bool = False) -> str | None:
    """One variant x chip's last known result: the manifest's numbers when it was packaged since its checks last
    failed (and no check ran after it: `fresh_checks`); else each graph's binary size and check result, a failed gate
    marked with its message. None: nothing of it was built or checked yet."""
    from ..build_state import results
    folder = layout.chip_dir(model.name, variant, chip)
    checks = {g: results.last(layout.chip_file(model.name, variant, chip, f"{g}.check.json")) for g in model.graphs}
    evaluation = results.last(layout.chip_file(model.name, variant, chip, "evaluate.json")) if model.evaluate else None
    failures = [g for g, r in checks.items() if r and r["passed"] is False]
    if evaluation and evaluation["passed"] is False:
        failures.append("model")
    manifest = Path(folder, "manifest.json")
    if not failures and not failed_tasks and not fresh_checks and manifest.is_file():
        return _describe(str(manifest))
    from .split import units  # a split graph: its parts' binaries, summed
    parts = []
    for graph, result in checks.items():
        try:
            size = sum(os.stat(layout.chip_file(model.name, variant, chip, f"{unit}.bin")).st_size
                       for unit in units(model, model.graphs[graph]))
            size = f"{size / 1e6:.2f} MB"
        except OSError:
            size = "no binary"
        failed = result is not None and result["passed"] is False  # its gate's message says whose numbers they are
        parts.append(f"{graph} {size} {_result_text(result)}{'' if failed else _notes(result)}")
    if evaluation:
        failed = evaluation["passed"] is False
        parts.append(f"model {_result_text(evaluation, 'metrics')}{'' if failed else _notes(evaluation)}")
    pair = f"{variant}@{chip}"
    explained = {f"evaluate:{model.name}/{pair}" if g == "model" else f"check:{model.name}/{g}/{pair}"
                 for g in failures}  # gate failures: their numbers are shown
    other = [t for t in failed_tasks if t not in explained]
    if other:  # e.g. a compile that QNN refused: its message is above
        parts.append(f"{', '.join(other)} failed (see above)")
    if not any(checks.values()) and not evaluation and not other:
        return None
    return f"{folder}: " + ", ".join(parts)


def _result_text(result: dict | None, metrics_key: str = "summary") -> str:
    if result is None:
        return "not checked"
    if result["passed"] is None:
        return "(check not run)"
    metrics = result.get(metrics_key) or {}
    if result["passed"] is False:
        # The gate's own message (metric, value, bound, gap): the first line, without the task name.
        message = str(result.get("error", "")).splitlines()[0] if result.get("error") else ""
        message = message.split(": ", 1)[1] if ": " in message else message
        return f"FAILED: {message.removeprefix('gate failed: ')}"
    shown = list(dict.fromkeys(r["metric"] for r in result.get("gated") or [])) or ["cosine"]  # each gated value
    return " ".join(f"{m} {metrics[m]:.4g}" for m in shown if isinstance(metrics.get(m), (int, float)))


def _lpbq_text(manifest_path: str, graph: str) -> str:
    """'LPBQ 3 of 4 weights' when the graph's binary runs block-quantized weights (its compile report says)."""
    from ..quantization.block_quant import describe
    try:
        report = json.loads((Path(manifest_path).parent / f"{graph}.compile.json").read_text())
    except (OSError, ValueError):
        return ""
    return describe(report.get("weight_encodings"))


def _notes(info: dict | None, extra: str = "") -> str:
    """What a graph's check or manifest entry adds after its numbers: the chip its metrics were measured on when its
    outputs equal that chip's, what its binary runs in float and `extra` (its LPBQ weights)."""
    from ..toolchains.qnn_graph import describe as describe_float_ops
    if not info:
        return ""
    text = ""
    if info.get("equal_to"):
        text += f" (equal to {info['equal_to']['chip']} on {info['equal_to']['samples']} samples)"
    # a quantized variant that is partly float; its LPBQ weights
    bracket = ", ".join(t for t in (describe_float_ops(info.get("float_ops")), extra) if t)
    return text + (f" [{bracket}]" if bracket else "")


def _describe(manifest_path: str) -> str:
    try:
        manifest = json.loads(Path(manifest_path).read_text())
    except (OSError, ValueError):
        return manifest_path
    parts = []
    for graph, info in manifest["graphs"].items():
        gate_text = ""
        if info.get("check") == "not run":  # qairt without qnn-net-run: no metric was measured
            gate_text = " (check not run)"
        else:
            values = []
            for metric in dict.fromkeys(r["metric"] for r in info.get("gated", [])):  # every gated value, once
                value = f"{metric} {info['metrics'].get(metric, float('nan')):.4g}"
                if metric in info.get("worst_output", {}):  # several outputs: the one that sets the value
                    value += f" (worst: {info['worst_output'][metric]})"
                values.append(value)
            gate_text = "".join(f" {v}" for v in values)  # "cosine 1 sqnr 41.2": graphs are split by commas
        pieces = f" in {len(info['parts'])} parts" if info.get("parts") else ""  # a split graph
        parts.append(f"{graph} {info['bytes'] / 1e6:.2f} MB{pieces}{gate_text}"
                     f"{_notes(info, _lpbq_text(manifest_path, graph))}")
    evaluation = manifest.get("evaluate")
    if evaluation and evaluation.get("gated"):  # the model-level metrics, e.g. WER of encoder + decoder
        parts.append("model " + " ".join(f"{m} {evaluation['metrics'].get(m, float('nan')):.4g}"
                                          for m in dict.fromkeys(r["metric"] for r in evaluation["gated"]))
                     + _notes({"equal_to": evaluation.get("equal_to")}))
    return f"{Path(manifest_path).parent}: " + ", ".join(parts)

