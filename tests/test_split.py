"""Models too big for one context (docs/split.md): the size budget checked before compiling, graphs cut into parts
that are compiled apart and checked as a chain, and weight-shared contexts.

The split graph is MTCNN's O-Net (real weights from the facenet-pytorch wheel, real lfw_subset faces; 20 of its 200
evaluation crops to keep the emulator time small), built for one chip at w8a8 (fp16 parts: bench/split_bench.py).
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from conftest import ROOT, make_repo, run_doit

CHIP = "SM8750"
FLATTEN = "/net/Reshape_output_0"  # O-Net's flatten output (torchscript's name), where the conv trunk meets dense5

ONET_HOOKS = '''"""O-Net of models/mtcnn with 20 of its 200 lfw_subset evaluation crops (10 faces, 10 non-faces)."""
import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("mtcnn_export_for_split", Path(__file__).with_name("export.py"))
_export = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_export)
build, calibration_inputs = _export.build, _export.calibration_inputs
EVERY = 10


def evaluation_inputs(graph):
    return _export.evaluation_inputs(graph)[::EVERY]


def score(graph, inputs, outputs):
    labels = [1 if i < 100 else 0 for i in range(0, 200, EVERY)]
    correct = sum(int(float(o["face_prob"].reshape(-1, 2)[0, 1]) > 0.5) == label for label, o in zip(labels, outputs))
    return {"accuracy": correct / len(labels)}
'''

ONET_TOML = '''[model]
description = "MTCNN O-Net, split"
license = "MIT"
hooks = "hooks.py"
chips = ["SM8750"]
export = { exporter = "torchscript" }   # half the export time of dynamo's for O-Net; names as /net/<layer>/<Op>

[graphs.onet]
checkpoints = ["pkg:facenet_pytorch/data/onet.pt"]
inputs = { image = { shape = [1, 3, 48, 48], dtype = "float32" } }
outputs = ["box", "landmarks", "face_prob"]
calibration_samples = 8
gate = { metric = "accuracy", min = 0.95 }
SPLIT

[variants.w8a8]
activations = "uint8"
weights = "uint8"
per_channel = true
calibration = { method = "minmax", samples = 8 }
'''


def _write_onet(repo: Path, split: str) -> None:
    (repo / "models/onet/model.toml").write_text(ONET_TOML.replace("SPLIT", split))


@pytest.fixture(scope="module")
def onet_split(tmp_path_factory):
    folder = tmp_path_factory.mktemp("onet-split-model")
    shutil.copy(ROOT / "models/mtcnn/export.py", folder / "export.py")
    (folder / "hooks.py").write_text(ONET_HOOKS)
    (folder / "model.toml").write_text(ONET_TOML.replace("SPLIT", "split = { parts = 2 }"))
    repo = make_repo(tmp_path_factory.mktemp("onet-split"), {"onet": folder})
    result = run_doit(repo, "onet")
    assert result.code == 0, result.output
    return repo, result


def _copy(onet_split, tmp_path) -> Path:
    repo = tmp_path / "repo"
    shutil.copytree(onet_split[0], repo, symlinks=True)
    return repo


@pytest.mark.slow
def test_a_split_graph_is_compiled_per_part_and_checked_as_a_chain(onet_split):
    repo, result = onet_split
    assert result.ran_stage("split") == {"split:onet/onet", "split:onet/onet/w8a8"}
    assert result.ran_stage("compile") == {f"compile:onet/onet.part{k}/w8a8@{CHIP}" for k in (1, 2)}
    assert result.ran_stage("check") == {f"check:onet/onet/w8a8@{CHIP}"}
    assert not result.ran_stage("size")  # a split graph's parts are checked against the budget by the split stage
    plan = json.loads((repo / "out/onet/float/onet.split.json").read_text())
    assert [p["name"] for p in plan["parts"]] == ["onet.part1", "onet.part2"]
    # the one activation between the conv trunk and the dense layer: the O-Net's flatten output, 1 x 1152
    assert [[(t["name"], t["shape"]) for t in c["tensors"]] for c in plan["cuts"]] == [[(FLATTEN, [1, 1152])]]
    assert plan["pin"] == f'split = {{ cuts = [["{FLATTEN}"]] }}'
    for variant in ("w8a8",):
        folder = repo / f"out/onet/{variant}/{CHIP}"
        check = json.loads((folder / "onet.check.json").read_text())
        assert check["samples"] == 20 and check["summary"]["accuracy"] >= 0.95, check["summary"]
        assert len(check["inputs"]["binary"]) == 2  # both parts' binaries are in what the measurement was made from
        assert [(g["gate"], g["passed"]) for g in check["gated"]] == [("accuracy >= 0.95", True)]  # gated as a whole
        compiled = [json.loads((folder / f"onet.part{k}.compile.json").read_text())["float_ops"] for k in (1, 2)]
        assert check["float_ops"]["count"] == sum(c["count"] for c in compiled)  # what ran in float: both parts
        assert check["float_ops"]["weights"] == sum(c["weights"] for c in compiled)
        manifest = json.loads((folder / "manifest.json").read_text())
        parts = manifest["graphs"]["onet"]["parts"]
        assert [p["binary"] for p in parts] == ["onet.part1.bin", "onet.part2.bin"]
        assert manifest["graphs"]["onet"]["bytes"] == sum((folder / p["binary"]).stat().st_size for p in parts)
        assert not (folder / "onet.bin").exists()
    assert re.search(r"built now +out/onet/w8a8/SM8750: onet 0\.\d\d MB in 2 parts accuracy 1", result.output), \
        result.output


def test_chained_parts_compute_what_the_whole_graph_computes_on_the_cpu(onet_split):
    import numpy as np
    import onnxruntime as ort

    from build_rules.emulator import chain
    from build_rules.measuring.samples import load_evaluation
    repo, _ = onet_split
    inputs, reference = load_evaluation(str(repo / "out/onet/float/onet.evaluation.npz"))
    for whole, parts in ((repo / "out/onet/float/onet.sim.onnx", "out/onet/float/onet.part{}.sim.onnx"),
                         (repo / "out/onet/w8a8/onet.qdq.onnx", "out/onet/w8a8/onet.part{}.qdq.onnx")):
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # as the chain's (chain.py)
        session = ort.InferenceSession(str(whole), options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        run = chain.open_on_cpu([repo / parts.format(k) for k in (1, 2)], optimize=False)
        for sample in inputs[:8]:
            expected = dict(zip(names, session.run(names, sample)))
            got = run(sample)
            assert set(got) == set(names)
            for name in names:  # the cut's Q/DQ pair reproduces the value the whole QDQ graph passes on
                np.testing.assert_array_equal(got[name], expected[name], err_msg=f"{parts} {name}")


def test_the_chain_on_the_emulator_agrees_with_the_unsplit_binary(onet_split, tmp_path):
    import numpy as np

    from build_rules.emulator import emulator_runs
    from build_rules.measuring.samples import compare, load_evaluation
    from build_rules.toolchains import ort_qnn
    repo, _ = onet_split
    whole = ort_qnn.compile_context_binary(repo / "out/onet/w8a8/onet.qdq.onnx", tmp_path, "onet", soc_model=69,
                                           vtcm_mb=8, fp16=False)
    inputs, reference = load_evaluation(str(repo / "out/onet/float/onet.evaluation.npz"))
    inputs, reference = inputs[::5], reference[::5]  # 4 of the 20
    unsplit = emulator_runs.run_outputs(whole["ctx_model"], inputs)
    chained = emulator_runs.run_outputs([repo / f"out/onet/w8a8/{CHIP}/onet.part{k}_ctx.onnx" for k in (1, 2)], inputs)
    against_float = (compare(reference, unsplit), compare(reference, chained))
    for name in ("box", "landmarks", "face_prob"):
        assert abs(against_float[0][name]["cosine"] - against_float[1][name]["cosine"]) < 2e-3, against_float
        worst = max(float(np.abs(a[name] - b[name]).max()) for a, b in zip(unsplit, chained))
        assert worst < 0.05, (name, worst)
    sizes = sum((repo / f"out/onet/w8a8/{CHIP}/onet.part{k}.bin").stat().st_size for k in (1, 2))
    assert 0.9 < sizes / whole["binary"].stat().st_size < 1.6  # two contexts' fixed overhead on a 0.2 MB graph


def test_the_plan_changes_only_with_the_graph_or_the_budget_and_pinning_keeps_it(onet_split, tmp_path):
    repo = _copy(onet_split, tmp_path)
    plan = (repo / "out/onet/float/onet.split.json").read_bytes()
    parts = [(repo / f"out/onet/w8a8/onet.part{k}.qdq.onnx").read_bytes() for k in (1, 2)]
    again = run_doit(repo, "onet")
    assert again.code == 0 and not again.ran, again.output
    # another budget re-checks the parts (the split task) but makes the same plan: nothing downstream re-runs
    chips = (repo / "chips.toml").read_text()
    (repo / "chips.toml").write_text(chips.replace('[chips.SM8750]\n', '[chips.SM8750]\nmax_context_mb = 512\n'))
    budget = run_doit(repo, "onet")
    assert budget.code == 0, budget.output
    assert budget.ran == {"split:onet/onet"}, budget.ran
    assert (repo / "out/onet/float/onet.split.json").read_bytes() == plan
    # the pinned plan is the same plan: the same part models, so no compile (the plan file says how it was made,
    # so the variant's parts are cut again, to the same bytes)
    _write_onet(repo, "split = " + json.loads(plan)["pin"].split(" = ", 1)[1])
    pinned = run_doit(repo, "onet")
    assert pinned.code == 0, pinned.output
    assert pinned.ran == {"split:onet/onet", "split:onet/onet/w8a8"}, pinned.ran
    assert json.loads((repo / "out/onet/float/onet.split.json").read_text())["how"] == "pinned"
    assert [(repo / f"out/onet/w8a8/onet.part{k}.qdq.onnx").read_bytes() for k in (1, 2)] == parts
    # three parts: a new plan and parts, compiled and checked; export, verify, calibration and quantize stay
    _write_onet(repo, "split = { parts = 3 }")
    three = run_doit(repo, "onet")
    assert three.code == 0, three.output
    stages = {name.split(":")[0] for name in three.ran}
    assert stages == {"split", "compile", "check", "package"}, three.ran
    # the first part is the same model as before (the new cut is in the old second part): not compiled again
    assert {t for t in three.ran if t.startswith("compile:")} == {f"compile:onet/onet.part{k}/w8a8@{CHIP}"
                                                                   for k in (2, 3)}
    described = json.loads((repo / "out/onet/float/onet.split.json").read_text())
    assert [[t["name"] for t in c["tensors"]] for c in described["cuts"]] == [[FLATTEN], ["/net/dense5/Gemm_output_0"]]
    check = json.loads((repo / f"out/onet/w8a8/{CHIP}/onet.check.json").read_text())
    assert check["summary"]["accuracy"] >= 0.95 and len(check["inputs"]["binary"]) == 3


def test_a_pinned_cut_no_tensor_set_matches_fails_naming_it(onet_split, tmp_path):
    repo = _copy(onet_split, tmp_path)
    _write_onet(repo, 'split = { cuts = [["/net/prelu4/PRelu_output_0", "no_such_tensor"]] }')
    result = run_doit(repo, "split:onet/onet")
    assert result.code != 0
    assert "split:onet/onet: cut 1 names 'no_such_tensor', which no node of the graph makes" in result.output


def test_max_part_mb_picks_the_fewest_parts_and_names_a_part_it_cannot_shrink(onet_split, tmp_path):
    repo = _copy(onet_split, tmp_path)
    _write_onet(repo, "split = { max_part_mb = 0.7 }")  # w8a8: 0.2 + 0.5 MB estimated
    result = run_doit(repo, "split:onet/onet")
    assert result.code == 0, result.output
    assert len(json.loads((repo / "out/onet/float/onet.split.json").read_text())["parts"]) == 2
    _write_onet(repo, "split = { max_part_mb = 0.3 }")  # the dense layer's part alone is 0.4 MB at w8a8
    result = run_doit(repo, "split:onet/onet")
    assert result.code != 0
    assert "split:onet/onet: no plan keeps every part within max_part_mb = 0.3" in result.output


def test_a_part_over_the_budget_fails_before_compile(onet_split, tmp_path):
    repo = _copy(onet_split, tmp_path)
    _write_onet(repo, "split = { parts = 2 }\nmax_context_mb = 0.4")
    result = run_doit(repo, "onet")
    assert result.code != 0
    assert ("split:onet/onet: onet.part2 (part 2 of 2) at variant w8a8 on SM8750: estimated context binary "
            "0.41 MB, over the budget of 0.4 MB ([graphs.onet] max_context_mb). Fix: more parts ([graphs.onet] "
            "split = { parts = 3 }, or split = { max_part_mb = 0.4 }), or lower-bit weights for w8a8") in result.output
    assert not result.ran_stage("compile")


def test_a_graph_over_its_budget_fails_before_quantize_and_compile(tinynet_repo):
    toml = tinynet_repo / "models/tinynet/model.toml"
    toml.write_text(toml.read_text().replace('outputs = ["logits"]', 'outputs = ["logits"]\nmax_context_mb = 0.01'))
    stale = ["quantize:tinynet/head/w8a16"] + [f"compile:tinynet/head/{v}@{c}" for v in ("fp16", "w8a16")
                                               for c in ("SM8550", "SM8750")]
    assert run_doit(tinynet_repo, "forget", *stale).code in (0, None)  # so that they would run now
    result = run_doit(tinynet_repo, "--continue")
    assert result.code != 0
    message = re.search(r"size:tinynet/head/fp16: graph 'head' at variant (\w+) on (\w+): .*", result.output).group(0)
    assert re.fullmatch(
        r"size:tinynet/head/fp16: graph 'head' at variant fp16 on SM8550: estimated context binary \d+\.\d KB "
        r"\(weights 1\.3 KB at this variant's bit widths, 1 node\(s\)\), over the budget of 0\.01 MB "
        r"\(\[graphs\.head\] max_context_mb\)\. Fix: lower-bit weights do not suffice alone \(weights = \"uint8\": "
        r"about \d+\.\d KB\); or split the graph: \[graphs\.head\] split = \{ parts = \d+ \} \(or split = "
        r"\{ max_part_mb = 0\.01 \}\)", message), message
    # quantize and compile wait for their variant's check and did not run
    assert result.ran == {"size:tinynet/head/fp16", "size:tinynet/head/w8a16"}, result.ran
    for task in stale:
        assert f"not run: {task} (it needs " in result.output, result.output
    # the chip's budget, when the graph sets none
    toml.write_text(toml.read_text().replace("max_context_mb = 0.01\n", ""))
    chips = tinynet_repo / "chips.toml"
    chips.write_text(chips.read_text().replace("[chips.SM8750]\n", "[chips.SM8750]\nmax_context_mb = 0.02\n"))
    result = run_doit(tinynet_repo, "--continue", "size")  # every check: which one doit starts first is its own
    assert result.code != 0
    assert re.search(r"size:tinynet/encoder/fp16: graph 'encoder' at variant fp16 on SM8750: .*over the budget of 0\.02 MB "
                     r"\(\[chips\.SM8750\] max_context_mb of chips\.toml\)", result.output), result.output


def test_the_bundle_lists_the_parts_in_order_with_each_cut_and_verify_runs_the_chain(onet_split, tmp_path):
    from build_rules import dist
    repo = _copy(onet_split, tmp_path)
    result = run_doit(repo, "dist:onet/w8a8")
    assert result.code == 0, result.output
    bundle = repo / "out/onet/dist/w8a8"
    index = json.loads((bundle / "index.json").read_text())
    entry = index["graphs"]["onet"]
    assert [p["name"] for p in entry["parts"]] == ["onet.part1", "onet.part2"]
    assert [p["binary"] for p in entry["parts"]] == ["onet.part1.bin", "onet.part2.bin"]
    assert all((bundle / CHIP / p["binary"]).is_file() for p in entry["parts"])
    (cut,) = entry["cuts"]
    assert (cut["tensor"], cut["from"], cut["to"], cut["dtype"]) == (FLATTEN, "onet.part1", "onet.part2",
                                                                     "UFIXED_POINT_8")
    given = next(t for t in entry["parts"][0]["io"]["outputs"] if t["name"] == FLATTEN)
    taken = next(t for t in entry["parts"][1]["io"]["inputs"] if t["name"] == FLATTEN)
    assert (given["scale"], given["offset"]) == (taken["scale"], taken["offset"]) == (cut["scale"], cut["offset"])
    assert [t["name"] for t in entry["io"]["inputs"]] == ["image"]
    assert sorted(t["name"] for t in entry["io"]["outputs"]) == ["box", "face_prob", "landmarks"]
    lines = []
    measured = dist.verify(bundle, samples=4, say=lines.append)
    assert measured["contract"][f"{CHIP}/onet"]["parts"] == 2
    assert measured["contract"][f"{CHIP}/onet"]["worst_steps"] <= 1.0
    assert any("2 parts chained through the bare binaries hold the I/O contract" in line for line in lines), lines


@pytest.mark.slow
def test_no_cut_at_a_tensor_the_quantizer_folds_away(tinynet_repo):
    """tinynet's encoder is Conv, Relu, Conv, Relu: onnxruntime's QDQ quantizer folds each Relu into its Conv (the
    Conv writes the Relu's output), so the Conv's own output is no tensor of the w8a16 QDQ model. The plan cuts where
    both models have the tensor, and the w8a16 parts build, chain and pass the gate on both chips."""
    toml = tinynet_repo / "models/tinynet/model.toml"
    toml.write_text(toml.read_text().replace('calibration_samples = 8\ngate = { metric = "cosine", min = 0.99 }',
                                             'calibration_samples = 8\nsplit = { parts = 2 }\n'
                                             'gate = { metric = "cosine", min = 0.99 }', 1))
    result = run_doit(tinynet_repo)
    assert result.code == 0, result.output
    plan = json.loads((tinynet_repo / "out/tinynet/float/encoder.split.json").read_text())
    assert [[t["name"] for t in c["tensors"]] for c in plan["cuts"]] == [["/Relu_output_0"]]
    assert {"split:tinynet/encoder/w8a16", "split:tinynet/encoder"} <= result.ran
    for chip in ("SM8550", "SM8750"):
        assert re.search(rf"out/tinynet/w8a16/{chip}: encoder \S+ MB in 2 parts cosine", result.output), result.output
