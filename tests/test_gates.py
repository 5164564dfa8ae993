"""Gates users asked for (issue 18, item 4): a two-sided bound against the float model (`max_change`), several gates
per graph (all must pass, every failure named, every gated value reported), and a score() hook that gets the float
model's outputs and the labels evaluation_inputs() returns, while score(graph, inputs, outputs) keeps working."""
from __future__ import annotations

import json
import re
from types import SimpleNamespace

import numpy as np
import pytest

from build_rules.measuring import gates
from build_rules.errors import BuildError
from build_rules.measuring import samples as common
from build_rules.stages import report
from conftest import TEST_MODELS, make_repo, run_doit, write_tinynet_checkpoints

F1_NEAR_FLOAT = {"metric": "f1", "max_change": 0.1}


# --- judging ------------------------------------------------------------------------------------------------------

def test_a_two_sided_gate_passes_within_its_change_either_way_and_names_the_gap():
    float_score = {"f1": 0.777}
    for value in (0.677, 0.70, 0.777, 0.85, 0.877):  # both ends included (0.777 - 0.1 is 0.6770000000000001)
        assert gates.judge("check:m/g/v@c", F1_NEAR_FLOAT, {"f1": value}, float_score)[0]["passed"]
    with pytest.raises(BuildError) as below:
        gates.judge("check:m/g/v@c", F1_NEAR_FLOAT, {"f1": 0.042}, float_score)
    assert str(below.value) == ("check:m/g/v@c: gate failed: f1 = 0.0420, needs 0.677 to 0.877 (below by 0.635; "
                                "float model 0.777, f1 within 0.1 of float)")
    with pytest.raises(BuildError) as above:
        gates.judge("check:m/g/v@c", F1_NEAR_FLOAT, {"f1": 0.9}, float_score)
    assert str(above.value) == ("check:m/g/v@c: gate failed: f1 = 0.9000, needs 0.677 to 0.877 (above by 0.023; "
                                "float model 0.777, f1 within 0.1 of float)")
    assert gates.describe(F1_NEAR_FLOAT) == "f1 within 0.1 of float"


def test_several_gates_must_all_pass_and_every_failure_is_named():
    several = [{"metric": "cosine", "min": 0.98}, F1_NEAR_FLOAT, {"metric": "wer", "max_increase": 0.05}]
    float_score = {"f1": 0.8, "wer": 0.08}
    gated = gates.judge("check:m/g/v@c", several, {"cosine": 0.99, "f1": 0.75, "wer": 0.1}, float_score)
    assert [(r["metric"], r["value"], r["passed"]) for r in gated] == [("cosine", 0.99, True), ("f1", 0.75, True),
                                                                       ("wer", 0.1, True)]
    assert gated[1]["float"] == 0.8 and gated[1]["low"] == pytest.approx(0.7) and gated[1]["high"] == pytest.approx(0.9)
    with pytest.raises(BuildError) as two:
        gates.judge("check:m/g/v@c", several, {"cosine": 0.97, "f1": 0.95, "wer": 0.1}, float_score)
    assert str(two.value) == ("check:m/g/v@c: 2 of 3 gates failed: cosine = 0.9700, needs >= 0.98 (short by 0.01); "
                              "f1 = 0.9500, needs 0.7 to 0.9 (above by 0.05; float model 0.8, f1 within 0.1 of float)")
    with pytest.raises(BuildError) as one:  # one failure of several reads as a single gate's
        gates.judge("check:m/g/v@c", several, {"cosine": 0.99, "f1": 0.75, "wer": 0.2}, float_score)
    assert str(one.value) == ("check:m/g/v@c: gate failed: wer = 0.2000, needs <= 0.13 (over by 0.07; float model "
                              "0.08, wer <= float + 0.05)")
    with pytest.raises(BuildError) as unmeasured:  # a metric nothing measured is a failure too, named as such
        gates.judge("check:m/g/v@c", several, {"cosine": 0.97, "f1": 0.75}, float_score)
    assert str(unmeasured.value) == (
        "check:m/g/v@c: 2 of 3 gates failed: cosine = 0.9700, needs >= 0.98 (short by 0.01); gate metric 'wer' was "
        "not measured (measured: cosine, f1); a task metric needs a score() hook (per graph) or evaluate() (per "
        "model) that returns it")
    assert gates.passes_all(several, {"cosine": 0.97, "f1": 0.75, "wer": 0.1}, float_score) is False
    assert gates.passes_all(several, {"cosine": 0.99}, float_score) is None  # cannot be judged: not a pass
    assert gates.passes_all([], {"cosine": 0.5}) is None


@pytest.mark.parametrize("gate, message", [
    ("[]", "[graphs.encoder] gate: expected a table { metric = ..., min = ... } or a list of them, got []"),
    ('[{ metric = "cosine", min = 0.99 }, { metric = "cosine", max = 0.9 }]',
     "[graphs.encoder] gate[1] max: 'cosine' is higher-is-better: use min"),
    ('[{ metric = "f1", max_change = 0.1 }, 3]', "[graphs.encoder] gate[1]: expected a table, got 3"),
    ('{ metric = "cosine", max_change = 0.01 }',
     "[graphs.encoder.gate] max_change: 'cosine' is already measured against the float model: give an absolute min"),
    ('{ metric = "f1", max_change = -0.1 }',
     "[graphs.encoder.gate] max_change: must be 0 or more (how far from the float model's value), got -0.1"),
])
def test_a_gate_list_in_model_toml_names_the_item_that_is_wrong(tmp_path, gate, message):
    repo = make_repo(tmp_path, {"tinynet": TEST_MODELS / "tinynet"})
    write_tinynet_checkpoints(repo / "models/tinynet")
    toml = repo / "models/tinynet/model.toml"
    toml.write_text(toml.read_text().replace('gate = { metric = "cosine", min = 0.99 }', f"gate = {gate}"))
    result = run_doit(repo, "list")
    assert result.code == 3
    assert f"error: models/tinynet/model.toml: {message}" in result.output


# --- score() and labels -------------------------------------------------------------------------------------------

def test_score_gets_float_outputs_and_labels_by_keyword_and_the_old_signature_still_works():
    inputs, outputs, floats, labels = [{"x": 1}], [{"y": np.array([2.0])}], [{"y": np.array([3.0])}], [7]
    calls = []

    def old(graph, inputs, outputs):
        calls.append("old")
        return {"n": len(outputs)}

    def new(graph, inputs, outputs, *, float_outputs, labels):
        calls.append((float_outputs, labels))
        return {"agree": float(outputs[0]["y"][0] == float_outputs[0]["y"][0]), "label": labels[0]}

    def anything(graph, inputs, outputs, **extra):
        calls.append(sorted(extra))
        return {}

    assert common.score(SimpleNamespace(score=old), "g", inputs, outputs, floats, labels, "h") == {"n": 1.0}
    assert common.score(SimpleNamespace(score=new), "g", inputs, outputs, floats, labels, "h") == {"agree": 0.0,
                                                                                                 "label": 7.0}
    assert common.score(SimpleNamespace(score=anything), "g", inputs, outputs, floats, None, "h") == {}
    assert calls == ["old", (floats, labels), ["float_outputs", "labels"]]
    with pytest.raises(BuildError) as missing:  # a hook that needs labels, from evaluation inputs without them
        common.score(SimpleNamespace(score=new), "g", inputs, outputs, floats, None, "models/m/hooks.py: score('g')")
    assert str(missing.value) == ("models/m/hooks.py: score('g'): score() takes labels, but evaluation_inputs('g') "
                                  "returned none: return (inputs, label) pairs from it, or give labels a default "
                                  "(labels=None)")


def test_labels_are_kept_in_the_evaluation_file_as_the_hook_returned_them(tmp_path):
    pairs = [({"x": np.zeros(2)}, {"boxes": np.ones((n, 4)), "name": f"img{n}", "classes": list(range(n))})
             for n in (1, 3)]  # per-sample boxes of different counts: fine, one array per field
    inputs, labels = common.split_labels(pairs, "hooks.py: evaluation_inputs('det')")
    assert inputs == [p[0] for p in pairs]
    path = tmp_path / "det.evaluation.npz"
    common.save_arrays(path, {"count": np.array(2), "0/input/x": np.zeros(2), "1/input/x": np.zeros(2),
                              **common.label_arrays(labels, "w")})
    back = common.load_labels(str(path))
    assert back[1]["name"] == "img3" and back[1]["boxes"].shape == (3, 4) and list(back[1]["classes"]) == [0, 1, 2]
    assert len(common.load_evaluation(str(path))[0]) == 2  # the inputs' reader skips the labels
    plain = tmp_path / "cls.evaluation.npz"
    common.save_arrays(plain, {"count": np.array(2), **common.label_arrays([1, 0], "w")})
    assert common.load_labels(str(plain)) == [1, 0]
    unlabelled = tmp_path / "old.evaluation.npz"
    common.save_arrays(unlabelled, {"count": np.array(1), "0/input/x": np.zeros(2)})
    assert common.load_labels(str(unlabelled)) is None
    with pytest.raises(BuildError) as ragged:
        common.label_arrays([[[1, 2], [3]]], "hooks.py: evaluation_inputs('det')")
    assert str(ragged.value) == ("hooks.py: evaluation_inputs('det'): sample 0: label of type list cannot be kept for "
                                 "score(): use a number, a string, an array (a ragged list: one array per field in a "
                                 "dict label), or a dict of those")
    with pytest.raises(BuildError) as mixed:
        common.split_labels([pairs[0], {"x": np.zeros(2)}], "hooks.py: evaluation_inputs('det')")
    assert str(mixed.value) == ("hooks.py: evaluation_inputs('det'): sample 1 is a plain dict but sample 0 is an "
                                "(inputs, label) pair: return (inputs, label) pairs for every sample or for none")


# --- on the built tiny net: the check, the manifest and the summary -------------------------------------------------

SCORE_HOOKS = '''

def evaluation_inputs(graph):  # (inputs, label) pairs: the labels reach score()
    return [(sample, i % 3) for i, sample in enumerate(_samples(graph, 4, seed=2))]


def score(graph, inputs, outputs, *, float_outputs, labels):
    name = next(iter(outputs[0]))
    return {"agreement": float(np.mean([np.argmax(o[name]) == np.argmax(f[name])
                                        for o, f in zip(outputs, float_outputs)])),
            "mean_output": float(np.mean([o[name].mean() for o in outputs])), "label_sum": float(sum(labels))}
'''
THREE_GATES = ('gate = [{ metric = "cosine", min = 0.98 }, { metric = "mean_output", max_change = 0.1 }, '
               '{ metric = "agreement", min = 0.75 }]')


@pytest.mark.slow
def test_several_gates_on_a_graph_with_labels_and_float_outputs_in_score(tinynet_repo):
    folder = tinynet_repo / "models/tinynet"
    hooks = folder / "hooks.py"
    hooks.write_text(hooks.read_text().replace(
        "def evaluation_inputs(graph):\n    return _samples(graph, 4, seed=2)\n", "") + SCORE_HOOKS)
    toml = folder / "model.toml"
    text = toml.read_text()
    head = text.index("[graphs.head]")
    toml.write_text(text[:head] + text[head:].replace('gate = { metric = "cosine", min = 0.98 }', THREE_GATES, 1))

    result = run_doit(tinynet_repo, "check:tinynet/head/w8a16@SM8750")  # only the head's chain: hooks changed
    assert result.code == 0, result.output
    check = json.loads((tinynet_repo / "out/tinynet/w8a16/SM8750/head.check.json").read_text())
    assert check["float_score"]["label_sum"] == 3.0  # labels 0, 1, 2, 0 from evaluation_inputs
    assert check["float_score"]["agreement"] == 1.0  # the float model against its own outputs
    assert [(r["gate"], r["passed"]) for r in check["gated"]] == [
        ("cosine >= 0.98", True), ("mean_output within 0.1 of float", True), ("agreement >= 0.75", True)]
    mean = check["gated"][1]  # every gated value is in the report, with its bounds
    assert mean["value"] == check["score"]["mean_output"] and mean["float"] == check["float_score"]["mean_output"]
    assert mean["low"] == pytest.approx(mean["float"] - 0.1) and mean["high"] == pytest.approx(mean["float"] + 0.1)

    # Tighter: two of the three fail, both named; the measurement is reused (no emulator run for a gate change).
    toml.write_text(toml.read_text().replace(THREE_GATES, THREE_GATES.replace("min = 0.98", "min = 0.99999")
                                             .replace("max_change = 0.1", "max_change = 0")))
    failed = run_doit(tinynet_repo, "check:tinynet/head/w8a16@SM8750")
    assert failed.code != 0
    assert re.search(r"check:tinynet/head/w8a16@SM8750: 2 of 3 gates failed: cosine = 0\.9\d{3}, needs >= 0\.99999 "
                     r"\(short by [\d.e-]+\); mean_output = -?[\d.]+, needs (-?[\d.e-]+) to \1 \((below|above) by "
                     r"[\d.e-]+; float model -?[\d.e-]+, mean_output within 0 of float\)", failed.output), failed.output


def test_the_report_shows_each_gate_with_its_verdict():
    gated = [{"metric": "cosine", "min": 0.98}, {"metric": "f1", "max_change": 0.1}]
    summary = {"cosine": 0.99, "sqnr": 30.0, "max_abs": 0.1, "f1": 0.5}
    row = {"variant": "w8a8", "chip": "SM8750", "graph": "det", "bytes": 2000, "compile_seconds": 1.0,
           "summary": summary, "float_score": {"f1": 0.77}, "gates": gated,
           "gated": gates.results(gated, summary, {"f1": 0.77}), "passed": False, "float_ops": {"count": 0},
           "measured_by": "check"}
    text = report.markdown({"model": "m", "toolchain": {"name": "ort-qnn"}, "cells": [row], "quantizers": {"w8a8": "ort"},
                            "variants": {"w8a8": {"weights": "uint8", "activations": "uint8"}}})
    assert ("| variant | quantizer | weights/activations | chip | size (MB) | compile (s) | det cosine / f1 | gates |"
            in text)
    assert "| w8a8 | ort | uint8/uint8 | SM8750 | 0.002 | 1.00 | 0.99 / 0.5 | FAIL: det |" in text
    assert ("| pass (cosine >= 0.98); **FAIL** (f1 within 0.1 of float) | check | none |") in text
