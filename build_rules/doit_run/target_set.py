"""Outputs of targets that left the build: when a variant, chip, graph or model is taken out of models/ or
chips.toml (or a graph calibrates on fewer samples), the files its tasks made are removed at the next build, so
that out/ holds only what the build defines. A stale binary beside current ones looks current (a user's out/ had
15 .bin files after a variant was dropped, 10 of them current).

Free for a no-op build: the paths the build_rules tasks write (targets, logs, the memo beside a check or evaluate
report, folders a stage publishes as a whole) are remembered in out/.build-state/outputs-<toolchain>-<digest>.json,
named by a digest of those paths. Each build works out the digest of its own set from the loaded tasks (no file is
read) and looks that one name up (one stat): there, nothing changed. Otherwise the previous set (the other
outputs-<toolchain>-*.json) is read, what no task writes any more is removed, and the new set is saved.

Removed: only paths under out/ that a build_rules task of the previous set wrote, never out/.cache, out/.build-state,
out/.staging, the build cache folder, nor a file no task named (a user's own file, or an output of a task defined in
the user's dodo.py). The build cache keeps the outputs of cached stages: putting a variant back restores them
instead of rebuilding them. One set per toolchain (and qairt flow): a build with another toolchain names other
targets and removes nothing of the first one's. The first build with this module only records the set.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from ..build_state import layout
from ..build_state.state import OUTPUTS_PREFIX, STATE_DIR as BUILD_STATE

STATE_DIR = Path(BUILD_STATE)
PROTECTED = (".cache", ".build-state", ".staging")  # out/<these>: never removed


def own_stages() -> set[str]:
    """The task basenames build_rules defines (a row of stage_table.py with a generator, and the groups)."""
    from .. import stage_table
    return {stage.name for stage in stage_table.STAGES if stage.generators} | {"chips", "models"}


def written_paths(tasks: dict) -> list[str]:
    """Every path a build_rules task writes, in task order; a folder published as a whole ends with '/'."""
    from ..runner import run_stage
    own = own_stages()
    paths: list[str] = []
    for name, task in tasks.items():
        # The actions as the task dict gave them (doit's _actions): doit makes its action objects when first asked,
        # and a no-op never needs them (~2 us a task, ~1 ms with ten models).
        if name.split(":", 1)[0] not in own or not task._actions:
            continue
        paths += task.targets
        for target in task.targets:
            if target.endswith((".check.json", "evaluate.json")):
                paths.append(layout.memo_file(target))  # the measurement memo (and a failure's numbers)
            if target.endswith(".check.json"):
                paths.append(layout.proof_file(target))  # a reference chip's outputs on the proof samples
                paths.append(layout.proof_memo(target))  # another chip's proof of equal outputs
        for action in task._actions:
            call = _stage_call(action, run_stage)
            if call is not None and len(call[0]) >= 4:
                paths.append(call[0][3])  # the stage's log
                paths += [f"{folder.rstrip('/')}/" for folder in call[1].get("publish_dirs", ())]
    return paths


def _stage_call(action, run_stage) -> tuple | None:
    """(args, kwargs) of a run_stage action: a (callable, args, kwargs) tuple, as the task dicts give it, or an
    action object doit made; None for any other action."""
    if isinstance(action, tuple):
        if len(action) > 1 and action[0] is run_stage:
            return action[1], (action[2] if len(action) > 2 else {})
        return None
    if getattr(action, "py_callable", None) is run_stage:
        return action.args, action.kwargs
    return None


def _flavor(toolchain: dict) -> str:
    return "-".join(str(p) for p in (toolchain.get("name"), toolchain.get("flow")) if p)


def _digest(paths: list[str]) -> str:
    import xxhash
    return xxhash.xxh3_64("\0".join(paths).encode()).hexdigest()


def prune(tasks: dict, toolchain: dict, state_dir: Path = STATE_DIR) -> list[str]:
    """Remove the outputs of targets that left the build since the last build with this toolchain; returns the
    removed paths (files, and folders ending with '/'). Costs one stat when the set of targets did not change."""
    paths = written_paths(tasks)
    flavor = _flavor(toolchain)
    record = state_dir / f"{OUTPUTS_PREFIX}{flavor}-{_digest(paths)}.json"
    if record.exists():
        return []
    previous: list[str] = []
    older = sorted(state_dir.glob(f"{OUTPUTS_PREFIX}{flavor}-*.json"))
    for path in older:
        try:
            previous += json.loads(path.read_text())["paths"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a damaged record: nothing is removed on its account
    removed = _remove(previous, set(paths))
    from ..plumbing.files import atomic_write_json
    atomic_write_json(record, {"toolchain": flavor, "paths": paths})
    for path in older:
        path.unlink(missing_ok=True)
    return removed


def _removable(path: str) -> bool:
    parts = Path(path).parts
    if Path(path).is_absolute() or ".." in parts or len(parts) < 3 or parts[0] != layout.OUT:
        return False  # out/<model>/...: never out/ itself, nor anything outside it
    if parts[1] in PROTECTED:
        return False
    from ..cache import cache_root
    cache = cache_root()
    if cache is not None:
        try:
            Path(path).resolve().relative_to(cache.resolve())
            return False  # inside the build cache ($BUILD_RULES_CACHE may point into out/)
        except ValueError:
            pass
    return True


def _remove(previous: list[str], current: set[str]) -> list[str]:
    current_dirs = [p for p in current if p.endswith("/")]
    removed = []
    for path in dict.fromkeys(previous):
        if path in current or not _removable(path):
            continue
        if path.endswith("/"):
            # A published folder; kept while a current task writes into it or publishes a folder inside it.
            if any(p.startswith(path) for p in current) or any(path.startswith(d) for d in current_dirs):
                continue
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
        elif any(path.startswith(d) for d in current_dirs):
            continue  # inside a folder a current task publishes: that task owns it
        elif os.path.lexists(path) and not os.path.isdir(path):
            os.unlink(path)
            removed.append(path)
    _remove_empty_folders(removed)
    return removed


def _remove_empty_folders(removed: list[str]) -> None:
    """Folders the removal emptied, up to out/<model>/ (out/ itself stays)."""
    folders = {Path(p.rstrip("/")).parent for p in removed}
    for folder in sorted(folders, key=lambda f: -len(f.parts)):
        while len(folder.parts) >= 2 and folder.parts[0] == layout.OUT and folder.parts[1] not in PROTECTED:
            try:
                folder.rmdir()  # only when empty
            except OSError:
                break
            folder = folder.parent


def describe(removed: list[str]) -> str:
    """'out/tinynet/w8a8/SM8550/ (5 files), out/tinynet/w8a8/ (2 files)': removed files per folder."""
    per_folder: dict[str, int] = {}
    for path in removed:
        if path.endswith("/"):
            per_folder[path] = per_folder.get(path, 0)
        else:
            folder = str(Path(path).parent) + "/"
            per_folder[folder] = per_folder.get(folder, 0) + 1
    return ", ".join(f"{folder} ({count} file{'s' if count != 1 else ''})" if count else f"{folder} (folder)"
                     for folder, count in per_folder.items())
