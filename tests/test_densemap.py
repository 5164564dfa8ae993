"""The dense-map detector of issue 35 (tests/models/densemap: a DBNet-like text detector trained in its build hook,
real photos with text lines drawn on them, each line's box a label): int4 weights the HTP refuses stay int8 with a
note, a compile that fails on an int4 weight names the node and the weight_overrides line, the stopped build says
what one failure kept from running, and `doit diagnose` proposes the weight override that makes w4a16 pass."""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import TEST_MODELS, make_repo, run_doit

FIX_TABLE = '''[variants.w4a16.graphs.det]
weight_overrides = { "/stem/stem.0/Conv" = "int8", "/down1/down1.0/Conv" = "int8" }
'''


def _toml(repo: Path) -> Path:
    return repo / "models/densemap/model.toml"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The model as a user first has it: w4a16 without the weight overrides diagnose proposes (its gate fails)."""
    repo = make_repo(tmp_path_factory.mktemp("densemap"), {"densemap": TEST_MODELS / "densemap"})
    text = _toml(repo).read_text()
    assert FIX_TABLE in text
    _toml(repo).write_text(text.replace(FIX_TABLE, ""))
    result = run_doit(repo, "--continue")
    return repo, result


def _weight_types(qdq: Path) -> dict[str, str]:
    """Conv / ConvTranspose node -> the ONNX type name of the weight its DequantizeLinear reads."""
    import onnx
    model = onnx.load(str(qdq))
    inits = {i.name: i.data_type for i in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    return {n.name: onnx.TensorProto.DataType.Name(inits[producers[n.input[1]].input[0]])
            for n in model.graph.node if n.op_type in ("Conv", "ConvTranspose")}


@pytest.mark.slow
def test_the_float_detector_finds_the_text_lines_and_8_bit_variants_pass(built):
    repo, result = built
    assert "check:densemap/det/w8a16@SM8750" in result.ran and "check:densemap/det/w8a8@SM8750" in result.ran
    for variant in ("w8a16", "w8a8"):
        check = json.loads((repo / f"out/densemap/{variant}/SM8750/det.check.json").read_text())
        assert all(g["passed"] for g in check["gated"]) and len(check["gated"]) == 2
        # the float model finds most labelled lines: its map is a detector's, not noise
        assert 0.7 <= check["float_score"]["line_recall"] <= 1.0
        assert check["summary"]["text_iou"] >= 0.95
    from build_rules.measuring.samples import load_evaluation
    inputs, _ = load_evaluation(str(repo / "out/densemap/float/det.evaluation.npz"))
    assert len(inputs) == 6 and inputs[0]["image"].shape == (1, 3, 64, 96)


def test_int4_weights_the_htp_refuses_stay_int8_with_a_note_and_the_variant_compiles(built):
    repo, result = built
    assert "compile:densemap/det/w4a16@SM8750" in result.ran  # before the fix, QNN refused /up1/ConvTranspose
    assert ("  note: quantize:densemap/det/w4a16: 1 weight(s) kept at int8, not int4 (the HTP refuses them at int4): "
            "/up1/ConvTranspose (int4 weights of a convolution only per channel, and it has one output channel); "
            "the other weights are int4\n") in result.output
    types = _weight_types(repo / "out/densemap/w4a16/det.qdq.onnx")
    assert types.pop("/up1/ConvTranspose") == "INT8"
    assert set(types.values()) == {"INT4"} and len(types) == 7  # 5 Convs and the other 2 ConvTransposes


@pytest.mark.skipif(importlib.util.find_spec("aimet_onnx") is None, reason="aimet-onnx is not installed")
def test_aimet_keeps_the_same_int4_weights_at_int8(built, tmp_path):
    repo, _ = built
    copy = Path(shutil.copytree(repo, tmp_path / "repo", symlinks=True))
    _toml(copy).write_text(_toml(copy).read_text() + '\n[variants.w4a16_aimet]\nactivations = "uint16"\n'
                                                    'weights = "int4"\nquantizer = "aimet"\n'
                                                    'calibration = { samples = 16 }\n')
    result = run_doit(copy, "compile:densemap/det/w4a16_aimet@SM8750")
    assert result.code == 0, result.output  # before, QNN refused /up1/ConvTranspose as with onnxruntime's quantizer
    assert ("  note: aimet:densemap/det/w4a16_aimet: 1 weight(s) kept at int8, not int4 (the HTP refuses them at "
            "int4): /up1/ConvTranspose (int4 weights of a convolution only per channel, and it has one output "
            "channel); the other weights are int4\n") in result.output
    report = json.loads((copy / "out/densemap/w4a16_aimet/det.aimet.json").read_text())
    assert report["int4_kept"] == {"/up1/ConvTranspose": "int4 weights of a convolution only per channel, and it "
                                                         "has one output channel"}


def test_which_convolutions_take_no_int4_weight():
    """block_quant.int4_refused on the cases measured one layer at a time with onnxruntime-qnn 2.7.0 for SM8750
    (the comment above it)."""
    from onnx import TensorProto, helper

    from build_rules.quantization.block_quant import int4_refused

    def conv(name, op, dims, group=1):
        weight = helper.make_tensor(f"{name}_w", TensorProto.FLOAT, dims, np.zeros(int(np.prod(dims))).tolist())
        return helper.make_node(op, ["x", weight.name], [f"{name}_y"], name=name, group=group), weight

    cases = [conv("wide", "Conv", [8, 8, 3, 3]), conv("one_out", "Conv", [1, 8, 3, 3]),
             conv("up", "ConvTranspose", [8, 4, 2, 2]), conv("up_to_map", "ConvTranspose", [8, 1, 2, 2]),
             conv("up_depthwise", "ConvTranspose", [8, 1, 2, 2], group=8), conv("cube", "Conv", [4, 4, 3, 3, 3]),
             conv("line", "Conv", [1, 8, 3]), conv("line_up", "ConvTranspose", [8, 8, 2])]  # 1-D: int4 compiles
    graph = helper.make_graph([n for n, _ in cases], "g", [], [], initializer=[w for _, w in cases])
    model = helper.make_model(graph)
    assert int4_refused(model, per_channel=True) == {
        "one_out": "int4 weights of a convolution only per channel, and it has one output channel",
        "up_to_map": "int4 weights of a convolution only per channel, and it has one output channel",
        "up_depthwise": "int4 weights of a convolution only per channel, and it has one output channel per group",
        "cube": "a 3-D convolution's int4 weight fails to finalize"}
    refused = int4_refused(model, per_channel=False)
    assert set(refused) == {n.name for n, _ in cases} - {"line", "line_up"}
    assert refused["wide"] == "int4 weights of a convolution only per channel (per_channel = false)"


def test_an_int4_weight_the_htp_refuses_fails_the_compile_with_the_override_to_add(built, tmp_path):
    """A weight override asking int4 where the HTP takes none wins over quantize's own choice: QNN refuses the node
    and the message names it with the model.toml line; the stopped build says what else it kept from running."""
    repo, _ = built
    copy = Path(shutil.copytree(repo, tmp_path / "repo", symlinks=True))  # sources, outputs and build state
    toml = _toml(copy)
    toml.write_text(toml.read_text() + '\n[variants.w4a16.graphs.det]\nweight_overrides = '
                                       '{ "/up1/ConvTranspose" = "int4" }\n')
    shutil.rmtree(copy / "out/densemap/w8a8/SM8750")  # w8a8's binary is rebuilt: planned with w4a16's
    result = run_doit(copy, "-v", "0", "compile:densemap/det/w4a16@SM8750", "package:densemap/w8a8@SM8750")
    assert result.code != 0
    assert ("; QNN gave no node: see the compile log -- the HTP refuses the int4 weight of '/up1/ConvTranspose': "
            "keep it at 8 bit, add `[variants.w4a16.graphs.det]` `weight_overrides = { \"/up1/ConvTranspose\" = "
            "\"int8\" }` to models/densemap/model.toml (or merge it into that table's weight_overrides)\n"
            in result.output), result.output
    assert "Node '/up1/ConvTranspose_token_" in result.output  # onnxruntime's own words stay
    stopped = re.search(r"  stopped at the first failure, compile:densemap/det/w4a16@SM8750 \(its message above\): "
                        r"(\d+) planned task\(s\) not run, of variant\(s\) w8a8 too; `doit --continue "
                        r"compile:densemap/det/w4a16@SM8750 package:densemap/w8a8@SM8750` builds everything that does "
                        r"not need the failed task\n", result.output)
    assert stopped, result.output
    assert int(stopped.group(1)) >= 2  # at least w8a8's check and package


def test_diagnose_finds_the_loss_in_the_int4_weights_and_its_override_passes_the_gate(built):
    repo, result = built
    assert "FAILED now  out/densemap/w4a16/SM8750: det 0.10 MB FAILED: text_iou = " in result.output
    diagnosed = run_doit(repo, "diagnose:densemap/det/w4a16@SM8750")
    assert diagnosed.code == 0, diagnosed.output
    text = (repo / "out/densemap/w4a16/SM8750/det.diagnose.md").read_text()
    assert ("- The loss is in the weights: node '/stem/stem.0/Conv' (Conv) reads int4 weights, and its output is 16 "
            "bit, so an activation override cannot help. Keep its weight and the weights of the 1 later int4 "
            "layer(s) below the floor that lose >= 3 dB themselves at 8 bit, in models/densemap/model.toml:\n\n"
            "```toml\n" + FIX_TABLE + "```\n") in text, text
    assert ("`doit tune:densemap/w4a16` finds the fewest weights at int8 that meet the gate (its per-layer weight "
            "bits, docs/tuning.md).") in text
    assert "| `/stem/stem.0/Conv` | Conv | 16 / int4 |" in text  # the weight type beside the activation bits
    # the user's next step: the line as proposed, and the gate passes
    _toml(repo).write_text(_toml(repo).read_text() + "\n" + FIX_TABLE)
    fixed = run_doit(repo, "densemap")
    assert fixed.code == 0, fixed.output
    assert fixed.ran_stage("quantize") == {"quantize:densemap/det/w4a16"}  # only that variant is redone
    check = json.loads((repo / "out/densemap/w4a16/SM8750/det.check.json").read_text())
    assert all(g["passed"] for g in check["gated"]) and check["summary"]["text_iou"] >= 0.95


def test_the_report_figure_shows_the_gated_metrics_of_every_variant_against_their_thresholds(built):
    """`doit report` on the built model (no emulator run): its PNG is 1200 x 700 and shows text_iou and line_recall
    per variant with the gates' thresholds, not SQNR (stages/report.py figure(), tests/test_report_figure.py)."""
    import matplotlib.pyplot as plt
    from PIL import Image

    from build_rules.stages.report import figure
    repo, _ = built
    result = run_doit(repo, "report")
    assert result.code == 0, result.output
    assert Image.open(repo / "out/densemap/report.png").size == (1200, 700)
    # the table says what w4a16 is: two weights int8 by its weight_overrides, /up1/ConvTranspose by quantize
    assert "| w4a16 | ort minmax | int4/uint16 (3 int8 of 8 weights) | SM8750 |" in \
        (repo / "out/densemap/report.md").read_text()
    report = json.loads((repo / "out/densemap/report.json").read_text())
    fig = figure(report)
    try:
        axes = fig.get_axes()
        assert [ax.get_title() for ax in axes] == ["det: text_iou", "det: line_recall"]
        assert [t.get_text() for t in axes[0].get_xticklabels()] == ["w8a16", "w8a8", "w4a16"]
        assert [round(line.get_ydata()[0], 4) for line in axes[0].get_lines()] == [0.9]
        check = json.loads((repo / "out/densemap/w8a16/SM8750/det.check.json").read_text())
        recall = check["float_score"]["line_recall"]
        assert sorted(round(line.get_ydata()[0], 4) for line in axes[1].get_lines()) == \
            [round(recall - 0.05, 4), round(recall, 4)]  # max_decrease 0.05 below the float model, and the float model
        assert [t.get_text() for t in fig.legends[0].get_texts()] == ["SM8750", "gate threshold", "float model"]
    finally:
        plt.close(fig)
