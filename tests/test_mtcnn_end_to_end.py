"""End to end on the real example model: MTCNN weights from the facenet-pytorch wheel, real images,
compiled for two chips with the embedded toolchain and checked on the HTP emulator."""
from __future__ import annotations

import json
import shutil

import pytest

from conftest import ROOT, make_repo, run_doit

CHIPS = {"SM8550": "73", "SM8750": "79"}
GRAPHS = ("pnet", "rnet", "onet")
VARIANTS = ("fp16", "w8a16", "w8a8")


@pytest.fixture(scope="module")
def mtcnn_build(tmp_path_factory):
    repo = make_repo(tmp_path_factory.mktemp("mtcnn"), {"mtcnn": ROOT / "models/mtcnn"})
    result = run_doit(repo, "-n", "2", "-P", "thread", *CHIPS)
    assert result.code == 0, result.output
    return repo, result


@pytest.mark.slow
def test_builds_every_graph_variant_and_chip_and_only_those_chips(mtcnn_build):
    repo, result = mtcnn_build
    expected = {f"compile:mtcnn/{g}/{v}@{c}" for g in GRAPHS for v in VARIANTS for c in CHIPS}
    assert result.ran_stage("compile") == expected
    assert sorted(p.name for p in (repo / "out/mtcnn/w8a16").iterdir() if p.is_dir()) == sorted(CHIPS)
    for variant in VARIANTS:
        for chip in CHIPS:
            folder = repo / f"out/mtcnn/{variant}/{chip}"
            manifest = json.loads((folder / "manifest.json").read_text())
            assert set(manifest["graphs"]) == set(GRAPHS)
            assert manifest["toolchain"]["name"] == "ort-qnn"
            assert manifest["toolchain"]["build_id"].startswith("v2.")
            assert manifest["model"]["license"] == "MIT"


def test_each_binary_embeds_its_chip(mtcnn_build):
    from build_rules.toolchains.ort_qnn import read_binary_target
    repo, _ = mtcnn_build
    for variant in VARIANTS:
        for chip, arch in CHIPS.items():
            for graph in GRAPHS:
                target = read_binary_target(repo / f"out/mtcnn/{variant}/{chip}/{graph}.bin")
                assert (target["soc_type"], str(target["arch"])) == (chip, arch), (variant, chip, graph, target)


def test_onet_accuracy_on_lfw_subset_on_the_emulator(mtcnn_build):
    repo, _ = mtcnn_build
    for variant in VARIANTS:
        for chip in CHIPS:
            check = json.loads((repo / f"out/mtcnn/{variant}/{chip}/onet.check.json").read_text())
            assert check["samples"] == 200  # skimage.data.lfw_subset(): 100 faces, 100 non-faces
            assert check["summary"]["accuracy"] >= 0.98, (variant, chip, check["summary"])
            for graph in ("pnet", "rnet"):
                summary = json.loads((repo / f"out/mtcnn/{variant}/{chip}/{graph}.check.json").read_text())["summary"]
                assert summary["cosine"] >= 0.99 if graph == "rnet" else summary["cosine"] >= 0.98
                assert summary["max_abs"] < 0.5


@pytest.mark.slow
def test_two_builds_from_clean_give_identical_binaries(mtcnn_build, tmp_path, monkeypatch):
    repo, _ = mtcnn_build
    second = make_repo(tmp_path / "again", {"mtcnn": ROOT / "models/mtcnn"})
    # From clean means without the run's shared build cache too: with it, every stage of this build was restored
    # from the fixture's entries (0.16 s, fresh57) and the bytes compared were the fixture's own
    monkeypatch.setenv("BUILD_RULES_CACHE", "off")
    # One chip: export, calibration and quantization are chip-independent, and a compile's determinism does not
    # depend on which chip it targets (the fixture built both from the same quantized graphs)
    compiles = [f"compile:mtcnn/{g}/{v}@SM8750" for g in GRAPHS for v in VARIANTS]
    result = run_doit(second, "-n", "2", "-P", "thread", *compiles)
    assert result.code == 0, result.output
    assert result.ran_stage("compile") == set(compiles) and "restored from the build cache" not in result.output
    for variant in VARIANTS:
        for chip in ["SM8750"]:
            for name in [f"{g}.bin" for g in GRAPHS] + [f"{g}_ctx.onnx" for g in GRAPHS]:
                a = (repo / f"out/mtcnn/{variant}/{chip}/{name}").read_bytes()
                b = (second / f"out/mtcnn/{variant}/{chip}/{name}").read_bytes()
                assert a == b, f"{variant}/{chip}/{name} differs between two clean builds"
    shutil.rmtree(second)


def test_diagnose_names_the_tensor_a_broken_override_starts_at(mtcnn_build, tmp_path):
    """O-Net's box regression kept at 8 bit in the 16-bit variant: diagnose names that tensor, its node and the
    override that did it, proposes the line that undoes it, and shows the exposed binary computes what the plain
    one does."""
    repo, _ = mtcnn_build
    copy = tmp_path / "repo"
    shutil.copytree(repo, copy, symlinks=True)
    toml = copy / "models/mtcnn/model.toml"
    toml.write_text(toml.read_text() + '\n[variants.w8a16.graphs.onet]\noverrides = { "box" = "uint8" }\n')
    result = run_doit(copy, "diagnose:mtcnn/onet/w8a16@SM8750")
    assert result.code == 0, result.output
    # Only what the diagnosis needs: this graph's quantize and this chip's compile, no check
    assert result.ran == {"quantize:mtcnn/onet/w8a16", "compile:mtcnn/onet/w8a16@SM8750",
                          "diagnose:mtcnn/onet/w8a16@SM8750"}, result.output
    folder = copy / "out/mtcnn/w8a16/SM8750"
    report = json.loads((folder / "onet.diagnose.json").read_text())
    drop = report["drops"]["cpu_vs_float"]
    assert (drop["tensor"], drop["node"], drop["op_type"]) == ("box", "node_linear_1", "Gemm")
    assert drop["sqnr"] < report["floor_db"] and drop["own_drop_db"] >= 6
    assert report["drops"]["binary_vs_cpu"]["tensor"] is None  # the binary does what the CPU QDQ model does
    assert report["exposure"]["identical"], report["exposure"]
    rows = {r["tensor"]: r for r in report["rows"]}
    assert rows["box"]["bits"] == 8 and rows["landmarks"]["bits"] == 16
    text = (folder / "onet.diagnose.md").read_text()
    assert "It is 8 bit in a 16-bit variant (the variant's overrides set it to uint8)" in text
    assert '[variants.w8a16.graphs.onet]\noverrides = { "box" = "uint16" }' in text
    assert "bit-identical to the plain binary's" in text
    assert (folder / "onet.diagnose.png").stat().st_size > 10_000
    assert run_doit(copy, "diagnose:mtcnn/onet/w8a16@SM8750").ran == set()  # up to date
