"""Results that outlive a failure, and outputs that do not outlive their targets (issue 19 items 3 and 4, issue 18
item 7): a failed check keeps its numbers where the summary and the report read them (tune too: in
test_quant_tuning.py), a re-run does not run the emulator again for it, the summary lists every variant x chip with
its last known result, and the outputs of a variant or chip taken out of model.toml are removed at the next build."""
from __future__ import annotations

import json
import re
import shutil

import pytest

from conftest import run_doit

REFERENCE_HEAD_CHECKS = {f"check:tinynet/head/{v}@SM8750" for v in ("fp16", "w8a16")}

# These tests kill, time or count stages and read each repo's out/.cache: no stage restored from the run-wide
# build cache (conftest._test_cwd)
RUN_WIDE_CACHE = False


def fail_the_head_gate(repo) -> None:
    toml = repo / "models/tinynet/model.toml"
    toml.write_text(toml.read_text().replace('gate = { metric = "cosine", min = 0.98 }',
                                             'gate = { metric = "sqnr", min = 500 }'))


@pytest.mark.slow
def test_a_failed_check_keeps_its_numbers_and_is_not_measured_again(tinynet_repo, emulator_sessions):
    from build_rules.build_state import results
    fail_the_head_gate(tinynet_repo)
    for memo in tinynet_repo.glob("out/tinynet/*/*/head.measure.json"):
        memo.unlink()  # as if the binaries were new: the first failing run measures them on the emulator
    shutil.rmtree(tinynet_repo / "out/.build-state/emulator-outputs")  # (and its outputs were not known)
    first = run_doit(tinynet_repo, "-v", "0", "--continue")
    assert first.code != 0
    # the reference chip's checks fail (after 1 sample: no SQNR of 4 can reach 500 dB then, whatever the other 3
    # give); SM8550's come after them (task_dep) and are not run
    assert first.ran == REFERENCE_HEAD_CHECKS
    assert len(emulator_sessions()) == 2
    for variant in ("fp16", "w8a16"):
        folder = tinynet_repo / f"out/tinynet/{variant}/SM8750"
        assert not (folder / "head.check.json").exists()  # a failed task's target is removed...
        kept = results.last(str(folder / "head.check.json"))  # ...its numbers are in the memo, marked failed
        assert kept["passed"] is False and kept["samples"] == 1 and kept["partial"]["of"] == 4
        sqnr = kept["summary"]["sqnr"]
        assert 0 < sqnr < 500
        assert kept["error"].startswith(f"check:tinynet/head/{variant}@SM8750: gate failed after 1 of 4 samples "
                                        f"(partial: sqnr = {sqnr:.4f} on those 1; sqnr at most ")
        # The summary lists the failed variant x chip with those numbers.
        encoder = json.loads((folder / "encoder.check.json").read_text())["summary"]["cosine"]
        line = re.search(rf"^  FAILED now  out/tinynet/{variant}/SM8750: (.*)$", first.output, re.M).group(1)
        size = (folder / "head.bin").stat().st_size / 1e6
        assert line.startswith(f"encoder {(folder / 'encoder.bin').stat().st_size / 1e6:.2f} MB cosine "
                               f"{encoder:.4g}, head {size:.2f} MB FAILED: gate failed after 1 of 4 samples (partial: "
                               f"sqnr = {sqnr:.4f} on those 1; "), line
        assert f"   not run: check:tinynet/head/{variant}@SM8550 (it needs check:tinynet/head/{variant}@SM8750, " \
               "which failed)" in first.output

    # A plain re-run and `doit --continue` judge the remembered numbers (they still decide the gate): the checks
    # fail again, the emulator does not run.
    again = run_doit(tinynet_repo, "-v", "0")
    assert again.code != 0 and len(again.ran) == 1 and again.ran <= REFERENCE_HEAD_CHECKS
    kept_going = run_doit(tinynet_repo, "-v", "0", "--continue")
    assert kept_going.code != 0 and kept_going.ran == REFERENCE_HEAD_CHECKS
    assert "gate failed after 1 of 4 samples" in kept_going.output
    assert len(emulator_sessions()) == 2
    assert "the emulator does not run again" in (tinynet_repo / "out/tinynet/w8a16/SM8750/head.check.log").read_text()

    # The report shows them too, marked failed, without running the emulator.
    report = run_doit(tinynet_repo, "report")
    assert report.code == 0, report.output
    assert len(emulator_sessions()) == 2
    cells = json.loads((tinynet_repo / "out/tinynet/report.json").read_text())["cells"]
    head = {(c["variant"], c["chip"]): c for c in cells if c["graph"] == "head" and c["chip"] == "SM8750"}
    for (variant, chip), cell in head.items():
        kept = results.last(str(tinynet_repo / f"out/tinynet/{variant}/{chip}/head.check.json"))
        assert cell["passed"] is False and cell["measured_by"] == "memo"
        assert cell["summary"]["sqnr"] == kept["summary"]["sqnr"]
        # numbers of 1 sample of 4, so marked: the gate they decide failed, never a verdict on all 4
        assert cell["partial"] == {"samples": 1, "of": 4, "failed": [f["failure"] for f in kept["partial"]["failed"]]}
        assert cell["samples"] == 1
        assert [g["passed"] for g in cell["gated"]] == [False]
    text = (tinynet_repo / "out/tinynet/report.md").read_text()
    sqnr = head["w8a16", "SM8750"]["summary"]["sqnr"]
    assert re.search(rf"^\| w8a16 \| .* \| SM8750 \| .* \| {sqnr:.4g} \(1 of 4 samples\) \| FAIL: head \|$", text,
                     re.M), text
    assert re.search(r"^\| w8a16 \| SM8750 \| head \| .* \| memo \(1 of 4 samples\) \|", text, re.M), text
    assert re.search(r"^\*\*Stopped early\*\* .*: .*w8a16@SM8750 head after 1 of 4 samples: sqnr at most [0-9.]+ whatever "
                     r"the other 3 samples give, needs >= 500", text, re.M), text

    # The gate relaxed: the numbers of 1 sample no longer decide it, so the reference binaries are measured on every
    # sample (once each), the other chip's checks take them from their proofs, and no failure is left behind.
    toml = tinynet_repo / "models/tinynet/model.toml"
    toml.write_text(toml.read_text().replace('gate = { metric = "sqnr", min = 500 }',
                                             'gate = { metric = "sqnr", min = 5 }'))
    fixed = run_doit(tinynet_repo, "-v", "0")
    assert fixed.code == 0, fixed.output
    assert len(emulator_sessions()) == 4
    memo = json.loads((tinynet_repo / "out/tinynet/w8a16/SM8750/head.measure.json").read_text())
    assert "failed" not in memo and "partial" not in memo["metrics"] and memo["metrics"]["samples"] == 4
    assert re.search(r"^  built now   out/tinynet/w8a16/SM8750: encoder .* MB cosine .*, head .* MB sqnr ",
                     fixed.output, re.M), fixed.output


def test_the_summary_lists_every_variant_and_chip_with_its_last_known_result(tinynet_repo):
    import shutil
    shutil.rmtree(tinynet_repo / "out/tinynet/fp16/SM8750")
    result = run_doit(tinynet_repo, "-v", "0", "SM8750")
    assert result.code == 0, result.output
    assert result.ran == {"compile:tinynet/encoder/fp16@SM8750", "compile:tinynet/head/fp16@SM8750",
                          "check:tinynet/encoder/fp16@SM8750", "check:tinynet/head/fp16@SM8750",
                          "package:tinynet/fp16@SM8750"}
    lines = re.findall(r"^  (built now|up to date|earlier|FAILED now|not run now) +(out/\S+): ", result.output, re.M)
    assert lines == [("earlier", "out/tinynet/fp16/SM8550"), ("built now", "out/tinynet/fp16/SM8750"),
                     ("earlier", "out/tinynet/w8a16/SM8550"), ("up to date", "out/tinynet/w8a16/SM8750")]
    manifest = json.loads((tinynet_repo / "out/tinynet/w8a16/SM8550/manifest.json").read_text())
    cosine = manifest["graphs"]["head"]["metrics"]["cosine"]
    assert re.search(rf"^  earlier     out/tinynet/w8a16/SM8550: encoder .*, head .* MB cosine {cosine:.4g} \(equal to "
                     r"SM8750 on 3 samples\)$",
                     result.output, re.M), result.output


def _files(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_outputs_of_a_removed_variant_or_chip_are_removed_at_the_next_build(tinynet_repo):
    out = tinynet_repo / "out/tinynet"
    mine = out / "fp16/SM8550/notes.txt"
    mine.write_text("a file of the user's: not a target, stays")
    made = [p for p in (out / "fp16").rglob("*") if p.is_file() and p != mine]
    toml = tinynet_repo / "models/tinynet/model.toml"
    text = toml.read_text()
    toml.write_text(text.replace('[variants.fp16]\nprecision = "fp16"\n', ""))
    result = run_doit(tinynet_repo, "-v", "0")
    assert result.code == 0, result.output
    # the quantized variant's packages are made again: their manifests have no fp16 sibling to compare sizes with
    assert result.ran == {f"package:tinynet/w8a16@{chip}" for chip in ("SM8550", "SM8750")}
    lines = result.output.splitlines()
    lines = lines[lines.index("summary: 2 task(s) ran, 22 up to date"):]
    # per graph, chip-independent: the fp16 lint's report and log, and the size check's report
    per_variant = 6
    # per graph: binary, ctx model, compile and check reports, 2 logs; a manifest. SM8750, the reference chip, also its
    # measurement memo and its outputs on the proof samples per graph; SM8550's checks proved equal (no measurement
    # memo: a proof memo per graph)
    assert lines[1] == (f"  removed {len(made)} output(s) of targets no longer in models/ or chips.toml: "
                        f"out/tinynet/fp16/ ({per_variant} files), out/tinynet/fp16/SM8550/ (15 files), "
                        f"out/tinynet/fp16/SM8750/ (17 files)")
    assert len(made) == 38
    assert _files(out / "fp16") == ["SM8550/notes.txt"]  # everything the fp16 tasks wrote: binaries, reports, logs
    assert (out / "w8a16/SM8550/head.bin").is_file() and (out / "float/head.sim.onnx").is_file()
    assert any((tinynet_repo / "out/.cache").iterdir())  # the build cache stays
    assert run_doit(tinynet_repo, "-v", "0").output.splitlines() == [
        "summary: 0 task(s) ran, 24 up to date; no work to do"]  # a no-op again: one line

    # Put back, the variant is restored from the build cache, not rebuilt.
    toml.write_text(text)
    back = run_doit(tinynet_repo, "-v", "0")
    assert back.code == 0, back.output
    # 4 compile, 4 check and the 2 fp16 lints; the packages (w8a16's have their fp16 sibling again) and the size checks
    # (in-process, never cached) are made again
    assert "(10 restored from the build cache)" in back.output

    # A chip taken out of the model's chips: its folders go.
    toml.write_text(text.replace('chips = ["SM8550", "SM8750"]', 'chips = ["SM8750"]'))
    result = run_doit(tinynet_repo, "-v", "0")
    assert "removed " in result.output
    assert not (out / "w8a16/SM8550").exists()
    assert _files(out / "fp16/SM8550") == ["notes.txt"]
    assert (out / "w8a16/SM8750/head.bin").is_file()


def test_the_report_shows_a_failed_model_evaluation_from_its_memo(tmp_path):
    from build_rules.build_state import results
    from build_rules.stages import report
    passed, failed = tmp_path / "fp16/SM8750/evaluate.json", tmp_path / "w8a16/SM8750/evaluate.json"
    passed.parent.mkdir(parents=True)
    failed.parent.mkdir(parents=True)
    gate = {"metric": "wer", "max_increase": 0.05}
    passed.write_text(json.dumps({"on": "emulator", "metrics": {"wer": 0.053}, "gates": [gate]}))
    message = "evaluate:w/w8a16@SM8750: gate failed: wer = 0.2100, needs <= 0.103 (over by 0.107; float model 0.053)"
    results.keep_failed(str(failed.with_name("evaluate.measure.json")),
                        {"on": "emulator", "metrics": {"wer": 0.21}, "gates": [gate]}, message, {"k": 1}, {"wer": 0.21})
    found = report.evaluations({"fp16@SM8750": str(passed), "w8a16@SM8750": str(failed),
                                "w8a8@SM8750": str(tmp_path / "w8a8/SM8750/evaluate.json")})  # never evaluated
    assert set(found) == {"fp16@SM8750", "w8a16@SM8750"}
    assert found["w8a16@SM8750"]["passed"] is False and found["w8a16@SM8750"]["metrics"] == {"wer": 0.21}
    text = report.markdown({"model": "w", "toolchain": {"name": "ort-qnn"}, "cells": [], "variants": {},
                            "evaluate": found})
    assert '| fp16@SM8750 | wer 0.053 | pass |' in text  # (no float evaluation in this report: no baseline)
    assert ('| w8a16@SM8750 | wer 0.21 | **FAIL** (gate failed: wer = 0.2100, needs <= 0.103 (over by 0.107; '
            'float model 0.053)) |') in text
