"""A binary that does not repeat itself (build_rules/emulator/repeats.py): the emulator door runs a binary's first samples
twice and compares the bytes, keeps what it found per binary, never memoizes a binary that gave other outputs on
another run, and every verdict says so. The unstable binary is tests/models/detector's w8a16 (C2f-style blocks at
12x12 x 128 channels: different outputs on nearly every run on the x86 HTP emulator); its w8a8 repeats itself."""
from __future__ import annotations

import json
import os
import re
import runpy
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime_qnn")

from conftest import TEST_MODELS, make_repo, run_doit  # noqa: E402

from build_rules.emulator import emulator_runs, repeats  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_emulator_runs import binary, spy  # noqa: E402,F401  (fixtures: a tiny fp16 binary, a session spy)
from test_ort_qnn_toolchain import samples  # noqa: E402

UNSTABLE = "check:detector/det/w8a16@SM8750"


def detector_repo(dest: Path, extra: str = "", chips: list[str] | None = None) -> Path:
    repo = make_repo(dest, {"detector": TEST_MODELS / "detector"})
    folder = repo / "models/detector"
    runpy.run_path(str(folder / "hooks.py"))["write_model"](folder / "detector.onnx")
    toml = folder / "model.toml"
    text = toml.read_text() + extra
    if chips:
        text = text.replace('chips = ["SM8750"]', f"chips = {json.dumps(chips)}")
    toml.write_text(text)
    return repo


@pytest.fixture(scope="module")
def built_detector(tmp_path_factory) -> Path:
    """The detector compiled for SM8750 at w8a16 and w8a8 (not checked: each test checks what it asserts on)."""
    repo = detector_repo(tmp_path_factory.mktemp("detector-built"))
    result = run_doit(repo, "compile:detector/det/w8a16@SM8750", "compile:detector/det/w8a8@SM8750",
                      "verify:detector/det")
    assert result.code == 0, result.output
    return repo


@pytest.fixture
def detector(built_detector, tmp_path) -> Path:
    copy = tmp_path / "repo"
    shutil.copytree(built_detector, copy, symlinks=True)
    return copy


def _evaluation(repo: Path):
    from build_rules.measuring.samples import load_evaluation
    return load_evaluation(str(repo / "out/detector/float/det.evaluation.npz"))


# --- the door -------------------------------------------------------------------------------------------------------

def test_a_binarys_first_samples_run_twice_then_once_and_go_in_the_memo(binary, spy, monkeypatch):
    monkeypatch.setenv("BUILD_RULES_REPEAT_SAMPLES", "3")
    monkeypatch.setenv("BUILD_RULES_EMULATOR_WORKERS", "1")
    feeds = samples(5, 11)
    first = emulator_runs.run_outputs(binary, feeds)
    assert [line[0] for line in spy()].count("run") == 3 * 2 + 2  # samples 0-2 twice, 3-4 once
    assert [len(o.others) for o in first] == [1, 1, 1, 0, 0]
    assert repeats.shown(first) == {"repeats": True, "samples": 3, "runs": 2, "spread": {"y": 0.0},
                                    "varying_samples": 0, "first": None}
    assert emulator_runs.repeat_record(binary) == {"equal": 3, "unstable": None}
    # checked: a new job runs each new sample once, and every sample of the first job comes from the memo
    more = samples(2, 12)
    before = len(spy())
    emulator_runs.run_outputs(binary, feeds + more)
    assert [line[0] for line in spy()[before:]].count("run") == 2


def test_which_samples_run_twice_is_decided_for_the_job_not_by_racing_workers(binary, monkeypatch):
    """Two workers each asked the shared record whether the binary was checked yet: a check reported 16 samples run
    twice for one build and 17 for the same binary in another (issue 46's byte-identical check reports). The job
    decides: the first samples it runs, as many as the binary still needs, whichever worker runs them."""
    monkeypatch.setenv("BUILD_RULES_REPEAT_SAMPLES", "3")
    monkeypatch.setenv("BUILD_RULES_EMULATOR_WORKERS", "2")
    monkeypatch.setenv("BUILD_RULES_EMULATOR_INLINE_SECONDS", "0")  # on the workers, however small the job
    first = emulator_runs.run_outputs(binary, samples(12, 13))
    assert [len(o.others) for o in first] == [1, 1, 1] + [0] * 9
    assert repeats.shown(first)["samples"] == 3 and emulator_runs.repeat_record(binary)["equal"] == 3


def test_workers_noting_samples_at_once_lose_no_count_and_no_finding(tmp_path):
    """A job's workers note the samples they ran twice in the binary's record at once: under load two read the same
    count and one update was lost (fresh27: 3 samples ran twice, the record said 2); a worker could as well write
    "unstable": None back over another's finding. Four processes note 40 equal samples each: 160; then again with one
    differing sample among them: the finding stays."""
    import multiprocessing
    context = multiprocessing.get_context("spawn")  # fresh interpreters, as the workers are
    with context.Pool(4) as pool:
        pool.starmap(_note_many, [(str(tmp_path / "equal"), 40, False) for _ in range(4)])
        pool.starmap(_note_many, [(str(tmp_path / "differ"), 40, worker == 3) for worker in range(4)])
    assert repeats.Record("ab" * 8, tmp_path / "equal").load() == {"equal": 160, "unstable": None}
    assert repeats.Record("ab" * 8, tmp_path / "differ").load()["unstable"] == {"output": "y", "spread": 1.0,
                                                                                "runs": 2}


def _note_many(folder: str, count: int, differ_midway: bool) -> None:
    import numpy as np
    record = repeats.Record("ab" * 8, folder)
    same = repeats.Outputs({"y": np.zeros(2)}, [{"y": np.zeros(2)}])
    for i in range(count):
        if differ_midway and i == count // 2:
            record.note(repeats.Outputs({"y": np.zeros(2)}, [{"y": np.ones(2)}]))
        record.note(same)


def test_a_binary_that_does_not_repeat_itself_is_never_memoized(detector, monkeypatch):
    monkeypatch.chdir(detector)
    inputs, _ = _evaluation(detector)
    ctx = "out/detector/w8a16/SM8750/det_ctx.onnx"
    first = emulator_runs.run_outputs(ctx, inputs)
    found = repeats.shown(first)
    assert found["repeats"] is False and found["runs"] == 2 and found["varying_samples"] >= 3
    assert found["spread"]["output0"] > 1.0  # boxes in pixels of a 320-pixel frame: differences of pixels, not steps
    record = emulator_runs.repeat_record(ctx)
    assert record["unstable"]["output"] == "output0" and record["unstable"]["spread"] > 0
    assert not list(Path("out/.build-state/emulator-outputs").rglob("*.npz"))  # not one draw kept as the answer
    again = emulator_runs.run_outputs(ctx, inputs[:2])  # from the record: each sample twice, none from the memo
    assert all(len(o.others) == 1 for o in again)
    # the w8a8 binary of the same model repeats itself: its samples are memoized
    stable = emulator_runs.run_outputs("out/detector/w8a8/SM8750/det_ctx.onnx", inputs)
    assert repeats.shown(stable)["repeats"] is True
    assert len(list(Path("out/.build-state/emulator-outputs").rglob("*.npz"))) == len(inputs)


# --- the verdicts ----------------------------------------------------------------------------------------------------

def test_the_check_of_a_binary_that_does_not_repeat_itself_fails_naming_it(detector):
    result = run_doit(detector, UNSTABLE)
    assert result.code != 0
    message = next(line for line in result.output.splitlines() if line.startswith(f"{UNSTABLE}: "))
    # which sample shows it first is itself chance (fresh35: sample 1, sample 0 unchanged between its two runs)
    assert re.match(re.escape(f"{UNSTABLE}: the binary does not repeat itself on the emulator: sample ") +
                    r"\d+'s output 'output0' differed between 2 runs of one session by up to ", message), message
    assert "; it starts at node '/" in message and "16-bit output" in message  # located on the exposed model
    assert message.endswith("a verdict on one run would be chance, so the check fails; `doit diagnose:detector/det/"
                            "w8a16@SM8750` tries precisions until one repeats itself (docs/building.md, \"A binary "
                            "that does not repeat itself\")")
    memo = json.loads((detector / "out/detector/w8a16/SM8750/det.measure.json").read_text())
    metrics = memo["metrics"]
    assert metrics["repeats"]["repeats"] is False and len(metrics["runs"]) == 2
    # its numbers are the worst of its runs
    worst = metrics["outputs"]["output0"]["cosine"]
    assert worst == min(run["cosine"] for run in metrics["runs"])
    assert memo["failed"]["error"].startswith(f"{UNSTABLE}: the binary does not repeat itself")
    # the w8a8 binary's check says how many samples repeated themselves
    run_doit(detector, "--continue", "check:detector/det/w8a8@SM8750")
    w8a8 = json.loads((detector / "out/detector/w8a8/SM8750/det.measure.json").read_text())["metrics"]
    assert w8a8["repeats"]["repeats"] is True and w8a8["repeats"]["samples"] == 6


def test_no_chip_is_proven_equal_to_a_binary_that_does_not_repeat_itself(tmp_path):
    repo = detector_repo(tmp_path / "repo", chips=["SM8750", "SM8650"])
    result = run_doit(repo, "--continue", "check:detector/det/w8a16@SM8650")
    assert result.code != 0  # the reference chip's check fails first, and the other chip's waits on it
    assert ("not run: check:detector/det/w8a16@SM8650 (it needs check:detector/det/w8a16@SM8750, which failed)"
            in result.output)
    result = run_doit(repo, "-s", "check:detector/det/w8a16@SM8650")  # that one alone, as a user may run it
    assert result.code != 0
    log = (repo / "out/detector/w8a16/SM8650/det.check.log").read_text()
    assert ("proof: SM8750's binary does not repeat itself (output 'output0' differed by up to ") in log
    assert "no proof by equal outputs, a full check of this binary" in log
    assert "check:detector/det/w8a16@SM8650: the binary does not repeat itself on the emulator" in result.output
    proof = json.loads((repo / "out/detector/w8a16/SM8650/det.proof.json").read_text())["proof"]
    assert proof["equal"] is False and proof["unstable"] == "reference"


def test_diagnose_names_where_it_starts_and_a_precision_that_repeats(detector):
    result = run_doit(detector, "diagnose:detector/det/w8a16@SM8750")
    assert result.code == 0, result.output
    report = json.loads((detector / "out/detector/w8a16/SM8750/det.diagnose.json").read_text())
    examined = report["instability"]
    assert examined["found"]["repeats"] is False
    assert all(not session["repeats"] and session["sources"] for session in examined["located"])
    assert report["exposure"]["identical"] is None  # not judged: the plain binary varies by itself
    fixes = examined["fixes"]
    # measured: its source alone at 8 bit still varies; the stage of the network it sits in (12x12) repeats itself
    assert fixes[-1]["repeats"] is True and "stage of the network (outputs of 12x12)" in fixes[-1]["description"]
    assert all(f["repeats"] is False for f in fixes[:-1])
    assert fixes[-1]["cosine"] > 0.999
    lines = report["diagnosis"]
    assert re.match(r"The binary does not repeat itself on the emulator: sample \d+'s output 'output0'", lines[0])
    fix = next(line for line in lines if "Fix: " in line)
    assert "[variants.w8a16.graphs.det]\nnode_overrides = { " in fix
    # the fix, built as the build makes it, repeats itself on every sample and passes the gates
    overrides = fix.split("node_overrides = ", 1)[1]
    toml = detector / "models/detector/model.toml"
    toml.write_text(toml.read_text() + f'\n[variants.w8a16_fixed]\ninherits = "w8a16"\nnode_overrides = {overrides}\n')
    result = run_doit(detector, "check:detector/det/w8a16_fixed@SM8750")
    assert result.code == 0, result.output
    check = json.loads((detector / "out/detector/w8a16_fixed/SM8750/det.check.json").read_text())
    assert check["repeats"] == {"repeats": True, "samples": 6, "runs": 2, "spread": {"output0": 0.0},
                                "varying_samples": 0, "first": None}
    assert check["summary"]["det_f1"] >= 0.9


def test_sensitivity_says_when_an_end_does_not_repeat_itself(detector):
    toml = detector / "models/detector/model.toml"
    toml.write_text(toml.read_text() + '\n[tuning]\nsamples = 3\nmax_measurements = 8\n')
    result = run_doit(detector, "sensitivity:detector/det/w8a8")
    assert result.code == 0, result.output
    report = json.loads((detector / "out/detector/tuning/w8a8/det.sensitivity.json").read_text())
    assert "unstable" not in report["base"]  # every candidate at 8 bit: w8a8, which repeats itself
    assert report["all_16bit"]["unstable"].startswith("sample ")
    markdown = (detector / "out/detector/tuning/w8a8/det.sensitivity.md").read_text()
    assert "**Every candidate at 16 bit does not repeat itself on the emulator** (sample " in markdown


class _RarelyVarying:
    """An emulator session whose output for sample `sample` differs from its first run on run `on` (1: the first)."""

    def __init__(self, sample: int, on: int):
        self.sample, self.on, self.calls = sample, on, {}

    def run(self, names, feed):
        import numpy as np
        index = int(feed["x"][0])
        self.calls[index] = self.calls.get(index, 0) + 1
        value = 1.0 + (index == self.sample and self.calls[index] == self.on)
        return [np.full(2, value, dtype=np.float32)]


@pytest.mark.parametrize("checks", ["", "0", "8"])
def test_a_fix_diagnose_names_repeats_itself_over_as_many_pairs_of_runs_as_the_builds_check_asks(monkeypatch, checks):
    """instability.repeatable judged a candidate on 3 runs of each of diagnose's 4 samples: 8 pairs, which a candidate
    that still varies, as often as YOLOv8n's binary does (1 pair in 3), passes with probability 4 % (the check: 16
    pairs, 0.2 %). Now it runs each sample until it has the check's pairs (BUILD_RULES_REPEAT_SAMPLES, 16 when unset
    or 0), so a candidate whose sample 2 differs only on its 5th run is seen to vary."""
    import contextlib

    import numpy as np

    from build_rules.stages.support import instability
    from build_rules.toolchains import ort_qnn
    monkeypatch.setenv(repeats.SAMPLES_ENV, checks)
    sessions = []

    def session(model, **options):
        sessions.append(_RarelyVarying(sample=2, on=5))
        return sessions[-1]
    monkeypatch.setattr(ort_qnn, "emulator_session", session)
    monkeypatch.setattr(emulator_runs, "holding_slot", lambda pin=False: contextlib.nullcontext())
    feeds = [{"x": np.array([i], dtype=np.float32)} for i in range(4)]
    reference = [{"y": np.ones(2, dtype=np.float32)} for _ in feeds]
    found = instability.repeatable(b"model", feeds, reference, {"soc_id": 69, "vtcm_mb": 8})
    pairs = 8 if checks == "8" else 16
    assert (found["runs"], found["pairs"]) == (1 + pairs // 4, pairs)
    assert sessions[0].calls == {i: 1 + pairs // 4 for i in range(4)}
    assert found["repeats"] is (pairs < 16)  # 8 pairs (3 runs each) miss the 5th run's difference
    assert found["spread"] == {"y": 0.0 if pairs < 16 else 1.0}


class _VaryingOnRun:
    """An emulator session of a model with one exposed tensor 't' and the final output 'y': 't' differs from the
    first run on run `on` (1: the first; None: never)."""

    def __init__(self, on: int | None):
        self.on, self.calls = on, 0

    def get_outputs(self):
        from types import SimpleNamespace
        return [SimpleNamespace(name="t"), SimpleNamespace(name="y")]

    def run(self, names, feed):
        import numpy as np
        self.calls += 1
        return [np.full(2, 1.0 + (self.calls == self.on), dtype=np.float32), np.ones(2, dtype=np.float32)]


@pytest.mark.parametrize("on, checks, runs", [(3, "", 4), (7, "", 7), (None, "", 17), (12, "8", 9)])
def test_locate_runs_one_sample_on_while_no_run_differs_up_to_the_checks_pairs(monkeypatch, on, checks, runs):
    """instability.locate ran one sample 4 times and called the exposed model one that repeats itself when they all
    agreed: for a model whose runs differ one time in three (YOLOv8n w8a16) that is (2/3)^3, 30 % of the sessions, and
    check and diagnose then said that no op could be named. It runs on while nothing differed, up to as many later
    runs as the check's pairs (BUILD_RULES_REPEAT_SAMPLES, 16 when unset)."""
    import contextlib
    from types import SimpleNamespace

    from build_rules.stages.support import instability
    from build_rules.toolchains import ort_qnn
    monkeypatch.setenv(repeats.SAMPLES_ENV, checks)
    session = _VaryingOnRun(on)
    monkeypatch.setattr(ort_qnn, "emulator_session", lambda model, **options: session)
    monkeypatch.setattr(emulator_runs, "holding_slot", lambda pin=False: contextlib.nullcontext())
    graph = SimpleNamespace(exposed_model=lambda tensors: SimpleNamespace(SerializeToString=lambda: b"model"),
                            sources=lambda names: {n: [] for n in names}, final=["y"])
    tensor = SimpleNamespace(output="t", float_name="t", scale=0.5, node="/stage/Mul", op_type="Mul", bits=16)
    found = instability.locate(graph, [tensor], {"x": None}, {"soc_id": 69, "vtcm_mb": 8}, fp16=False)
    assert session.calls == found["runs"] == runs
    varies = on is not None and on <= runs
    assert found["repeats"] is not varies
    assert found["sources"] == ([{"tensor": "t", "node": "/stage/Mul", "op_type": "Mul", "bits": 16, "spread": 0.5}]
                                if varies else [])
    assert found["outputs"] == {"y": 0.0}
    if not varies:
        assert instability.where(found).startswith(f"the model with its 1 tensors exposed repeated itself over {runs} "
                                                   "runs of one sample")
