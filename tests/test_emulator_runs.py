"""The emulator door (build_rules/emulator/emulator_runs.py): samples across worker processes, the machine-wide limit on
sessions, and the output memo. The binary is a small Conv/Gemm model compiled for SM8750 in tmp_path."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime_qnn")

from build_rules.emulator import emulator_memo, emulator_runs  # noqa: E402
from build_rules.toolchains import ort_qnn  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_ort_qnn_toolchain import make_tiny, samples  # noqa: E402

# Imported by every Python process started with the spy's PYTHONPATH (the workers): logs each session opened and
# each run, with the process and the machine's monotonic clock, to $SPY_LOG. Samples can be held instead of racing
# the test: with $SPY_HOLD_OPENS=n a process's first sample waits until n sessions are open, with $SPY_HOLD (a path)
# each later one waits until that file exists (2 minutes at most, so a broken door fails an assertion, not the run).
SPY = '''
import os, time
from build_rules.toolchains import ort_qnn

_open = ort_qnn.open_context_binary
_ran = 0


def _log(line):
    with open(os.environ["SPY_LOG"], "a") as f:
        f.write(line + "\\n")


def _wait(done):
    deadline = time.monotonic() + 120
    while not done() and time.monotonic() < deadline:
        time.sleep(0.05)


def _hold():
    global _ran
    opens, hold = int(os.environ.get("SPY_HOLD_OPENS", "0")), os.environ.get("SPY_HOLD")
    if _ran == 0 and opens:
        _wait(lambda: open(os.environ["SPY_LOG"]).read().count("open ") >= opens)
    elif _ran > 0 and hold:
        _wait(lambda: os.path.exists(hold))
    _ran += 1


def _recorded(ctx_model, *args, **kwargs):
    _log(f"open {os.getpid()} {time.monotonic()}")
    run = _open(ctx_model, *args, **kwargs)

    def timed(feed):
        _hold()
        started = time.monotonic()
        try:
            return run(feed)
        finally:
            _log(f"run {os.getpid()} {started} {time.monotonic()}")
    return timed


ort_qnn.open_context_binary = _recorded
'''


@pytest.fixture(scope="module")
def binary(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("emulator_runs")
    return ort_qnn.compile_context_binary(make_tiny(work / "tiny.onnx"), work / "SM8750", "tiny", soc_model=69,
                                          vtcm_mb=8, fp16=True)["ctx_model"]


@pytest.fixture
def spy(tmp_path, monkeypatch):
    """Sessions and runs of this process and its workers: a function returning the log's lines, split."""
    folder = tmp_path / "spy"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(SPY)
    log = tmp_path / "spy.log"
    log.write_text("")
    monkeypatch.setenv("SPY_LOG", str(log))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(folder), str(ROOT)]))
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # private emulator slots: other test runs on the machine do not count
    # each sample runs once: these tests count the runs of the door's plumbing (tests/test_repeats.py counts the
    # repeated runs that check a binary repeats itself)
    monkeypatch.setenv("BUILD_RULES_REPEAT_SAMPLES", "0")
    monkeypatch.chdir(tmp_path)  # the memo under ./out/.build-state
    monkeypatch.setattr(ort_qnn, "open_context_binary", ort_qnn.open_context_binary)  # put back after the test
    exec(SPY, {})  # this process too
    return lambda: [line.split() for line in log.read_text().splitlines()]


def _same_bytes(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(
        list(x) == list(y) and all(x[k].dtype == y[k].dtype and x[k].shape == y[k].shape
                                   and x[k].tobytes() == y[k].tobytes() for k in x) for x, y in zip(a, b))


def test_workers_give_the_serial_runs_bytes_in_sample_order(binary, spy, monkeypatch):
    monkeypatch.setenv("BUILD_RULES_EMULATOR_MEMO_MB", "0")
    feeds = samples(7, 3)
    monkeypatch.setenv("BUILD_RULES_EMULATOR_WORKERS", "1")
    from build_rules.emulator.emulator_slots import session_seconds
    before = session_seconds()
    serial = emulator_runs.run_outputs(binary, feeds)
    assert [line[0] for line in spy()].count("open") == 1 and {line[1] for line in spy()} == {str(os.getpid())}
    in_process = session_seconds() - before  # the slot this process held while it ran the 7 samples
    assert in_process > 0
    # a small job (7 samples of ~2 ms) runs here even with two workers allowed: starting them costs more
    monkeypatch.setenv("BUILD_RULES_EMULATOR_WORKERS", "2")
    (Path(os.environ["SPY_LOG"])).write_text("")
    assert _same_bytes(serial, emulator_runs.run_outputs(binary, feeds))
    assert [line[0] for line in spy()].count("open") == 1 and {line[1] for line in spy()} == {str(os.getpid())}
    # without that probe (BUILD_RULES_EMULATOR_INLINE_SECONDS=0) the job goes to two worker processes
    monkeypatch.setenv("BUILD_RULES_EMULATOR_INLINE_SECONDS", "0")
    monkeypatch.setenv("SPY_HOLD_OPENS", "2")  # (unheld, an idle machine's first worker ran all 7 before the second)
    (Path(os.environ["SPY_LOG"])).write_text("")
    before = session_seconds()
    parallel = emulator_runs.run_outputs(binary, feeds)
    assert session_seconds() > before  # the workers' sessions, from ready to stopped: the build log's fifth column
    assert _same_bytes(serial, parallel)
    opened = [line[1] for line in spy() if line[0] == "open"]
    ran = [line[1] for line in spy() if line[0] == "run"]
    # two worker processes, each opening the binary once and running a share of the 7 samples
    assert len(opened) == 2 and len(set(opened)) == 2 and str(os.getpid()) not in opened
    assert len(ran) == 7 and set(ran) == set(opened)
    # the progress line counts the samples done on both workers: all 7 by the last one's turn
    from build_rules.plumbing import progress
    lines = [progress.line() for _ in emulator_runs.iter_outputs(binary, feeds)]
    assert "7/7 samples on 2 emulator workers" in lines[-1] and all("/7 samples" in line for line in lines)
    # a split graph's form (a list of parts) takes the same road
    assert _same_bytes(serial, emulator_runs.run_outputs([binary], feeds))


@pytest.mark.parametrize("clock, here", [((0.0, 0.01, 0.0, 10.0), 2), ((0.0, 5.0), 1)],
                         ids=["the second sample decides", "a slow first sample hands over at once"])
def test_a_job_that_the_probe_finds_large_goes_to_the_workers_after_its_first_samples(binary, spy, monkeypatch, clock,
                                                                                      here):
    """The first samples run in this process and are timed (here by a clock the test sets): a second sample whose time
    times the samples left is over BUILD_RULES_EMULATOR_INLINE_SECONDS (1 s), or a first one that took that alone
    (its session opened in it), hands the rest to the workers. The samples come back in order, in the serial bytes."""
    monkeypatch.setenv("BUILD_RULES_EMULATOR_MEMO_MB", "0")
    feeds = samples(7, 8)
    monkeypatch.setenv("BUILD_RULES_EMULATOR_WORKERS", "1")
    serial = emulator_runs.run_outputs(binary, feeds)
    monkeypatch.setenv("BUILD_RULES_EMULATOR_WORKERS", "2")
    (Path(os.environ["SPY_LOG"])).write_text("")
    monkeypatch.setattr(emulator_runs, "_now", iter(clock).__next__)
    assert _same_bytes(serial, emulator_runs.run_outputs(binary, feeds))
    ran = [line[1] for line in spy() if line[0] == "run"]
    assert len(ran) == 7 and ran[:here] == [str(os.getpid())] * here
    assert str(os.getpid()) not in ran[here:]  # (one worker may run them all before the other opens: any workers)


def test_closing_early_runs_no_more_samples_and_leaves_no_worker(binary, spy, tmp_path, monkeypatch):
    """Whatever the machine's speed: each worker runs its first sample once both workers are open, and every later
    sample waits for a file this test never makes (the spy's hold). The caller gets sample 0, closes, and the
    workers are gone with at most their first samples run. (Unheld, an idle machine's workers could finish all 40
    tiny samples before the close, and a loaded one could close before the second worker opened.)"""
    monkeypatch.setenv("BUILD_RULES_EMULATOR_MEMO_MB", "0")
    monkeypatch.setenv("BUILD_RULES_EMULATOR_WORKERS", "2")
    monkeypatch.setenv("BUILD_RULES_EMULATOR_INLINE_SECONDS", "0")  # the workers from the first sample
    monkeypatch.setenv("SPY_HOLD", str(tmp_path / "never"))
    monkeypatch.setenv("SPY_HOLD_OPENS", "2")
    runs = emulator_runs.iter_outputs(binary, samples(40, 4))
    index, first = next(runs)
    runs.close()
    assert index == 0 and list(first) == ["y"]
    workers = {line[1] for line in spy() if line[0] == "open"}
    assert len(workers) == 2
    for pid in workers:
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid), 0)
    done = len([line for line in spy() if line[0] == "run"])
    assert 1 <= done <= 2, f"{done} of 40 samples ran though the caller stopped after the first"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()  # a zombie has ended (its reaper may be slow in a container)
    except OSError:  # gone before the open, or reaped between the open and the read (ProcessLookupError, fresh58)
        return False


@pytest.mark.parametrize("started", ["fresh", "forked"])
def test_workers_end_with_a_stage_killed_outright(spy, monkeypatch, started):
    """An interrupted build kills its stage processes with SIGKILL (no cleanup runs): their workers end too, even in
    the middle of an item that would take an hour (here: functools.partial(time.sleep) over [3600] * 4). Forked
    (plumbing/fork_server.py), the stage and its workers are children of the fork server, not stage and children."""
    import signal
    import time

    from build_rules.plumbing import fork_server
    monkeypatch.setenv("BUILD_RULES_EMULATOR_WORKERS", "2")
    monkeypatch.setenv("BUILD_RULES_EMULATOR_INLINE_SECONDS", "0")  # (else the stage itself sleeps in the first item)
    job = ("import time; from build_rules.emulator import emulator_runs; "
           "list(emulator_runs.iter_results('functools:partial', (time.sleep,), [3600] * 4))")
    if started == "fresh":
        stage = subprocess.Popen([sys.executable, "-c", job])
        parent = stage.pid
    else:
        monkeypatch.delenv(fork_server.SWITCH, raising=False)
        stage = fork_server.python_process(["-c", job], start_server=True)
        assert not isinstance(stage, subprocess.Popen)
        parent = fork_server._servers[()].process.pid

    def workers() -> list[int]:
        try:
            children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        except OSError:
            return []
        return [int(p) for p in children if int(p) != stage.pid]

    deadline = time.monotonic() + 120
    while len(workers()) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    started = workers()
    assert len(started) == 2

    def asleep(pid: int) -> bool:  # in its first item: the worker's main thread waits in the kernel's nanosleep
        try:  # (its wait channel, or where wchan is hidden its system call: x86_64's clock_nanosleep, nanosleep)
            return "nanosleep" in Path(f"/proc/{pid}/wchan").read_text() or \
                Path(f"/proc/{pid}/syscall").read_text().split()[0] in ("230", "35")
        except (OSError, IndexError):
            return False
    while not all(asleep(pid) for pid in started) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(asleep(pid) for pid in started)  # started, holding their slots, each asleep in its first item
    assert stage.poll() is None and all(_alive(pid) for pid in started)
    stage.send_signal(signal.SIGKILL)
    stage.wait()
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in started) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in started)


@pytest.mark.parametrize("inline", ["0", "1"], ids=["on a worker", "in this process"])
def test_a_worker_error_reaches_the_caller_with_the_sample(binary, spy, monkeypatch, inline):
    monkeypatch.setenv("BUILD_RULES_EMULATOR_WORKERS", "2")
    monkeypatch.setenv("BUILD_RULES_EMULATOR_INLINE_SECONDS", inline)
    feeds = samples(3, 5)
    feeds[2] = {"x": np.zeros((1, 3, 4, 4), np.float32)}  # a wrong shape: onnxruntime refuses it in the worker
    with pytest.raises(Exception, match="x"):
        emulator_runs.run_outputs(binary, feeds)


def test_a_limit_of_one_runs_one_session_at_a_time_machine_wide(binary, spy, tmp_path, monkeypatch):
    monkeypatch.setenv("BUILD_RULES_EMULATOR_MEMO_MB", "0")
    monkeypatch.setenv("BUILD_RULES_EMULATOR_WORKERS", "1")
    job = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
        from test_ort_qnn_toolchain import samples
        from build_rules.emulator import emulator_runs
        assert len(emulator_runs.run_outputs({str(binary)!r}, samples(4, int(sys.argv[1])))) == 4
    """)
    jobs = [subprocess.Popen([sys.executable, "-c", job, str(seed)]) for seed in (6, 7)]
    assert [p.wait(timeout=600) for p in jobs] == [0, 0]
    spans = {}
    for kind, pid, *times in spy():
        first, last = spans.get(pid, (float("inf"), 0.0))
        spans[pid] = (min(first, float(times[0])), max(last, float(times[-1])))
    assert len(spans) == 2
    (a_first, a_last), (b_first, b_last) = sorted(spans.values())
    assert a_last <= b_first, f"two sessions ran at once under a limit of 1: {spans}"


def test_a_second_stage_gets_the_memos_bytes_without_the_emulator(binary, spy, monkeypatch):
    monkeypatch.setenv("BUILD_RULES_EMULATOR_WORKERS", "1")
    feeds = samples(3, 8)
    first = emulator_runs.run_outputs(binary, feeds)
    assert len([line for line in spy() if line[0] == "run"]) == 3
    # another stage (evaluate's graphs, dist verify) runs the same binary on the same bytes: the memo answers
    run = emulator_runs.open_binary(binary)
    again = [run({"x": f["x"].copy()}) for f in feeds]
    assert _same_bytes(first, again)
    assert _same_bytes(first, emulator_runs.run_outputs(binary, feeds))
    assert len([line for line in spy() if line[0] == "run"]) == 3 and len([l for l in spy() if l[0] == "open"]) == 1
    # other input bytes are another entry
    other = samples(1, 9)
    emulator_runs.run_outputs(binary, other)
    assert len([line for line in spy() if line[0] == "run"]) == 4


def test_a_corrupt_entry_is_a_miss_and_the_memo_stays_bounded(binary, spy, monkeypatch):
    monkeypatch.setenv("BUILD_RULES_EMULATOR_WORKERS", "1")
    feeds = samples(4, 10)
    first = emulator_runs.run_outputs(binary, feeds)
    entries = sorted(Path("out/.build-state/emulator-outputs").rglob("*.npz"))
    assert len(entries) == 4
    memo = emulator_memo.Memo(binary)
    broken = Path("out/.build-state/emulator-outputs") / memo.key(feeds[1])[:2] / f"{memo.key(feeds[1])}.npz"
    broken.write_bytes(broken.read_bytes()[:100])
    assert _same_bytes(first, emulator_runs.run_outputs(binary, feeds))
    assert len([line for line in spy() if line[0] == "run"]) == 5  # only the broken one ran again
    # a limit of 2.5 entries keeps the most recently used (sample 1 was just written again, sample 3 read)
    size = entries[0].stat().st_size
    for k, feed in enumerate(feeds):
        path = Path("out/.build-state/emulator-outputs") / memo.key(feed)[:2] / f"{memo.key(feed)}.npz"
        os.utime(path, (1000 + k, 1000 + k))
    assert emulator_memo.prune(limit=int(size * 2.5)) > 0
    kept = [k for k, feed in enumerate(feeds) if memo.get(feed) is not None]
    assert kept == [2, 3]


def test_bad_settings_say_what_is_expected(monkeypatch):
    monkeypatch.setenv("BUILD_RULES_EMULATOR_WORKERS", "many")
    with pytest.raises(ValueError, match=r"^BUILD_RULES_EMULATOR_WORKERS='many' is not a whole number of emulator "
                                         r"workers >= 1; unset it for the default \d+ \(one per core here\)$"):
        emulator_runs.worker_count()
    monkeypatch.setenv("BUILD_RULES_EMULATOR_MEMO_MB", "-1")
    with pytest.raises(ValueError, match=r"^BUILD_RULES_EMULATOR_MEMO_MB='-1' is not the emulator output memo's size "
                                         r"in MB >= 0 \(0: off\); unset it for the default 2048$"):
        emulator_memo.limit_bytes()
    monkeypatch.setenv("BUILD_RULES_EMULATOR_MEMO_MB", " ")  # blank: unset
    assert emulator_memo.limit_bytes() == 2048 << 20


def test_diagnose_gets_the_checks_outputs_from_the_memo(tinynet_repo, emulator_sessions):
    """One binary, one input, one emulator run across stages: the build checked head@SM8750 on its evaluation set;
    diagnose's plain-binary runs on 4 of those samples are the check's, read from the memo."""
    from conftest import run_doit
    result = run_doit(tinynet_repo, "diagnose:tinynet/head/w8a16@SM8750")
    assert result.code == 0, result.output
    assert emulator_sessions() == []  # (its exposed model compiles in-process: emulator_session, not a binary)
    log = (tinynet_repo / "out/tinynet/w8a16/SM8750/head.diagnose.log").read_text()
    assert "all 4 plain binary samples from the emulator output memo: the emulator does not run" in log, log


def test_a_check_writes_the_same_bytes_with_one_worker_and_with_two(tinynet_repo, monkeypatch):
    from conftest import run_doit
    monkeypatch.setenv("BUILD_RULES_CACHE", "off")  # the check runs each time (no restore)
    monkeypatch.setenv("BUILD_RULES_EMULATOR_MEMO_MB", "0")  # and runs its samples on the emulator each time
    folder = tinynet_repo / "out/tinynet/w8a16/SM8750"
    written = []
    for workers in ("1", "2"):
        monkeypatch.setenv("BUILD_RULES_EMULATOR_WORKERS", workers)
        for name in ("head.check.json", "head.measure.json"):
            (folder / name).unlink()
        result = run_doit(tinynet_repo, "check:tinynet/head/w8a16@SM8750")
        assert result.code == 0 and result.ran == {"check:tinynet/head/w8a16@SM8750"}, result.output
        written.append([(folder / name).read_bytes() for name in ("head.check.json", "head.measure.json")])
    assert written[0] == written[1]
