"""The task graph: what dodo.py imports (`from build_rules.tasks import *`): one doit creator task_<stage> per row of
stage_table.STAGES, in the pipeline's order (`doit list` sorts them by name; each line starts with its number in
that order), the groups, and doit_config().

A stage's task generator is named in its row, per toolchain; the modules here, in the pipeline's order:
  pipeline.py   float graph (data, export, simplify, verify), quantization (calibrate, calibration_stats,
                quantize, fp16_lint), compile and check (compile, check, evaluate, package), the chip/model groups
  split.py      size and split (a graph cut into parts; the size budget)
  aimet.py      aimet (QuantSim's QDQ model and encodings)
  qairt.py      the qairt toolchain's stages (convert, model_libs, htp_config, compile, check, package, ...)
  tuning.py     report, sensitivity, tune
  diagnose.py   diagnose
  dist.py       multi_soc, shared_context, dist
Besides them, summary.py: doit's console output (the reporter doit_config names; it reads split.py's units).
The code a task runs is its worker, build_rules/stages/<module>.py, also named in the row.

This module imports no generator module at load: a creator imports its own when doit calls it. Loading must stay
light (no torch, onnx, onnxruntime, not even numpy): every heavy stage runs in its own process via runner.run_stage.
"""
from __future__ import annotations

import importlib
import os
import sys

from .. import stage_table
from ..doit_run import collector
from ..plumbing import interrupt, progress
from ..configuration.config import ConfigError
from ..device import named
from ..build_state.hashing import ContentChecker, use_key_digests, use_stat_cache
from ..doit_run.project import project
from ..build_state.state import DOIT_DB, KEY_DIGESTS, STAT_CACHE, STATE_DIR
from ..runner import remove_stale_staging


def _generate(stage: str):
    where = stage_table.generator(stage, project().toolchain["name"])
    if where is None:
        return None  # a stage this toolchain does not have (convert under ort-qnn, calibration_stats under qairt)
    module, function = where.split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), function)()


def _group(generator: str, doc: str):
    module, function = generator.split(":")

    def creator():
        return getattr(importlib.import_module(f"{__name__}.{module}"), function)()
    creator.__doc__ = doc
    return creator


def _creator(stage: stage_table.Stage):
    def creator():
        return _generate(stage.name)
    creator.__doc__ = stage.doc  # the stage's line in `doit list`
    return creator


# What dodo.py imports: every stage's creator in pipeline order, the groups, and the doit configuration.
__all__ = ["doit_config"]
for _stage in stage_table.STAGES:
    if _stage.generators:
        globals()[f"task_{_stage.name}"] = _creator(_stage)
        __all__.append(f"task_{_stage.name}")
task_chips = _group("pipeline:_chips_tasks", "Per-chip groups: `doit SM8750` builds every model for that chip only")
task_models = _group("pipeline:_models_tasks", "Per-model groups: `doit mtcnn` builds that model for all its chips")
__all__ += ["task_chips", "task_models"]

# doit sorts task creators by their line number, from inspect.getsourcelines(), which tokenizes each creator's source
# (~7 ms of every load, most of it compiling tokenize's patterns). __all__ is in pipeline order already: pointing
# each creator's __wrapped__ (which inspect follows) at this module gives line 0 without reading any source, and
# the stable sort keeps __all__'s order (`doit list`, and a user's own task_ functions after these).
for _name in __all__:
    if _name.startswith("task_"):
        globals()[_name].__name__ = globals()[_name].__qualname__ = _name
        globals()[_name].__wrapped__ = sys.modules[__name__]


def _warn_about_devices() -> None:
    """A mistake in devices.toml leaves that phone's tasks out and fails nothing else (issue 37): one line each."""
    for problem in named.device_file().problems.values():
        print(f"warning: {problem} (its device tasks are left out)", file=sys.stderr)


def _check_settings() -> None:
    """The build's numeric settings (BUILD_RULES_*, read by its stages and workers as they run): a bad one is its
    one line before any task runs, not a failure in the middle of the build."""
    from ..emulator import emulator_memo, emulator_runs, emulator_slots, repeats
    from .diagnose import evaluation_samples as diagnose_samples
    for read in (emulator_slots.limit, emulator_runs.inline_seconds, emulator_memo.limit_bytes,
                 repeats.samples_to_check, progress.interval, diagnose_samples):
        try:
            read()
        except ValueError as e:
            raise ConfigError(str(e)) from None


def doit_config() -> dict:
    from .summary import SummaryReporter
    try:
        models = project().models
        if os.environ.get("BUILD_RULES_REMOTE_CACHE", "").strip():  # remote_cache.ENV (its module is not light)
            from ..build_state import remote_cache
            remote_cache.settings()  # a malformed remote cache setting stops the build before any task runs
        _check_settings()
        if named.device_file().found:  # the phone tasks' settings, read while their tasks are made
            from ..device.settings import check_settings
            check_settings()
    except ConfigError as e:
        # A config mistake is the user's to fix: the message, not a traceback through doit's loader.
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(3) from None
    _warn_about_devices()
    os.makedirs(STATE_DIR, exist_ok=True)
    named.install()  # a device task of a phone devices.toml does not name well: why, not "Invalid parameter"
    interrupt.install()  # Ctrl-C and SIGTERM: state kept, one line, stages stopped
    remove_stale_staging()
    use_stat_cache(STAT_CACHE)
    use_key_digests(KEY_DIGESTS)
    collector.pause()  # no garbage collection while doit loads and checks the tasks (collector.py)
    return {
        "default_tasks": [m.name for m in models],
        "check_file_uptodate": ContentChecker,
        # doit's own backends write once, at exit (a kill -9 forgets every finished task), and its
        # default dbm is dbm.dumb on many Pythons: build_rules/journal.py commits per change and
        # lets one doit at a time work on a repo.
        "backend": "build_rules_journal",
        "dep_file": DOIT_DB,
        "reporter": SummaryReporter,
        "verbosity": 0,
        "sort": "definition",  # `doit list` in pipeline order
    }
