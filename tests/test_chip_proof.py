"""One chip's binaries are checked in full on the HTP emulator; every other chip's prove their outputs equal to the
reference chip's on a few evaluation samples, bit for bit, and take its metrics, labelled so (stages/check.py,
[check] of model.toml). A difference, or `[check] every_chip = true`, gets the full check. The report shows what
was measured and marks what was not, without running a check itself."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from conftest import run_doit

OUT = Path("out/tinynet")


def _check(repo: Path, variant: str, chip: str, graph: str) -> dict:
    return json.loads((repo / OUT / variant / chip / f"{graph}.check.json").read_text())


def test_another_chip_takes_the_reference_metrics_when_its_outputs_are_equal(tinynet_repo):
    for variant in ("fp16", "w8a16"):
        for graph in ("encoder", "head"):
            reference, other = _check(tinynet_repo, variant, "SM8750", graph), _check(tinynet_repo, variant, "SM8550", graph)
            assert "equal_to" not in reference and reference["samples"] > 3
            assert other["equal_to"]["chip"] == "SM8750" and other["equal_to"]["samples"] == 3
            assert other["summary"] == reference["summary"] and other["inputs"] == reference["inputs"]
            log = (tinynet_repo / OUT / variant / "SM8550" / f"{graph}.check.log").read_text()
            assert "proof: equal to SM8750's outputs, bit for bit: its metrics, no full check" in log
            # only the reference binary was measured over the whole evaluation set
            assert not (tinynet_repo / OUT / variant / "SM8550" / f"{graph}.measure.json").exists()
            manifest = json.loads((tinynet_repo / OUT / variant / "SM8550" / "manifest.json").read_text())
            assert manifest["graphs"][graph]["equal_to"] == other["equal_to"]
    result = run_doit(tinynet_repo, "dist:tinynet")
    assert result.code == 0, result.output
    index = json.loads((tinynet_repo / OUT / "dist/w8a16/index.json").read_text())
    assert index["chips"]["SM8550"]["equal_to"]["head"]["chip"] == "SM8750"
    assert "equal_to" not in index["chips"]["SM8750"]


def test_the_summary_says_which_chip_the_metrics_were_measured_on(tinynet_repo):
    result = run_doit(tinynet_repo, "-a", "check:tinynet/head/w8a16@SM8550")
    assert result.code == 0, result.output
    # The pair's check ran, its package did not: "checked now", numbers from the checks, not "earlier"
    assert re.search(r"^  checked now out/tinynet/w8a16/SM8550: encoder 0\.\d\d MB cosine 1 \(equal to SM8750 on 3 "
                     r"samples\), head 0\.\d\d MB cosine 0\.99\d+ \(equal to SM8750 on 3 samples\)$", result.output, re.M), \
        result.output


def test_every_chip_setting_forces_full_checks(tinynet_repo):
    toml = tinynet_repo / "models/tinynet/model.toml"
    toml.write_text(toml.read_text() + "\n[check]\nevery_chip = true\n")
    result = run_doit(tinynet_repo)
    assert result.code == 0, result.output
    # only the other chip's checks change (their proof is gone); the reference's keys are the same
    assert result.ran_stage("check") == {f"check:tinynet/{g}/{v}@SM8550" for g in ("encoder", "head")
                                         for v in ("fp16", "w8a16")}
    full = _check(tinynet_repo, "w8a16", "SM8550", "head")
    assert "equal_to" not in full and full["samples"] > 3
    assert (tinynet_repo / OUT / "w8a16/SM8550/head.measure.json").exists()
    assert full["summary"] == _check(tinynet_repo, "w8a16", "SM8750", "head")["summary"]  # equal, measured again
    assert "(equal to SM8750" not in result.output


def test_a_reference_chip_that_is_not_the_models_is_refused(tinynet_repo):
    toml = tinynet_repo / "models/tinynet/model.toml"
    toml.write_text(toml.read_text() + "\n[check]\nreference_chip = \"SM8650\"\n")
    result = run_doit(tinynet_repo, "list")
    assert result.code != 0
    assert (f"{Path('models/tinynet/model.toml')}: [check] reference_chip: 'SM8650' is not one of the model's chips "
            "(SM8550, SM8750)") in result.output


def test_outputs_that_differ_get_a_full_check_of_their_own(tinynet_repo):
    """A forced difference: the w8a16 binary checked against the fp16 binary of the reference chip as if it were the
    reference (their outputs differ): the stage measures the w8a16 binary in full and says where they differed."""
    from build_rules.stages import check

    os.chdir(tinynet_repo)
    folder = OUT / "w8a16/SM8550"
    report = tinynet_repo / "proof-test/head.check.json"
    report.parent.mkdir()
    params = {"name": "check:tinynet/head/w8a16@SM8550", "ctx_model": str(folder / "head_ctx.onnx"),
              "evaluation": str(OUT / "float/head.evaluation.npz"), "hooks": "models/tinynet/hooks.py",
              "graph": "head", "gates": [{"metric": "cosine", "min": 0.98}],
              "reference": {"chip": "SM8750", "ctx_model": str(OUT / "fp16/SM8750/head_ctx.onnx"),
                            "check": str(OUT / "fp16/SM8750/head.check.json"), "samples": 2},
              "outputs": {"report": str(report)}, "final_outputs": {"report": str(report)}}
    check.run(params)
    written = json.loads(report.read_text())
    assert "equal_to" not in written
    assert written["differs_from"]["chip"] == "SM8750" and written["differs_from"]["samples"] == 2
    assert written["differs_from"]["sample"] == 0 and written["differs_from"]["output"] == "logits"
    assert written["differs_from"]["max_abs"] > 0
    assert written["samples"] > 3  # the whole evaluation set
    assert written["summary"] == _check(tinynet_repo, "w8a16", "SM8550", "head")["summary"]  # its own numbers
    assert (report.parent / "head.measure.json").exists()


def test_the_report_shows_a_partly_checked_build_without_running_the_missing_checks(tinynet_repo):
    folder = tinynet_repo / OUT / "w8a16/SM8750"
    assert run_doit(tinynet_repo, "forget", "check:tinynet/head/w8a16@SM8750").code in (0, None)
    (folder / "head.check.json").unlink()
    (folder / "head.measure.json").unlink()
    result = run_doit(tinynet_repo, "report")
    assert result.code == 0, result.output
    assert result.ran == {"report:tinynet"}  # no check, no emulator
    report = json.loads((tinynet_repo / OUT / "report.json").read_text())
    cells = {(c["variant"], c["chip"], c["graph"]): c for c in report["cells"]}
    missing = cells[("w8a16", "SM8750", "head")]
    assert missing["measured_by"] == "not measured" and missing["passed"] is None and missing["summary"] == {}
    assert cells[("w8a16", "SM8750", "encoder")]["measured_by"] == "check"
    markdown = (tinynet_repo / OUT / "report.md").read_text()
    assert "| w8a16 | ort minmax | uint8/uint16 | SM8750 | " in markdown
    assert "| not measured | not measured: head |" in markdown
    assert ("1 of 8 binaries not measured yet (their checks have not run; the report shows what the checks measured "
            "and runs none itself): `doit check:tinynet/head/w8a16@SM8750`, then `doit report:tinynet`.") in markdown
    assert run_doit(tinynet_repo, "report").ran == set()  # nothing new measured: up to date

    assert run_doit(tinynet_repo, "check:tinynet/head/w8a16@SM8750").code == 0
    result = run_doit(tinynet_repo, "report")  # a check that ended since: the report is made again
    assert result.ran == {"report:tinynet"}
    cells = {(c["variant"], c["chip"], c["graph"]): c for c in json.loads((tinynet_repo / OUT / "report.json").read_text())["cells"]}
    assert cells[("w8a16", "SM8750", "head")]["measured_by"] == "check"
    assert "not measured" not in (tinynet_repo / OUT / "report.md").read_text()


EVALUATE_HOOK = '''

def evaluate(run_graph):
    import numpy as np
    top = []
    for sample in _samples("encoder", 3, seed=5):
        features = run_graph("encoder", sample)["features"]
        top.append(int(np.argmax(run_graph("head", {"features": features})["logits"])))
    return {"top_sum": float(sum(top))}
'''


@pytest.mark.slow
def test_a_chip_proven_equal_takes_the_reference_evaluation(tinynet_repo, sample_runs):
    """[evaluate] on two chips: the reference chip's binaries are evaluated on the emulator; the other chip, whose
    graphs all proved equal in their checks, takes those metrics, labelled, and runs no emulator sample."""
    folder = tinynet_repo / "models/tinynet"
    (folder / "hooks.py").write_text((folder / "hooks.py").read_text() + EVALUATE_HOOK)
    toml = folder / "model.toml"
    toml.write_text(toml.read_text() + '\n[evaluate]\ngate = { metric = "top_sum", min = 0 }\n')
    result = run_doit(tinynet_repo, "package:tinynet/w8a16@SM8550")
    assert result.code == 0, result.output
    assert {"evaluate:tinynet/w8a16@SM8750", "evaluate:tinynet/w8a16@SM8550"} <= result.ran
    runs = sample_runs()
    # the reference's checks again (new hooks: its 4 evaluation samples) and its evaluation (3 samples)
    assert runs == {str(OUT / f"w8a16/SM8750/{g}_ctx.onnx"): 4 + 3 for g in ("encoder", "head")}, runs
    # nothing on SM8550: its checks' proofs depend on the binaries only (remembered), and no evaluation
    reference = json.loads((tinynet_repo / OUT / "w8a16/SM8750/evaluate.json").read_text())
    other = json.loads((tinynet_repo / OUT / "w8a16/SM8550/evaluate.json").read_text())
    assert other["metrics"] == reference["metrics"] and "equal_to" not in reference
    assert other["equal_to"]["chip"] == "SM8750" and other["equal_to"]["samples"] == 3
    assert set(other["equal_to"]["graphs"]) == {"encoder", "head"}
    log = (tinynet_repo / OUT / "w8a16/SM8550/evaluate.log").read_text()
    assert "every graph's outputs equal SM8750's on 3 samples, bit for bit: its evaluation" in log
    assert re.search(r"^  built now   out/tinynet/w8a16/SM8550: .* model top_sum \d+ \(equal to SM8750 on 3 samples\)$",
                     result.output, re.M), result.output
    manifest = json.loads((tinynet_repo / OUT / "w8a16/SM8550/manifest.json").read_text())
    assert manifest["evaluate"]["equal_to"]["chip"] == "SM8750"


def test_another_chips_check_waits_in_doits_queue_not_on_the_reference_lock(tinynet_repo):
    """Under `doit -n 2`, while the reference chip's binaries are measured, the other chip's checks are not started
    (they come after the reference's check: task_dep), so the second worker takes other work instead of waiting on
    the reference's memo lock; when they run, the reference's report is there to read."""
    for path in (tinynet_repo / OUT).glob("*/SM8750/*.measure.json"):
        path.unlink()  # the reference binaries must be measured again
    for graph, bound in (("encoder", "0.985"), ("head", "0.975")):  # every check's key changes
        toml = tinynet_repo / "models/tinynet/model.toml"
        text = toml.read_text()
        start = text.index(f"[graphs.{graph}]")
        line = re.compile(r"^gate = .*$", re.M).search(text, start)
        toml.write_text(text[:line.start()] + f'gate = {{ metric = "cosine", min = {bound} }}' + text[line.end():])
    result = run_doit(tinynet_repo, "-n", "2", "-P", "thread")
    assert result.code == 0, result.output
    order = re.findall(r"^\.  \[\d+/\d+\] (check:\S+)", result.output, re.M)
    for variant in ("fp16", "w8a16"):
        for graph in ("encoder", "head"):
            other = f"check:tinynet/{graph}/{variant}@SM8550"
            assert order.index(other) > order.index(f"check:tinynet/{graph}/{variant}@SM8750")
            # it started once the reference's check had ended: its report was there, no lock was waited on
            log = (tinynet_repo / OUT / variant / "SM8550" / f"{graph}.check.log").read_text()
            assert f"metrics from out/tinynet/{variant}/SM8750/{graph}.check.json" in log, log
            assert "has no measurement yet" not in log
