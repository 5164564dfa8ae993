"""The qairt toolchain made ready for a real SDK (issue 11), against the stand-in SDK of tests/fake_qairt:
the tools' environment, build prerequisites, SDK identity, log scanning, I/O contracts, 16-bit weights and
per-row quantization, and the DLC flow (qairt-converter -> qairt-quantizer -> qnn-context-binary-generator
--dlc_path). The stand-in refuses to run without the environment a real SDK's tools need and prints the real
tools' log lines; it does not show that a real SDK accepts these command lines (docs/qairt.md says what does).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TEST_MODELS, make_repo, run_doit, write_tinynet_checkpoints
from fake_qairt.make_sdk import make_host_tools, make_sdk
from test_qairt_toolchain import CHIPS, GRAPHS, VARIANTS, VERSION, recorded, sdk_tasks, use_sdk

DLC_STAGES = ("convert", "quantize", "htp_config", "compile", "check", "package")


def dlc_tasks(stages=DLC_STAGES) -> set[str]:
    names = set()
    for stage in stages:
        if stage == "quantize":
            names |= {f"quantize:tinynet/{g}/w8a16" for g in GRAPHS}
        elif stage == "convert":
            names |= {f"convert:tinynet/{g}/{v}" for g in GRAPHS for v in VARIANTS}
        elif stage == "package":
            names |= {f"package:tinynet/{v}@{c}" for v in VARIANTS for c in CHIPS}
        else:
            names |= {f"{stage}:tinynet/{g}/{v}@{c}" for g in GRAPHS for v in VARIANTS for c in CHIPS}
    return names


@pytest.fixture(scope="session")
def built_dlc(tmp_path_factory):
    """tinynet built once in the DLC flow, with qnn-net-run, without clang++ or an NDK on PATH."""
    base = tmp_path_factory.mktemp("qairt-dlc")
    sdk = make_sdk(base / "qairt" / VERSION, net_run=True)
    repo = make_repo(base / "repo", {"tinynet": TEST_MODELS / "tinynet"})
    write_tinynet_checkpoints(repo / "models" / "tinynet")
    with pytest.MonkeyPatch.context() as mp:
        use_sdk(mp, sdk, base / "calls.jsonl", host_tools=False)
        mp.setenv("BUILD_RULES_QAIRT_FLOW", "dlc")
        result = run_doit(repo)
    assert result.code == 0, result.output
    return base, result


@pytest.fixture
def dlc_copy(built_dlc, tmp_path, monkeypatch):
    base, _ = built_dlc
    shutil.copytree(base, tmp_path / "b", symlinks=True)
    base = tmp_path / "b"
    (base / "calls.jsonl").unlink()
    sdk, repo = base / "qairt" / VERSION, base / "repo"
    use_sdk(monkeypatch, sdk, base / "calls.jsonl", host_tools=False)
    monkeypatch.setenv("BUILD_RULES_QAIRT_FLOW", "dlc")
    settle = run_doit(repo)  # the copy's HTP configs name the old folder
    assert settle.code == 0 and settle.ran == dlc_tasks(["htp_config"]), settle.output
    return repo, sdk, base / "calls.jsonl"


# ----------------------------------------------------------------------------------------------- 1 environment

def test_tool_env_is_made_from_the_sdk_folder_alone(tmp_path):
    from build_rules.toolchains import qairt
    sdk = qairt.Sdk(tmp_path / "qairt" / VERSION)
    env = qairt.tool_env(sdk, {"PATH": "/usr/bin", "HOME": "/root"})
    assert env == {"HOME": "/root", "QNN_SDK_ROOT": str(sdk.root), "PYTHONPATH": f"{sdk.root}/lib/python",
                   "LD_LIBRARY_PATH": f"{sdk.root}/lib/x86_64-linux-clang",
                   "PATH": f"{sdk.root}/bin/x86_64-linux-clang{os.pathsep}/usr/bin"}
    kept = qairt.tool_env(sdk, {"PATH": "/usr/bin", "PYTHONPATH": "/mine", "LD_LIBRARY_PATH": "/opt/lib"})
    assert kept["PYTHONPATH"] == f"{sdk.root}/lib/python{os.pathsep}/mine"
    assert kept["LD_LIBRARY_PATH"] == f"{sdk.root}/lib/x86_64-linux-clang{os.pathsep}/opt/lib"


@pytest.mark.parametrize("drop, message", [
    (None, "ERROR - input network missing.onnx does not exist"),  # past the environment checks
    ("PYTHONPATH", "ModuleNotFoundError: No module named 'qti'"),
    ("LD_LIBRARY_PATH", "error while loading shared libraries: libQnnHtpPrepare.so: cannot open shared object file"),
    ("PATH", "bin/x86_64-linux-clang is not on PATH"),
])
def test_the_stand_in_tools_refuse_to_run_without_the_sdk_environment(tmp_path, drop, message):
    from build_rules.toolchains import qairt
    sdk = qairt.Sdk(make_sdk(tmp_path / "qairt" / VERSION))
    env = qairt.tool_env(sdk, {"PATH": os.environ["PATH"]})
    if drop == "PATH":
        env["PATH"] = os.environ["PATH"]
    elif drop:
        del env[drop]
    proc = subprocess.run([str(sdk.tool("qairt-converter")), "--input_network", "missing.onnx"], env=env,
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 1
    assert message in proc.stderr


# ----------------------------------------------------------------------------------------------- 2 prerequisites

def test_missing_build_programs_are_named(tmp_path):
    from build_rules.toolchains import qairt
    folder = make_host_tools(tmp_path / "bin", ("clang++-9",))
    assert qairt.missing_build_programs(str(folder)) == ["make"]  # clang++-9 will do, as the generator prefers it
    make_host_tools(folder, ("make",))
    assert qairt.missing_build_programs(str(folder)) == []
    assert qairt.missing_build_programs(str(tmp_path / "nothing")) == ["clang++", "make"]


def test_without_clang_the_model_lib_flow_stops_before_any_tool_runs(tmp_path, monkeypatch):
    sdk = make_sdk(tmp_path / "qairt" / VERSION)
    repo = make_repo(tmp_path / "repo", {"tinynet": TEST_MODELS / "tinynet"})
    write_tinynet_checkpoints(repo / "models" / "tinynet")
    use_sdk(monkeypatch, sdk, tmp_path / "calls.jsonl", host_tools=False)
    result = run_doit(repo)
    assert result.code == 3
    assert "qairt model-lib flow: no clang++ on PATH: qnn-model-lib-generator builds the x86_64-linux-clang model " \
           "library with clang++ and make; install them (Debian/Ubuntu: apt-get install clang make), or use the DLC " \
           "flow, which needs neither" in result.output
    assert not (tmp_path / "calls.jsonl").exists()  # no SDK tool ran
    monkeypatch.setenv("BUILD_RULES_QAIRT_FLOW", "dlc")
    assert run_doit(repo, "list").code == 0  # the DLC flow needs no compiler


# ----------------------------------------------------------------------------------------------- 3 identity

@pytest.mark.parametrize("folder, yaml, expected", [
    ("2.40.0.251030", "name: qairt\nversion: 2.40.0\nbuild_id: 251030\n", ("2.40.0", "251030", "sdk.yaml")),
    ("sdk", "version: '2.41.0'\nbuild_id: \"251215\"\n", ("2.41.0", "251215", "sdk.yaml")),
    ("sdk", "version: 2.40.0.251030\n", ("2.40.0", "251030", "sdk.yaml")),  # one string: its last part is the build
    ("sdk", "version: 2.40.0\n", ("2.40.0", None, "sdk.yaml")),
    ("2.40.0.251030", None, ("2.40.0", "251030", "folder name")),
    ("v2.39.0.250926", None, ("2.39.0", "250926", "folder name")),
    ("my-sdk", None, ("my-sdk", None, "folder name")),
])
def test_sdk_version_and_build_id_from_sdk_yaml_or_the_folder(tmp_path, folder, yaml, expected):
    from build_rules.toolchains import qairt
    root = tmp_path / folder
    root.mkdir()
    if yaml is not None:
        (root / "sdk.yaml").write_text(yaml)
    assert qairt.Sdk(root).release() == expected


@pytest.mark.slow
def test_a_new_sdk_build_id_reruns_exactly_the_sdk_tasks(dlc_copy):
    repo, sdk, calls = dlc_copy
    (sdk / "sdk.yaml").write_text("name: qairt\nversion: 2.40.0\nbuild_id: 251031\n")
    result = run_doit(repo)
    assert result.code == 0, result.output
    assert result.ran == dlc_tasks()
    manifest = json.loads((repo / "out/tinynet/w8a16/SM8750/manifest.json").read_text())
    assert (manifest["sdk_version"], manifest["sdk_build_id"]) == ("2.40.0", "251031")
    assert manifest["toolchain"]["sdk_build_id"] == "251031"
    assert run_doit(repo).ran == set()


# ----------------------------------------------------------------------------------------------- 4 logs

def test_the_converter_log_fails_only_on_its_fatal_lines():
    from build_rules.toolchains.qairt_outputs import scan_converter_log
    warnings = ("2025-04-01 23:50:17,978 - 250 - WARNING - WARNING_CAST_TYPE: Only numerical type cast is supported. "
                "The op: /layers.7/attn/core/Cast_14 will be interpreted at conversion time\n"
                "2025-04-01 23:50:18,000 - 240 - WARNING - WARNING_OP_VERSION_NOT_SUPPORTED: Operation Gemm Not "
                "Supported\nop Foo falls back to CPU\n")
    assert scan_converter_log(warnings) == {"rejected": [], "quantization_warnings": []}
    found = scan_converter_log(
        "2025-07-09 10:00:00,000 - 235 - ERROR - Node image_QuantizeLinear: 'No translation registered for op type "
        "onnx_dynamicquantizelinear.'\nKeyError: 'No translation registered for op type onnx_einsum.'\n"
        "2025-07-09 10:00:01,000 - 427 - WARNING - Quantization encodings of tensor 'a' were clipped\n")
    assert found["rejected"] == [
        {"node": "image_QuantizeLinear", "op": "onnx_dynamicquantizelinear",
         "text": "No translation registered for op type onnx_dynamicquantizelinear"},
        {"node": None, "op": "onnx_einsum", "text": "No translation registered for op type onnx_einsum"}]
    assert found["quantization_warnings"] == ["WARNING - Quantization encodings of tensor 'a' were clipped"]


def test_the_context_binary_log_names_each_node_htp_refused():
    from build_rules.stages.context_binary import rejection_error
    from build_rules.toolchains.qairt_outputs import scan_context_binary_log
    model_lib = (' <W> Initializing HtpProvider\n   132.5ms [ ERROR ]  <E> [4294967295] has incorrect Value 68, expected '
                 '>= 73.\n   132.5ms [ ERROR ]  <E> QnnBackend_validateOpConfig failed 3110\n   132.5ms [ ERROR ]  <E> '
                 'Failed to validate op _layers_23_self_attn_o_proj_Linear_MatMul with error 0xc26\n[ ERROR ] '
                 'QnnModel::addNode() validating node _layers_23_self_attn_o_proj_Linear_MatMul failed.\n[ ERROR ] '
                 'graph24.addNode(QNN_OPCONFIG_VERSION_1, "_layers_23_self_attn_o_proj_Linear_MatMul", "qti.aisw", '
                 '"MatMul", params, 0, inputs, 3, outputs, 1) expected MODEL_NO_ERROR, got MODEL_GRAPH_OP_VALIDATION_ERROR\n')
    dlc = ("<E> None of the combinations match the provided case\n<E> QnnBackend_validateOpConfig failed 3110\n"
           "<E> Failed to validate op rms_norm_node_ with error 0xc26\nValidate OpConfig failed: "
           "QNN_OP_PACKAGE_ERROR_VALIDATION_FAILURE\nGraph composer failed, no graphs were created\n")
    rejected = scan_context_binary_log(model_lib + dlc)
    assert rejected == [
        {"node": "_layers_23_self_attn_o_proj_Linear_MatMul", "op_type": "MatMul", "code": "0xc26",
         "text": "[4294967295] has incorrect Value 68, expected >= 73."},
        {"node": "rms_norm_node_", "op_type": None, "code": "0xc26",
         "text": "None of the combinations match the provided case"}]
    assert str(rejection_error("compile:m/g/v@SM8350", rejected, None, "v68")) == (
        "compile:m/g/v@SM8350: qnn-context-binary-generator: QNN rejected node "
        "'_layers_23_self_attn_o_proj_Linear_MatMul' (MatMul): [4294967295] has incorrect Value 68, expected >= 73. "
        "(error 0xc26). Fix: this op needs HTP v73 or newer at these bit widths and the chip is v68: build this chip "
        "with 8-bit activations (a w8a8 variant), or keep 16 bit only where needed (overrides); QNN rejected node "
        "'rms_norm_node_' (op type not in the log): None of the combinations match the provided case (error 0xc26). "
        "Fix: HTP has no kernel for this op with these input/output data types: change its precision (the variant's "
        "activations/weights, or an override of its tensors) or replace the op in the export")
    assert scan_context_binary_log(" <W> Initializing HtpProvider\nSaved context binary out/x.bin\n") == []


def test_warning_lines_never_fail_a_build(built_dlc):
    base, result = built_dlc
    log = (base / "repo/out/tinynet/w8a16/head.convert.log").read_text()
    assert "- WARNING - WARNING_GEMM: GEMM operation is not supported in the general case" in log
    assert result.code == 0


def test_a_node_htp_rejects_in_the_dlc_flow_is_named_from_the_onnx_model(dlc_copy, monkeypatch):
    repo, sdk, calls = dlc_copy
    monkeypatch.setenv("FAKE_QAIRT_REJECT_OP", "Gemm")
    (repo / "out/tinynet/w8a16/SM8750/head.bin").unlink()
    result = run_doit(repo)
    assert result.code != 0
    assert "compile:tinynet/head/w8a16@SM8750: qnn-context-binary-generator: QNN rejected node '/fc/Gemm' (Gemm): " \
           "None of the combinations match the provided case (error 0xc26). Fix: HTP has no kernel" in result.output
    assert "Failed in QnnSystemDlc_composeGraphs()" in (repo / "out/tinynet/w8a16/SM8750/head.compile.log").read_text()
    assert not (repo / "out/tinynet/w8a16/SM8750/head.bin").exists()


# ----------------------------------------------------------------------------------------------- 5 I/O contracts

def test_io_contract_from_net_json_and_from_a_binary_dump(tmp_path):
    from build_rules.toolchains.qairt_outputs import ContractError, binary_graph_names, read_io_contract
    net = tmp_path / "g_net.json"
    net.write_text(json.dumps({"graph": {"tensors": {
        "x": {"id": 1, "type": 0, "dataFormat": 0, "data_type": 0x0416, "src_axis_format": "NCHW",
              "axis_format": "NHWC", "dims": [1, 8, 8, 3],
              "quant_params": {"definition": 1, "encoding": 0, "scale_offset": {"scale": 0.5, "offset": -128}}},
        "w": {"id": 2, "type": 4, "data_type": 0x0408, "dims": [3]},
        "ids": {"id": 3, "type": 0, "data_type": 0x0032, "dims": [1, 4], "axis_format": "NOT_YET_DEFINED",
                "quant_params": {"definition": 2147483647, "encoding": 2147483647,
                                 "scale_offset": {"scale": 0.0, "offset": 0}}},
        "y": {"id": 4, "type": 1, "data_type": 0x0216, "dims": [1, 10], "axis_format": "NF",
              "quant_params": {"definition": 2147483647, "encoding": 2147483647}}}}}))
    assert read_io_contract(net) == {
        "inputs": [{"name": "x", "shape": [1, 8, 8, 3], "dtype": "UFIXED_POINT_16", "scale": 0.5, "offset": -128,
                    "layout": "NHWC"},
                   {"name": "ids", "shape": [1, 4], "dtype": "INT_32", "scale": None, "offset": None, "layout": None}],
        "outputs": [{"name": "y", "shape": [1, 10], "dtype": "FLOAT_16", "scale": None, "offset": None, "layout": "NF"}]}
    dump = tmp_path / "g.info.json"
    dump.write_text(json.dumps({"info": {"graphs": [{"info": {
        "graphName": "g",
        "graphInputs": [{"info": {"id": 1, "name": "x", "dataType": "QNN_DATATYPE_UFIXED_POINT_8",
                                  "dimensions": [1, 3, 8, 8],
                                  "quantizeParams": {"quantizationEncoding": "QNN_QUANTIZATION_ENCODING_SCALE_OFFSET",
                                                     "scaleOffset": {"scale": 0.25, "offset": -3}}}}],
        "graphOutputs": [{"info": {"id": 2, "name": "y", "dataType": "QNN_DATATYPE_FLOAT_32", "dimensions": [1, 10],
                                   "quantizeParams": {"scaleOffset": {"scale": 0.0, "offset": 0}}}}]}}]}}))
    assert read_io_contract(dump) == {
        "inputs": [{"name": "x", "shape": [1, 3, 8, 8], "dtype": "UFIXED_POINT_8", "scale": 0.25, "offset": -3,
                    "layout": None}],
        "outputs": [{"name": "y", "shape": [1, 10], "dtype": "FLOAT_32", "scale": None, "offset": None, "layout": None}]}
    assert binary_graph_names(dump) == ["g"]
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(ContractError, match="neither a _net.json"):
        read_io_contract(tmp_path / "other.json")
    with pytest.raises(ContractError, match="no graph names in it"):
        binary_graph_names(tmp_path / "other.json")


def test_input_problems_name_shape_and_order_mismatches():
    from build_rules.toolchains.qairt_outputs import input_problems

    def contract(*entries):
        return {"inputs": [{"name": n, "shape": s, "layout": None} for n, s in entries], "outputs": []}

    specs = {"x.0": {"shape": [1, 3, 8, 8], "dtype": "float32", "layout": None},
             "ids": {"shape": [1, 4], "dtype": "int32", "layout": None}}
    assert input_problems(contract(("x_0", [1, 8, 8, 3]), ("ids", [1, 4])), specs, "model-lib") == []
    assert input_problems(contract(("x.0", [1, 3, 8, 8]), ("ids", [1, 4])), specs, "dlc") == []
    assert input_problems(contract(("ids", [1, 4]), ("x.0", [1, 3, 8, 8])), specs, "dlc") == [
        "the converted graph takes its inputs in the order ['ids', 'x.0'], but the calibration samples list them in "
        "the ONNX order ['x.0', 'ids']"]
    assert input_problems(contract(("x.0", [1, 8, 8, 3]), ("ids", [1, 4])), specs, "dlc") == [
        "input 'x.0' is [1, 8, 8, 3] in the converted graph, but its data is written as [1, 3, 8, 8] (the ONNX shape)"]
    assert input_problems(contract(("ids", [1, 4])), specs, "dlc") == [
        "input 'x.0' is not an input of the converted graph (its inputs: ids)"]


# ----------------------------------------------------------------------------------------------- 6 16-bit weights

def test_16_bit_weights_are_symmetric_with_restricted_steps():
    from build_rules.toolchains import qairt
    w16 = {"precision": "quantized", "activations": "uint16", "weights": "uint16", "per_channel": False}
    assert qairt.quantization_flags(w16) == [
        "--act_bitwidth", "16", "--bias_bitwidth", "32", "--weights_bitwidth", "16", "--param_quantizer_schema",
        "symmetric", "--restrict_quantization_steps", "-0x8000 0x7F7F"]
    w8 = dict(w16, weights="uint8", per_channel=True)
    assert qairt.quantization_flags(w8, per_row=True) == [
        "--act_bitwidth", "16", "--bias_bitwidth", "32", "--weights_bitwidth", "8", "--use_per_channel_quantization",
        "--use_per_row_quantization"]
    assert qairt.needs_per_row(w8, {"v69", "v79"}) and not qairt.needs_per_row(w8, {"v73", "v79"})
    assert not qairt.needs_per_row(dict(w8, activations="uint8"), {"v68"})
    assert qairt.needs_per_row(dict(w8, activations="uint8", overrides={"t": "uint16"}), {"v68"})
    assert not qairt.needs_per_row({"precision": "fp16"}, {"v68"})


V68_MODEL = """[model]
description = "tiny two-graph test net, on a v68 chip"
hooks = "hooks.py"
chips = ["SM8350"]
export = { exporter = "torchscript" }  # as tests/models/tinynet has it

[graphs.encoder]
checkpoints = ["encoder.pt"]
inputs = { image = { shape = [1, 3, 16, 16], dtype = "float32" } }
outputs = ["features"]
calibration_samples = 8

[graphs.head]
checkpoints = ["head.pt"]
inputs = { features = { shape = [1, 64], dtype = "float32" } }
outputs = ["logits"]
calibration_samples = 8

[variants.w8a16]
activations = "uint16"
weights = "uint8"
calibration = { method = "minmax", samples = 8 }

[variants.w16a16]
activations = "uint16"
weights = "uint16"
calibration = { method = "minmax", samples = 8 }
"""


@pytest.mark.slow
def test_16_bit_activations_on_a_v68_chip_use_per_row_quantization(tmp_path, monkeypatch):
    """The stand-in's HTP refuses a 16-bit FullyConnected on v68 unless its weights are quantized per row."""
    from build_rules.toolchains import qairt
    sdk = make_sdk(tmp_path / "qairt" / VERSION)
    repo = make_repo(tmp_path / "repo", {"tinynet": TEST_MODELS / "tinynet"})
    (repo / "models/tinynet/model.toml").write_text(V68_MODEL)
    write_tinynet_checkpoints(repo / "models" / "tinynet")
    calls = tmp_path / "calls.jsonl"
    use_sdk(monkeypatch, sdk, calls)
    result = run_doit(repo)
    assert result.code == 0, result.output
    head = {c[c.index("--output_path") + 1]: c for c in recorded(calls, "qnn-onnx-converter")}
    assert head["out/tinynet/w8a16/head.cpp"][4:13] == [
        "--act_bitwidth", "16", "--bias_bitwidth", "32", "--weights_bitwidth", "8", "--use_per_channel_quantization",
        "--use_per_row_quantization", "--input_list"]
    assert head["out/tinynet/w16a16/head.cpp"][4:16] == [
        "--act_bitwidth", "16", "--bias_bitwidth", "32", "--weights_bitwidth", "16", "--param_quantizer_schema",
        "symmetric", "--use_per_channel_quantization", "--use_per_row_quantization", "--restrict_quantization_steps",
        "-0x8000 0x7F7F"]

    monkeypatch.setattr(qairt, "PER_ROW_ARCHS", ())  # as if the build did not know v68 needs it
    result = run_doit(repo)
    assert result.code != 0
    assert result.ran_stage("convert") == {f"convert:tinynet/{g}/{v}" for g in GRAPHS for v in ("w8a16", "w16a16")}
    assert re.search(r"compile:tinynet/head/w(8|16)a16@SM8350: qnn-context-binary-generator: QNN rejected node "
                     r"'/fc/Gemm' \(Gemm\): \[4294967295\] has incorrect Value 68, expected >= 73\. \(error 0xc26\)\. "
                     r"Fix: this op needs HTP v73 or newer at these bit widths and the chip is v68", result.output)


# ----------------------------------------------------------------------------------------------- 7 DLC flow

def test_qairt_flow_from_chips_toml_or_the_environment(tmp_path):
    from build_rules.configuration.config import ConfigError, load_chips
    from build_rules.toolchains import qairt
    chips = tmp_path / "chips.toml"
    block = '[chips.SM8750]\nsoc_id = 69\ndsp_arch = "v79"\nvtcm_mb = 8\nfp16 = true\n'
    chips.write_text('qairt_flow = "dlc"\n' + block)
    assert load_chips(chips).qairt_flow == "dlc"
    chips.write_text(block)
    assert load_chips(chips).qairt_flow == "model-lib"
    chips.write_text('qairt_flow = "snpe"\n' + block)
    with pytest.raises(ConfigError, match="qairt_flow: expected one of"):
        load_chips(chips)
    assert qairt.choose_flow("dlc", {}) == "dlc"
    assert qairt.choose_flow("dlc", {"BUILD_RULES_QAIRT_FLOW": "model-lib"}) == "model-lib"
    with pytest.raises(ConfigError, match="BUILD_RULES_QAIRT_FLOW=cpp: unknown QAIRT flow"):
        qairt.choose_flow("model-lib", {"BUILD_RULES_QAIRT_FLOW": "cpp"})


def test_dlc_flow_command_lines_and_outputs(built_dlc):
    base, result = built_dlc
    repo, calls, sdk = base / "repo", base / "calls.jsonl", base / "qairt" / VERSION
    assert result.ran >= dlc_tasks() and not result.ran_stage("model_libs")
    assert result.ran_stage("quantize") == dlc_tasks(["quantize"])
    assert recorded(calls, "qnn-onnx-converter") == recorded(calls, "qnn-model-lib-generator") == []
    convert = {c[3]: c for c in recorded(calls, "qairt-converter")}
    assert convert["out/tinynet/fp16/head.dlc"] == [
        "--input_network", "out/tinynet/float/head.sim.onnx", "--output_path", "out/tinynet/fp16/head.dlc",
        "--float_bitwidth", "16", "--source_model_input_datatype", "features", "float32"]
    assert convert["out/tinynet/w8a16/float_dlc/encoder.dlc"] == [  # ONNX layout kept: no layout flag, no transpose
        "--input_network", "out/tinynet/float/encoder.sim.onnx", "--output_path", "out/tinynet/w8a16/float_dlc/encoder.dlc",
        "--source_model_input_datatype", "image", "float32"]
    quantize = [c for c in recorded(calls, "qairt-quantizer") if "out/tinynet/w8a16/encoder.dlc" in c]
    assert quantize == [["--input_dlc", "out/tinynet/w8a16/float_dlc/encoder.dlc", "--input_list",
                         "out/tinynet/w8a16/.encoder.qnn_inputs/input_list.txt", "--output_dlc",
                         "out/tinynet/w8a16/encoder.dlc", "--act_bitwidth", "16", "--bias_bitwidth", "32",
                         "--weights_bitwidth", "8", "--use_per_channel_quantization", "--use_native_input_files"]]
    # The quantizer's list has absolute paths (it reads the list from its own folder), one per input.
    assert re.search(r"first line: /\S+/out/tinynet/calibration/encoder/0000\.image\.raw$",
                     (repo / "out/tinynet/w8a16/encoder.quantize.log").read_text(), re.M)
    compile_ = [c for c in recorded(calls, "qnn-context-binary-generator") if "out/tinynet/w8a16/SM8750" in c and
                "head" in c]
    assert compile_ == [["--backend", f"{sdk}/lib/x86_64-linux-clang/libQnnHtp.so",
                         "--model", f"{sdk}/lib/x86_64-linux-clang/libQnnModelDlc.so",
                         "--dlc_path", "out/tinynet/w8a16/head.dlc", "--output_dir", "out/tinynet/w8a16/SM8750",
                         "--binary_file", "head", "--config_file",
                         "out/tinynet/w8a16/SM8750/head_config/htp_backend_extensions.json"]]
    assert ["--context_binary", "out/tinynet/w8a16/SM8750/head.bin", "--json_file",
            "out/tinynet/w8a16/SM8750/head.info.json"] in recorded(calls, "qnn-context-binary-utility")
    out = repo / "out/tinynet"
    assert not (out / "w8a16/model_libs").exists() and not (out / "w8a16/encoder.cpp").exists()
    manifest = json.loads((out / "w8a16/SM8750/manifest.json").read_text())
    assert manifest["qairt_flow"] == "dlc" and manifest["toolchain"]["flow"] == "dlc"
    encoder = manifest["graphs"]["encoder"]
    assert encoder["model_libs"] == {} and encoder["check"] == "ran" and encoder["metrics"]["cosine"] > 0.9999
    (image,) = encoder["io"]["inputs"]
    assert (image["name"], image["shape"], image["dtype"], image["layout"]) == ("image", [1, 3, 16, 16],
                                                                                "UFIXED_POINT_16", None)
    assert image["scale"] > 0 and image["offset"] < 0
    assert sorted(p.name for p in (out / "w8a16/SM8750/runtime").iterdir()) == [
        "libQnnHtp.so", "libQnnHtpV79Skel.so", "libQnnHtpV79Stub.so", "libQnnSystem.so"]
    # SM8550's checks proved its outputs equal to SM8750's with qnn-net-run on 3 samples, and took its metrics
    other = json.loads((out / "w8a16/SM8550/manifest.json").read_text())["graphs"]["encoder"]
    assert other["equal_to"]["chip"] == "SM8750" and other["equal_to"]["samples"] == 3
    assert other["metrics"] == encoder["metrics"] and other["check"] == "ran"
    proofs = [c for c in recorded(calls, "qnn-net-run") if "out/tinynet/w8a16/SM8550/encoder.bin" in c]
    assert len(proofs) == 1  # its binary once, on the proof samples (no full check of its own)
    fp16 = json.loads((out / "fp16/SM8550/manifest.json").read_text())["graphs"]["head"]["io"]["inputs"]
    assert fp16 == [{"name": "features", "shape": [1, 64], "dtype": "FLOAT_16", "scale": None, "offset": None,
                     "layout": None}]


def test_doit_list_in_the_dlc_flow(built_dlc, monkeypatch):
    base, _ = built_dlc
    use_sdk(monkeypatch, base / "qairt" / VERSION, base / "calls.jsonl", host_tools=False)
    monkeypatch.setenv("BUILD_RULES_QAIRT_FLOW", "dlc")
    listing = run_doit(base / "repo", "list")
    assert listing.code == 0, listing.output
    for stage in DLC_STAGES:
        assert f"[qairt {VERSION}, dlc flow]" in next(line for line in listing.output.splitlines()
                                                       if line.startswith(stage + " ")), listing.output
    assert not any(line.startswith("model_libs ") for line in listing.output.splitlines())


def test_switching_the_flow_reruns_exactly_the_sdk_tasks(dlc_copy, monkeypatch):
    repo, sdk, calls = dlc_copy
    monkeypatch.setenv("BUILD_RULES_QAIRT_FLOW", "model-lib")
    monkeypatch.setenv("PATH", f"{make_host_tools(calls.parent / 'host-bin')}{os.pathsep}{os.environ['PATH']}")
    result = run_doit(repo)
    assert result.code == 0, result.output
    assert result.ran == sdk_tasks()  # the model-lib flow's convert .. package; no export, simplify, verify, calibrate
    manifest = json.loads((repo / "out/tinynet/w8a16/SM8750/manifest.json").read_text())
    assert manifest["qairt_flow"] == "model-lib" and manifest["graphs"]["head"]["io"]["inputs"][0]["name"] == "features"
    assert run_doit(repo).ran == set()


def test_the_dlc_flow_on_an_sdk_without_the_dlc_tools_names_them(tmp_path, monkeypatch):
    old = make_sdk(tmp_path / "qairt" / "2.20.0.240223", version="2.20.0.240223")
    repo = make_repo(tmp_path / "repo", {"tinynet": TEST_MODELS / "tinynet"})
    write_tinynet_checkpoints(repo / "models" / "tinynet")
    use_sdk(monkeypatch, old, tmp_path / "calls.jsonl")
    monkeypatch.setenv("BUILD_RULES_QAIRT_FLOW", "dlc")
    result = run_doit(repo, "list")
    assert result.code == 3
    assert f"QAIRT SDK 2.20.0 at QNN_SDK_ROOT={old} has no bin/x86_64-linux-clang/qairt-converter, " \
           "bin/x86_64-linux-clang/qairt-quantizer, lib/x86_64-linux-clang/libQnnModelDlc.so: the DLC flow needs " \
           "qairt-converter, qairt-quantizer and libQnnModelDlc.so" in result.output
    assert "or the model-lib flow (qairt_flow = \"model-lib\" in chips.toml" in result.output
    monkeypatch.delenv("BUILD_RULES_QAIRT_FLOW")
    assert run_doit(repo, "list").code == 0  # the same SDK in the model-lib flow
    # ... and its context-binary generator does not know --dlc_path, as a real one of that age would not.
    from build_rules.toolchains import qairt
    sdk = qairt.Sdk(old)
    proc = subprocess.run([str(sdk.tool("qnn-context-binary-generator")), "--backend", str(sdk.htp_backend), "--model",
                           "x.so", "--binary_file", "x", "--dlc_path", "x.dlc"], env=qairt.tool_env(sdk),
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2 and "unrecognized arguments: --dlc_path x.dlc" in proc.stderr


def test_the_build_file_stays_light_in_the_dlc_flow(built_dlc):
    base, _ = built_dlc
    code = ("import runpy, sys, json; runpy.run_path('dodo.py'); from build_rules import tasks; tasks.project(); "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('numpy', 'onnx', 'onnxruntime', 'torch', 'onnxruntime_qnn'))))")
    env = dict(os.environ, QNN_SDK_ROOT=str(base / "qairt" / VERSION), BUILD_RULES_QAIRT_FLOW="dlc",
               PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    env["BUILD_RULES_TOOLCHAIN"] = "qairt"
    proc = subprocess.run([sys.executable, "-c", code], cwd=base / "repo", env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
