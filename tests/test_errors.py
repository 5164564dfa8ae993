"""Bad input fails with a message naming the culprit and leaves no target behind (issue: the build graph).

The models here are tiny ONNX files written by the test (they enter the pipeline at simplify), so each
case isolates one mistake: a dynamic input, an int64 input, an op QNN HTP cannot run, a malformed
model.toml, an unknown chip.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import TEST_MODELS, make_repo, run_doit

HOOKS = '''import numpy as np
def evaluation_inputs(graph):
    rng = np.random.default_rng(0)
    return [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(2)]
'''


def onnx_model_repo(tmp_path: Path, build_graph, graph_toml: str, extra_model_toml: str = "") -> Path:
    import onnx
    folder = tmp_path / "src" / "bad"
    folder.mkdir(parents=True)
    onnx.save(build_graph(), folder / "model.onnx")
    (folder / "hooks.py").write_text(HOOKS)
    (folder / "model.toml").write_text(f'''[model]
onnx = "model.onnx"
hooks = "hooks.py"
chips = ["SM8550"]
{extra_model_toml}
[graphs.net]
{graph_toml}
[variants.fp16]
precision = "fp16"
''')
    return make_repo(tmp_path / "repo", {"bad": folder})


def conv_graph(batch="N", input_type=None, tail_op=None):
    """x[batch,3,8,8] -> Conv -> (tail_op) -> y."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    weight = numpy_helper.from_array(np.full((4, 3, 3, 3), 0.1, np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv_1", pads=[1, 1, 1, 1])]
    last = "c"
    if tail_op:
        nodes.append(helper.make_node(tail_op, ["c"], ["t"], name=f"{tail_op.lower()}_1"))
        last = "t"
    nodes.append(helper.make_node("Relu", [last], ["y"], name="relu_1"))
    graph = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", input_type or TensorProto.FLOAT,
                                                                           [batch, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4, 8, 8])], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def int64_graph():
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    table = numpy_helper.from_array(np.ones((10, 4), np.float32), "table")
    graph = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["y"], name="gather_1")], "net",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, 4])], [table])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def targets_left(repo: Path) -> list[str]:
    """Files under out/ other than logs and doit's own state: a failed build must have written none."""
    out = repo / "out"
    if not out.exists():
        return []
    return sorted(str(p.relative_to(out)) for p in out.rglob("*")
                  if p.is_file() and not p.name.endswith(".log") and ".build-state" not in p.parts)


def test_dynamic_input_names_the_tensor(tmp_path):
    repo = onnx_model_repo(tmp_path, conv_graph, 'outputs = ["y"]')
    result = run_doit(repo)
    assert result.code != 0
    assert "model.onnx: input 'x' has a dynamic shape ['N', 3, 8, 8]" in result.output
    assert ('or pin the inputs in models/bad/model.toml [graphs.net]: '
            'inputs = { x = { shape = [1, 3, 8, 8], dtype = "float32" } }') in result.output
    assert targets_left(repo) == []


def test_declared_shape_pins_a_dynamic_input(tmp_path):
    repo = onnx_model_repo(tmp_path, conv_graph, 'inputs = { x = { shape = [1, 3, 8, 8], dtype = "float32" } }')
    result = run_doit(repo, "simplify")
    assert result.code == 0, result.output
    assert "simplify:bad/net" in result.ran


@pytest.mark.parametrize("declared, message", [
    ("[1, 3, 8, 9]", "input 'x' is declared [1, 3, 8, 9], but the model fixes dim 3 at 8 (declared 9) (its shape: "
                     "[N, 3, 8, 8]): declare [1, 3, 8, 8]"),
    ("[1, 3, 64]", "input 'x' is declared with 3 dims [1, 3, 64], but the model's has 4: [N, 3, 8, 8]"),
])
def test_a_declared_dim_that_contradicts_a_fixed_dim_of_the_model_is_named(tmp_path, declared, message):
    """(A user declared [1, 200, 160] on a model whose last dim is 161 and was told the output is dynamic.)"""
    repo = onnx_model_repo(tmp_path, conv_graph, f'inputs = {{ x = {{ shape = {declared}, dtype = "float32" }} }}')
    result = run_doit(repo, "simplify")
    assert result.code != 0
    assert (f"models/bad/model.toml [graphs.net] inputs: {message} -- the model is models/bad/model.onnx; only its "
            "dynamic dims can be pinned") in result.output
    assert "dynamic shape" not in result.output
    assert targets_left(repo) == []


def paddle_style_graph():
    """As paddle2onnx writes a dynamic batch: dim_value -1 on the I/O and on an intermediate's value_info."""
    from onnx import TensorProto, helper
    model = conv_graph(batch=-1)
    model.graph.value_info.append(helper.make_tensor_value_info("c", TensorProto.FLOAT, [-1, 4, 8, 8]))
    return model


def test_declared_input_shape_also_pins_outputs_written_as_minus_one(tmp_path):
    repo = onnx_model_repo(tmp_path, paddle_style_graph, 'inputs = { x = { shape = [1, 3, 8, 8], dtype = "float32" } }')
    result = run_doit(repo, "simplify")
    assert result.code == 0, result.output
    io = json.loads((repo / "out/bad/float/net.io.json").read_text())
    assert io["outputs"] == [{"name": "y", "shape": [1, 4, 8, 8], "dtype": "float32"}]
    assert "1 output shape(s) inferred from the inputs' shapes" in (repo / "out/bad/float/net.simplify.log").read_text()


def test_int64_input_names_the_tensor(tmp_path):
    repo = onnx_model_repo(tmp_path, int64_graph, 'outputs = ["y"]')
    result = run_doit(repo)
    assert result.code != 0
    assert "input 'ids' is int64 (QNN HTP has no int64: use int32)" in result.output
    assert targets_left(repo) == []


def test_declaring_an_int64_input_is_refused_at_load(tmp_path):
    repo = onnx_model_repo(tmp_path, int64_graph, 'inputs = { ids = { shape = [1, 5], dtype = "int64" } }')
    result = run_doit(repo, "list")
    assert result.code == 3
    assert ("error: models/bad/model.toml: [graphs.net.inputs.ids] dtype: int64 is not supported on QNN HTP: "
            "export the input as int32") in result.output


def test_unsupported_op_names_op_and_node_and_leaves_no_binary(tmp_path):
    repo = onnx_model_repo(tmp_path, lambda: conv_graph(batch=1, tail_op="Hardmax"),
                           'inputs = { x = { shape = [1, 3, 8, 8], dtype = "float32" } }')
    result = run_doit(repo)
    assert result.code != 0
    assert "compile:bad/net/fp16@SM8550" in result.output
    assert "QNN HTP cannot run 1 node(s)" in result.output
    assert "QNN rejected node 'hardmax_1' (Hardmax)" in result.output
    assert not list((repo / "out").rglob("*.bin"))
    assert not list((repo / "out").rglob("*_ctx.onnx"))
    assert not any((repo / "out/.staging").iterdir())
    # the failed task re-runs next time (nothing was recorded as done)
    assert "compile:bad/net/fp16@SM8550" in run_doit(repo).ran


@pytest.mark.parametrize("edit, message", [
    (('activations = "uint16"', 'activations = "uint12"'),
     "error: models/tinynet/model.toml: [variants.w8a16] activations: expected one of 'uint8', 'uint16', "
     "got 'uint12'"),
    (('outputs = ["features"]', 'outputs = ["features"'),
     "error: models/tinynet/model.toml: invalid TOML:"),
    (('calibration_samples = 8\ngate', 'calibration_sample = 8\ngate'),
     "error: models/tinynet/model.toml: [graphs.encoder] calibration_sample: unknown key"),
    (('[variants.fp16]', '[variants."../fp16"]'),
     "error: models/tinynet/model.toml: [variants.\"../fp16\"]: name '../fp16' is not allowed"),
    (('chips = ["SM8550", "SM8750"]', 'chips = ["SM8550", "SM9999"]'),
     "error: models/tinynet/model.toml: [model] chips: unknown chip 'SM9999' (chips in chips.toml: "),
])
def test_config_errors_name_file_and_key(tmp_path, edit, message):
    repo = make_repo(tmp_path / "repo", {"tinynet": TEST_MODELS / "tinynet"})
    toml = repo / "models/tinynet/model.toml"
    text = toml.read_text()
    assert edit[0] in text
    toml.write_text(text.replace(edit[0], edit[1], 1))
    result = run_doit(repo)
    assert result.code == 3
    assert message in result.output
    assert targets_left(repo) == []


def test_unknown_chip_in_default_list(tmp_path):
    chips = (Path(__file__).parent.parent / "chips.toml").read_text().replace('"QCS9100"]', '"QCS9999"]', 1)
    repo = make_repo(tmp_path / "repo", {}, chips=chips)
    result = run_doit(repo, "list")
    assert result.code == 3
    assert "error: chips.toml: default: unknown chip 'QCS9999'" in result.output


def test_a_model_folder_copied_as_a_dangling_link_is_named(tmp_path):
    """This repo's models/mtcnn is a link into build_rules/templates: `cp -r` copies the link, which points nowhere
    in the copy; the model would vanish from `doit list` without a word."""
    repo = make_repo(tmp_path / "repo", {"tinynet": TEST_MODELS / "tinynet"})
    (repo / "models/mtcnn").symlink_to("../build_rules/templates/repo/models/mtcnn")
    result = run_doit(repo, "list")
    assert result.code == 3
    assert ("error: models/mtcnn: a link to ../build_rules/templates/repo/models/mtcnn, which does not exist; copy "
            "the folder itself (cp -rL) or remove the link") in result.output, result.output


def test_failed_gate_names_metric_value_and_threshold(tinynet_repo):
    toml = tinynet_repo / "models/tinynet/model.toml"
    text = toml.read_text()
    head = text.index("[graphs.head]")
    toml.write_text(text[:head] + text[head:].replace('min = 0.98', 'min = 0.99999', 1))
    result = run_doit(tinynet_repo, "SM8750")
    assert result.code != 0
    assert "TaskFailed - taskid:check:tinynet/head/w8a16@SM8750" in result.output
    assert "check:tinynet/head/w8a16@SM8750: gate failed: cosine = 0.99" in result.output
    assert "needs >= 0.99999 (short by" in result.output
    # the failing check's old report is gone: no stale pass is left to package
    assert not (tinynet_repo / "out/tinynet/w8a16/SM8750/head.check.json").exists()


def test_one_bad_frame_fails_frame_cosine_but_not_whole_tensor_cosine():
    import numpy as np
    from build_rules.measuring.samples import compare
    rng = np.random.default_rng(0)
    reference = rng.standard_normal((1, 1500, 384)).astype(np.float32)  # encoder-like: 1500 frames
    actual = reference.copy()
    actual[0, 700] = -actual[0, 700]  # one frame flipped
    metrics = compare([{"out": reference}], [{"out": actual}], frames=True)["out"]
    assert metrics["cosine"] > 0.998
    assert metrics["frame_cosine"] == pytest.approx(-1.0)
    assert "frame_cosine" not in compare([{"out": reference}], [{"out": actual}])["out"]


def test_frame_cosine_of_a_sparse_map_counts_zero_frames_that_agree():
    """Issue 35: a per-pixel text map is 96 % exact zeros, so most frames are zero vectors; frame_cosine was 0 on
    every line, even for float vs float (max_abs 2.9e-5). Two (near) zero frames agree, one zero frame against one
    that is not disagrees, other frames keep their cosine."""
    import numpy as np
    from build_rules.measuring.samples import ZERO_FRAME, compare
    rng = np.random.default_rng(0)
    reference = np.zeros((1, 1, 96, 128), np.float32)
    reference[0, 0, 40:44, 10:90] = rng.uniform(0.5, 1.0, (4, 80))  # one line of text: 4 rows of the map
    float_again = reference + rng.uniform(-2.9e-5, 2.9e-5, reference.shape).astype(np.float32) * (reference > 0)
    noise_only = reference.copy()
    noise_only[0, 0, 0] = 1e-7  # ONNX Runtime's rounding where PyTorch gave an exact 0
    for actual in (reference, float_again, noise_only):
        metrics = compare([{"map": reference}], [{"map": actual}], frames=True)["map"]
        assert metrics["frame_cosine"] == pytest.approx(1.0, abs=1e-9)
    # a frame of text lost (zero where the reference has text), or text where the reference is zero: 0
    lost = reference.copy()
    lost[0, 0, 41] = 0
    ghost = reference.copy()
    ghost[0, 0, 5, :20] = 0.5
    for actual in (lost, ghost):
        assert compare([{"map": reference}], [{"map": actual}], frames=True)["map"]["frame_cosine"] == 0.0
    # a frame below ZERO_FRAME of the largest one is a zero frame: it agrees with an exact zero; above, it does not
    largest = float(np.linalg.norm(reference[0, 0], axis=1).max())
    faint, visible = reference.copy(), reference.copy()
    faint[0, 0, 5, 0] = 0.9 * ZERO_FRAME * largest
    visible[0, 0, 5, 0] = 1.1 * ZERO_FRAME * largest
    assert compare([{"map": reference}], [{"map": faint}], frames=True)["map"]["frame_cosine"] == pytest.approx(1.0)
    assert compare([{"map": reference}], [{"map": visible}], frames=True)["map"]["frame_cosine"] == 0.0
    # all zeros in both (an empty page): they agree
    empty = np.zeros_like(reference)
    assert compare([{"map": empty}], [{"map": empty}], frames=True)["map"]["frame_cosine"] == 1.0


def test_verify_gate_on_frame_cosine_names_the_metric(tinynet_repo):
    toml = tinynet_repo / "models/tinynet/model.toml"
    text = toml.read_text()
    head = text.index("[graphs.head]")
    # 1.01 cannot be reached: the verify stage must fail on it and say so
    toml.write_text(text[:head] + text[head:].replace(
        'calibration_samples = 8', 'calibration_samples = 8\nverify = { metric = "frame_cosine", min = 1.01 }', 1))
    result = run_doit(tinynet_repo, "verify")
    assert result.code != 0
    assert "verify:tinynet/head: ONNX Runtime vs source frame_cosine = 1, allowed >= 1.01" in result.output
    assert not (tinynet_repo / "out/tinynet/float/head.verify.json").exists()


def if_graph():
    """y = x * 2 if flag else x - 1: an If on an input value, as exporters write a Python branch they cannot fold."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    two = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["a"], name="mul_1")], "then",
                            [], [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 4])],
                            [numpy_helper.from_array(np.array(2, np.float32), "two")])
    one = helper.make_graph([helper.make_node("Sub", ["x", "one"], ["b"], name="sub_1")], "else",
                            [], [helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 4])],
                            [numpy_helper.from_array(np.array(1, np.float32), "one")])
    cond = helper.make_node("Greater", ["s", "zero"], ["c"], name="greater_1")
    branch = helper.make_node("If", ["c"], ["y"], name="branch_1", then_branch=two, else_branch=one)
    graph = helper.make_graph([cond, branch], "net",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
                               helper.make_tensor_value_info("s", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                              [numpy_helper.from_array(np.zeros(1, np.float32), "zero")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_control_flow_left_after_simplify_names_the_node(tmp_path):
    repo = onnx_model_repo(tmp_path, if_graph, 'outputs = ["y"]')
    result = run_doit(repo, "simplify")
    assert result.code != 0
    assert ("model.onnx: the graph has control flow, which QNN HTP cannot run: 'branch_1' (If) -- fix: export the "
            "branch the device needs as its own graph") in result.output
    assert targets_left(repo) == []


def test_a_qdq_model_the_cpu_ep_refuses_names_its_quantizer(tmp_path):
    """The aimet stage runs AIMET's QDQ export through the load check onnxruntime's QDQ models get: the message says
    who wrote the model and where to report it."""
    import onnx
    from onnx import TensorProto, helper

    from build_rules.errors import BuildError
    from build_rules.stages.quantize import check_quantized

    def graph(second_input_type):
        nodes = [helper.make_node("Add", ["x", "y"], ["z"], name="add")]
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
                  helper.make_tensor_value_info("y", second_input_type, [1, 4])]
        outputs = [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4])]
        return helper.make_model(helper.make_graph(nodes, "g", inputs, outputs),
                                 opset_imports=[helper.make_opsetid("", 17)])

    onnx.save(graph(TensorProto.FLOAT), tmp_path / "float.onnx")
    onnx.save(graph(TensorProto.INT32), tmp_path / "broken.qdq.onnx")  # Add of float and int32: a type error
    check_quantized(str(tmp_path / "float.onnx"), str(tmp_path / "float.onnx"), "aimet:m/g/v", "out/m/v/g.qdq.onnx",
                    ("AIMET's QDQ export", "AIMET"))  # a model that loads passes
    with pytest.raises(BuildError) as error:
        check_quantized(str(tmp_path / "broken.qdq.onnx"), str(tmp_path / "float.onnx"), "aimet:m/g/v",
                        "out/m/v/g.qdq.onnx", ("AIMET's QDQ export", "AIMET"))
    message = str(error.value)
    assert message.startswith("aimet:m/g/v: AIMET's QDQ export wrote an invalid QDQ model (out/m/v/g.qdq.onnx is not "
                              "written): onnxruntime's CPU EP refuses it: "), message
    assert message.endswith("or report it to AIMET with that file"), message


@pytest.mark.parametrize("variable, value, said", [
    ("BUILD_RULES_EMULATOR_WORKERS", "0", "a whole number of emulator workers >= 1; unset it for the default"),
    ("BUILD_RULES_EMULATOR_INLINE_SECONDS", "-1", "a number of seconds >= 0; unset it for the default 1.0"),
    ("BUILD_RULES_EMULATOR_MEMO_MB", "lots", "the emulator output memo's size in MB >= 0 (0: off); unset it for the "
                                             "default 2048"),
    ("BUILD_RULES_REPEAT_SAMPLES", "-2", "a whole number >= 0 of samples each binary runs twice to check that it "
                                         "repeats itself (0: none); unset it for the default 16"),
    ("BUILD_RULES_PROGRESS_SECONDS", "fast", "a number of seconds >= 0 between progress lines; unset it for the "
                                             "default 20"),
    ("BUILD_RULES_PROGRESS_SECONDS", "nan", "a number of seconds >= 0 between progress lines"),
    ("BUILD_RULES_DIAGNOSE_SAMPLES", "4.5", "a whole number of evaluation samples >= 1; unset it for the default 4"),
])
def test_a_bad_build_setting_is_one_line_before_any_task(tinynet_repo, monkeypatch, variable, value, said):
    """The build's own numeric settings are read by its stages and workers as they run: a bad one failed there, in
    the middle of a build (or, BUILD_RULES_PROGRESS_SECONDS, was ignored in silence). The build refuses it as it
    loads, in the setting's line (plumbing/env_settings.py), and runs nothing."""
    toml = tinynet_repo / "models/tinynet/model.toml"
    toml.write_text(toml.read_text().replace("samples = 8 }", "samples = 7 }"))  # the quantized variant is stale
    monkeypatch.setenv(variable, value)
    result = run_doit(tinynet_repo, "--continue")
    assert result.code == 3 and result.ran == set(), result.output
    assert f"error: {variable}={value!r} is not {said}" in result.output and "Traceback" not in result.output
