"""Shared fixtures: throwaway copies of a model repo, and doit runs that report which tasks ran."""
from __future__ import annotations

import contextlib
import functools
import importlib.metadata
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
    import doit.plugin
    from doit.cmd_base import ModuleTaskLoader
    from doit.doit_cmd import DoitMain

    from build_rules import tasks
    from build_rules.doit_run import collector
    from build_rules.build_state.hashing import stat_cache

    doit.plugin.entry_points_impl = lambda: _installed_doit_plugins
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
    return doit_run(code, out.getvalue())


@functools.lru_cache(maxsize=None)
def _installed_doit_plugins(group: str) -> tuple:
    """doit's plugins of a group, as importlib.metadata lists them: doit reads them at each DoitMain.run (a scan of
    every installed distribution, ~25 ms a run here), the same in every run of a test process."""
    return tuple(importlib.metadata.entry_points(group=group))


def doit_run(code: int, text: str) -> DoitRun:
    ran = set(re.findall(r"^\.  \[\d+/\d+\] (\S+)", text, re.M))
    skipped = set(re.findall(r"^-- (\S+)$", text, re.M))
    return DoitRun(code, text, ran, skipped)


SHIMS = Path(__file__).resolve().parent / "shims"


def environment_without(*modules: str) -> dict[str, str]:
    """The environment of a subprocess in which these installed modules are missing, as for a user without an extra
    (tests/shims/sitecustomize.py hides them from import, find_spec and importlib.metadata), with this checkout's
    build_rules first on the path. doit's stage processes inherit it."""
    path = os.pathsep.join(p for p in (str(SHIMS), str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "HIDDEN_PACKAGES": " ".join(modules)}


def run_doit_process(repo: Path, *args: str, env: dict[str, str]) -> DoitRun:
    """Run `python -m doit <args>` in a new process in the repo, with `env` (environment_without(...))."""
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "doit", *args], cwd=repo, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    return doit_run(done.returncode, done.stdout)


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


def labelled_repo(dest: Path) -> Path:
    """tests/models/labelled: a classifier whose evaluation samples are (inputs, label) pairs and whose score() takes
    the labels (the float model's own classes, so its accuracy is 1)."""
    repo = make_repo(dest, {"labelled": TEST_MODELS / "labelled"})
    runpy.run_path(str(repo / "models/labelled/hooks.py"))["write_weights"](repo / "models/labelled/classifier.npz")
    return repo


@pytest.fixture(scope="session", autouse=True)
def _worker_cwd(tmp_path_factory):
    """The session's fixtures start in a folder of this pytest process's own, and each test in one of its own
    (_test_cwd): what the emulator door keeps under ./out/.build-state (the output memo, the records of whether a
    binary repeats itself) for a binary run in-process would otherwise land in the checkout, shared by every later
    test and xdist worker (a memo hit where a test counts emulator runs, or a record another test left)."""
    old = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("session-cwd"))
    # One build cache for the whole run (every xdist worker): many files build the same graphs (MTCNN's, the tiny
    # net's) in repos of their own, and a stage whose inputs and parameters are the same is restored from it, as a
    # team's shared cache does (cache.py). A test of the cache itself sets BUILD_RULES_CACHE (or removes it) itself;
    # a file whose tests time, kill or count stages says RUN_WIDE_CACHE = False (_test_cwd).
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BUILD_RULES_CACHE", str(run_folder(tmp_path_factory) / "build-cache"))
        yield
    os.chdir(old)


@pytest.fixture(autouse=True)
def _test_cwd(_worker_cwd, tmp_path_factory, monkeypatch, request):
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))
    if not getattr(request.module, "RUN_WIDE_CACHE", True):
        # the file's tests time, kill or count stages, or read each repo's out/.cache: the cache as a user has it
        monkeypatch.delenv("BUILD_RULES_CACHE", raising=False)


def run_folder(tmp_path_factory) -> Path:
    """A folder every pytest process of this run shares: the parent of the xdist workers' base temporary folders
    (/tmp/pytest-of-<user>/pytest-<n>/), or the base folder itself without xdist."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def _flock(path: Path):
    import fcntl
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def built_once(tmp_path_factory, name: str, build) -> Path:
    """A build that tests of several files (on any xdist worker) read: made once per run by whichever process asks
    first, build(folder), while the others wait on a file lock, then shared read-only (a test that changes it takes a
    copy). A build that failed is tried again by the next process that asks (and fails there too, with its output)."""
    shared = run_folder(tmp_path_factory)
    folder, done = shared / name, shared / f"{name}.done"
    with _flock(shared / f"{name}.lock"):
        if not done.exists():
            if folder.exists():
                shutil.rmtree(folder)
            build(folder)
            done.write_text("")
    return folder


def _build_tinynet(folder: Path) -> None:
    repo = make_repo(folder, {"tinynet": TEST_MODELS / "tinynet"})
    write_tinynet_checkpoints(repo / "models" / "tinynet")
    # with its own out/.cache, as a user's repo has it: copies of it (tinynet_repo) restore from and count that one
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("BUILD_RULES_CACHE", raising=False)
        result = run_doit(repo)
    assert result.code == 0, result.output


@pytest.fixture(scope="session")
def built_tinynet(tmp_path_factory) -> Path:
    """The tiny two-graph model, fully built once per run (whichever xdist worker asks first); tests read it or take
    copies of it, never change it."""
    return built_once(tmp_path_factory, "tinynet-built", _build_tinynet)


@pytest.fixture
def tinynet_repo(built_tinynet, tmp_path) -> Path:
    """A private copy of the built tiny repo (mtimes kept, so the copy is up to date)."""
    copy = tmp_path / "repo"
    shutil.copytree(built_tinynet, copy, symlinks=True)
    return copy


# Imported by every Python process started with the fixture's PYTHONPATH (the stage processes): records each
# context model opened on the HTP emulator (check, evaluate, report, dist verify all open them with this function).
# With BUILD_RULES_TEST_EMULATOR_OPENS=n, the first session a process opens waits (2 minutes at most) until the
# log has n lines: a test of samples spread over two workers then sees both open, however late one starts.
EMULATOR_SPY = '''
import os
import time
from build_rules.toolchains import ort_qnn

_open = ort_qnn.open_context_binary
_first = True


def _recorded(ctx_model, *args, **kwargs):
    global _first
    path = os.environ["BUILD_RULES_TEST_EMULATOR_LOG"]
    with open(path, "a") as log:
        log.write(f"{ctx_model}\\n")
    session = _open(ctx_model, *args, **kwargs)
    wanted, deadline = int(os.environ.get("BUILD_RULES_TEST_EMULATOR_OPENS", "0")), time.monotonic() + 120
    while _first and len(open(path).read().splitlines()) < wanted and time.monotonic() < deadline:
        time.sleep(0.05)
    _first = False
    return session


ort_qnn.open_context_binary = _recorded
'''


def _spy(tmp_path, monkeypatch, name: str, code: str, log_variable: str) -> Path:
    """Every stage process started from here imports `code` (a sitecustomize.py first on PYTHONPATH); it writes to
    the log file returned, named by the environment variable `log_variable`."""
    spy = tmp_path / f"{name}-spy"
    spy.mkdir()
    (spy / "sitecustomize.py").write_text(code)
    log = tmp_path / f"{name}.log"
    log.write_text("")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(spy), str(ROOT), os.environ.get("PYTHONPATH"))
                                                     if p))
    monkeypatch.setenv(log_variable, str(log))
    # what a spy counts is what the stages ran: each repo's own build cache (out/.cache), as before the run-wide one
    # (a check another test's identical build left in that one would be restored, not run)
    monkeypatch.delenv("BUILD_RULES_CACHE", raising=False)
    return log


@pytest.fixture
def emulator_sessions(tmp_path, monkeypatch):
    """A function returning the context models the stage processes opened on the HTP emulator so far (a binary whose
    outputs on the samples are in the emulator output memo is not opened: out/.build-state/emulator-outputs)."""
    log = _spy(tmp_path, monkeypatch, "emulator-sessions", EMULATOR_SPY, "BUILD_RULES_TEST_EMULATOR_LOG")
    # one emulator worker: a session opened is then a measurement (with more, each worker opens the binary once)
    monkeypatch.setenv("BUILD_RULES_EMULATOR_WORKERS", "1")
    return lambda: log.read_text().splitlines()


# Imported by every stage process: one line per sample a binary runs on the HTP emulator (whatever runs it).
SAMPLE_SPY = '''
import os
from build_rules.toolchains import ort_qnn

_open = ort_qnn.open_context_binary


def _counted(ctx_model, *args, **kwargs):
    run = _open(ctx_model, *args, **kwargs)

    def counted(feed):
        with open(os.environ["BUILD_RULES_TEST_SAMPLE_LOG"], "a") as log:
            log.write(f"{ctx_model}\\n")
        return run(feed)
    return counted


ort_qnn.open_context_binary = _counted
'''


@pytest.fixture
def sample_runs(tmp_path, monkeypatch):
    """A function returning, per context model, how many samples the stage processes ran on it since the last call."""
    log = _spy(tmp_path, monkeypatch, "samples", SAMPLE_SPY, "BUILD_RULES_TEST_SAMPLE_LOG")
    # one emulator worker: an early verdict then stops at the deciding sample (workers may run a little ahead); no
    # output memo: every sample a stage asks for runs (the memo's own tests: test_emulator_runs.py)
    monkeypatch.setenv("BUILD_RULES_EMULATOR_WORKERS", "1")
    monkeypatch.setenv("BUILD_RULES_EMULATOR_MEMO_MB", "0")
    # each sample once: the runs that check a binary repeats itself are counted by tests/test_repeats.py
    monkeypatch.setenv("BUILD_RULES_REPEAT_SAMPLES", "0")

    def runs() -> dict[str, int]:
        counts: dict[str, int] = {}
        for line in log.read_text().splitlines():
            counts[line] = counts.get(line, 0) + 1
        log.write_text("")
        return counts
    return runs


# --- the slow end-to-end tests, and the order the files start in ---------------------------------------------------

# Fixtures that build a model end to end, each tens of seconds to minutes on 2 cores (setup times: docs/testing.md):
# every test that uses one is marked slow, as are the tests marked @pytest.mark.slow themselves. `-m "not slow"` is
# the inner loop while working on the tool (CI and the README's command run everything).
SLOW_FIXTURES = {"mtcnn_build", "whisper_float", "dist_built", "uploaded", "built", "conv_built", "shared_build",
                 "built_qairt", "built_dlc", "kvstep_dist", "speaker", "hook_calls", "built_ffn", "built_recurrent",
                 "onet_split", "gru_repo", "built_detector", "detector", "built_rnet_aimet", "cluster"}

# Seconds each file's tests took in all (setup, call, teardown; docs/testing.md, fresh49, a fresh run on the idle 2
# cores, 2026-12-07; only their order matters; a session fixture counts in the file that asked first). Under xdist
# (--dist loadfile --no-loadscope-reorder) the files start heaviest first, so that no worker is left alone with a
# heavy file at the end; a file not listed starts first of all (unknown: maybe heavy). xdist's own order (by number
# of tests) started tests/test_mtcnn_end_to_end.py last.
FILE_SECONDS = {
    "test_quant_tuning.py": 114, "test_device.py": 112, "test_repeats.py": 78, "test_aimet.py": 57,
    "test_user_models.py": 55, "test_ray.py": 50, "test_block_quant.py": 48, "test_mtcnn_end_to_end.py": 45,
    "test_data_and_evaluate.py": 36, "test_qairt_flows.py": 36, "test_whisper.py": 36, "test_reliability.py": 32,
    "test_remote_cache.py": 31, "test_emulator_runs.py": 28, "test_tune_as_built.py": 22, "test_progress.py": 21,
    "test_verdict_numbers.py": 21, "test_qairt_toolchain.py": 19, "test_step_graphs.py": 19,
    "test_tune_model_gate.py": 19, "test_dist.py": 17, "test_incremental.py": 16, "test_densemap.py": 15,
    "test_split.py": 15, "test_recurrent_cells.py": 14, "test_variant_precision.py": 12, "test_fuzzed_inputs.py": 10,
    "test_chip_proof.py": 9, "test_diagnose.py": 9, "test_transformer_blocks.py": 9, "test_concat_slices.py": 8,
    "test_shared_weights.py": 8, "test_house.py": 7, "test_fork_server.py": 6, "test_ort_qnn_toolchain.py": 5,
    "test_errors.py": 4, "test_early_verdicts.py": 3, "test_hooks.py": 3, "test_report_figure.py": 3,
    "test_results.py": 3, "test_gates.py": 1, "test_load_paths.py": 0, "test_quant_spec.py": 0,
}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by the marks added here
def pytest_collection_modifyitems(config, items):
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    unknown = max(FILE_SECONDS.values()) + 1
    items.sort(key=lambda item: -FILE_SECONDS.get(item.path.name, unknown))  # stable: a file's own order is kept
