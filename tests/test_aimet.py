"""quantizer = "aimet" (issue 20): AIMET's HTP QuantSim config and techniques as variant settings, a stage of their
own (aimet:<model>/<graph>/<variant>), its QDQ model compiled and gated on the emulator like any variant, and its
encodings JSON in the qairt converters' --quantization_overrides.

Real graph: MTCNN's R-Net (SM8550 + SM8750), W4A16 with SeqMSE on 16 calibration samples and 5 candidates (the
test keeps it small; docs/benchmarks.md has the full-size numbers). Without aimet-onnx (the `aimet` extra) only the
tests of settings and of the missing package run.
"""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest

from conftest import ROOT, make_repo, run_doit
from fake_qairt.make_sdk import make_sdk
from test_qairt_toolchain import VERSION, recorded, use_sdk

AIMET = importlib.util.find_spec("aimet_onnx") is not None
needs_aimet = pytest.mark.skipif(not AIMET, reason="aimet-onnx is not installed (pip install -e '.[aimet]')")
VARIANT = "w4a16_seqmse"
TASK = f"aimet:mtcnn/rnet/{VARIANT}"
CHIPS = ("SM8550", "SM8750")

AIMET_VARIANT = f"""
[variants.{VARIANT}]
activations = "uint16"
weights = "int4"
quantizer = "aimet"
techniques = ["seq_mse"]
seq_mse = {{ candidates = 5 }}
calibration = {{ method = "minmax", samples = 16 }}
"""


def rnet_repo(dest: Path, variants: str = AIMET_VARIANT) -> Path:
    """MTCNN with R-Net only, on SM8550 (v73) and SM8750 (v79), 16 calibration samples, gate cosine >= 0.95, the
    given variants."""
    repo = make_repo(dest, {"mtcnn": ROOT / "models/mtcnn"})
    toml = repo / "models/mtcnn/model.toml"
    text = toml.read_text()
    text = text[:text.index("# Proposal net")] + text[text.index("# Refine net"):text.index("# Output net on 48x48")]
    text = text.replace('hooks = "export.py"', f'hooks = "export.py"\nchips = {json.dumps(list(CHIPS))}', 1)
    # W4A16 R-Net: onnxruntime's min-max gives box cosine 0.86 on the emulator, AIMET's SeqMSE 0.97 (64 samples)
    text = text.replace('gate = { metric = "cosine", min = 0.99 }', 'gate = { metric = "cosine", min = 0.95 }')
    toml.write_text(text.replace("calibration_samples = 64", "calibration_samples = 16") + variants)
    return repo


@pytest.fixture(scope="session")
def built_rnet_aimet(tmp_path_factory):
    repo = rnet_repo(tmp_path_factory.mktemp("aimet") / "repo")
    result = run_doit(repo, "-n", "2", "-P", "thread")
    assert result.code == 0, result.output
    return repo, result


@pytest.fixture
def rnet_copy(built_rnet_aimet, tmp_path):
    repo, _ = built_rnet_aimet
    shutil.copytree(repo, tmp_path / "repo", symlinks=True)
    return tmp_path / "repo"


def set_candidates(repo: Path, count: int) -> None:
    toml = repo / "models/mtcnn/model.toml"
    text, found = re.subn(r"seq_mse = \{ candidates = \d+ \}", f"seq_mse = {{ candidates = {count} }}", toml.read_text())
    assert found == 1
    toml.write_text(text)


# --- settings ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("extra, message", [
    ('quantizer = "qnn"', "[variants.bad] quantizer: expected one of 'ort', 'aimet', got 'qnn'"),
    ('quantizer = "aimet"\ntechniques = ["seqmse"]',
     "[variants.bad] techniques: unknown technique 'seqmse' (allowed: 'seq_mse', 'adaround', 'cle')"),
    ('techniques = ["seq_mse"]', "[variants.bad] techniques: AIMET's techniques need quantizer = \"aimet\""),
    ('quantizer = "aimet"\ntechniques = ["seq_mse", "cle"]', "[variants.bad] techniques: 'cle' must come first"),
    ('quantizer = "aimet"\ntechniques = ["seq_mse"]\nseq_mse = { candidate = 3 }',
     "[variants.bad.seq_mse] candidate: unknown key (allowed: candidates)"),
    ('quantizer = "aimet"\ntechniques = ["seq_mse"]\nadaround = { iterations = 10 }',
     "[variants.bad.adaround] iterations: parameters for 'adaround', which is not in techniques = ['seq_mse']"),
    ('quantizer = "aimet"\nweights = "uint8"',
     "[variants.bad] weights: with quantizer = \"aimet\" expected one of 'int8', 'int4'"),
])
def test_aimet_settings_errors_name_the_file_table_and_allowed_values(tmp_path, extra, message):
    weights = "" if "weights" in extra else 'weights = "int8"\n'
    repo = rnet_repo(tmp_path / "repo", f'\n[variants.bad]\nactivations = "uint16"\n{weights}{extra}\n')
    result = run_doit(repo, "list")
    assert result.code == 3
    assert f"models/mtcnn/model.toml: {message}" in result.output


@pytest.mark.slow
def test_a_missing_aimet_onnx_fails_the_variant_naming_the_extra_and_nothing_else(tmp_path, monkeypatch, request):
    from build_rules.tasks import aimet as aimet_tasks
    # The built repo when AIMET is here (the aimet task then made stale), else a new one.
    repo = request.getfixturevalue("rnet_copy") if AIMET else rnet_repo(tmp_path / "repo")
    set_candidates(repo, 3)
    toml = repo / "models/mtcnn/model.toml"
    toml.write_text(toml.read_text() + '\n[variants.w8a8]\nactivations = "uint8"\nweights = "uint8"\n'
                                       'calibration = { samples = 16 }\n')
    monkeypatch.setattr(aimet_tasks, "tool_version", lambda dist: None if dist == "aimet-onnx" else "1")
    listing = run_doit(repo, "list")
    assert listing.code == 0, listing.output
    assert "aimet-onnx not installed: pip install 'aimet-onnx==2.42.0' 'torch==2.13.0'" in listing.output
    report = repo / f"out/mtcnn/{VARIANT}/rnet.aimet.json"
    before = report.read_bytes() if report.exists() else None
    result = run_doit(repo, "--continue", TASK, "quantize:mtcnn/rnet/w8a8")
    assert result.code != 0
    assert (f"models/mtcnn/model.toml: [variants.{VARIANT}] quantizer = \"aimet\" needs the Python package "
            "aimet-onnx, which is not installed: pip install 'aimet-onnx==2.42.0' 'torch==2.13.0'") in result.output
    # the line adds AIMET to the tool as installed (not an editable reinstall), at the version of pyproject's extra
    import tomllib
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["aimet"]
    assert f"'{extra[0]}'" in aimet_tasks.INSTALL
    assert "quantize:mtcnn/rnet/w8a8" in result.ran and (repo / "out/mtcnn/w8a8/rnet.qdq.onnx").is_file()
    assert (report.read_bytes() if report.exists() else None) == before  # no stage process ran


# --- the stage, compiled and gated --------------------------------------------------------------------------------

@needs_aimet
def test_an_aimet_variant_builds_for_two_chips_and_passes_its_gate(built_rnet_aimet):
    repo, result = built_rnet_aimet
    assert TASK in result.ran
    assert not result.ran_stage("quantize") and not result.ran_stage("calibration_stats")  # AIMET calibrates itself
    out = repo / f"out/mtcnn/{VARIANT}"
    report = json.loads((out / "rnet.aimet.json").read_text())
    # The QuantSim config follows the oldest chip (SM8550, v73), with its supergroups removed.
    assert report["config"]["file"] == "htp_quantsim_config_v73.json" and report["config"]["supergroups_removed"] > 0
    assert report["techniques"]["seq_mse"]["candidates"] == 5 and report["samples"] == 16
    encodings = json.loads((out / "rnet.encodings.json").read_text())
    weights = {e["name"]: e for e in encodings["param_encodings"]}
    assert {e["bw"] for n, e in weights.items() if n.endswith("weight")} == {4}  # int4 weights
    assert {e["bw"] for e in encodings["activation_encodings"]} == {16}
    for chip in CHIPS:
        check = json.loads((out / chip / "rnet.check.json").read_text())
        assert check["summary"]["cosine"] >= 0.95  # the gate, on the emulator for that chip's binary
        compiled = json.loads((out / chip / "rnet.compile.json").read_text())
        assert compiled["target"]["soc_type"] == chip
        manifest = json.loads((out / chip / "manifest.json").read_text())
        assert manifest["variant"]["quantizer"] == "aimet" and manifest["variant"]["techniques"] == ["seq_mse"]
        assert manifest["aimet"]["rnet"]["config"]["file"] == "htp_quantsim_config_v73.json"
        assert manifest["aimet"]["rnet"]["aimet_onnx"] == "2.42.0"


@needs_aimet
def test_the_aimet_stage_is_cached_and_reruns_when_a_technique_parameter_changes(rnet_copy):
    assert run_doit(rnet_copy, TASK).ran == set()  # up to date
    set_candidates(rnet_copy, 4)
    result = run_doit(rnet_copy, f"compile:mtcnn/rnet/{VARIANT}@SM8750")
    assert result.code == 0, result.output
    assert result.ran == {TASK, f"compile:mtcnn/rnet/{VARIANT}@SM8750"}
    report = json.loads((rnet_copy / f"out/mtcnn/{VARIANT}/rnet.aimet.json").read_text())
    assert report["techniques"]["seq_mse"]["candidates"] == 4
    log = rnet_copy / f"out/mtcnn/{VARIANT}/rnet.aimet.log"
    before = log.read_text()
    set_candidates(rnet_copy, 5)  # flipped back: restored from the build cache, no AIMET run
    result = run_doit(rnet_copy, TASK)
    assert result.ran == {TASK} and "restored from the build cache" in result.output
    assert json.loads((rnet_copy / f"out/mtcnn/{VARIANT}/rnet.aimet.json").read_text())[
        "techniques"]["seq_mse"]["candidates"] == 5
    assert log.read_text() != before  # the cached run's log came back with its outputs


@needs_aimet
@pytest.mark.parametrize("flow", ["model-lib", "dlc"])
def test_aimet_encodings_reach_the_qairt_converter(rnet_copy, tmp_path, monkeypatch, flow):
    sdk = make_sdk(tmp_path / "qairt" / VERSION)
    calls = tmp_path / "calls.jsonl"
    use_sdk(monkeypatch, sdk, calls)
    monkeypatch.setenv("BUILD_RULES_QAIRT_FLOW", flow)
    result = run_doit(rnet_copy, f"compile:mtcnn/rnet/{VARIANT}@SM8750")
    assert result.code == 0, result.output
    assert TASK not in result.ran  # the aimet stage does not depend on the toolchain: its outputs serve both
    out = f"out/mtcnn/{VARIANT}"
    converter = recorded(calls, "qnn-onnx-converter" if flow == "model-lib" else "qairt-converter")
    assert len(converter) == 1
    argv = converter[0]
    assert argv[argv.index("--quantization_overrides") + 1] == f"{out}/rnet.encodings.json"
    assert argv[argv.index("--input_network") + 1] == f"{out}/rnet.aimet.onnx"  # the weights the encodings are for
    encodings = json.loads((rnet_copy / out / "rnet.encodings.json").read_text())
    image = next(e for e in encodings["activation_encodings"] if e["name"] == "image")
    if flow == "model-lib":  # the converter took AIMET's encoding of the input, not its own calibration
        net = json.loads((rnet_copy / out / "rnet_net.json").read_text())
        quant = net["graph"]["tensors"]["image"]["quant_params"]["scale_offset"]
    else:  # the quantizer kept the overrides the DLC carries
        info = json.loads((rnet_copy / out / "SM8750/rnet.info.json").read_text())
        tensor = info["info"]["graphs"][0]["info"]["graphInputs"][0]["info"]
        quant = tensor["quantizeParams"]["scaleOffset"]
    assert quant == {"scale": pytest.approx(image["scale"][0], rel=1e-9), "offset": int(image["offset"][0])}
    log = (rnet_copy / out / ("rnet.convert.log" if flow == "model-lib" else "rnet.quantize.log")).read_text()
    assert (f"{len(encodings['activation_encodings'])} activation(s), {len(encodings['param_encodings'])} param(s)"
            in log)  # every encoding was read and checked against the model


# --- tune: whole variants across quantizers and bit widths before 16-bit tensors ---------------------------------

@pytest.mark.slow
@needs_aimet
def test_tune_proposes_the_smallest_whole_variant_that_meets_the_gate_before_16_bit_tensors(rnet_copy):
    from build_rules import tuning
    toml = rnet_copy / "models/mtcnn/model.toml"
    toml.write_text(toml.read_text() + '\n[variants.w4a16]\nactivations = "uint16"\nweights = "int4"\n'
                    'calibration = { samples = 16 }\n\n[tuning]\nchip = "SM8750"\nsamples = 16\n')
    result = run_doit(rnet_copy, "tune:mtcnn/w4a16")
    assert result.code == 0, result.output
    tuned = json.loads((rnet_copy / "out/mtcnn/tuning/w4a16.tuned.json").read_text())
    # onnxruntime's W4A16 misses cosine >= 0.95 (0.86); the first rung, W4A16 with AIMET's SeqMSE, meets it.
    assert tuned["chosen"] == "w4a16_aimet_seq_mse"
    rung = tuned["ladder"]["rungs"][0]
    assert rung["name"] == "w4a16_aimet_seq_mse" and rung["graphs"]["rnet"]["full"]["cosine"] >= 0.95
    assert rung["bytes"] == rung["graphs"]["rnet"]["bytes"] > 0  # its binary size, beside its metrics
    text = (rnet_copy / "out/mtcnn/tuning/w4a16.tuned.toml").read_text()
    assert f"w4a16_aimet_seq_mse: {rung['bytes'] / 1e3:.1f} KB, chosen" in text
    assert 'quantizer = "aimet"\ntechniques = ["seq_mse"]' in text
    import os
    cwd = os.getcwd()
    os.chdir(rnet_copy)
    try:
        assert tuning.apply(Path("out/mtcnn/tuning/w4a16.tuned.toml")) == "w4a16_tuned"
    finally:
        os.chdir(cwd)
    listing = run_doit(rnet_copy, "list", "--all").output  # the proposal is an aimet variant of the same settings
    assert "aimet:mtcnn/rnet/w4a16_tuned" in listing and "quantize:mtcnn/rnet/w4a16_tuned" not in listing


@pytest.mark.slow
@needs_aimet
def test_an_aimet_step_graph_gives_each_state_output_the_encoding_of_the_input_it_feeds(tmp_path):
    """A recurrent cell with its state declared ([graphs.cell.state], no stacked output): AIMET calibrates h and c
    apart from the h_out and c_out they receive, and the stage loads the union of each pair's ranges into both, so
    the compiled binary's state input and output have one scale and offset (the app copies the buffer over), as
    onnxruntime's quantize does."""
    from build_rules import dist
    from test_user_models import recurrent_repo

    repo = recurrent_repo(tmp_path / "repo")
    folder = repo / "models/recurrent"
    (folder / "hooks.py").write_text((folder / "hooks.py").read_text().replace("STACK_STATES = True",
                                                                               "STACK_STATES = False"))
    toml = folder / "model.toml"
    text = toml.read_text().replace('outputs = ["logits", "state"]', 'outputs = ["logits", "h_out", "c_out"]')
    text = text.replace("\n[variants.fp16]", '\n[graphs.cell.state]\nh_out = "h"\nc_out = "c"\n\n[variants.fp16]')
    toml.write_text(text + '\n[variants.w8a16_aimet]\nactivations = "uint16"\nweights = "int8"\nquantizer = "aimet"\n'
                           'calibration = { samples = 12 }\n')
    result = run_doit(repo, "dist:recurrent/w8a16_aimet")
    assert result.code == 0, result.output
    report = json.loads((repo / "out/recurrent/w8a16_aimet/cell.aimet.json").read_text())
    pairs = {(t["output"], t["input"]): t for t in report["tied"]}
    assert set(pairs) == {("h_out", "h"), ("c_out", "c")}
    for tie in pairs.values():
        ranges = list(tie["calibrated"].values())
        assert len(ranges) == 2 and ranges[0] != ranges[1], tie  # calibrated apart: the tie has work to do
        assert [tie["min"], tie["max"]] == [min(r[0] for r in ranges), max(r[1] for r in ranges)]
    contract = dist.contract_from_ctx(repo / "out/recurrent/w8a16_aimet/SM8750/cell_ctx.onnx")
    io = {t["name"]: t for t in contract["inputs"] + contract["outputs"]}
    for output, target in (("h_out", "h"), ("c_out", "c")):
        assert io[output]["dtype"] == io[target]["dtype"] == "UFIXED_POINT_16"
        assert (io[output]["scale"], io[output]["offset"]) == (io[target]["scale"], io[target]["offset"])
    # the encodings the qairt converters get say the same
    encodings = {e["name"]: e for e in json.loads((repo / "out/recurrent/w8a16_aimet/cell.encodings.json").read_text())
                 ["activation_encodings"]}
    for tie in pairs.values():
        assert len({(tuple(encodings[t]["scale"]), tuple(encodings[t]["offset"])) for t in tie["calibrated"]}) == 1
    # the bundle tells the app to copy the buffers over, and dist verify stepped the cell that way
    index = json.loads((repo / "out/recurrent/dist/w8a16_aimet/index.json").read_text())
    assert [(s["output"], s["input"], s["same_encoding"]) for s in index["graphs"]["cell"]["step"]["state"]] == \
        [("h_out", "h", True), ("c_out", "c", True)]
    log = (repo / "out/recurrent/w8a16_aimet/dist.log").read_text()
    assert re.search(r"SM8750/cell: \d+ steps with the state fed back in the binary's own types agree with "
                     r"cell_ctx.onnx \(worst output: ", log), log


@needs_aimet
def test_aimet_onnx_imports_without_its_analyzer_or_bokehs_server_and_both_import_after():
    """aimet_onnx's __init__ imports its per-layer sensitivity analyzer (scikit-learn) and its common.utils bokeh's
    server, for tools the build never calls: 1.4 s of the 2.4 s import, in every aimet stage and tune
    (plumbing/lean_imports.py). The stage imports neither; a call of the analyzer loads the real one, and a later
    `import bokeh.application` (a user's hook) gets bokeh's own."""
    import subprocess
    import sys
    import textwrap
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from build_rules.plumbing import lean_imports
        aimet_onnx = lean_imports.aimet_onnx()
        from aimet_onnx.quantsim import QuantizationSimModel
        from aimet_onnx import apply_seq_mse, apply_adaround
        print(aimet_onnx.__version__ > "", "sklearn" in sys.modules, "bokeh.application" in sys.modules)
        try:
            aimet_onnx.analyze_per_layer_sensitivity()
        except TypeError as e:  # the real function's signature speaks
            print(type(sys.modules["aimet_onnx.quant_analyzer"].analyze_per_layer_sensitivity).__name__,
                  "sklearn" in sys.modules, "missing" in str(e))
        import bokeh.application
        print(bokeh.application.Application.__module__)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["True False False", "function True True",
                                        "bokeh.application.application"]
