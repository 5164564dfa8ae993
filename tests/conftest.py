"""Shared fixtures: throwaway copies of a model repo, and doit runs that report which tasks ran."""
from __future__ import annotations

import contextlib
import io
import os
import re
import runpy
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEST_MODELS = Path(__file__).resolve().parent / "models"


@dataclass
class DoitRun:
    code: int
    output: str
    ran: set[str]         # tasks whose actions executed (".  [k/N] name" lines)
    up_to_date: set[str]  # tasks doit skipped ("-- name" lines: listed at verbosity 1, which run_doit sets)

    def ran_stage(self, stage: str) -> set[str]:
        return {t for t in self.ran if t.startswith(stage + ":")}


def run_doit(repo: Path, *args: str) -> DoitRun:
    """Run doit in-process on a repo, as the `doit` command would (cwd = the dodo file's folder)."""
    from doit.cmd_base import ModuleTaskLoader
    from doit.doit_cmd import DoitMain

    from build_rules import collector, tasks
    from build_rules.hashing import stat_cache

    old_cwd = os.getcwd()
    os.chdir(repo)
    tasks.project.cache_clear()  # config is re-read on every run, like a new doit process
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                namespace = runpy.run_path(str(repo / "dodo.py"))
            except SystemExit as e:  # the build file refused to load (config error)
                code = e.code
            else:
                # doit binds sys.stdout as the reporter's default stream at import: hand it ours. Verbosity 1
                # lists the up-to-date tasks (`doit -v 1`); a test passing "-v", "0" sees what a user sees.
                namespace["DOIT_CONFIG"] = dict(namespace["DOIT_CONFIG"], outfile=out, verbosity=1)
                code = DoitMain(ModuleTaskLoader(namespace), config_filenames=()).run(list(args))
        stat_cache().save()
    finally:
        os.chdir(old_cwd)
        tasks.project.cache_clear()
        collector.resume()  # a `doit list` run leaves collection paused (its process would exit next)
    text = out.getvalue()
    ran = set(re.findall(r"^\.  \[\d+/\d+\] (\S+)", text, re.M))
    skipped = set(re.findall(r"^-- (\S+)$", text, re.M))
    return DoitRun(code, text, ran, skipped)


def make_repo(dest: Path, models: dict[str, Path], chips: str | None = None) -> Path:
    """A model repo as a user has it: dodo.py, chips.toml and models/<name>/ (copied)."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "dodo.py", dest / "dodo.py")
    (dest / "chips.toml").write_text(chips if chips is not None else (ROOT / "chips.toml").read_text())
    for name, source in models.items():
        shutil.copytree(source, dest / "models" / name)
    return dest


def write_tinynet_checkpoints(folder: Path, seed: int = 0) -> None:
    import torch
    namespace = runpy.run_path(str(folder / "hooks.py"))
    torch.manual_seed(seed)
    for graph, cls in namespace["modules"]().items():
        torch.save(cls().state_dict(), folder / f"{graph}.pt")


@pytest.fixture(scope="session")
def built_tinynet(tmp_path_factory) -> Path:
    """The tiny two-graph model, fully built once; tests take copies of it."""
    repo = make_repo(tmp_path_factory.mktemp("tinynet-built"), {"tinynet": TEST_MODELS / "tinynet"})
    write_tinynet_checkpoints(repo / "models" / "tinynet")
    result = run_doit(repo)
    assert result.code == 0, result.output
    return repo


@pytest.fixture
def tinynet_repo(built_tinynet, tmp_path) -> Path:
    """A private copy of the built tiny repo (mtimes kept, so the copy is up to date)."""
    copy = tmp_path / "repo"
    shutil.copytree(built_tinynet, copy, symlinks=True)
    return copy


# Imported by every Python process started with the fixture's PYTHONPATH (the stage processes): records each
# context model opened on the HTP emulator (check, evaluate, report, dist verify all open them with this function).
EMULATOR_SPY = '''
import os
from build_rules.toolchains import ort_qnn

_open = ort_qnn.open_context_binary


def _recorded(ctx_model, *args, **kwargs):
    with open(os.environ["BUILD_RULES_TEST_EMULATOR_LOG"], "a") as log:
        log.write(f"{ctx_model}\\n")
    return _open(ctx_model, *args, **kwargs)


ort_qnn.open_context_binary = _recorded
'''


@pytest.fixture
def emulator_sessions(tmp_path, monkeypatch):
    """A function returning the context models the stage processes opened on the HTP emulator so far (a binary whose
    outputs on the samples are in the emulator output memo is not opened: out/.build-state/emulator-outputs)."""
    spy = tmp_path / "emulator-spy"
    spy.mkdir()
    (spy / "sitecustomize.py").write_text(EMULATOR_SPY)
    log = tmp_path / "emulator-sessions.log"
    log.write_text("")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(spy), str(ROOT), os.environ.get("PYTHONPATH"))
                                                     if p))
    monkeypatch.setenv("BUILD_RULES_TEST_EMULATOR_LOG", str(log))
    # one emulator worker: a session opened is then a measurement (with more, each worker opens the binary once)
    monkeypatch.setenv("BUILD_RULES_EMULATOR_WORKERS", "1")
    return lambda: log.read_text().splitlines()
