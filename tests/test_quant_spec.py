"""The one quantization spec (build_rules/quantization/quant_spec.py): the record config validates, tune's ladder derives its
candidates from and the quantizing stages receive."""
from __future__ import annotations

import pytest

from build_rules.quantization.quant_spec import QuantSpec
from build_rules.stages.support import tune_ladder

FULL = QuantSpec(activations="uint16", weights="int4", per_channel=True, calibration_method="minmax",
                 calibration_samples=16, overrides={"y": "uint16"}, node_overrides={"Add_1": "uint16"},
                 weight_overrides={"Gemm_6": "int8"}, quantizer="aimet", techniques=("seq_mse",),
                 technique_params={"seq_mse": {"candidates": 5}}, block_size=64,
                 graph_overrides={"block": {"overrides": {"h": "uint8"}, "weight_overrides": {"Gemm_1": "int4"}}})


def test_a_stage_gets_back_the_spec_it_was_keyed_on():
    """settings(graph) is the quantize task's key and params; from_settings is what the stage makes of them."""
    assert QuantSpec.from_settings(FULL.settings("block")) == FULL.for_graph("block")
    assert QuantSpec.from_settings(FULL.settings()) == FULL
    assert FULL.for_graph("block").overrides == {"y": "uint16", "h": "uint8"}
    assert FULL.for_graph("block").weight_overrides == {"Gemm_6": "int8", "Gemm_1": "int4"}
    assert FULL.for_graph("other").overrides == {"y": "uint16"}


def test_the_key_form_of_a_plain_variant_is_what_it_always_was():
    """Keys only hold the fields a variant sets: an ort variant without blocks has the dict of before LPBQ and AIMET."""
    plain = QuantSpec(activations="uint8", weights="uint8", calibration_samples=8)
    assert plain.settings() == {"precision": "quantized", "activations": "uint8", "weights": "uint8",
                                "per_channel": True, "calibration_method": "minmax", "calibration_samples": 8,
                                "overrides": {}}
    assert plain.settings("g") == {**plain.settings(), "node_overrides": {}}


@pytest.mark.parametrize("changes, path, message", [
    ({"weights": "uint8"}, ("weights",), "with quantizer = \"aimet\" expected one of 'int8', 'int4'"),
    ({"calibration_method": "entropy"}, ("calibration", "method"), "expected one of 'minmax', 'percentile'"),
    ({"block_size": 48}, ("block_size",), "block size 48 is not one the HTP takes"),
    ({"techniques": ("adaround", "cle")}, ("techniques",), "'cle' must come first"),
    ({"quantizer": "ort"}, ("techniques",), "AIMET's techniques need quantizer = \"aimet\""),
])
def test_a_combination_config_refuses_is_named_at_its_key(changes, path, message):
    found = FULL.replace(**changes).problems()
    assert found and found[0][0] == path and message in found[0][1]


def test_a_rung_that_could_not_be_a_variant_is_refused_like_one():
    """An ort variant's 8-bit weight override is no AIMET weight type: the AIMET rungs built from it fail with
    model.toml's message instead of reaching AIMET unchecked."""
    base = QuantSpec(activations="uint16", weights="uint8", calibration_samples=8, weight_overrides={"Gemm_6": "uint8"})
    ladder = tune_ladder.Ladder.__new__(tune_ladder.Ladder)
    ladder.params, ladder._built = {"name": "tune:m/v"}, {}  # no Candidates: nothing is measured here
    graph = {"name": "g", "variant": base.settings("g"), "onnx": "unused.onnx"}
    aimet_rung = next(r for r in tune_ladder.rungs(base) if r["name"] == "w8a8_aimet")
    built = ladder.build_graph(aimet_rung, graph)
    assert built == {"error": "ValueError: weight_overrides.Gemm_6: expected one of 'int8', 'int4', got 'uint8'"}


def test_an_ort_rung_of_an_aimet_variant_is_written_as_an_ort_variant():
    base = QuantSpec(activations="uint16", weights="int8", calibration_samples=8, quantizer="aimet",
                     techniques=("seq_mse",), technique_params={"seq_mse": {"candidates": 20}})
    rung = {**next(r for r in tune_ladder.rungs(base) if r["name"] == "w8a8_ort"), "bytes": 1000, "graphs": {}}
    _, section = tune_ladder.toml_lines({"rungs": [rung], "chosen": rung, "notes": []}, "tuned", "base",
                                        [{"variant": base.settings("g")}])
    assert section == ["[variants.tuned]", 'inherits = "base"', 'weights = "int8"', 'activations = "uint8"',
                       'quantizer = "ort"', "techniques = []", ""]


def test_the_variant_itself_is_not_tried_again():
    base = QuantSpec(activations="uint8", weights="uint8", calibration_samples=8)
    same = [r["name"] for r in tune_ladder.rungs(base) if tune_ladder._same_as_variant(r, base)]
    assert same == ["w8a8_ort"]
