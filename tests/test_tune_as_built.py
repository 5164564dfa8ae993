"""doit tune on the YOLOv8-style detector (tests/models/detector): its w8a8 misses det_f1 at cosine 0.9997 (boxes
and class scores share one output). tune starts from the quantize stage's Concat warning, searches on the CPU and
confirms on the emulator; its last step builds the proposal as the build builds it, and the build's check of the
applied proposal gives exactly those numbers (issue 44 items 2 and 3, issue 45)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime_qnn")

from conftest import run_doit  # noqa: E402
from test_repeats import detector_repo  # noqa: E402


def test_tune_starts_from_the_concat_fix_and_its_proposal_builds_to_its_numbers(tmp_path, monkeypatch):
    repo = detector_repo(tmp_path / "repo", extra='\n[tuning]\ntry_variants = false\n')
    result = run_doit(repo, "tune:detector/w8a8")
    assert result.code == 0, result.output
    log = (repo / "out/detector/tuning/w8a8.tune.log").read_text()
    assert ("det: first in the ranking, the fix of the quantize stage's Concat warning: output0, "
            "/head/cls/Sigmoid_output_0") in log
    assert " # LIBNATIVE:" not in log  # the emulator's per-session line stays out of stage logs
    tuned = json.loads((repo / "out/detector/tuning/w8a8.tuned.json").read_text())
    det = tuned["graphs"]["det"]
    assert det["base"]["det_f1"] < 0.9 <= det["tuned"]["det_f1"]
    assert set(det["sixteen_bit"]) <= {"output0", "/head/cls/Sigmoid_output_0"}, det["sixteen_bit"]
    # the CPU searched: the emulator measured the ends and confirmed the proposal, no more
    assert det["evaluations"] <= 4 and det["cpu_evaluations"] > det["evaluations"]
    assert [p["point"] for p in det["cpu_vs_emulator"]] == ["the variant at 8 bit", "all at 16 bit", "proposal 1"]
    built = tuned["as_built"]["det"]
    assert built["meets"] is True and built["summary"]["det_f1"] == det["tuned"]["det_f1"]
    text = (repo / "out/detector/tuning/w8a8.tuned.toml").read_text()
    assert "#     the CPU against the emulator: the variant at 8 bit (6 samples): det_f1 CPU " in text
    assert "# Built as the build builds it (quantize, compile for SM8750, " in text
    from build_rules import tuning
    monkeypatch.chdir(repo)
    assert tuning.apply(Path("out/detector/tuning/w8a8.tuned.toml")) == "w8a8_tuned"
    result = run_doit(repo, "check:detector/det/w8a8_tuned@SM8750")
    assert result.code == 0, result.output
    check = json.loads((repo / "out/detector/w8a8_tuned/SM8750/det.check.json").read_text())
    assert check["summary"]["det_f1"] == built["summary"]["det_f1"]
    assert check["summary"]["cosine"] == built["summary"]["cosine"]
    assert check["repeats"]["repeats"] is True
