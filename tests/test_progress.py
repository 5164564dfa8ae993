"""Long builds say where they are (issue 14): `[k/N]` on every started task, the time left from the build log,
progress lines from inside long stages, one line for a no-op, and the wall time and slowest tasks at the end."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, TEST_MODELS, make_repo, run_doit, write_tinynet_checkpoints

MARK = re.compile(r"^\.  \[(\d+)/(\d+)\] (\S+)(?:  \((.+?) left(?:, (\d+) guessed from other tasks)?\))?$", re.M)

# These tests kill, time or count stages and read each repo's out/.cache: no stage restored from the run-wide
# build cache (conftest._test_cwd)
RUN_WIDE_CACHE = False


def markers(output: str) -> list[tuple[int, int, str, str]]:
    return [(int(k), int(n), name, left) for k, n, name, left, _ in MARK.findall(output)]


def guessed(output: str) -> list[int]:
    """Per started task, how many of the tasks left the time-left estimate timed by other tasks."""
    return [int(g or 0) for *_, g in MARK.findall(output)]


def change_head_checkpoint(repo) -> None:
    import torch
    checkpoint = repo / "models/tinynet/head.pt"
    state = torch.load(checkpoint, weights_only=True)
    name = next(iter(state))
    state[name] = state[name] + 0.01
    torch.save(state, checkpoint)


def write_build_log(repo, seconds_of, emulator_of=lambda name: 0.0) -> None:
    """A build log with made-up seconds for every task the fixture's build ran (seconds_of(name) -> s or None;
    emulator_of(name): its emulator sessions' seconds, the fifth column when not 0)."""
    log = repo / "out/.build-state/build.log"
    names = [line.split("\t")[3].strip() for line in log.read_text().splitlines() if not line.startswith("#")]
    rows = ["# build 2026-01-01 00:00:00 pid 1", "1.0\t99.000\tran\texport:tinynet/head"]  # an older run: superseded
    rows += [f"2.0\t{seconds_of(n):.3f}\tran\t{n}" + (f"\t{emulator_of(n):.3f}" if emulator_of(n) else "")
             for n in names if seconds_of(n) is not None]
    rows.append("3.0\t0.100\trestored\texport:tinynet/head")  # a cache restore does not say how long the work takes
    log.write_text("\n".join(rows) + "\n")


@pytest.mark.slow
def test_each_started_task_says_k_of_n_and_the_time_left(tinynet_repo):
    from build_rules.plumbing.progress import format_seconds
    from build_rules.build_log import read_build_log
    # Last seconds: 10 s per task, packages 2 s; package:tinynet/w8a16@SM8750 never ran: the median of its stage.
    write_build_log(tinynet_repo, lambda n: None if n == "package:tinynet/w8a16@SM8750"
                    else 2.0 if n.startswith("package:") else 10.0)
    change_head_checkpoint(tinynet_repo)
    result = run_doit(tinynet_repo)
    assert result.code == 0, result.output
    marks = markers(result.output)
    assert len(result.ran) == 21  # the head graph: export ... check, its fp16 lint, its 2 size checks, every package
    assert [k for k, *_ in marks] == list(range(1, 22))
    assert {n for _, n, _, _ in marks} == {21}  # N = the tasks this run executed, known from the first line on
    assert {name for _, _, name, _ in marks} == result.ran

    total = 17 * 10.0 + 4 * 2.0  # 17 tasks of 10 s (15 stage tasks, 2 size checks), 4 packages of 2 s (one of them
    #                              the stage's median)
    assert (f"21 task(s) to run, about {format_seconds(total)} by out/.build-state/build.log (1 never ran here: "
            "each counted as the median of its stage)\n") in result.output
    assert marks[0][2:] == ("export:tinynet/head", format_seconds(total))
    assert marks[1][2:] == ("simplify:tinynet/head", format_seconds(total - 10))  # export is done
    assert marks[2][3] == format_seconds(total - 20)
    started = [name for _, _, name, _ in marks]
    first_package = started.index("package:tinynet/w8a16@SM8750")  # the guessed one: said until it starts
    assert guessed(result.output) == [1] * (first_package + 1) + [0] * (20 - first_package)

    slowest = re.search(r"^  wall time (.+); slowest: (\S+) .+, (\S+) .+, (\S+) .+$", result.output, re.M)
    assert slowest, result.output
    logged = {task: seconds for _, seconds, _, task in
              read_build_log(str(tinynet_repo / "out/.build-state/build.log"), last_build=True)}
    # the summary's three, in its order, took the log's three longest times; the log keeps milliseconds, so two
    # tasks within one of each other tie there and may come in either order (fresh59: two checks)
    assert [logged[task] for task in slowest.groups()[1:]] == sorted(logged.values(), reverse=True)[:3]


@pytest.mark.slow
def test_a_check_that_never_ran_counts_as_the_checks_of_its_kind(tinynet_repo):
    """Another chip's check proves its outputs equal to the reference chip's in seconds (stages/check.py): one that
    never ran counts as the median of those, not of every check (the full checks take minutes)."""
    from build_rules.plumbing.progress import format_seconds

    def seconds(name):
        if name == "check:tinynet/head/w8a16@SM8550":
            return None  # never ran here
        if name.startswith("check:"):
            return 60.0 if name.endswith("@SM8750") else 3.0  # SM8750: the reference, measured in full
        return 2.0 if name.startswith("package:") else 10.0
    write_build_log(tinynet_repo, seconds)
    change_head_checkpoint(tinynet_repo)
    result = run_doit(tinynet_repo)
    assert result.code == 0, result.output
    total = 13 * 10.0 + (60 + 60 + 3 + 3) + 4 * 2.0  # the guessed check: 3 s, the median of its kind (not 60 s)
    assert (f"21 task(s) to run, about {format_seconds(total)} by out/.build-state/build.log (1 never ran here: "
            "each counted as the median of its stage)\n") in result.output


def test_tasks_the_build_cache_holds_count_as_their_restore_not_their_work(tinynet_repo):
    """A rebuild restored from the cache in well under a second said "2 min 06 s left": its tasks counted as their
    last real run. Forgotten, simplify:tinynet/head and every task reading it are stale, and the cache holds them."""
    from build_rules.plumbing.progress import format_seconds
    in_process = ("package:", "size:")  # tasks run inside doit: not cached, a fraction of a second
    write_build_log(tinynet_repo, lambda n: 0.2 if n.startswith(in_process) else 10.0)  # one restore: 0.1 s
    assert run_doit(tinynet_repo, "forget", "simplify:tinynet/head").output == "forgetting simplify:tinynet/head\n"
    result = run_doit(tinynet_repo)
    assert result.code == 0, result.output
    hits = 13  # simplify, verify, calibration_stats, quantize, fp16_lint, 4 compiles and 4 checks of the head graph
    total = hits * 0.1 + 6 * 0.2  # the 4 packages and the 2 size checks are not cached: their own 0.2 s
    assert (f"19 task(s) to run, about {format_seconds(total)} by out/.build-state/build.log ({hits} in the build "
            "cache)\n") in result.output
    assert result.ran == {"simplify:tinynet/head"}  # restored with the same bytes: its readers stay up to date
    assert "(1 restored from the build cache)" in result.output


def test_a_no_op_prints_one_line(tinynet_repo):
    quiet = run_doit(tinynet_repo, "-v", "0")  # what `doit` prints
    assert quiet.code == 0, quiet.output
    assert quiet.output.splitlines() == ["summary: 0 task(s) ran, 38 up to date; no work to do"]
    listed = run_doit(tinynet_repo)  # verbosity 1: every up-to-date task, as doit lists them
    assert "package:tinynet/w8a16@SM8750" in listed.up_to_date and len(listed.up_to_date) > 38
    assert listed.output.endswith("summary: 0 task(s) ran, 38 up to date; no work to do\n")


def test_n_is_an_upper_bound_that_follows_what_doit_decides():
    from build_rules.doit_run.plan import predict

    class Task:
        def __init__(self, name, file_dep=(), task_dep=(), actions=True):
            self.name, self.file_dep, self.task_dep = name, set(file_dep), list(task_dep)
            self.targets, self.setup_tasks, self.actions = [f"{name}.out"], [], ["run"] if actions else []

    tasks = {t.name: t for t in (
        Task("a"), Task("b", ["a.out"], ["a"]), Task("c", ["b.out"], ["b"]),
        Task("d"), Task("e", task_dep=["a"]),  # e waits for a but reads nothing of it
        Task("all", task_dep=["c", "d", "e"], actions=False))}
    stale_by_itself = {"a"}
    assert predict(tasks, ["all"], lambda t: t.name in stale_by_itself, {}) == {"a", "b", "c"}
    # doit found b up to date after a ran (same bytes): c depends on b only, so it is not counted either
    assert predict(tasks, ["all"], lambda t: t.name in stale_by_itself, {"a": True, "b": False}) == {"a"}
    assert predict(tasks, ["c"], lambda t: False, {}) == set()


@pytest.mark.slow
def test_a_long_stage_reports_progress_in_its_log_and_on_the_console(tmp_path, monkeypatch):
    monkeypatch.setenv("BUILD_RULES_PROGRESS_SECONDS", "0.1")
    repo = make_repo(tmp_path / "repo", {"tinynet": TEST_MODELS / "tinynet"})
    folder = repo / "models/tinynet"
    write_tinynet_checkpoints(folder)
    (folder / "hooks.py").write_text((folder / "hooks.py").read_text() + '''

def evaluate(run_graph):
    import time
    for sample in _samples("encoder", 3, seed=5):
        time.sleep(0.5)  # a slow model: the stage reports between runs
        features = run_graph("encoder", sample)["features"]
        run_graph("head", {"features": features})
    return {"accuracy": 1.0}
''')
    toml = folder / "model.toml"
    toml.write_text(toml.read_text() + '\n[evaluate]\ngate = { metric = "accuracy", min = 0.5 }\n')
    result = run_doit(repo, "evaluate:tinynet/float")
    assert result.code == 0, result.output

    log = (repo / "out/tinynet/float/model.evaluate.log").read_text()
    lines = re.findall(r"^progress: graph runs: (.*), [\d.]+ s elapsed$", log, re.M)
    assert "encoder 1, head 1" in lines and "encoder 2, head 2" in lines, log  # between the runs, as they happen
    console = re.findall(r"^   evaluate:tinynet/float: graph runs: (.*), [\d.]+ s elapsed$", result.output, re.M)
    assert "encoder 1, head 1" in console, result.output
    report = json.loads((repo / "out/tinynet/float/model.evaluate.json").read_text())
    assert report["graph_runs"] == {"encoder": 3, "head": 3}  # the emulator runs' totals


def test_progress_lines_count_samples_and_time():
    code = ("import time\nfrom build_rules.plumbing import progress\nprogress.start()\n"
            "for _ in progress.track(range(3), 'samples'):\n    time.sleep(0.4)\n")
    env = dict(os.environ, BUILD_RULES_PROGRESS_SECONDS="0.1", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    counts = re.findall(r"^progress: (\d)/3 samples, [\d.]+ s elapsed$", out, re.M)
    assert {"0", "1", "2"} <= set(counts), out


def test_emulator_evaluate_progress_has_the_float_runs_as_totals(tmp_path, monkeypatch):
    from build_rules.plumbing import progress
    # A stage process has one stage's counters; this test process may hold those of stages other test files called
    # in-process (a search's watch stays registered): start from none.
    monkeypatch.setattr(progress, "_counters", {})
    report = tmp_path / "model.evaluate.json"
    report.write_text(json.dumps({"metrics": {}, "graph_runs": {"encoder": 4, "decoder": 90}}))
    run_graph = progress.count_graph_runs(lambda graph, feed: {"out": graph}, str(report))
    for graph in ("encoder", "decoder", "decoder"):
        assert run_graph(graph, {}) == {"out": graph}
    assert run_graph.runs == {"encoder": 1, "decoder": 2}
    assert progress.line().startswith("progress: graph runs: encoder 1/4, decoder 2/90, ")


def test_a_failure_says_what_was_not_built_and_continue_builds_the_rest(tinynet_repo):
    toml = tinynet_repo / "models/tinynet/model.toml"
    text = toml.read_text()
    toml.write_text(text.replace('gate = { metric = "cosine", min = 0.98 }', 'gate = { metric = "sqnr", min = 500 }'))
    stopped = run_doit(tinynet_repo, "-v", "0")
    assert stopped.code != 0
    assert "gate failed: sqnr = " in stopped.output
    summary = stopped.output[stopped.output.index("summary:"):]
    assert ", 1 failed\n" in summary, summary
    # One line names the failure, what it stopped and the way on (issue 35: the user counted 43 tasks not run)
    stopped_line = re.search(r"  stopped at the first failure, (\S+) \(its message above\): (\d+) planned task\(s\) "
                             r"not run(, of variant\(s\) [\w, ]+ too)?; `doit --continue` builds everything that does "
                             r"not need the failed task\n", summary)
    assert stopped_line, summary
    assert stopped_line.group(1).startswith("check:tinynet/head/"), summary
    assert int(stopped_line.group(2)) >= 1
    # The gate is judged on the head's checks only: --continue builds the encoder's and skips what needs the head.
    kept_going = run_doit(tinynet_repo, "-v", "0", "--continue")
    assert kept_going.code != 0
    summary = kept_going.output[kept_going.output.index("summary:"):]
    assert "stopped at the first failure" not in summary
    # the 2 reference chip's head checks fail; the other chip's come after them (task_dep) and are not run, nor
    # are the 4 packages (the model and chip groups are not counted)
    assert ", 2 failed, 6 not run (they need a failed task)" in summary, summary
    assert ("   not run: check:tinynet/head/w8a16@SM8550 (it needs check:tinynet/head/w8a16@SM8750, which failed)\n"
            in kept_going.output)
    assert kept_going.ran == {f"check:tinynet/head/{v}@SM8750" for v in ("fp16", "w8a16")}


def test_always_execute_counts_every_task_from_the_first_line(tinynet_repo):
    """doit hands the reporter no runner, so `-a` is seen when a task its status check finds up to date starts:
    N then counts every task of the selection, from the first [k/N] on."""
    result = run_doit(tinynet_repo, "-a", "export:tinynet/head", "simplify:tinynet/head", "verify:tinynet/head")
    assert result.code == 0, result.output
    marks = markers(result.output)
    assert [(k, n) for k, n, *_ in marks] == [(1, 3), (2, 3), (3, 3)], result.output
    assert result.ran == {"export:tinynet/head", "simplify:tinynet/head", "verify:tinynet/head"}


@pytest.mark.slow
def test_parallel_workers_share_the_time_left(tinynet_repo):
    """`doit -n 2` (worker processes, doit's default): the time left is the work left over the two workers doit
    started before the first task (plan.workers)."""
    from build_rules.plumbing.progress import format_seconds
    write_build_log(tinynet_repo, lambda n: 10.0)
    change_head_checkpoint(tinynet_repo)
    result = run_doit(tinynet_repo, "-n", "2")
    assert result.code == 0, result.output
    assert f"21 task(s) to run, about {format_seconds(21 * 10.0 / 2)} by out/.build-state/build.log\n" in result.output


@pytest.mark.slow
def test_the_emulator_work_left_is_bounded_by_the_machines_emulator_slots(tinynet_repo, monkeypatch):
    """Issue 36 item 6: doit's jobs divide the wall times, but every task shares the machine's emulator slots. The
    head graph's 4 checks each ran 40 s of emulator sessions last time; with one slot they take 160 s whatever
    `-n` says, more than the 21 tasks' 210 s over doit's 2 jobs. The real build then logs what its checks ran."""
    from build_rules.build_log import emulator_seconds
    from build_rules.plumbing.progress import format_seconds
    write_build_log(tinynet_repo, lambda n: 10.0, lambda n: 40.0 if n.startswith("check:tinynet/head/") else 0.0)
    change_head_checkpoint(tinynet_repo)
    monkeypatch.setenv("BUILD_RULES_EMULATOR_WORKERS", "1")
    result = run_doit(tinynet_repo, "-n", "2")
    assert result.code == 0, result.output
    assert f"21 task(s) to run, about {format_seconds(4 * 40.0)} by out/.build-state/build.log\n" in result.output
    logged = emulator_seconds(str(tinynet_repo / "out/.build-state/build.log"))
    checks = {n for n in result.ran if n.startswith("check:")}
    assert len(checks) == 4 and all(logged.get(n, 0) > 0 for n in checks), logged  # their sessions' seconds
    assert not any(n.startswith(("export:", "simplify:", "compile:")) for n in logged), logged  # no emulator


def test_a_rerun_that_judges_remembered_numbers_estimates_seconds_not_their_measurement(tinynet_repo):
    """Issue 35: "about 5 min 09 s" for a 0.9 s re-run that only judged saved numbers again (issue 36: a gate edit).
    Checks keep their measurement in the memo (another chip's, its proof in the proof memo); with the gate edited
    they run again without the emulator, and the estimate counts each as a second, not as its last measurement."""
    from build_rules.doit_run.plan import REMEMBERED_SECONDS
    from build_rules.plumbing.progress import format_seconds
    toml = tinynet_repo / "models/tinynet/model.toml"
    text = toml.read_text()
    built = run_doit(tinynet_repo)  # (the fixture's repo is built: its checks' memos and proofs are there)
    assert built.code == 0, built.output
    # as measured on the user's detector: minutes per full check on the emulator
    write_build_log(tinynet_repo, lambda n: 300.0 if n.startswith("check:") else 0.2)
    toml.write_text(text.replace('gate = { metric = "cosine", min = 0.98 }', 'gate = { metric = "cosine", min = 0.97 }'))
    result = run_doit(tinynet_repo)  # (a gate never built before: not from the build cache)
    assert result.code == 0, result.output
    checks = result.ran_stage("check")
    assert checks == {f"check:tinynet/head/{v}@{c}" for v in ("fp16", "w8a16") for c in ("SM8550", "SM8750")}
    packages = result.ran_stage("package")
    assert len(result.ran) == len(checks) + len(packages)
    total = len(checks) * REMEMBERED_SECONDS + len(packages) * 0.2
    assert (f"{len(result.ran)} task(s) to run, about {format_seconds(total)} by out/.build-state/build.log "
            f"({len(checks)} judged again on remembered numbers, without the emulator)\n") in result.output, \
        re.findall(r"^\d+ task.*$", result.output, re.M)
    for name in checks:  # and so they did: no emulator run
        model, rest = name.split(":")[1].split("/", 1)
        graph, variant_chip = rest.split("/")
        variant, chip = variant_chip.split("@")
        log = (tinynet_repo / f"out/{model}/{variant}/{chip}/{graph}.check.log").read_text()
        assert "the emulator does not run again" in log or "(the same binaries and samples): equal to" in log, (name, log)


def test_a_task_of_a_kind_that_never_ran_here_is_not_given_another_kinds_time(tinynet_repo):
    """A first `doit tune` said 'about 3.3 s' and ran 5 min 42 s, a first sensitivity 'about 2.5 s' for 9 min (issue
    44 item 7): a task whose stage never ran here was timed as the median of every task. It is left out of the time
    left, which says so; here the report, the one task of `doit report:tinynet`, after a build log without one."""
    write_build_log(tinynet_repo, lambda n: None if n.startswith("report:") else 10.0)
    result = run_doit(tinynet_repo, "report:tinynet")
    assert result.code == 0, result.output
    assert "1 task(s) to run (report:tinynet never ran here, nor any report task: no estimate for it)\n" in result.output
    assert markers(result.output) == [(1, 1, "report:tinynet", "")]  # no time left on its line either
