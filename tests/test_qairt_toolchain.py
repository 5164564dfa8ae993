"""The qairt toolchain (issue: the QAIRT SDK toolchain), against the stand-in SDK of tests/fake_qairt.

The real SDK is a license-gated download, so these tests check what the build does with an SDK: the exact
command lines (recorded by the stand-in tools, which parse the real tools' flags), where outputs and logs go,
what re-runs when the SDK changes, and the errors a user gets. They do not show that a real SDK accepts them.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from conftest import ROOT, TEST_MODELS, make_repo, run_doit, write_tinynet_checkpoints
from fake_qairt.make_sdk import make_host_tools, make_sdk

VERSION = "2.40.0.251030"  # the SDK's folder name: sdk.yaml says version: 2.40.0, build_id: 251030
GRAPHS = ("encoder", "head")
VARIANTS = ("fp16", "w8a16")
CHIPS = ("SM8550", "SM8750")
SDK_STAGES = ("convert", "model_libs", "htp_config", "compile", "check", "package")


def sdk_tasks(stages=SDK_STAGES) -> set[str]:
    names = set()
    for stage in stages:
        if stage in ("convert", "model_libs"):
            names |= {f"{stage}:tinynet/{g}/{v}" for g in GRAPHS for v in VARIANTS}
        elif stage == "package":
            names |= {f"package:tinynet/{v}@{c}" for v in VARIANTS for c in CHIPS}
        else:
            names |= {f"{stage}:tinynet/{g}/{v}@{c}" for g in GRAPHS for v in VARIANTS for c in CHIPS}
    return names


def path_without(*programs: str) -> str:
    """$PATH without the folders that hold any of these programs."""
    return os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and not any((Path(p) / program).exists() for program in programs))


def use_sdk(mp: pytest.MonkeyPatch, sdk: Path, calls: Path, host_tools: bool = True) -> None:
    """Only QNN_SDK_ROOT points at the SDK: no envsetup.sh, no SDK entries on PYTHONPATH / LD_LIBRARY_PATH / PATH;
    the qairt toolchain chosen for the run (BUILD_RULES_TOOLCHAIN=qairt: an SDK alone does not choose it).
    host_tools: stand-in clang++ and make on PATH (what the model-lib flow's library build needs); never an NDK."""
    mp.setenv("QNN_SDK_ROOT", str(sdk))
    mp.setenv("FAKE_QAIRT_LOG", str(calls))
    path = path_without("ndk-build", "clang++", "clang++-9")
    if host_tools:
        path = f"{make_host_tools(calls.parent / 'host-bin')}{os.pathsep}{path}"
    mp.setenv("PATH", path)
    mp.setenv("BUILD_RULES_TOOLCHAIN", "qairt")
    for name in ("BUILD_RULES_QAIRT_FLOW", "FAKE_QAIRT_UNSUPPORTED_OP", "FAKE_QAIRT_WARNING",
                 "FAKE_QAIRT_REJECT_OP", "FAKE_QAIRT_KEEP_LAYOUT", "PYTHONPATH", "LD_LIBRARY_PATH"):
        mp.delenv(name, raising=False)


def recorded(calls: Path, tool: str | None = None) -> list[list[str]]:
    """Command lines the stand-in tools saw, staging folders taken out (out/.staging/<id>/out/x -> out/x)."""
    if not calls.exists():
        return []
    rows = [json.loads(line) for line in calls.read_text().splitlines()]
    return [[re.sub(r"(/[^ ]*)?out/\.staging/(\d+-)?[0-9a-f]{32}/", "", a) for a in r["argv"]]
            for r in rows if tool is None or r["tool"] == tool]


@pytest.fixture(scope="session")
def built_qairt(tmp_path_factory):
    """tinynet built once with the stand-in SDK (no qnn-net-run, no NDK); tests take copies."""
    base = tmp_path_factory.mktemp("qairt-built")
    sdk = make_sdk(base / "qairt" / VERSION)
    repo = make_repo(base / "repo", {"tinynet": TEST_MODELS / "tinynet"})
    write_tinynet_checkpoints(repo / "models" / "tinynet")
    with pytest.MonkeyPatch.context() as mp:
        use_sdk(mp, sdk, base / "calls.jsonl")
        result = run_doit(repo)
    assert result.code == 0, result.output
    return base, result


@pytest.fixture
def qairt_copy(built_qairt, tmp_path, monkeypatch):
    """A private copy of the built repo and its SDK, in use; its first run re-writes only the HTP configs,
    which hold absolute paths."""
    base, _ = built_qairt
    shutil.copytree(base, tmp_path / "b", symlinks=True)
    base = tmp_path / "b"
    (base / "calls.jsonl").unlink()
    sdk, repo = base / "qairt" / VERSION, base / "repo"
    use_sdk(monkeypatch, sdk, base / "calls.jsonl")
    settle = run_doit(repo)
    assert settle.code == 0, settle.output
    assert settle.ran == sdk_tasks(["htp_config"]), settle.output
    return repo, sdk, base / "calls.jsonl"


# ----------------------------------------------------------------------------------------------- choice

def test_toolchain_choice_env_then_repo_never_the_sdk_root():
    from build_rules.configuration.config import ConfigError
    from build_rules.toolchains import choose

    assert choose("auto", {}) == ("ort-qnn", "default")
    # QAIRT's envsetup.sh sets QNN_SDK_ROOT for everyone with the SDK: it is the phone's runtime, not a choice
    assert choose("auto", {"QNN_SDK_ROOT": "/sdk"}) == (
        "ort-qnn", "default; QNN_SDK_ROOT is set and used only for the phone's runtime -- toolchain = \"qairt\" in "
                   "chips.toml or BUILD_RULES_TOOLCHAIN=qairt builds with it")
    assert choose("qairt", {"QNN_SDK_ROOT": "/sdk"}) == ("qairt", 'chips.toml: toolchain = "qairt"')
    assert choose("ort-qnn", {"QNN_SDK_ROOT": "/sdk"})[0] == "ort-qnn"
    assert choose("qairt", {})[0] == "qairt"
    assert choose("qairt", {"BUILD_RULES_TOOLCHAIN": "ort-qnn"})[0] == "ort-qnn"
    assert choose("auto", {"BUILD_RULES_TOOLCHAIN": "qairt"})[0] == "qairt"
    with pytest.raises(ConfigError, match="BUILD_RULES_TOOLCHAIN=qnn: unknown toolchain"):
        choose("auto", {"BUILD_RULES_TOOLCHAIN": "qnn"})


def test_chips_toml_toolchain_key(tmp_path):
    from build_rules.configuration.config import ConfigError, load_chips
    chips = tmp_path / "chips.toml"
    block = '[chips.SM8750]\nsoc_id = 69\ndsp_arch = "v79"\nvtcm_mb = 8\nfp16 = true\n'
    chips.write_text('toolchain = "qairt"\n' + block)
    assert load_chips(chips).toolchain == "qairt"
    chips.write_text(block)
    assert load_chips(chips).toolchain == "auto"
    chips.write_text('toolchain = "snpe"\n' + block)
    with pytest.raises(ConfigError, match="toolchain: expected one of"):
        load_chips(chips)


def test_input_layout_key_is_validated_and_drives_the_qnn_layout(tmp_path):
    from build_rules.configuration.config import ConfigError, load_chips, load_model
    from build_rules.toolchains import qairt

    chips = tmp_path / "chips.toml"
    chips.write_text('[chips.SM8750]\nsoc_id = 69\ndsp_arch = "v79"\nvtcm_mb = 8\nfp16 = true\n')
    folder = tmp_path / "asr"
    folder.mkdir()
    (folder / "export.py").write_text("")
    (folder / "model.onnx").write_bytes(b"")

    def model(layout_line):
        (folder / "model.toml").write_text(f'[model]\nonnx = "model.onnx"\n[graphs.enc]\n'
                                           f'inputs = {{ x = {{ shape = [1, 100, 80], dtype = "float32"{layout_line} }} }}\n'
                                           '[variants.fp16]\nprecision = "fp16"\n')
        return load_model(folder, load_chips(chips))

    spec = model(', layout = "NTF"').graphs["enc"].inputs["x"]
    assert spec.layout == "NTF"
    as_params = {"shape": list(spec.shape), "dtype": spec.dtype, "layout": spec.layout}
    assert qairt.qnn_permutation(as_params) is None  # NTF: the converter keeps the ONNX order
    assert qairt.qnn_permutation(dict(as_params, layout=None)) == (0, 2, 1)  # default NCF: transposed
    assert qairt.qnn_permutation({"shape": [1, 3, 8, 8], "dtype": "float32"}) == (0, 2, 3, 1)
    assert qairt.qnn_permutation({"shape": [1, 64], "dtype": "float32"}) is None
    with pytest.raises(ConfigError, match=r"\[graphs.enc.inputs.x\] layout: 'NCHW' names 4 dims, the input has 3"):
        model(', layout = "NCHW"')
    with pytest.raises(ConfigError, match="layout: expected one of"):
        model(', layout = "XYZ"')


# ----------------------------------------------------------------------------------------------- command lines

def test_mtcnn_command_lines_follow_the_sherpa_onnx_flow(tmp_path, monkeypatch):
    """The task dicts of the real example model, and the command lines its stages run, under qairt."""
    from build_rules import tasks
    from build_rules.tasks import qairt as qairt_tasks
    from build_rules.toolchains import qairt

    sdk = make_sdk(tmp_path / "qairt" / VERSION)
    repo = make_repo(tmp_path / "repo", {"mtcnn": ROOT / "models/mtcnn"})
    use_sdk(monkeypatch, sdk, tmp_path / "calls.jsonl")
    monkeypatch.chdir(repo)
    tasks.project.cache_clear()
    try:
        found = {}
        for stage in SDK_STAGES:
            for task in getattr(qairt_tasks, stage)():
                if task["name"]:
                    found[f"{stage}:{task['name']}"] = task
    finally:
        tasks.project.cache_clear()
    S = str(sdk)
    # an action's arguments: (stage, params, ...) for stage tasks and in-process stages (htp_config too)
    params = lambda name: found[name]["actions"][0][1][1]
    tool = lambda name: f"{S}/bin/x86_64-linux-clang/{name}"

    convert = params("convert:mtcnn/pnet/w8a8")
    assert found["convert:mtcnn/pnet/w8a8"]["targets"] == [
        "out/mtcnn/w8a8/pnet.cpp", "out/mtcnn/w8a8/pnet.bin", "out/mtcnn/w8a8/pnet_net.json",
        "out/mtcnn/w8a8/pnet.convert.json"]
    assert set(found["convert:mtcnn/pnet/w8a8"]["file_dep"]) >= {
        "out/mtcnn/float/pnet.sim.onnx", "out/mtcnn/calibration/pnet/input_list.txt",
        "out/mtcnn/calibration/pnet/0063.image.raw"}
    qnn_list = "out/mtcnn/w8a8/.pnet.qnn_inputs/input_list.txt"  # the images, transposed to NHWC by the stage
    assert qairt.converter_command(qairt.Sdk(sdk), convert["onnx"], "out/mtcnn/w8a8/pnet.cpp", convert["inputs"],
                                   convert["variant"], qnn_list) == [
        tool("qnn-onnx-converter"), "--input_network", "out/mtcnn/float/pnet.sim.onnx",
        "--output_path", "out/mtcnn/w8a8/pnet.cpp", "--act_bitwidth", "8", "--bias_bitwidth", "32",
        "--weights_bitwidth", "8", "--use_per_channel_quantization", "--input_list", qnn_list,
        "--use_native_input_files", "--input_dtype", "image", "float32"]
    w8a16 = params("convert:mtcnn/onet/w8a16")
    assert qairt.converter_command(qairt.Sdk(sdk), w8a16["onnx"], "out/mtcnn/w8a16/onet.cpp", w8a16["inputs"],
                                   w8a16["variant"], qnn_list)[5:9] == [
        "--act_bitwidth", "16", "--bias_bitwidth", "32"]
    fp16 = params("convert:mtcnn/rnet/fp16")
    assert fp16["input_list"] is None and "out/mtcnn/calibration/rnet/input_list.txt" not in \
        found["convert:mtcnn/rnet/fp16"]["file_dep"]
    assert qairt.converter_command(qairt.Sdk(sdk), fp16["onnx"], "out/mtcnn/fp16/rnet.cpp", fp16["inputs"],
                                   fp16["variant"]) == [
        tool("qnn-onnx-converter"), "--input_network", "out/mtcnn/float/rnet.sim.onnx",
        "--output_path", "out/mtcnn/fp16/rnet.cpp", "--act_bitwidth", "16", "--bias_bitwidth", "32",
        "--float_bitwidth", "16", "--input_dtype", "image", "float32"]

    libs = params("model_libs:mtcnn/onet/w8a16")
    assert found["model_libs:mtcnn/onet/w8a16"]["targets"] == [
        "out/mtcnn/w8a16/model_libs/x86_64-linux-clang/libonet.so"]  # no ndk-build on PATH
    assert qairt.model_lib_command(qairt.Sdk(sdk), libs["cpp"], libs["bin"], "out/mtcnn/w8a16/model_libs",
                                   libs["lib_targets"]) == [
        tool("qnn-model-lib-generator"), "-c", "out/mtcnn/w8a16/onet.cpp", "-b", "out/mtcnn/w8a16/onet.bin",
        "-o", "out/mtcnn/w8a16/model_libs", "-t", "x86_64-linux-clang"]

    config = found["htp_config:mtcnn/onet/w8a16@SM8750"]
    assert config["targets"] == ["out/mtcnn/w8a16/SM8750/onet_config/htp_backend_extensions.json",
                                 "out/mtcnn/w8a16/SM8750/onet_config/htp_config.json"]
    extensions, htp = qairt.htp_config_files(qairt.Sdk(sdk), "onet", params("htp_config:mtcnn/onet/w8a16@SM8750")
                                             ["chip"], "/abs/htp_config.json")
    assert extensions == {"backend_extensions": {
        "shared_library_path": f"{S}/lib/x86_64-linux-clang/libQnnHtpNetRunExtensions.so",
        "config_file_path": "/abs/htp_config.json"}}
    assert htp == {"graphs": [{"vtcm_mb": 8, "O": 3, "graph_names": ["onet"]}],
                   "devices": [{"device_id": 0, "soc_id": 69, "dsp_arch": "v79",
                                "cores": [{"core_id": 0, "perf_profile": "burst", "rpc_control_latency": 200}]}]}

    compile_ = params("compile:mtcnn/onet/w8a16@SM8750")
    assert found["compile:mtcnn/onet/w8a16@SM8750"]["targets"] == ["out/mtcnn/w8a16/SM8750/onet.bin"]
    assert qairt.context_binary_command(qairt.Sdk(sdk), "out/mtcnn/w8a16/SM8750", "onet", compile_["config_file"],
                                        model_lib=compile_["model_lib"]) == [
        tool("qnn-context-binary-generator"), "--backend", f"{S}/lib/x86_64-linux-clang/libQnnHtp.so",
        "--model", "out/mtcnn/w8a16/model_libs/x86_64-linux-clang/libonet.so",
        "--output_dir", "out/mtcnn/w8a16/SM8750", "--binary_file", "onet",
        "--config_file", "out/mtcnn/w8a16/SM8750/onet_config/htp_backend_extensions.json"]

    package = found["package:mtcnn/w8a16@SM8750"]
    assert package["targets"] == ["out/mtcnn/w8a16/SM8750/manifest.json"] + [
        f"out/mtcnn/w8a16/SM8750/runtime/{name}" for name in
        ("libQnnHtp.so", "libQnnHtpV79Stub.so", "libQnnSystem.so", "libQnnHtpV79Skel.so")]
    assert params("package:mtcnn/w8a16@SM8750")["runtime_libs"]["libQnnHtpV79Skel.so"] == \
        f"{S}/lib/hexagon-v79/unsigned/libQnnHtpV79Skel.so"
    assert not any(name.startswith("quantize:") for name in found)


def test_converter_flags_for_layouts_weights_and_overrides(tmp_path):
    from build_rules.toolchains import qairt
    sdk = qairt.Sdk(tmp_path)
    variant = {"precision": "quantized", "activations": "uint16", "weights": "int4", "per_channel": False,
               "calibration_method": "entropy", "calibration_samples": 4, "overrides": {"t1": "uint16"}}
    inputs = {"x": {"shape": [1, 100, 80], "dtype": "float32", "layout": "NTF"},
              "prompt": {"shape": [1, 4], "dtype": "int32", "layout": None}}
    cmd = qairt.converter_command(sdk, "m.onnx", "o/m.cpp", inputs, variant, "list.txt", "o/m.overrides.json")
    assert cmd[1:] == ["--input_network", "m.onnx", "--output_path", "o/m.cpp", "--act_bitwidth", "16",
                       "--bias_bitwidth", "32", "--weights_bitwidth", "4", "--param_quantizer_schema", "symmetric",
                       "--act_quantizer_calibration", "entropy", "--quantization_overrides", "o/m.overrides.json",
                       "--input_list", "list.txt", "--use_native_input_files", "--input_dtype", "x", "float32",
                       "--input_layout", "x", "NTF", "--input_dtype", "prompt", "int32"]
    assert qairt.overrides_json({"t1": "uint16"}) == {
        "activation_encodings": {"t1": [{"bitwidth": 16, "dtype": "int"}]}, "param_encodings": {}}
    assert qairt.qnn_graph_name("model-5-seconds") == "model_5_seconds"




# ----------------------------------------------------------------------------------------------- a build

@pytest.mark.slow
def test_build_writes_outputs_and_logs_where_the_design_says(built_qairt):
    base, result = built_qairt
    repo, calls = base / "repo", base / "calls.jsonl"
    assert not result.ran_stage("quantize")
    assert sdk_tasks() <= result.ran
    out = repo / "out/tinynet"
    for variant in VARIANTS:
        for graph in GRAPHS:
            for name in (f"{graph}.cpp", f"{graph}.bin", f"{graph}_net.json", f"{graph}.convert.json",
                         f"{graph}.convert.log", f"{graph}.model_libs.log",
                         f"model_libs/x86_64-linux-clang/lib{graph}.so"):
                assert (out / variant / name).is_file(), name
            assert not (out / variant / "model_libs/aarch64-android").exists()
            for chip in CHIPS:
                folder = out / variant / chip
                for name in (f"{graph}.bin", f"{graph}.compile.log", f"{graph}.check.json", f"{graph}.check.log",
                             f"{graph}_config/htp_backend_extensions.json", f"{graph}_config/htp_config.json"):
                    assert (folder / name).is_file(), name
                assert not (folder / f"{graph}_ctx.onnx").exists()
        assert not (out / variant / "encoder.qdq.onnx").exists()

    # Each tool's output stays in its own log; the converter's is not overwritten by later stages.
    assert "qnn-onnx-converter --input_network out/tinynet/float/head.sim.onnx" in \
        (out / "w8a16/head.convert.log").read_text()
    assert "INFO - Quantizing with 8 calibration samples" in (out / "w8a16/head.convert.log").read_text()
    assert "qnn-model-lib-generator -c out/tinynet/w8a16/head.cpp" in (out / "w8a16/head.model_libs.log").read_text()
    assert "no ndk-build on PATH" in (out / "w8a16/head.model_libs.log").read_text()
    assert "Saved context binary" in (out / "w8a16/SM8750/head.compile.log").read_text()

    config = json.loads((out / "w8a16/SM8750/head_config/htp_backend_extensions.json").read_text())
    assert config["backend_extensions"]["config_file_path"] == \
        str((out / "w8a16/SM8750/head_config/htp_config.json").absolute())
    assert b"soc_type=SM8750;arch=79;vtcm_size=8388608;" in (out / "w8a16/SM8750/head.bin").read_bytes()

    # The recorded command lines: quantized iff --input_list, from the shared calibration files.
    w8a16 = [c for c in recorded(calls, "qnn-onnx-converter") if "out/tinynet/w8a16/head.cpp" in c]
    assert w8a16 == [["--input_network", "out/tinynet/float/head.sim.onnx", "--output_path",
                      "out/tinynet/w8a16/head.cpp", "--act_bitwidth", "16", "--bias_bitwidth", "32",
                      "--weights_bitwidth", "8", "--use_per_channel_quantization", "--input_list",
                      "out/tinynet/calibration/head/input_list.txt", "--use_native_input_files",
                      "--input_dtype", "features", "float32"]]
    encoder = [c for c in recorded(calls, "qnn-onnx-converter") if "out/tinynet/w8a16/encoder.cpp" in c][0]
    assert encoder[encoder.index("--input_list") + 1] == "out/tinynet/w8a16/.encoder.qnn_inputs/input_list.txt"
    fp16 = [c for c in recorded(calls, "qnn-onnx-converter") if "out/tinynet/fp16/head.cpp" in c][0]
    assert "--input_list" not in fp16 and fp16[-5:] == ["--float_bitwidth", "16", "--input_dtype", "features",
                                                        "float32"]
    libs = recorded(calls, "qnn-model-lib-generator")
    assert ["-c", "out/tinynet/w8a16/head.cpp", "-b", "out/tinynet/w8a16/head.bin", "-o",
            "out/tinynet/w8a16/model_libs", "-t", "x86_64-linux-clang"] in libs
    rows = [json.loads(line) for line in calls.read_text().splitlines()]
    assert {r["LDFLAGS"] for r in rows if r["tool"] == "qnn-model-lib-generator"} == {"-Wl,-z,max-page-size=16384"}

    manifest = json.loads((out / "w8a16/SM8750/manifest.json").read_text())
    assert (manifest["sdk_version"], manifest["sdk_build_id"], manifest["qairt_flow"]) == ("2.40.0", "251030", "model-lib")
    assert manifest["toolchain"]["name"] == "qairt" and manifest["toolchain"]["sdk_version"] == "2.40.0"
    assert manifest["toolchain"]["build_id"] is None and manifest["toolchain"]["htp_library_xxh3"]
    assert "no build id" in manifest["toolchain"]["build_id_note"]
    assert manifest["graphs"]["head"]["check"] == "not run"
    assert "no qnn-net-run" in manifest["graphs"]["head"]["check_note"]
    assert "ADSP_LIBRARY_PATH" in manifest["runtime"]
    assert manifest["runtime_libraries"] == {n: f"runtime/{n}" for n in (
        "libQnnHtp.so", "libQnnHtpV79Stub.so", "libQnnSystem.so", "libQnnHtpV79Skel.so")}
    for name in manifest["runtime_libraries"]:
        assert VERSION in (out / "w8a16/SM8750/runtime" / name).read_text()
    assert "hexagon-v79" in (out / "w8a16/SM8750/runtime/libQnnHtpV79Skel.so").read_text()
    check = json.loads((out / "w8a16/SM8750/head.check.json").read_text())
    assert check["status"] == "not run" and check["summary"] == {}
    assert "check not run" in result.output
    assert "no ndk-build on PATH" in result.output
    # Only QNN_SDK_ROOT pointed at the SDK (use_sdk): every tool got the rest of its environment from the build.
    assert {json.loads(line)["QNN_SDK_ROOT"] for line in calls.read_text().splitlines()} == {str(base / "qairt" / VERSION)}


def test_the_runtime_package_is_the_chips_arch_only_and_no_on_device_prepare(built_qairt):
    base, _ = built_qairt
    sdk = base / "qairt" / VERSION
    assert (sdk / "lib/aarch64-android/libQnnHtpPrepare.so").is_file()  # the SDK has it; a context binary needs none
    for chip, arch in (("SM8750", "V79"), ("SM8550", "V73")):
        shipped = sorted(p.name for p in (base / f"repo/out/tinynet/w8a16/{chip}/runtime").iterdir())
        assert shipped == sorted(["libQnnHtp.so", "libQnnSystem.so", f"libQnnHtp{arch}Stub.so", f"libQnnHtp{arch}Skel.so"])


def test_manifest_records_each_binarys_io_contract_from_net_json(built_qairt):
    """graphs.<g>.io: what a runtime must feed and read back (the dist stage reads exactly these fields)."""
    import numpy as np

    base, _ = built_qairt
    out = base / "repo/out/tinynet"
    io = json.loads((out / "w8a16/SM8750/manifest.json").read_text())["graphs"]["encoder"]["io"]
    (image,), (features,) = io["inputs"], io["outputs"]
    assert {k: image[k] for k in ("name", "shape", "dtype", "layout")} == {
        "name": "image", "shape": [1, 16, 16, 3], "dtype": "UFIXED_POINT_16", "layout": "NHWC"}
    assert features["name"] == "features" and features["shape"] == [1, 64] and features["dtype"] == "UFIXED_POINT_16"
    # QNN's convention, real = scale * (q + offset): q = 0 and q = 65535 are the calibration data's range (with 0).
    data = np.concatenate([np.fromfile(p, dtype=np.float32) for p in (out / "calibration/encoder").glob("*.image.raw")])
    low, high = min(0.0, float(data.min())), max(0.0, float(data.max()))
    assert image["offset"] < 0 and abs(image["scale"] * image["offset"] - low) <= image["scale"]
    assert abs(image["scale"] * (65535 + image["offset"]) - high) <= image["scale"]
    fp16 = json.loads((out / "fp16/SM8750/manifest.json").read_text())["graphs"]["head"]["io"]
    assert fp16 == {"inputs": [{"name": "features", "shape": [1, 64], "dtype": "FLOAT_16", "scale": None, "offset": None,
                                "layout": "NF"}],
                    "outputs": [{"name": "logits", "shape": [1, 10], "dtype": "FLOAT_16", "scale": None, "offset": None,
                                 "layout": "NF"}]}


def first_lines(output: str) -> list[str]:
    """A build's first two lines (the up-to-date tasks doit -v 1 lists before them left out), the estimate cut off."""
    lines = [line for line in output.splitlines() if not line.startswith("-- ")]
    return [lines[0], re.sub(r"^\d+ task\(s\) to run.*", "N task(s) to run", lines[1])]


def test_an_sdk_on_the_machine_does_not_choose_the_toolchain(tinynet_repo, tmp_path, monkeypatch):
    """QAIRT's envsetup.sh sets QNN_SDK_ROOT (issue 37): the build stays ort-qnn and says why in its first line;
    toolchain = "qairt" in chips.toml builds with the SDK."""
    sdk = make_sdk(tmp_path / "qairt" / VERSION)
    monkeypatch.setenv("QNN_SDK_ROOT", str(sdk))
    monkeypatch.setenv("PATH", f"{make_host_tools(tmp_path / 'host-bin')}{os.pathsep}{os.environ['PATH']}")
    for name in ("BUILD_RULES_TOOLCHAIN", "BUILD_RULES_QAIRT_FLOW"):
        monkeypatch.delenv(name, raising=False)
    listing = run_doit(tinynet_repo, "list")
    assert listing.code == 0, listing.output
    assert "with ort-qnn" in listing.output and re.search(r"^quantize ", listing.output, re.M)
    assert not re.search(r"^(convert|model_libs|htp_config) ", listing.output, re.M)
    build = run_doit(tinynet_repo, "-a", "size:tinynet/encoder/w8a16")
    assert build.code == 0, build.output
    assert first_lines(build.output) == [
        "toolchain: ort-qnn (default; QNN_SDK_ROOT is set and used only for the phone's runtime -- toolchain = "
        "\"qairt\" in chips.toml or BUILD_RULES_TOOLCHAIN=qairt builds with it)", "N task(s) to run"]
    assert build.output.count("toolchain: ") == 1  # once a build, not per task
    assert not (tmp_path / "calls.jsonl").exists()

    chips = tinynet_repo / "chips.toml"
    chips.write_text(chips.read_text().replace('toolchain = "auto"', 'toolchain = "qairt"'))
    monkeypatch.setenv("FAKE_QAIRT_LOG", str(tmp_path / "calls.jsonl"))
    listing = run_doit(tinynet_repo, "list")
    assert listing.code == 0, listing.output
    assert "with qairt" in listing.output
    assert re.search(rf"^convert .*\[qairt {VERSION}, model-lib flow\]$", listing.output, re.M)
    build = run_doit(tinynet_repo, "convert:tinynet/encoder/w8a16")
    assert build.code == 0, build.output
    assert first_lines(build.output)[0] == 'toolchain: qairt, model-lib flow (chips.toml: toolchain = "qairt")'
    assert [r[0] for r in recorded(tmp_path / "calls.jsonl")] and "convert:tinynet/encoder/w8a16" in build.ran


def test_doit_list_names_the_toolchain(built_qairt, monkeypatch):
    base, _ = built_qairt
    use_sdk(monkeypatch, base / "qairt" / VERSION, base / "calls.jsonl")
    listing = run_doit(base / "repo", "list")
    assert listing.code == 0, listing.output
    for stage in ("convert", "model_libs", "htp_config", "compile", "check", "package"):
        assert re.search(rf"^{stage} .*\[qairt {VERSION}, model-lib flow\]$", listing.output, re.M), listing.output
    assert not re.search(r"^quantize ", listing.output, re.M)  # no quantize task (other docs may say "quantized")
    assert "with qairt" in listing.output

    monkeypatch.setenv("BUILD_RULES_TOOLCHAIN", "ort-qnn")
    pytest.importorskip("onnxruntime_qnn")
    listing = run_doit(base / "repo", "list")
    assert listing.code == 0, listing.output
    assert "with ort-qnn" in listing.output and "quantize" in listing.output
    assert not re.search(r"^(convert|model_libs|htp_config) ", listing.output, re.M)


def test_another_sdk_version_reruns_exactly_the_sdk_tasks(qairt_copy):
    repo, sdk, calls = qairt_copy
    (sdk / "sdk.yaml").write_text("name: qairt\nversion: 2.41.0\nbuild_id: 251215\n")
    result = run_doit(repo)
    assert result.code == 0, result.output
    assert result.ran == sdk_tasks()
    manifest = json.loads((repo / "out/tinynet/fp16/SM8550/manifest.json").read_text())
    assert (manifest["sdk_version"], manifest["sdk_build_id"]) == ("2.41.0", "251215")
    assert run_doit(repo).ran == set()


def test_without_sdk_yaml_the_version_comes_from_the_folder_name(qairt_copy):
    repo, sdk, calls = qairt_copy
    (sdk / "sdk.yaml").unlink()  # the version now comes from the folder name, which is the same version
    result = run_doit(repo)
    assert result.code == 0, result.output
    assert result.ran == sdk_tasks()  # sdk_version_from changed, so the identity did (an honest re-run)
    assert json.loads((repo / "out/tinynet/fp16/SM8550/manifest.json").read_text())["toolchain"][
        "sdk_version_from"] == "folder name"


def test_with_ndk_build_on_path_both_targets_are_built(qairt_copy, monkeypatch, tmp_path):
    repo, sdk, calls = qairt_copy
    ndk = tmp_path / "ndk"
    ndk.mkdir()
    (ndk / "ndk-build").write_text("#!/bin/sh\nexit 0\n")
    (ndk / "ndk-build").chmod(0o755)
    monkeypatch.setenv("PATH", f"{ndk}{os.pathsep}{os.environ['PATH']}")
    result = run_doit(repo)
    assert result.code == 0, result.output
    assert result.ran == sdk_tasks(["model_libs", "package"])  # same x86 libs: no binary is recompiled
    assert ["-c", "out/tinynet/w8a16/head.cpp", "-b", "out/tinynet/w8a16/head.bin", "-o",
            "out/tinynet/w8a16/model_libs"] in recorded(calls, "qnn-model-lib-generator")
    for variant in VARIANTS:
        for graph in GRAPHS:
            assert (repo / f"out/tinynet/{variant}/model_libs/aarch64-android/lib{graph}.so").is_file()
    manifest = json.loads((repo / "out/tinynet/w8a16/SM8750/manifest.json").read_text())
    assert manifest["graphs"]["head"]["model_libs"] == {
        "x86_64-linux-clang": "../model_libs/x86_64-linux-clang/libhead.so",
        "aarch64-android": "../model_libs/aarch64-android/libhead.so"}
    assert "no ndk-build" not in result.output


def test_a_converter_log_with_an_unsupported_op_fails_naming_it(qairt_copy, monkeypatch):
    repo, sdk, calls = qairt_copy
    monkeypatch.setenv("FAKE_QAIRT_UNSUPPORTED_OP", "Gemm")  # tinynet's head is one Linear layer
    (repo / "out/tinynet/w8a16/head.cpp").unlink()
    result = run_doit(repo)
    assert result.code != 0
    assert "convert:tinynet/head/w8a16: qnn-onnx-converter on out/tinynet/float/head.sim.onnx: QNN rejected node " \
           "'/fc/Gemm' (Gemm): No translation registered for op type onnx_gemm. Fix: qnn-onnx-converter has no " \
           "translation for Gemm: change the export so that the model has no Gemm node" in result.output
    assert not (repo / "out/tinynet/w8a16/head.cpp").exists()
    assert "ERROR - Node /fc/Gemm: 'No translation registered for op type onnx_gemm.'" in \
        (repo / "out/tinynet/w8a16/head.convert.log").read_text()


def test_node_and_per_graph_overrides_reach_the_converter_by_tensor(qairt_copy):
    repo, sdk, calls = qairt_copy
    toml = repo / "models/tinynet/model.toml"
    toml.write_text(toml.read_text() + '\n[variants.w8a16.graphs.head]\nnode_overrides = { "/fc/Gemm" = "uint8" }\n')
    result = run_doit(repo, "convert")
    assert result.ran == {"convert:tinynet/head/w8a16"}, result.output  # the encoder's settings did not change
    overrides = json.loads((repo / "out/tinynet/w8a16/head.quantization_overrides.json").read_text())
    assert overrides["activation_encodings"] == {"logits": [{"bitwidth": 8, "dtype": "int"}]}  # /fc/Gemm's output
    toml.write_text(toml.read_text().replace('"/fc/Gemm"', '"/fc/Gemmm"'))
    result = run_doit(repo, "convert")
    assert result.code != 0
    assert ("convert:tinynet/head/w8a16: quantization override names unknown node '/fc/Gemmm': "
            "out/tinynet/float/head.sim.onnx has no such node; did you mean '/fc/Gemm'?") in result.output


def test_quantization_warnings_are_listed_in_the_manifest(qairt_copy, monkeypatch):
    repo, sdk, calls = qairt_copy
    monkeypatch.setenv("FAKE_QAIRT_WARNING", "1")
    (repo / "out/tinynet/w8a16/head.cpp").unlink()
    result = run_doit(repo)
    assert result.code == 0, result.output
    manifest = json.loads((repo / "out/tinynet/w8a16/SM8550/manifest.json").read_text())
    assert manifest["graphs"]["head"]["quantization_warnings"] == [
        "WARNING - Quantization encodings of tensor 'stand_in_tensor' were clipped to the calibrated range"]


def test_a_converter_that_keeps_the_layout_fails_naming_the_input(qairt_copy, monkeypatch):
    """The calibration samples were transposed to NHWC for the converter; if its _net.json says the input stayed
    NCHW, the quantization was calibrated on scrambled data: fail, naming the input and the fix."""
    repo, sdk, calls = qairt_copy
    monkeypatch.setenv("FAKE_QAIRT_KEEP_LAYOUT", "1")
    (repo / "out/tinynet/w8a16/encoder.cpp").unlink()
    result = run_doit(repo)
    assert result.code != 0
    assert "convert:tinynet/encoder/w8a16: qnn-onnx-converter on out/tinynet/float/encoder.sim.onnx: input 'image' " \
           "is [1, 3, 16, 16] (NCHW) in the converted graph, but its data is written as [1, 16, 16, 3] (transposed " \
           "by [0, 2, 3, 1] from the ONNX shape [1, 3, 16, 16]). Fix: declare the input's layout in model.toml" \
           in result.output
    assert not (repo / "out/tinynet/w8a16/encoder.cpp").exists() and not (repo / "out/tinynet/w8a16/encoder.bin").exists()


def test_a_node_htp_rejects_fails_compile_naming_node_op_and_fix(qairt_copy, monkeypatch):
    repo, sdk, calls = qairt_copy
    monkeypatch.setenv("FAKE_QAIRT_REJECT_OP", "Gemm")
    (repo / "out/tinynet/w8a16/SM8550/head.bin").unlink()
    result = run_doit(repo)
    assert result.code != 0
    assert "compile:tinynet/head/w8a16@SM8550: qnn-context-binary-generator: QNN rejected node '/fc/Gemm' (Gemm): " \
           "None of the combinations match the provided case (error 0xc26). Fix: HTP has no kernel for this op with " \
           "these input/output data types" in result.output
    # the log has QNN's name of the node (the converter's, '/' made '_'); the message above, the ONNX model's
    assert "Failed to validate op _fc_Gemm with error 0xc26" in (repo / "out/tinynet/w8a16/SM8550/head.compile.log").read_text()
    assert not (repo / "out/tinynet/w8a16/SM8550/head.bin").exists()


@pytest.mark.parametrize("damage, message", [
    (lambda sdk: (sdk / "lib/x86_64-linux-clang/libQnnHtp.so").unlink(),
     "is incomplete: expected lib/x86_64-linux-clang/libQnnHtp.so there"),
    (lambda sdk: (sdk / "bin/x86_64-linux-clang/qnn-onnx-converter").unlink(),
     "expected bin/x86_64-linux-clang/qnn-onnx-converter there"),
    (lambda sdk: (sdk / "sdk.yaml").write_text("name: qairt\nbuild_id: 251030\n"),
     "sdk.yaml is malformed: expected a line like 'version: 2.40.0' (and 'build_id: 251030'"),
    (lambda sdk: shutil.rmtree(sdk), "no such folder"),
])
def test_a_missing_or_broken_sdk_gives_one_clear_message(qairt_copy, damage, message):
    repo, sdk, calls = qairt_copy
    damage(sdk)
    result = run_doit(repo)
    assert result.code == 3
    assert message in result.output
    assert "Traceback" not in result.output


def test_an_sdk_without_the_chips_runtime_libraries_fails_the_package_naming_them(qairt_copy):
    repo, sdk, calls = qairt_copy
    (sdk / "lib/hexagon-v79/unsigned/libQnnHtpV79Skel.so").unlink()
    (repo / "out/tinynet/fp16/SM8750/runtime/libQnnHtpV79Skel.so").unlink()
    result = run_doit(repo)
    assert result.code != 0
    assert f"has no {sdk}/lib/hexagon-v79/unsigned/libQnnHtpV79Skel.so" in result.output
    assert "Traceback" not in result.output


def test_asking_for_qairt_without_an_sdk(qairt_copy, monkeypatch):
    repo, sdk, calls = qairt_copy
    monkeypatch.delenv("QNN_SDK_ROOT")
    monkeypatch.setenv("BUILD_RULES_TOOLCHAIN", "qairt")
    result = run_doit(repo, "list")
    assert result.code == 3
    assert "the qairt toolchain needs a QAIRT SDK: set QNN_SDK_ROOT" in result.output


def test_check_runs_qnn_net_run_where_the_sdk_has_it(qairt_copy, monkeypatch):
    """The stand-in qnn-net-run runs the float model, so this shows the plumbing (QNN layouts in and out,
    output files, metrics and gate), not HTP accuracy."""
    repo, sdk, calls = qairt_copy
    make_sdk(sdk, net_run=True)  # same version, same libraries, plus bin/x86_64-linux-clang/qnn-net-run
    result = run_doit(repo)
    assert result.code == 0, result.output
    assert result.ran == sdk_tasks(["check", "package"])
    net_run = recorded(calls, "qnn-net-run")
    # each reference (SM8750) check runs its binary once over all samples; each SM8550 check proves its outputs equal
    # on 3 samples: its binary and, once for the graph and variant, the reference's (kept in <graph>.proof.npz)
    ran = [next(a for a in c if a.endswith(".bin")) for c in net_run]
    pairs = [(v, g) for v in ("fp16", "w8a16") for g in ("encoder", "head")]
    assert sorted(ran) == sorted([f"out/tinynet/{v}/SM8750/{g}.bin" for v, g in pairs] * 2
                                 + [f"out/tinynet/{v}/SM8550/{g}.bin" for v, g in pairs]), ran
    log = (repo / "out/tinynet/w8a16/SM8550/head.check.log").read_text()
    assert "qnn-net-run: out/tinynet/w8a16/SM8550/head.bin on 3 sample(s)" in log, log
    assert "qnn-net-run: out/tinynet/w8a16/SM8750/head.bin on 3 sample(s)" in log, log
    for variant in ("fp16", "w8a16"):
        for graph in ("encoder", "head"):
            other = json.loads((repo / f"out/tinynet/{variant}/SM8550/{graph}.check.json").read_text())
            reference = json.loads((repo / f"out/tinynet/{variant}/SM8750/{graph}.check.json").read_text())
            assert other["equal_to"]["chip"] == "SM8750" and other["equal_to"]["samples"] == 3
            assert other["summary"] == reference["summary"] and "equal_to" not in reference
    assert "(equal to SM8750 on 3 samples)" in result.output
    one = [c for c in net_run if "out/tinynet/w8a16/SM8750/encoder.bin" in c][0]
    assert one[:4] == ["--backend", f"{sdk}/lib/x86_64-linux-clang/libQnnHtp.so", "--retrieve_context",
                       "out/tinynet/w8a16/SM8750/encoder.bin"]
    assert one[4] == "--input_list" and one[6] == "--output_dir"
    # Inputs go in by name (the graph's input name from _net.json), not by position.
    assert re.search(r"^input list, first line: image:=\S+/0000\.image\.raw$",
                     (repo / "out/tinynet/w8a16/SM8750/encoder.check.log").read_text(), re.M)
    check = json.loads((repo / "out/tinynet/w8a16/SM8750/encoder.check.json").read_text())
    assert check["status"] == "ran" and check["samples"] == 4
    assert check["summary"]["cosine"] > 0.9999
    manifest = json.loads((repo / "out/tinynet/w8a16/SM8750/manifest.json").read_text())
    assert manifest["graphs"]["encoder"]["check"] == "ran"
    assert manifest["graphs"]["encoder"]["metrics"]["cosine"] > 0.9999


def test_loading_the_build_file_stays_light_under_qairt(built_qairt):
    import subprocess
    import sys
    base, _ = built_qairt
    code = ("import runpy, sys, json; runpy.run_path('dodo.py'); "
            "from build_rules import tasks; tasks.project(); "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('numpy', 'onnx', 'onnxruntime', 'torch', 'onnxruntime_qnn'))))")
    env = dict(os.environ, QNN_SDK_ROOT=str(base / "qairt" / VERSION), PYTHONPATH=str(ROOT),
               PATH=f"{make_host_tools(base / 'host-bin')}{os.pathsep}{os.environ['PATH']}")
    env["BUILD_RULES_TOOLCHAIN"] = "qairt"
    proc = subprocess.run([sys.executable, "-c", code], cwd=base / "repo", env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
