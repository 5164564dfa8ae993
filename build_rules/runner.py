"""Runs one stage in its own Python process and publishes its outputs atomically.

Why a process per stage: QNN libraries can crash natively, torch and onnxruntime are heavy to
import, and doit itself must stay light. The process is forked from the fork server where it can be
(plumbing/fork_server.py: numpy and onnx, and torch for the stages that use it, imported once a run).
The stage writes into a private staging folder under out/.staging; only when it succeeded are its
files moved onto the targets (same file system, so each move is atomic). A failed or interrupted
stage leaves the old targets or none, never a half file. The stage's stdout and stderr go to a log
beside its outputs.
"""
from __future__ import annotations

import json
import os
import subprocess
import threading
import uuid
from pathlib import Path

from doit.exceptions import TaskFailed

from . import stage_table
from .plumbing import fork_server
from .plumbing.files import publish, remove_quietly, replace_folder
from .plumbing.native_stderr import EMULATOR_NOISE

STAGING = Path("out/.staging")
PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent)


# Tasks whose outputs came from the build cache in this process (the summary reports them).
CACHE_HITS: list[str] = []


def run_stage(stage: str, params: dict, targets: list[str], log: str, publish_dirs: tuple = (),
              cache_key=None, file_dep: tuple = (), relocatable: bool = False, names: dict | None = None):
    """doit action: run build_rules.stages.<stage>.run(params) in a subprocess.

    params["outputs"] maps names to target paths; the stage sees them rewritten into its staging
    folder (params["final_outputs"] keeps the real ones, for files that name other files).
    publish_dirs: folders whose files are not known in advance (a data hook's output): the staged
    folder replaces the old one as a whole.
    cache_key: the task key (hashing.TaskKey, or its digest); with the content digests of file_dep it
    names the outputs in the build cache (build_rules/cache.py): on a hit they are copied into place and the stage does not run.
    relocatable: the key holds no paths; an entry made for other target paths with the same file names serves.
    names: what the task builds (model, graph, variant, chip) as values: the stage reads params["names"] rather
    than parse its task's name.
    """
    store, entry = None, None
    if cache_key and not publish_dirs:
        from . import cache
        store = cache.open_cache()
        if store is not None:
            from .build_state.hashing import stat_cache
            digest = cache_key if isinstance(cache_key, str) else cache_key.digest
            entry = cache.entry_key(digest, [stat_cache().digest(f, os.stat(f)) for f in file_dep])
            values = store.restore(entry, targets, log, relocatable)
            if values is not None:
                CACHE_HITS.append(params.get("name", stage))
                return values
    staging = (STAGING / f"{os.getpid()}-{uuid.uuid4().hex}").resolve()
    staging.mkdir(parents=True)
    try:
        staged = {key: str(staging / path) for key, path in params.get("outputs", {}).items()}
        job = dict(params, outputs=staged, final_outputs=params.get("outputs", {}), **({"names": names} if names else {}))
        (staging / "params.json").write_text(json.dumps(job))
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (PACKAGE_PARENT, os.environ.get("PYTHONPATH")) if p))
        from .plumbing import progress
        with open(log, "wb") as log_file:
            proc = fork_server.python_process(["-m", "build_rules.stage_main", stage, str(staging)], env=env,
                                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_server=True,
                                              preload=("torch",) if stage_table.imports_torch(stage) else ())
            copying = threading.Thread(target=_copy_output, args=(proc.stdout, log_file), daemon=True)
            copying.start()
            try:
                code = progress.follow(proc, log, params.get("name", stage))  # its progress lines on the console
            finally:
                copying.join(timeout=30)  # to the end of the output: the stage's, and its workers' (they end with it)
        try:
            result = json.loads((staging / "result.json").read_text())
        except (OSError, ValueError):
            result = {}  # no result (a crash, or a full disk): the exit code and the log tell

        if code != 0 or "error" in result:
            remove_quietly(*targets)  # an old output must not pass for the result of this failed run
            message = result.get("error") or f"stage '{stage}' exited with code {code}; last lines of {log}:\n" \
                + _tail(log)
            return TaskFailed(f"{message}\n(log: {log})")
        missing = [t for t in targets if not (staging / t).exists()]
        if missing:
            remove_quietly(*targets)
            return TaskFailed(f"stage '{stage}' did not write {', '.join(missing)} (log: {log})")
        for folder in publish_dirs:
            replace_folder(staging / folder, Path(folder))
        for target in targets:
            if (staging / target).exists():  # a target inside a published folder is already in place
                publish(staging / target, Path(target))
        values = result.get("values", {})
        if entry is not None:
            store.store(entry, targets, values, log, stage)
        return values
    finally:
        remove_quietly(staging)


NATIVE_NOISE = EMULATOR_NOISE.encode()


def _copy_output(source, log_file) -> None:
    """A stage's output (and its emulator workers', who inherit its stdout) into its log, line by line, but for the
    emulator's per-session NATIVE_NOISE line. Here, outside the stage process: a stage that crashes natively still
    leaves every line it wrote."""
    with source:
        for line in iter(source.readline, b""):
            if not line.startswith(NATIVE_NOISE):
                log_file.write(line)
                log_file.flush()


def remove_stale_staging() -> None:
    """Staging folders of a doit that was killed (its pid is gone): never published, safe to drop."""
    if not STAGING.is_dir():
        return
    for folder in STAGING.iterdir():
        pid = folder.name.split("-", 1)[0]
        if pid.isdigit() and not fork_server.alive(int(pid)):
            remove_quietly(folder)


def _tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""
