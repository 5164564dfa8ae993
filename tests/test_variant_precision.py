"""A variant must be what it says (issue 19, item 2): the ops of a quantized variant that QNN HTP runs in float are
named, counted and weighed in the check report, the summary, `doit report` and the bundle index, and the summary
warns when a quantized binary is not smaller than its fp16 sibling.

The model is a 3-layer nn.LSTM speaker classifier (tests/models/speaker_lstm, its shipped weights):
the QDQ recipe puts Q/DQ around each ONNX LSTM, but QNN HTP has no quantized LSTM, so its w8a16 binary runs the
three LSTMs in float and is no smaller than fp16's. The tiny CNN is the control: all of it is quantized.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import TEST_MODELS, make_repo, run_doit

FLOAT_LSTM = "3 LSTM ran in float (99.4 % of the weights)"  # 23808 of the model's 23950 parameters are the LSTMs'


@pytest.fixture(scope="module")
def speaker(tmp_path_factory) -> tuple[Path, str]:
    repo = make_repo(tmp_path_factory.mktemp("speaker"), {"speaker_lstm": TEST_MODELS / "speaker_lstm"})
    built = run_doit(repo)
    assert built.code == 0, built.output
    return repo, built.output


@pytest.mark.slow
def test_the_lstms_of_a_quantized_variant_are_named_as_float_in_the_check_report(speaker):
    repo, _ = speaker
    out = repo / "out/speaker_lstm"
    check = json.loads((out / "w8a16/SM8750/encoder.check.json").read_text())
    float_ops = check["float_ops"]
    assert float_ops["count"] == 3 and float_ops["op_types"] == {"LSTM": 3}
    assert len(float_ops["nodes"]) == 3 and float_ops["weights_share"] == 0.9941
    assert float_ops["qnn_ops"]["Lstm"] == 24  # QNN unrolls each LSTM: one float cell per frame (8) and layer
    assert check["float_ops"] == json.loads((out / "w8a16/SM8750/encoder.compile.json").read_text())["float_ops"]
    assert json.loads((out / "fp16/SM8750/encoder.check.json").read_text())["float_ops"] is None  # fp16: all float
    # The labels of evaluation_inputs() reached score(): accuracy against them, agreement with the float model.
    assert check["float_score"] == {"accuracy": 1.0, "agreement": 1.0}
    assert [r["gate"] for r in check["gated"]] == ["accuracy >= float - 0.25", "agreement >= 0.5"]


def test_the_summary_names_the_float_ops_and_warns_that_the_binary_is_not_smaller(speaker):
    repo, output = speaker
    assert re.search(rf"^  built now   out/speaker_lstm/w8a16/SM8750: encoder 0\.\d\d MB accuracy 1 agreement 1 "
                     rf"\[{re.escape(FLOAT_LSTM)}\]$", output, re.M), output
    assert re.search(r"^  built now   out/speaker_lstm/fp16/SM8750: encoder 0\.\d\d MB accuracy 1 agreement 1$", output,
                     re.M)
    warning = re.search(r"^  warning: package:speaker_lstm/w8a16@SM8750: encoder\.bin \((\d\.\d\d) MB\) is not "
                        rf"smaller than fp16's \((\d\.\d\d) MB\): {re.escape(FLOAT_LSTM)}$", output, re.M)
    assert warning, output
    # More than a quarter of the weights in float: a warning of its own, naming the ops and the fix
    mostly = (f"  warning: package:speaker_lstm/w8a16@SM8750: encoder: {FLOAT_LSTM}: more than 25% of its weights "
              "are not quantized; QNN HTP has no quantized LSTM, GRU or RNN: export the recurrence as cells, one step "
              "a graph with the state as inputs and outputs (docs/models.md, \"Recurrent layers as cells\"; an "
              "ONNX-only model too), or build fp16")
    assert mostly in output.splitlines(), output
    manifest = json.loads((repo / "out/speaker_lstm/w8a16/SM8750/manifest.json").read_text())
    entry = manifest["graphs"]["encoder"]
    assert entry["bytes"] >= entry["fp16_bytes"] == (repo / "out/speaker_lstm/fp16/SM8750/encoder.bin").stat().st_size
    assert manifest["warnings"] == [warning.group(0).removeprefix("  warning: "), mostly.removeprefix("  warning: ")]
    assert "warnings" not in json.loads((repo / "out/speaker_lstm/fp16/SM8750/manifest.json").read_text())
    assert run_doit(repo).ran == set()  # computed by the stages: a no-op build recomputes nothing


def test_the_report_and_the_bundle_index_say_what_ran_in_float(speaker):
    repo, _ = speaker
    result = run_doit(repo, "report:speaker_lstm", "dist:speaker_lstm")
    assert result.code == 0, result.output
    assert not result.ran_stage("check") and not result.ran_stage("compile")
    rows = {line.split(" | ")[0]: line for line in (repo / "out/speaker_lstm/report.md").read_text().splitlines()
            if line.startswith(("| w8a16 | SM8750 | encoder", "| fp16 | SM8750 | encoder"))}
    assert rows["| w8a16"].endswith(f"| pass (accuracy >= float - 0.25); pass (agreement >= 0.5) | check | {FLOAT_LSTM} |")
    assert rows["| fp16"].endswith("| check | – |")  # fp16 is float by design: no float-op finding
    report = (repo / "out/speaker_lstm/report.md").read_text()
    assert f"**Mostly float:** w8a16 encoder: {FLOAT_LSTM}: more than 25% of its weights are not quantized;" in report
    index = json.loads((repo / "out/speaker_lstm/dist/w8a16/index.json").read_text())
    assert index["chips"]["SM8750"]["float_ops"]["encoder"]["op_types"] == {"LSTM": 3}
    assert any(f"encoder: {FLOAT_LSTM}: more than 25%" in w for w in index["chips"]["SM8750"]["warnings"])
    assert [r["passed"] for r in index["chips"]["SM8750"]["gates"]["encoder"]] == [True, True]
    assert "float_ops" not in json.loads((repo / "out/speaker_lstm/dist/fp16/index.json").read_text())["chips"]["SM8750"]
    assert f"  encoder: {FLOAT_LSTM} on SM8750" in result.output  # the dist summary line


def test_a_fully_quantized_variant_reports_no_float_op(built_tinynet):
    for graph in ("encoder", "head"):
        float_ops = json.loads((built_tinynet / f"out/tinynet/w8a16/SM8750/{graph}.compile.json").read_text())["float_ops"]
        assert float_ops["count"] == 0 and float_ops["op_types"] == {} and float_ops["weights"] > 0


def test_a_16_bit_element_wise_op_in_an_8_bit_variant_takes_its_constant_at_16_bit(tmp_path):
    """A Mul or Add by a constant whose tensors an override makes 16 bit in an 8-bit variant: onnxruntime's
    quantizer left the constant at 8 bit, and QNN ran the op in float (Whisper tiny.en's encoder, every activation at
    16 bit over W8A8: its positional Add and 4 attention-scale Muls, 6.1 % of its weights). The constant now takes
    the op's type, as in a W8A16 variant, and nothing runs in float (issue 45)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    types, float_ops = _mixed_model(tmp_path, rng, [
        numpy_helper.from_array((rng.standard_normal((16, 16)) * 0.3).astype(np.float32), "w"),
        numpy_helper.from_array(np.array(0.125, np.float32), "scale"),
        numpy_helper.from_array((rng.standard_normal((1, 16)) * 0.1).astype(np.float32), "positions")], [
        helper.make_node("MatMul", ["x", "w"], ["mm"], name="matmul"),
        helper.make_node("Mul", ["mm", "scale"], ["scaled"], name="mul"),
        helper.make_node("Add", ["scaled", "positions"], ["y"], name="add")],
        {"mm": "uint16", "scaled": "uint16", "y": "uint16"})
    assert types["scale_quantized"] == types["positions_quantized"] == TensorProto.UINT16
    assert float_ops["count"] == 0, float_ops


def _mixed_model(tmp_path, rng, weights, nodes, overrides):
    """(initializer -> ONNX data type, float_ops) of a 1x16 -> 1x16 graph of `nodes` quantized at W8A8 with
    `overrides` at 16 bit and compiled for SM8750."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    from build_rules.toolchains import ort_qnn
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])], weights)
    float_model = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(float_model))
    calibration = [{"x": rng.standard_normal((1, 16)).astype(np.float32)} for _ in range(8)]
    qdq = tmp_path / "mixed.qdq.onnx"
    ort_qnn.quantize(float_model, qdq, calibration, activations="uint8", weights="uint8", per_channel=False,
                     overrides=overrides)
    types = {i.name: i.data_type for i in onnx.load(str(qdq)).graph.initializer}
    compiled = ort_qnn.compile_context_binary(qdq, tmp_path / "SM8750", "g", soc_model=69, vtcm_mb=8, fp16=False)
    return types, compiled["float_ops"]


def test_a_constant_shared_by_element_wise_ops_of_both_types_is_split_and_nothing_runs_in_float(tmp_path):
    """A head-mask constant that Muls at 8 and at 16 bit both read (tune's Whisper decoder proposal, 90 of 184
    tensors at 16 bit over W8A8: 7 Muls in float): one initializer has one type, so each type gets its own copy and
    every Mul runs on the HTP."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(1)
    types, float_ops = _mixed_model(tmp_path, rng, [
        numpy_helper.from_array((rng.standard_normal((16, 16)) * 0.3).astype(np.float32), "w"),
        numpy_helper.from_array((rng.uniform(0.5, 1.0, (1, 16))).astype(np.float32), "mask")], [
        helper.make_node("MatMul", ["x", "w"], ["mm"], name="matmul"),
        helper.make_node("Mul", ["mm", "mask"], ["wide"], name="mul_16"),
        helper.make_node("Mul", ["x", "mask"], ["narrow"], name="mul_8"),
        helper.make_node("Add", ["wide", "narrow"], ["y"], name="add")],
        {"mm": "uint16", "wide": "uint16"})
    assert types["mask_quantized"] == TensorProto.UINT8 and types["mask_QUInt16_quantized"] == TensorProto.UINT16
    assert float_ops["count"] == 0, float_ops
