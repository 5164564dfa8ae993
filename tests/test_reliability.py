"""Interrupted builds, concurrent runs, clean/forget and a catalogue of bad inputs (issue: reliability).

Kills and concurrent runs use the real `doit` command in a subprocess, on the tiny two-graph model;
the reference for "the same outputs" is the uninterrupted serial build of the session fixture.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TEST_MODELS, make_repo, run_doit, write_tinynet_checkpoints

ALL_TASKS = 38  # tinynet: 2 graphs x (export, simplify, verify, calibrate, calibration_stats, quantize, fp16_lint)
#                + 4 size (2 graphs x 2 variants) + 8 compile + 8 check + 4 package

# These tests kill, time or count stages and read each repo's out/.cache: no stage restored from the run-wide
# build cache (conftest._test_cwd)
RUN_WIDE_CACHE = False


def fresh_tinynet(tmp_path: Path) -> Path:
    repo = make_repo(tmp_path / "repo", {"tinynet": TEST_MODELS / "tinynet"})
    write_tinynet_checkpoints(repo / "models/tinynet")
    return repo


_STARTED: list[subprocess.Popen] = []  # the doit processes this test started (start_doit)


@pytest.fixture(autouse=True)
def _no_doit_left_running():
    """A test that fails half-way (a wait that timed out, an assertion before its kill) or is stopped with Ctrl-C
    leaves no doit running on, with its stages and fork server, beside the tests after it: each doit started is in
    a session of its own, killed whole."""
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:  # still running: its process group id is its pid, and still its own
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def start_doit(repo: Path, *args: str, log_name: str = "doit.log") -> subprocess.Popen:
    log = open(repo / log_name, "w")
    # SIGINT as a terminal's doit has it: a test run started in the background of a non-interactive shell ignores
    # SIGINT, and an ignored signal stays ignored across exec (doit then rightly leaves it alone)
    proc = subprocess.Popen([sys.executable, "-m", "doit", *args], cwd=repo, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    _STARTED.append(proc)
    return proc


def finished_tasks(repo: Path) -> set[str]:
    """Tasks whose success doit has recorded: the snapshot (a clean exit, also after Ctrl-C or SIGTERM, folds the
    journal into it) and the journal, written as tasks finish (all there is after a kill -9)."""
    state = {}
    snapshot = repo / "out/.build-state/doit.json"
    if snapshot.exists() and snapshot.read_text().strip():
        state = {task: set(values) for task, values in json.loads(snapshot.read_text()).items()}
    journal = repo / "out/.build-state/doit.json.journal"
    if journal.exists():
        for line in journal.read_text().splitlines():
            try:
                op = json.loads(line)
            except ValueError:
                break
            if op[0] == "set":
                state.setdefault(op[1], set()).add(op[2])
            elif op[0] == "remove":
                state.pop(op[1], None)
            elif op[0] == "remove_all":
                state.clear()
    return {task for task, values in state.items() if "deps:" in values}


def wait_until(predicate, timeout=300.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    raise AssertionError("timed out")


def same_binaries(repo: Path, reference: Path) -> None:
    binaries = sorted(p.relative_to(reference) for p in (reference / "out").rglob("*.bin"))
    assert len(binaries) == 8
    for rel in binaries:
        assert (repo / rel).read_bytes() == (reference / rel).read_bytes(), rel
    for rel in sorted(p.relative_to(reference) for p in (reference / "out").rglob("*.check.json")):
        assert json.loads((repo / rel).read_text()) == json.loads((reference / rel).read_text()), rel


@pytest.mark.slow
def test_kill_9_loses_at_most_the_running_task(tmp_path, built_tinynet):
    """Killed during the export, resumed and killed again during the compiles, resumed to the end: no run starts a
    task an earlier run finished, and the outputs are the uninterrupted build's. (One repo for both kills: each
    full tinynet build is a minute of CI.)"""
    repo = fresh_tinynet(tmp_path)
    done: set[str] = set()
    for kill_after, when in [(1, "during export"), (16, "during compile")]:
        proc = start_doit(repo, log_name=f"doit-{kill_after}.log")
        wait_until(lambda: len({t for t in finished_tasks(repo) if ":" in t}) >= kill_after)
        os.killpg(proc.pid, signal.SIGKILL)  # doit and the stage it was running
        proc.wait()
        started = set(re.findall(r"^\.  \[\d+/\d+\] (\S+)", (repo / f"doit-{kill_after}.log").read_text(), re.M))
        assert not started & done, f"{when}: a task finished before the previous kill ran again"
        now = {t for t in finished_tasks(repo) if ":" in t}
        assert done <= now and kill_after <= len(now) < ALL_TASKS, when
        done = now

    result = run_doit(repo)
    assert result.code == 0, result.output
    assert result.ran == result.ran - done, "a task finished before the kill ran again"
    assert len(result.ran) == ALL_TASKS - len(done)
    assert not list((repo / "out/.staging").iterdir())  # the killed runs' staging folders were dropped
    same_binaries(repo, built_tinynet)


@pytest.mark.slow
def test_sigterm_keeps_finished_work(tmp_path, built_tinynet):
    repo = fresh_tinynet(tmp_path)
    proc = start_doit(repo)
    # ten tasks done and a stage process at work (not one of the size checks, which run inside doit)
    wait_until(lambda: len({t for t in finished_tasks(repo) if ":" in t}) >= 10 and stage_processes(repo))
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) != 0
    done = {t for t in finished_tasks(repo) if ":" in t}
    assert 10 <= len(done) < ALL_TASKS
    log = (repo / "doit.log").read_text()
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log
    last = log.splitlines()[-1]  # one line, instead of the summary and a traceback
    assert re.fullmatch(rf"interrupted \(SIGTERM\): {len(done)} task\(s\) finished and kept, stopped \S+; "
                        r"`doit` again goes on from there", last), log
    result = run_doit(repo)
    assert result.code == 0, result.output
    assert not result.ran & done
    same_binaries(repo, built_tinynet)


def stage_processes(repo: Path) -> list[str]:
    """The live stage processes working for this repo: a fresh interpreter's command line names stage_main and its
    staging folder in the repo; a child of the fork server (plumbing/fork_server.py, whose command line it shows) is
    named stage_main and works in the repo."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            text = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            name, cwd = (proc / "comm").read_text().strip(), os.readlink(proc / "cwd")
        except OSError:  # gone, or a zombie (no working folder)
            continue
        if "build_rules.stage_main" in text and f"{repo.resolve()}/out/.staging" in text \
                or name == "stage_main" and cwd == str(repo.resolve()):
            found.append(f"{proc.name} {name} {text}")
    return found


def test_ctrl_c_under_threads_stops_every_running_stage_and_prints_one_line(tmp_path):
    """SIGINT to doit alone (not its process group, as a terminal would): the stages of both worker threads stop."""
    repo = fresh_tinynet(tmp_path)
    proc = start_doit(repo, "-n", "2", "-P", "thread")
    wait_until(lambda: len(stage_processes(repo)) == 2)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) != 0
    log = (repo / "doit.log").read_text()
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log
    assert re.fullmatch(r"interrupted \(Ctrl-C\): \d+ task\(s\) finished and kept, stopped \S+, \S+; `doit` again "
                        r"goes on from there", log.splitlines()[-1]), log
    assert "summary:" not in log
    wait_until(lambda: stage_processes(repo) == [], timeout=60)  # (killed: gone a moment later, however busy)


@pytest.mark.slow
def test_two_parallel_doit_runs_at_once_wait_for_each_other_and_give_the_serial_outputs(tmp_path, built_tinynet):
    repo = fresh_tinynet(tmp_path)
    first = start_doit(repo, "-n", "2", "-P", "thread", log_name="first.log")
    second = start_doit(repo, "-n", "2", "-P", "thread", log_name="second.log")
    assert first.wait(timeout=600) == 0
    assert second.wait(timeout=600) == 0
    logs = (repo / "first.log").read_text() + (repo / "second.log").read_text()
    assert "another doit is running in this repo (pid" in logs
    assert re.search(rf"^summary: {ALL_TASKS} task\(s\) ran\b", logs, re.M), logs  # one built everything, in parallel
    built = next(log for log in ((repo / name).read_text() for name in ("first.log", "second.log"))
                 if "summary: 0 task(s) ran" not in log)
    # each task said k of N as it started, from two threads: k counts 1..N once, N is known from the first line on
    marks = re.findall(r"^\.  \[(\d+)/(\d+)\] (\S+)", built, re.M)
    assert sorted(int(k) for k, _, _ in marks) == list(range(1, ALL_TASKS + 1)), built
    assert {int(n) for _, n, _ in marks} == {ALL_TASKS} and len(re.findall(r"^summary: ", built, re.M)) == 1
    assert f"summary: 0 task(s) ran, {ALL_TASKS} up to date" in logs  # the later one found everything built
    assert run_doit(repo).ran == set()
    same_binaries(repo, built_tinynet)


def test_doit_list_does_not_wait_for_a_running_build(tinynet_repo):
    lock = tinynet_repo / "out/.build-state/doit.json.lock"
    holder = subprocess.Popen(  # holds the repo's lock the way a running build does
        [sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); "
         "fcntl.lockf(f, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(120)", str(lock)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        result = run_doit(tinynet_repo, "list", "--all")
        assert result.code == 0, result.output
        assert "compile:tinynet/encoder/w8a16@SM8750" in result.output
        assert "another doit is running" not in result.output
    finally:
        holder.kill()
        holder.wait()


def test_clean_and_forget(tinynet_repo):
    task = "compile:tinynet/encoder/w8a16@SM8750"
    binary = tinynet_repo / "out/tinynet/w8a16/SM8750/encoder.bin"
    assert run_doit(tinynet_repo, "clean", task).code in (0, None)  # doit clean returns None on success
    assert not binary.exists()
    assert not (tinynet_repo / "out/tinynet/w8a16/SM8750/encoder_ctx.onnx").exists()
    assert (tinynet_repo / "out/tinynet/w8a16/SM8550/encoder.bin").exists()
    assert run_doit(tinynet_repo).ran == {task}  # same bytes again: nothing downstream re-runs
    assert run_doit(tinynet_repo, "forget", task).code in (0, None)
    assert run_doit(tinynet_repo).ran == {task}


# --- bad inputs -------------------------------------------------------------------------------

def edit_hooks(repo: Path, old: str, new: str) -> None:
    hooks = repo / "models/tinynet/hooks.py"
    text = hooks.read_text()
    assert old in text
    hooks.write_text(text.replace(old, new))


@pytest.mark.slow
def test_checkpoints_load_without_pickled_code_unless_trusted(tmp_path):
    repo = fresh_tinynet(tmp_path)
    edit_hooks(repo, "weights_only=True", "weights_only=False")
    result = run_doit(repo, "export")
    assert result.code != 0
    assert ("torch.load(..., weights_only=False) can run code stored in a checkpoint; if you trust the "
            "checkpoints, set trusted_checkpoints = true under [model] in models/tinynet/model.toml") in result.output
    assert not list((repo / "out").rglob("*.onnx"))
    toml = repo / "models/tinynet/model.toml"
    toml.write_text(toml.read_text().replace('hooks = "hooks.py"', 'hooks = "hooks.py"\ntrusted_checkpoints = true'))
    assert run_doit(repo, "export").code == 0


@pytest.mark.slow
def test_truncated_checkpoint_names_the_file(tmp_path):
    repo = fresh_tinynet(tmp_path)
    checkpoint = repo / "models/tinynet/head.pt"
    checkpoint.write_bytes(checkpoint.read_bytes()[:100])
    result = run_doit(repo, "export")
    assert result.code != 0
    assert "TaskFailed - taskid:export:tinynet/head" in result.output
    assert "build('head') failed with checkpoints models/tinynet/head.pt:" in result.output
    assert not (repo / "out/tinynet/float/head.onnx").exists()
    assert (repo / "out/tinynet/float/encoder.onnx").exists()  # the other graph is fine


def test_corrupt_onnx_file_is_named(tmp_path):
    folder = tmp_path / "src/broken"
    folder.mkdir(parents=True)
    (folder / "model.onnx").write_bytes(b"\x08\x07garbage" * 10)
    (folder / "hooks.py").write_text("")
    (folder / "model.toml").write_text('[model]\nonnx = "model.onnx"\nhooks = "hooks.py"\n'
                                       '[graphs.net]\noutputs = ["y"]\n[variants.fp16]\nprecision = "fp16"\n')
    repo = make_repo(tmp_path / "repo", {"broken": folder})
    result = run_doit(repo)
    assert result.code != 0
    assert "models/broken/model.onnx: not a valid ONNX model" in result.output
    assert not (repo / "out/broken/float/net.sim.onnx").exists()


@pytest.mark.parametrize("old, new, message", [
    ("shape = (1, 3, 16, 16) if", "shape = (1, 3, 15, 16) if",
     "calibration_inputs('encoder', 8) sample 0: input 'image' is float32[1, 3, 15, 16], "
     "the graph declares float32[1, 3, 16, 16]"),
    ("rng.standard_normal(shape).astype(np.float32)", "rng.standard_normal(shape)",
     "calibration_inputs('encoder', 8) sample 0: input 'image' is float64[1, 3, 16, 16], "
     "the graph declares float32[1, 3, 16, 16]"),
    ("return _samples(graph, count, seed=1)", "return []",
     "calibration_inputs('encoder', 8) returned no samples: calibration needs real inputs"),
])
def test_bad_calibration_data_is_named(tmp_path, old, new, message):
    repo = fresh_tinynet(tmp_path)
    edit_hooks(repo, old, new)
    result = run_doit(repo, "calibrate")
    assert result.code != 0
    assert message in result.output
    assert not (repo / "out/tinynet/calibration/encoder/input_list.txt").exists()
    assert not list((repo / "out/tinynet/calibration/encoder").glob("*.raw")) \
        if (repo / "out/tinynet/calibration/encoder").exists() else True


def test_unsafe_chip_name_is_refused(tmp_path):
    chips = (Path(__file__).parent.parent / "chips.toml").read_text() + '\n[chips."../evil"]\nsoc_id = 1\n' \
        'dsp_arch = "v73"\nvtcm_mb = 8\nfp16 = true\n'
    repo = make_repo(tmp_path / "repo", {}, chips=chips)
    result = run_doit(repo, "list")
    assert result.code == 3
    assert "error: chips.toml: [chips.\"../evil\"]: name '../evil' is not allowed" in result.output  # the key as TOML writes it


def test_disk_full_while_writing_an_output(tmp_path):
    repo = fresh_tinynet(tmp_path)
    staging = repo / "out/.staging"
    staging.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12k", "tmpfs", str(staging)],
                             capture_output=True).returncode == 0
    if not mounted:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        result = run_doit(repo, "calibrate:tinynet/encoder")
    finally:
        subprocess.run(["umount", str(staging)])
    assert result.code != 0
    assert "calibrate:tinynet/encoder: no space left on device while writing" in result.output
    assert not (repo / "out/tinynet/calibration/encoder/input_list.txt").exists()


def test_an_atomically_written_output_gets_the_mode_open_would_give_it(tmp_path):
    """mkstemp's 0600 is not an output's mode: tune's proposals and bundle JSON are read by other users and tools."""
    from build_rules.plumbing.files import atomic_write_text
    atomic_write_text(tmp_path / "atomic.json", "{}\n")
    (tmp_path / "plain.json").write_text("{}\n")
    assert (tmp_path / "atomic.json").stat().st_mode == (tmp_path / "plain.json").stat().st_mode
