"""Numbers a user can trust (issue 44 items 4 and 6), on tests/models/detector, the YOLOv8-style detector with a score
hook (det_f1, box_iou): a check that stops early says why the hook's metrics are missing, the report marks a stopped
check's numbers as those of its first samples. One chip (SM8750); w8a8 with a cosine gate it misses on the first
sample, and fp16."""
from __future__ import annotations

import json
import re
import runpy
from pathlib import Path

import pytest

from conftest import TEST_MODELS, make_repo, run_doit

OUT = Path("out/detector")
FP16 = '''
[variants.fp16]
precision = "fp16"
'''


def detector_repo(dest: Path, cosine: float = 0.99, without: tuple = ("w8a16",), extra: str = "") -> Path:
    """tests/models/detector with its model written, its cosine gate at `cosine`, the variants in `without` left out
    (w8a16's outputs vary from run to run: issue 44 item 1) and `extra` appended to model.toml."""
    repo = make_repo(dest, {"detector": TEST_MODELS / "detector"})
    folder = repo / "models/detector"
    runpy.run_path(str(folder / "hooks.py"))["write_model"](folder / "detector.onnx")
    toml = folder / "model.toml"
    text = toml.read_text().replace('{ metric = "cosine", min = 0.99 }', f'{{ metric = "cosine", min = {cosine} }}')
    for name in without:
        start = text.index(f"[variants.{name}]")
        end = text.find("\n[", start + 1)
        text = text[:start] + (text[end + 1:] if end >= 0 else "")
    toml.write_text(text + extra)
    return repo


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """w8a8's check stopped after its first sample (cosine >= 0.99999 cannot hold), fp16 built: `doit --continue`
    as a user runs it."""
    repo = detector_repo(tmp_path_factory.mktemp("detector"), cosine=0.99999, extra=FP16)
    result = run_doit(repo, "--continue")
    assert result.code != 0
    assert {"check:detector/det/w8a8@SM8750", "package:detector/fp16@SM8750"} <= result.ran, result.output
    return repo


def test_a_check_stopped_early_says_why_the_score_hooks_metrics_are_missing(built):
    """The score hook exists; the check stopped once cosine decided: det_f1 was not measured for that reason, and the
    memo says so instead of 'a task metric needs a score() hook'."""
    memo = json.loads((built / OUT / "w8a8/SM8750/det.measure.json").read_text())
    assert memo["metrics"]["partial"]["samples"] == 1 and memo["metrics"]["partial"]["of"] == 6
    gated = {g["metric"]: g for g in memo["failed"]["gated"]}
    assert gated["det_f1"]["passed"] is None and gated["det_f1"]["value"] is None
    assert gated["det_f1"]["failure"] == (
        "det_f1 not measured: the measurement stopped after 1 of 6 samples, once cosine failed whatever the other "
        "samples give; score() runs only on a measurement of every sample")
    assert gated["cosine"]["passed"] is False


def test_the_report_marks_a_stopped_checks_numbers_as_those_of_its_first_samples(built):
    result = run_doit(built, "--continue", "report:detector")
    assert result.ran == {"report:detector"}, result.output
    markdown = (built / OUT / "report.md").read_text()
    report = json.loads((built / OUT / "report.json").read_text())
    cells = {c["variant"]: c for c in report["cells"]}
    assert set(cells) == {"w8a8", "fp16"}

    # w8a8: the numbers of its first sample, each marked; the score hook's metrics not measured, and why
    row = next(line for line in markdown.splitlines() if line.startswith("| w8a8 | SM8750 | det |"))
    cosine, sqnr, max_abs, task, gate, measured = row.split(" | ")[5:11]
    assert cosine.endswith(" (1 of 6)") and sqnr.endswith(" (1 of 6)") and max_abs.endswith(" (1 of 6)")
    assert float(cosine.split()[0]) == pytest.approx(cells["w8a8"]["summary"]["cosine"], abs=1e-6)
    assert task == "not measured (stopped after 1 of 6 samples)"
    assert gate == "not judged, stopped early (det_f1 >= 0.9); **FAIL** (cosine >= 0.99999)"
    assert measured == "memo (1 of 6 samples)"
    assert "det_f1" not in cells["w8a8"]["summary"]
    stopped = next(line for line in markdown.splitlines() if line.startswith("**Stopped early**"))
    assert re.search(r"\): w8a8@SM8750 det after 1 of 6 samples: cosine at most 0\.99\d+ whatever the other 5 samples "
                     r"give, needs >= 0\.99999 \(det_f1 not measured: score\(\) runs only on a check of every "
                     r"sample\)$", stopped), stopped

    # fp16: measured in full, its score hook's metrics beside the float model's; frame_cosine is not one of them
    row = next(line for line in markdown.splitlines() if line.startswith("| fp16 | SM8750 | det |"))
    assert row.split(" | ")[8] == "box_iou 0.9849 (98.5 % of float), det_f1 1 (100.0 % of float)"
