"""Early verdicts (issue 36): a measurement stops once the samples so far decide that a gate fails, reports the
numbers of those samples marked partial, and a passing verdict measures every sample (build_rules/measuring/gates.py,
early_verdicts.py, stages/check.py). Equal-chip proofs keep their own memo: a gate edit re-judges, never re-runs."""
from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import numpy as np
import pytest

from build_rules.measuring import gates
from build_rules.measuring.early_verdicts import Tally, run_until_decided
from build_rules.measuring.samples import compare, worst
from conftest import run_doit

OUT = Path("out/tinynet")

def _pairs(seed: int, count: int, noise: float):
    rng = np.random.default_rng(seed)
    reference = [{"y": rng.standard_normal((2, 5)) * rng.uniform(0.1, 3), "z": rng.standard_normal(7)}
                 for _ in range(count)]
    actual = [{k: v + noise * rng.standard_normal(v.shape) * rng.uniform(0, 2) for k, v in r.items()}
              for r in reference]
    return reference, actual


@pytest.mark.parametrize("seed", range(6))
def test_the_intervals_after_k_samples_hold_the_value_over_all_samples(seed):
    """Whatever the samples not yet run give (here: random ones, and the continuation that reaches the cosine's
    bound), the value over all samples stays inside the interval the first k gave."""
    reference, measured = _pairs(seed, 6, noise=0.3)
    rng = np.random.default_rng(100 + seed)
    for k in range(1, 6):
        tally = Tally(reference)
        for sample in measured[:k]:
            tally.add(sample)
        ranges = tally.ranges()
        best = [{n: r[n] * 7.0 for n in r} for r in reference[k:]]  # along the reference: the cosine's supremum
        for rest in (measured[k:], [{n: rng.standard_normal(v.shape) * 5 for n, v in r.items()} for r in reference[k:]],
                     best):
            final = compare(reference, measured[:k] + rest, frames=True)
            for metric, (low, high) in ranges.items():
                value = worst(final, metric)
                assert low is None or value >= low - 1e-9, (metric, k, value, low)
                assert high is None or value <= high + 1e-9, (metric, k, value, high)
        # the cosine bound is nearly reached by the continuation along the reference
        assert worst(compare(reference, measured[:k] + best), "cosine") <= ranges["cosine"][1] + 1e-9
    tally = Tally(reference)
    for sample in measured:
        tally.add(sample)
    final = compare(reference, measured, frames=True)
    for metric, (low, high) in tally.ranges().items():  # all samples in: the bound is the value itself
        assert (high if high is not None else low) == pytest.approx(worst(final, metric), rel=1e-9, abs=1e-12)


def test_a_gate_stops_early_only_when_it_fails_whatever_the_rest_give():
    reference, measured = _pairs(7, 8, noise=0.5)
    final = worst(compare(reference, measured), "cosine")
    ran = []

    def runs():
        for index, sample in enumerate(measured):
            ran.append(index)
            yield index, sample
    outputs, verdict = run_until_decided(runs(), reference, {"metric": "cosine", "min": (1 + final) / 2})
    assert verdict is not None and verdict["samples"] == len(outputs) == len(ran) < 8
    assert verdict["of"] == 8 and verdict["failed"][0]["metric"] == "cosine"
    assert verdict["failed"][0]["high"] < (1 + final) / 2
    for bound in (final, final - 0.01):  # passes (exactly at the bound, or below it): every sample runs
        ran.clear()
        outputs, verdict = run_until_decided(runs(), reference, {"metric": "cosine", "min": bound})
        assert verdict is None and len(outputs) == len(ran) == 8
    ran.clear()  # max_abs above the bound at some sample: stops at that sample
    largest = [max(float(np.max(np.abs(r[n] - a[n]))) for n in r) for r, a in zip(reference, measured)]
    bound = largest[2] - 1e-6 if largest[2] > max(largest[:2]) else max(largest[:3]) - 1e-6
    outputs, verdict = run_until_decided(runs(), reference, {"metric": "max_abs", "max": bound})
    assert verdict is not None and len(outputs) <= 3
    ran.clear()  # a task metric of a score hook, or a two-sided bound nobody reaches: every sample
    outputs, verdict = run_until_decided(runs(), reference, [{"metric": "accuracy", "min": 2.0},
                                                            {"metric": "cosine", "max": 0.1}])
    assert verdict is None and len(ran) == 8


def test_the_early_message_says_k_of_n_and_the_partial_numbers():
    verdict = gates.early_failure({"metric": "cosine", "min": 0.99}, {"cosine": (None, 0.95)}, 3, 16)
    assert gates.describe_early(verdict, {"cosine": 0.9412}) == (
        "failed after 3 of 16 samples (partial: cosine = 0.9412 on those 3; cosine at most 0.95 whatever the other "
        "13 samples give, needs >= 0.99)")
    assert gates.early_failure({"metric": "cosine", "min": 0.99}, {"cosine": (None, 0.995)}, 3, 16) is None
    assert gates.early_failure({"metric": "cosine", "min": 0.99}, {"cosine": (None, 0.95)}, 16, 16) is None


def _set_gate(repo: Path, graph: str, gate: str) -> None:
    toml = repo / "models/tinynet/model.toml"
    text = toml.read_text()
    start = text.index(f"[graphs.{graph}]")
    line = re.compile(r"^gate = .*$", re.M).search(text, start)
    toml.write_text(text[:line.start()] + f"gate = {gate}" + text[line.end():])


def _memo(repo: Path, chip: str, graph: str = "head") -> dict:
    return json.loads((repo / OUT / "w8a16" / chip / f"{graph}.measure.json").read_text())


def test_a_failing_check_stops_early_and_a_relaxed_gate_measures_every_sample(tinynet_repo, sample_runs):
    head = {chip: str(OUT / "w8a16" / chip / "head_ctx.onnx") for chip in ("SM8750", "SM8550")}
    samples = json.loads((tinynet_repo / OUT / "w8a16/SM8750/head.check.json").read_text())["samples"]
    assert samples == 4
    (tinynet_repo / OUT / "w8a16/SM8750/head.measure.json").unlink()  # not measured yet (the memo would answer)
    _set_gate(tinynet_repo, "head", '{ metric = "cosine", min = 0.99999 }')
    result = run_doit(tinynet_repo, "--continue", "check:tinynet/head/w8a16@SM8750",
                      "check:tinynet/head/w8a16@SM8550")
    assert result.code != 0
    runs = sample_runs()
    k = runs.get(head["SM8750"], 0)
    assert 1 <= k < samples, runs
    assert head["SM8550"] not in runs  # the proof is remembered from the build: nothing of it runs again
    message = re.search(r"check:tinynet/head/w8a16@SM8750: gate failed after (\d) of 4 samples \(partial: cosine = "
                        r"0\.9\d+ on those \d; cosine at most (0\.9\d+) whatever the other \d samples? give, needs "
                        r">= 0\.99999\)", result.output)
    assert message and int(message.group(1)) == k, result.output
    memo = _memo(tinynet_repo, "SM8750")
    assert memo["metrics"]["samples"] == k and memo["metrics"]["partial"]["of"] == 4
    assert memo["failed"]["partial"]["samples"] == k and "after" in memo["failed"]["error"]
    # the other chip's check comes after the reference's (task_dep): not run on a reference that failed
    assert "check:tinynet/head/w8a16@SM8550" not in result.ran

    # a tighter gate is still decided by the partial numbers: judged again, no emulator run
    _set_gate(tinynet_repo, "head", '{ metric = "cosine", min = 0.999999 }')
    result = run_doit(tinynet_repo, "--continue", "check:tinynet/head/w8a16@SM8750")
    assert result.code != 0 and sample_runs() == {}
    assert f"gate failed after {k} of 4 samples" in result.output

    # a relaxed gate the partial numbers no longer decide: every sample is measured, and it passes (not the
    # original 0.98: the build cache has that check's report)
    _set_gate(tinynet_repo, "head", '{ metric = "cosine", min = 0.975 }')
    result = run_doit(tinynet_repo, "check:tinynet/head/w8a16@SM8750", "check:tinynet/head/w8a16@SM8550")
    assert result.code == 0, result.output
    assert sample_runs() == {head["SM8750"]: samples}
    report = json.loads((tinynet_repo / OUT / "w8a16/SM8750/head.check.json").read_text())
    assert report["samples"] == samples and "partial" not in report and "partial" not in _memo(tinynet_repo, "SM8750")["metrics"]
    assert json.loads((tinynet_repo / OUT / "w8a16/SM8550/head.check.json").read_text())["summary"] == report["summary"]


def test_a_gate_edit_reruns_no_emulator_sample_on_any_chip(tinynet_repo, sample_runs):
    """Proofs depend on the two binaries and the samples only: a gate edit re-judges every chip from memos."""
    before = json.loads((tinynet_repo / OUT / "w8a16/SM8750/head.check.json").read_text())["summary"]["cosine"]
    _set_gate(tinynet_repo, "head", f'{{ metric = "cosine", min = {before - 0.001:.6f} }}')
    result = run_doit(tinynet_repo)
    assert result.code == 0, result.output
    assert result.ran_stage("check") == {"check:tinynet/head/w8a16@SM8750", "check:tinynet/head/w8a16@SM8550",
                                         "check:tinynet/head/fp16@SM8750", "check:tinynet/head/fp16@SM8550"}
    assert sample_runs() == {}
    _set_gate(tinynet_repo, "head", f'{{ metric = "cosine", min = {before + 0.0001:.6f} }}')  # the verdict follows
    result = run_doit(tinynet_repo, "--continue")
    assert result.code != 0 and sample_runs() == {}
    assert f"check:tinynet/head/w8a16@SM8750: gate failed: cosine = {before:.4f}" in result.output, result.output
    assert "check:tinynet/head/w8a16@SM8550" not in result.ran  # after the reference (task_dep), which failed
    result = run_doit(tinynet_repo, "-s", "check:tinynet/head/w8a16@SM8550")  # on its own: judged from the memos
    assert result.code != 0 and sample_runs() == {}
    assert (f"check:tinynet/head/w8a16@SM8550: gate failed: cosine = {before:.4f}" in result.output
            and "(the metrics of SM8750's binary: this chip's outputs equal its on 3 samples" in result.output), \
        result.output


def test_tune_misses_stop_early_and_the_result_is_the_same(tinynet_repo, monkeypatch, tmp_path):
    """tune's trials on the tiny encoder at w8a8: a trial that misses its target by far stops at the sample that
    decides it (partial, a miss), and the same set measured for a target it meets runs every sample, with the numbers
    of a measurement without a target. The exhaustive mixed-precision search (every trial judged) keeps the same
    16-bit tensors and reports the same numbers with early verdicts as without (but for the 8-bit start, which misses:
    its numbers are partial), running no more samples."""
    from build_rules import tasks
    from build_rules.doit_run.project import chip_params, project, rel
    from build_rules.stages.support import mixed_precision, precision
    from build_rules.tasks.tuning import _tuning_chip, _tuning_graph
    toml = tinynet_repo / "models/tinynet/model.toml"
    toml.write_text(toml.read_text() + '\n[variants.w8a8]\ninherits = "w8a16"\nactivations = "uint8"\n')
    samples = []
    real = precision.Candidates.iter_run

    def counted(self, model, indices, repeat_samples=None):
        for position, outputs in real(self, model, indices, repeat_samples):
            samples.append(position)
            yield position, outputs
    monkeypatch.setattr(precision.Candidates, "iter_run", counted)
    # each measurement here runs on the emulator: none is taken from what an earlier Candidates measured (tune_memo)
    from build_rules.stages.support.tune_memo import TuneMemo
    # a folder per Candidates from a counter, not id(self): CPython gives a freed object's id to the next one, and a
    # search then read the memo of the Candidates measured before it (fresh38: its 8-bit start came whole from plain's
    # measurement, not partial; once, the search without early verdicts from the one with them: fewer samples)
    made = itertools.count()

    def own_memo(self):
        if "_own" not in self.__dict__:
            self._own = TuneMemo("own", tmp_path / f"memo-{next(made)}")
        return self._own
    monkeypatch.setattr(precision.Candidates, "disk", own_memo)
    monkeypatch.chdir(tinynet_repo)
    tasks.project.cache_clear()
    try:
        model = project().models[0]
        graph = _tuning_graph(model, model.graphs["encoder"], model.variants["w8a8"])
        settings = dict(chip=chip_params(_tuning_chip(model)), samples=4, hooks=rel(model.hooks))
        c = precision.Candidates(graph, settings["chip"], 4, settings["hooks"])
        strict, loose = {"metric": "cosine", "min": 0.999999}, {"metric": "cosine", "min": 0.9}
        missed = c.measure(set(), full=True, target=strict)
        stopped = len(samples)
        samples.clear()
        met = c.measure(set(), full=True, target=loose)  # the partial numbers do not decide it: every sample
        measured = len(samples)
        plain = precision.Candidates(graph, settings["chip"], 4, settings["hooks"]).measure(set(), full=True)
        target = {"metric": "cosine", "min": 0.99985}
        found, lines = {}, []
        for early in (True, False):
            if not early:
                monkeypatch.setattr(gates, "EARLY_METRICS", ())  # every trial measures every sample
            samples.clear()
            found[early] = (mixed_precision.search(graph, target, method="exhaustive", log=lines.append, **settings),
                            len(samples))
    finally:
        tasks.project.cache_clear()
    assert 1 <= stopped < 4 and missed["partial"]["samples"] == stopped and missed["partial"]["of"] == 4
    assert not precision.meets(strict, missed) and precision.meets(loose, met)
    assert measured == 4 and "partial" not in met and precision.clean(met) == precision.clean(plain)
    (fast, fast_samples), (slow, slow_samples) = found[True], found[False]
    assert fast["sixteen_bit"] == slow["sixteen_bit"] and fast["tuned"] == slow["tuned"]
    assert fast["all_16bit"] == slow["all_16bit"] and "partial" not in slow["base"]
    # the 8-bit start misses the target: with early verdicts it stops at the sample that decides that, marked partial
    assert not precision.meets(target, slow["base"]) and not precision.meets(target, fast["base"])
    assert fast["base"]["partial"]["of"] == 4 and 1 <= fast["base"]["partial"]["samples"] < 4, fast["base"]
    assert fast["evaluations"] == slow["evaluations"] and fast_samples < slow_samples


def test_an_evaluate_hook_with_a_bound_stops_once_its_wer_cannot_be_met():
    """The per-sample evaluate form's optional bound(results, total): a WER of word errors over all reference words
    (known up front) is at least the errors so far / all words, so a `max` gate is decided once they exceed it."""
    from build_rules.measuring.early_verdicts import results_until_decided
    clips = [(1, 10), (4, 10), (3, 10), (0, 10), (0, 10)]  # (word errors, reference words) per clip
    words = sum(w for _, w in clips)
    scored = []

    def per_clip():
        for clip in clips:
            scored.append(clip)
            yield clip

    def bound(results, total):
        return {"wer": (sum(e for e, _ in results) / words, None)}
    done, verdict = results_until_decided(per_clip(), bound, {"metric": "wer", "max": 0.1}, len(clips))
    # after 2 clips 5 errors of 50 words: 0.1, still possible; after 3, 8 of 50: decided
    assert len(done) == len(scored) == 3 and verdict["samples"] == 3 and verdict["of"] == 5
    assert verdict["failed"][0]["failure"] == "wer at least 0.16 whatever the other 2 samples give, needs <= 0.1"
    scored.clear()  # a gate it meets: every clip; no bound hook: every clip
    assert results_until_decided(per_clip(), bound, {"metric": "wer", "max": 0.2}, 5)[1] is None and len(scored) == 5
    scored.clear()
    assert results_until_decided(per_clip(), None, {"metric": "wer", "max": 0.01}, 5)[1] is None and len(scored) == 5
