"""`doit dist` and `python -m build_rules.dist` (issue: ship it): bundles, checksums, a reproducible archive,
select, verify on the HTP emulator, the multi-SoC binary, and the qairt side (stand-in SDK)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from conftest import ROOT, TEST_MODELS, run_doit, write_tinynet_checkpoints

from build_rules import dist
from build_rules.configuration.config import ConfigError, load_chips, load_model

CHIPS = {"SM8550": (43, "v73"), "SM8750": (69, "v79")}
GRAPHS = ("encoder", "head")


def bundle_of(repo: Path, variant: str) -> Path:
    return repo / "out" / "tinynet" / "dist" / variant


def expected_files(chips=CHIPS, graphs=GRAPHS, extra=()) -> list[str]:
    files = ["LICENSES/MODEL.txt", "LICENSES/QNN-RUNTIME.txt", "index.json", *extra]
    files += [f"{c}/{g}{suffix}" for c in chips for g in graphs for suffix in (".bin", "_ctx.onnx")]
    files += [f"cpu/{g}.onnx" for g in graphs]
    return sorted(files)


def resign(bundle: Path) -> None:
    """What someone who edits a bundle by hand would do to get past the checksums: write SHA256SUMS again."""
    dist.write_sums(bundle)


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "build_rules.dist", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def dist_built(built_tinynet, tmp_path_factory) -> Path:
    """A copy of the built tiny repo after one `doit dist` (tests that change it take their own copy)."""
    repo = tmp_path_factory.mktemp("dist") / "repo"
    shutil.copytree(built_tinynet, repo, symlinks=True)
    first = run_doit(repo)
    assert first.code == 0 and not first.ran, first.output  # dist is not a default task
    assert not (repo / "out" / "tinynet" / "dist").exists()
    result = run_doit(repo, "dist")
    assert result.code == 0, result.output
    # Only the bundle task: the binaries were up to date, the multi-SoC stage is off by default.
    assert result.ran == {"dist:tinynet/fp16", "dist:tinynet/w8a16"}, result.output
    for variant in ("fp16", "w8a16"):
        assert (f"bundle out/tinynet/dist/{variant} (2 chip(s): SM8550, SM8750) -> "
                f"out/tinynet/dist/tinynet-{variant}.tar.gz") in result.output
    return repo


# ---------------------------------------------------------------------------------------------- the bundle

@pytest.mark.slow
def test_bundle_holds_the_binaries_index_licences_and_cpu_fallback(dist_built):
    import onnx
    from onnx import numpy_helper

    for variant in ("fp16", "w8a16"):
        bundle = bundle_of(dist_built, variant)
        assert dist.bundle_files(bundle) == expected_files()
        index = json.loads((bundle / "index.json").read_text())
        assert index["model"] == {"name": "tinynet", "description": "tiny two-graph test net", "license": "Apache-2.0"}
        assert index["variant"]["name"] == variant
        assert index["toolchain"]["name"] == "ort-qnn" and index["toolchain"]["qnn_version"] == "2.51.0"
        assert index["toolchain"]["build_id"].startswith("v2.51.0.")
        assert index["toolchain"]["oldest_device_runtime"]["qairt"] == "2.51.0"
        assert "real = scale * (q + offset)" in index["conventions"]["offset"]
        for chip, (soc, arch) in CHIPS.items():
            entry = index["chips"][chip]
            assert (entry["soc_model"], entry["ro.soc.model"], entry["dsp_arch"], entry["vtcm_mb"]) == \
                (soc, chip, arch, 8)
            # Sizes are the files' own, and the binaries are the built ones, byte for byte.
            for rel, size in entry["files"].items():
                assert (bundle / rel).stat().st_size == size
            for graph in GRAPHS:
                built = dist_built / "out" / "tinynet" / variant / chip / f"{graph}.bin"
                assert (bundle / chip / f"{graph}.bin").read_bytes() == built.read_bytes()
            runtime = entry["runtime"]
            assert runtime["shipped"] is False and runtime["minimum_sdk"] == "2.51.0"
            upper = arch.upper()
            assert runtime["libraries"] == {"aarch64-android": ["libQnnHtp.so", "libQnnSystem.so",
                                                                f"libQnnHtp{upper}Stub.so"],
                                            f"hexagon-{arch}": [f"libQnnHtp{upper}Skel.so"]}
        assert index["cpu_fallback"]["shipped"] is True
        for graph in GRAPHS:
            float_model = dist_built / "out" / "tinynet" / "float" / f"{graph}.sim.onnx"
            assert (bundle / "cpu" / f"{graph}.onnx").read_bytes() == float_model.read_bytes()
        assert "License: Apache-2.0" in (bundle / "LICENSES" / "MODEL.txt").read_text()
        assert "holds no Qualcomm library" in (bundle / "LICENSES" / "QNN-RUNTIME.txt").read_text()

    # The contract as the binary sees it: fp16 binaries take float32; w8a16 ones uint16 with the scale and zero point
    # of the Q/DQ nodes that stay outside the context binary (read here independently, offset = -zero point).
    fp16 = json.loads((bundle_of(dist_built, "fp16") / "index.json").read_text())["graphs"]
    assert fp16["encoder"]["io"]["inputs"] == [{"name": "image", "qnn_name": "image", "shape": [1, 3, 16, 16],
                                                "dtype": "FLOAT_32", "scale": None, "offset": None, "layout": None}]
    w8a16 = json.loads((bundle_of(dist_built, "w8a16") / "index.json").read_text())["graphs"]
    ctx = onnx.load(str(bundle_of(dist_built, "w8a16") / "SM8750" / "head_ctx.onnx"))
    init = {t.name: numpy_helper.to_array(t) for t in ctx.graph.initializer}
    q = next(n for n in ctx.graph.node if n.op_type == "QuantizeLinear")
    dq = next(n for n in ctx.graph.node if n.op_type == "DequantizeLinear")
    (features,), (logits,) = w8a16["head"]["io"]["inputs"], w8a16["head"]["io"]["outputs"]
    assert features["dtype"] == logits["dtype"] == "UFIXED_POINT_16"
    assert features["scale"] == float(init[q.input[1]]) and features["offset"] == -int(init[q.input[2]])
    assert logits["scale"] == float(init[dq.input[1]]) and logits["offset"] == -int(init[dq.input[2]])
    assert features["shape"] == [1, 64] and logits["shape"] == [1, 10]
    assert (features["qnn_name"], logits["qnn_name"]) == ("features", "logits")  # what the binary calls them
    assert features["offset"] < 0  # a real zero point, so the sign convention is visible


def test_sha256sum_checks_every_file(dist_built):
    bundle = bundle_of(dist_built, "w8a16")
    proc = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=bundle, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checked = sorted(line.rsplit(": ", 1)[0] for line in proc.stdout.splitlines())
    assert checked == expected_files() and all(line.endswith(": OK") for line in proc.stdout.splitlines())


@pytest.mark.slow
def test_the_archive_has_the_bundle_and_is_byte_identical_when_rebuilt(dist_built, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(dist_built, repo, symlinks=True)
    tarball = repo / "out" / "tinynet" / "dist" / "tinynet-w8a16.tar.gz"
    before = tarball.read_bytes()
    raw = before[:10]
    assert raw[:4] == b"\x1f\x8b\x08\x00" and raw[4:8] == b"\0\0\0\0"  # no file name, mtime 0
    with tarfile.open(tarball) as tar:
        members = tar.getmembers()
    files = [m.name for m in members if m.isfile()]
    assert files == [f"tinynet-w8a16/{f}" for f in sorted(expected_files() + ["SHA256SUMS"])]
    assert [m.name for m in members] == sorted(m.name for m in members)
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, 0, "", "")}
    with tarfile.open(tarball) as tar:
        for member in members:
            if member.isfile():
                inner = member.name.split("/", 1)[1]
                assert tar.extractfile(member).read() == (bundle_of(repo, "w8a16") / inner).read_bytes()

    shutil.rmtree(repo / "out" / "tinynet" / "dist")
    again = run_doit(repo, "dist")
    assert again.code == 0 and again.ran == {"dist:tinynet/fp16", "dist:tinynet/w8a16"}, again.output
    assert tarball.read_bytes() == before
    assert run_doit(repo, "dist").ran == set()  # and then it is up to date


# ---------------------------------------------------------------------------------------------- select

@pytest.mark.parametrize("soc, chip", [("69", "SM8750"), ("SM8750", "SM8750"), ("43", "SM8550"), ("sm8550", "SM8550")])
def test_select_prints_the_chip_folder(dist_built, capsys, soc, chip):
    bundle = bundle_of(dist_built, "w8a16")
    assert dist.main(["select", str(bundle), "--soc-model", soc]) == 0
    assert capsys.readouterr().out == f"{bundle / chip}\n"


@pytest.mark.parametrize("soc", ["SM8350", "35", "87"])
def test_select_an_unknown_soc_says_fall_back_to_the_cpu_with_the_float_onnx(dist_built, capsys, soc):
    bundle = bundle_of(dist_built, "w8a16")
    assert dist.main(["select", str(bundle), "--soc-model", soc]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"no binary in this bundle for SoC {soc!r}" in captured.err
    assert "SM8550 (soc_model 43, v73), SM8750 (soc_model 69, v79)" in captured.err
    assert (f"Fall back to the CPU: run the float ONNX graph(s) {bundle / 'cpu' / 'encoder.onnx'}, "
            f"{bundle / 'cpu' / 'head.onnx'} with ONNX Runtime's CPU execution provider") in captured.err


# ---------------------------------------------------------------------------------------------- verify

def test_verify_passes_on_a_built_bundle(dist_built):
    proc = run_cli("verify", "out/tinynet/dist/w8a16", cwd=dist_built)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "13 files match SHA256SUMS" in proc.stdout
    assert "4 binaries: embedded SoC and arch match index.json" in proc.stdout
    for chip in CHIPS:
        for graph in GRAPHS:
            # tinynet has 4 evaluation samples; quantized with the index, the bare binary gives the very outputs
            # of the _ctx.onnx float path (0 steps apart). On a busy machine the line also says how long it waited
            # for an emulator slot (fresh32: other tests held both; dist._timing's own test has the wording).
            assert re.search(f"^{chip}/{graph}: I/O contract holds on the HTP emulator over 4 samples \\(worst "
                             r"output: 0\.00 of one quantization step; \d+\.\d s on \d emulator sessions?"
                             r"(, about \d+ s of it waiting for a free emulator slot \(the machine's \d+ were held by "
                             r"other work\))?\)$", proc.stdout, re.M), proc.stdout
    assert proc.stdout.strip().endswith("ok: out/tinynet/dist/w8a16 is what its index says")
    # By default as many samples as `doit dist` checked ([dist] verify_samples, recorded in the index), not all.
    assert json.loads((dist_built / "out/tinynet/dist/w8a16/index.json").read_text())["verify"] == {"samples": 4}
    assert "I/O contract: 4 evaluation sample(s) per graph and chip" in proc.stdout
    fewer = run_cli("verify", "out/tinynet/dist/w8a16", "--samples", "2", cwd=dist_built)
    assert fewer.returncode == 0
    assert "SM8550/head: I/O contract holds on the HTP emulator over 2 samples" in fewer.stdout
    wrong = run_cli("verify", "out/tinynet/dist/w8a16", "--samples", "some", cwd=dist_built)
    assert wrong.returncode == 2 and "'some': a number of samples (0: no emulator run) or 'all'" in wrong.stderr


def copied_bundle(dist_built: Path, tmp_path: Path, variant: str = "w8a16") -> Path:
    copy = tmp_path / "bundle"
    shutil.copytree(bundle_of(dist_built, variant), copy)
    return copy


def edit_index(bundle: Path, change) -> None:
    index = json.loads((bundle / "index.json").read_text())
    change(index)
    (bundle / "index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    resign(bundle)


def test_a_mismatch_ends_the_emulator_workers_before_their_folder_goes(dist_built, tmp_path, monkeypatch):
    """check_contract's wrapper lives in a temporary folder its workers open: a mismatch raised while a worker is still
    opening it must end the workers first (else that worker found the folder gone and onnxruntime printed its own
    error above the mismatch; the CLI test below once saw it)."""
    from build_rules import dist
    monkeypatch.setenv("BUILD_RULES_EMULATOR_WORKERS", "2")
    monkeypatch.setenv("BUILD_RULES_EMULATOR_INLINE_SECONDS", "0")  # on the workers, however small the job
    monkeypatch.setenv("BUILD_RULES_EMULATOR_MEMO_MB", "0")
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # slots of its own (others' builds may hold the machine's)
    bundle = copied_bundle(dist_built, tmp_path)
    index = json.loads((bundle / "index.json").read_text())
    contract = index["graphs"]["head"]["io"]
    contract["inputs"][0]["scale"] *= 1.05

    def children() -> set[int]:
        return {int(p) for task in Path(f"/proc/{os.getpid()}/task").iterdir()
                for p in (task / "children").read_text().split()}
    before = children()
    with pytest.raises(dist.DistError, match="I/O contract mismatch on output 'logits'") as caught:
        dist.check_contract(bundle / "SM8550", "head", contract, dist_built / "out/tinynet/float/head.evaluation.npz",
                            None, "SM8550/head")
    assert children() - before == set(), caught.traceback[-1]  # (its traceback holds the generator's frame)


def test_verify_catches_a_wrong_scale_in_a_copied_index(dist_built, tmp_path):
    bundle = copied_bundle(dist_built, tmp_path)

    def wrong_scale(index):
        index["graphs"]["head"]["io"]["inputs"][0]["scale"] *= 1.05
    edit_index(bundle, wrong_scale)
    proc = run_cli("verify", str(bundle), "--evaluation", str(dist_built / "out" / "tinynet" / "float"), cwd=tmp_path)
    assert proc.returncode == 1
    assert "SM8550/encoder: I/O contract holds" in proc.stdout  # checked in order: the good graph passed first
    error = proc.stderr.strip()
    assert error.startswith("error: SM8550/head: I/O contract mismatch on output 'logits' (sample 0): the bare binary "
                            "with the index's scale/offset differs from head_ctx.onnx by "), error
    steps = float(error.split(" quantization steps")[0].rsplit(", ", 1)[1])
    assert steps > 10, error


@pytest.mark.parametrize("field, value, message", [
    ("dtype", "UFIXED_POINT_8", "SM8550/head: the binary refused inputs typed as the index says (features "
                                "UFIXED_POINT_8)"),
    ("offset", 0, "SM8550/head: I/O contract mismatch on output 'logits'"),
])
def test_verify_catches_a_wrong_dtype_or_offset(dist_built, tmp_path, field, value, message):
    bundle = copied_bundle(dist_built, tmp_path)
    edit_index(bundle, lambda index: index["graphs"]["head"]["io"]["inputs"][0].update({field: value}))
    with pytest.raises(dist.DistError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        dist.verify(bundle, {g: dist_built / "out" / "tinynet" / "float" / f"{g}.evaluation.npz" for g in GRAPHS},
                    say=lambda line: None)


@pytest.mark.parametrize("damage, message", [
    (lambda b: (b / "SM8750" / "head_ctx.onnx").unlink(), "SM8750/head_ctx.onnx: missing (listed in SHA256SUMS)"),
    (lambda b: (b / "SM8550" / "encoder.bin").write_bytes((b / "SM8550" / "encoder.bin").read_bytes()[:-1] + b"x"),
     "SM8550/encoder.bin: altered (its SHA-256 differs from SHA256SUMS)"),
    (lambda b: (b / "SM8750" / "notes.txt").write_text("hi"), "SM8750/notes.txt: not listed in SHA256SUMS"),
    (lambda b: (b / "SHA256SUMS").unlink(), "SHA256SUMS: missing"),
])
def test_verify_names_a_missing_or_altered_file(dist_built, tmp_path, damage, message):
    bundle = copied_bundle(dist_built, tmp_path)
    damage(bundle)
    proc = run_cli("verify", str(bundle), cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"error: {bundle}/{message}"


def test_verify_catches_a_binary_built_for_another_soc(dist_built, tmp_path):
    bundle = copied_bundle(dist_built, tmp_path)
    shutil.copyfile(bundle / "SM8750" / "encoder.bin", bundle / "SM8550" / "encoder.bin")
    resign(bundle)
    with pytest.raises(dist.DistError) as failure:
        dist.verify(bundle, samples=0, say=lambda line: None)
    assert str(failure.value) == (f"{bundle}/SM8550/encoder.bin: built for soc_type=SM8750 arch=v79, but index.json "
                                  "says SM8550 v73")


def test_verify_without_evaluation_inputs_says_where_it_looked(dist_built, tmp_path):
    bundle = copied_bundle(dist_built, tmp_path)
    proc = run_cli("verify", str(bundle), cwd=tmp_path)
    assert proc.returncode == 1
    # Looked beside the bundle's dist folder, as in out/<model>/dist/<variant> -> out/<model>/float/
    assert proc.stderr.strip() == (f"error: no evaluation inputs for graph 'encoder': {bundle.parent.parent}/float/"
                                   "encoder.evaluation.npz not found; pass --evaluation DIR (a folder with "
                                   "<graph>.evaluation.npz, out/<model>/float/ of the build)")


def test_contract_of_int32_and_layout_op_inputs(tmp_path):
    """A graph like a decoder: int32 tokens and a float input whose first consumer is a layout op reach the
    binary unquantized (INT_32, FLOAT_32), its output as UFIXED_POINT_16; the bare binary agrees with the ctx model."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from build_rules.measuring.samples import save_arrays
    from build_rules.toolchains import ort_qnn

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((32, 16)).astype(np.float32), "embedding"),
               numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w"),
               numpy_helper.from_array(np.array([1, 4, 16], np.int64), "shape")]
    nodes = [helper.make_node("Gather", ["embedding", "tokens"], ["e"], name="gather"),
             helper.make_node("Reshape", ["encoder_out", "shape"], ["r"], name="reshape"),
             helper.make_node("Add", ["e", "r"], ["s"], name="add"),
             helper.make_node("MatMul", ["s", "w"], ["logits"], name="matmul")]
    graph = helper.make_graph(nodes, "decoder", [helper.make_tensor_value_info("tokens", TensorProto.INT32, [1, 4]),
                                                 helper.make_tensor_value_info("encoder_out", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 4, 8])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.save(model, str(tmp_path / "decoder.onnx"))
    samples = [{"tokens": rng.integers(0, 32, (1, 4)).astype(np.int32),
                "encoder_out": rng.standard_normal((1, 64)).astype(np.float32)} for _ in range(6)]
    ort_qnn.quantize(tmp_path / "decoder.onnx", tmp_path / "decoder.qdq.onnx", samples, activations="uint16",
                     weights="uint8", per_channel=False)
    ort_qnn.compile_context_binary(tmp_path / "decoder.qdq.onnx", tmp_path / "SM8750", "decoder", soc_model=69,
                                   vtcm_mb=8, fp16=False)
    contract = dist.contract_from_ctx(tmp_path / "SM8750" / "decoder_ctx.onnx")
    assert [(t["name"], t["dtype"], t["scale"], t["offset"]) for t in contract["inputs"]] == \
        [("tokens", "INT_32", None, None), ("encoder_out", "FLOAT_32", None, None)]
    (logits,) = contract["outputs"]
    assert logits["dtype"] == "UFIXED_POINT_16" and logits["scale"] > 0 and logits["shape"] == [1, 4, 8]
    arrays = {"count": np.array(len(samples))}
    for i, sample in enumerate(samples):
        arrays.update({f"{i}/input/{k}": v for k, v in sample.items()})
    save_arrays(str(tmp_path / "decoder.evaluation.npz"), arrays)
    measured = dist.check_contract(tmp_path / "SM8750", "decoder", contract, tmp_path / "decoder.evaluation.npz",
                                   None, "SM8750/decoder")
    assert measured == {"samples": 6, "worst_steps": 0.0}


# ---------------------------------------------------------------------------------------------- multi-SoC

@pytest.mark.slow
def test_multi_soc_binary_for_all_chips(dist_built, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(dist_built, repo, symlinks=True)
    toml = repo / "models" / "tinynet" / "model.toml"
    toml.write_text(toml.read_text() + "\n[dist]\nmulti_soc = true\n")
    result = run_doit(repo, "dist")
    assert result.code == 0, result.output
    assert result.ran == {"multi_soc:tinynet/fp16", "multi_soc:tinynet/w8a16", "dist:tinynet/fp16",
                          "dist:tinynet/w8a16"}, result.output
    bundle = bundle_of(repo, "w8a16")
    assert dist.bundle_files(bundle) == expected_files(extra=[f"multi_soc/{g}{s}" for g in GRAPHS
                                                              for s in (".bin", "_ctx.onnx")])
    index = json.loads((bundle / "index.json").read_text())
    multi = index["multi_soc"]
    assert multi["chips"] == ["SM8550", "SM8750"] and multi["error"] is None
    for graph in GRAPHS:
        entry = multi["graphs"][graph]
        assert entry["bytes"] == (bundle / "multi_soc" / f"{graph}.bin").stat().st_size
        assert entry["per_chip_bytes"] == sum((bundle / c / f"{graph}.bin").stat().st_size for c in CHIPS)
        # One record per SoC, each with the SoC and arch it names, read back from the file.
        assert sorted((r["soc_model"], r["dsp_arch"], r["soc_type"]) for r in entry["records"]) == \
            [(43, "v73", "SM8550"), (69, "v79", "SM8750")]
        records = dist.multi_soc_records(bundle / "multi_soc" / f"{graph}.bin")
        for record in records:
            assert dist.compare_record_io(record["graphs"][entry["qnn_graph"]], index["graphs"][graph]["io"]) is None
    total = sum(multi["graphs"][g]["bytes"] for g in GRAPHS)
    chips_sum = sum(multi["graphs"][g]["per_chip_bytes"] for g in GRAPHS)
    assert (f"multi-SoC: {total / 1e6:.3f} MB for SM8550, SM8750 (per-chip binaries: {chips_sum / 1e6:.3f} MB; "
            f"{total / chips_sum:.2f} of it)") in result.output
    emulator = multi["graphs"]["encoder"]["emulator"]
    if not emulator["loaded"]:  # onnxruntime-qnn 2.7 / QNN 2.51 on x86: no record is selected
        assert "contextCreateFromBinary failed" in emulator["error"]
        assert "multi-SoC: the x86 HTP emulator cannot load it (encoder, head: " in result.output

    proc = run_cli("verify", "out/tinynet/dist/w8a16", cwd=repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "multi_soc/encoder.bin: one record per SoC (SM8550, SM8750), each with the index's I/O contract" in proc.stdout

    # Made once by its own stage: rebuilding the bundles reuses it, so the archive is the same bytes.
    tarball = repo / "out" / "tinynet" / "dist" / "tinynet-w8a16.tar.gz"
    before = tarball.read_bytes()
    shutil.rmtree(repo / "out" / "tinynet" / "dist")
    again = run_doit(repo, "dist")
    assert again.ran == {"dist:tinynet/fp16", "dist:tinynet/w8a16"}, again.output
    assert tarball.read_bytes() == before

    # A record whose I/O differs from the index is named.
    copy = copied_bundle(repo, tmp_path / "c")
    edit_index(copy, lambda i: i["graphs"]["head"]["io"]["outputs"][0].update(offset=1))
    with pytest.raises(dist.DistError, match=r"multi_soc/head.bin: record htp\.cache\.sm8550\.0 \(SM8550\): output "
                                             r"'logits' has scale .* offset -\d+, the index has scale .* offset 1"):
        dist.verify(copy, samples=0, say=lambda line: None)


def test_multi_soc_with_one_chip_makes_nothing_and_says_so(dist_built, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(dist_built, repo, symlinks=True)
    toml = repo / "models" / "tinynet" / "model.toml"
    toml.write_text(toml.read_text().replace('chips = ["SM8550", "SM8750"]', 'chips = ["SM8750"]')
                    + "\n[dist]\nmulti_soc = true\n")
    result = run_doit(repo, "dist")
    # the size checks judge each graph against the budgets of the model's chips: one chip fewer, checked again
    sizes = {f"size:tinynet/{g}/{v}" for g in ("encoder", "head") for v in ("fp16", "w8a16")}
    assert result.code == 0 and result.ran == {"dist:tinynet/fp16", "dist:tinynet/w8a16", *sizes}, result.output
    index = json.loads((bundle_of(repo, "w8a16") / "index.json").read_text())
    assert list(index["chips"]) == ["SM8750"]
    assert index["multi_soc"] == {"chips": [], "error": "variant w8a16 builds for one chip only (SM8750)", "graphs": {}}
    assert "multi-SoC: not made: variant w8a16 builds for one chip only (SM8750)" in result.output


def test_a_multi_soc_binary_that_cannot_be_made_is_recorded_not_fatal(tmp_path):
    from build_rules.stages import multi_soc
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not an onnx model")
    folder = tmp_path / "multi_soc"
    params = {"graphs": {"encoder": {"onnx": str(broken), "reference_ctx": str(broken)}},
              "chips": [{"name": "SM8550", "soc_id": 43, "dsp_arch": "v73", "vtcm_mb": 8},
                        {"name": "SM8750", "soc_id": 69, "dsp_arch": "v79", "vtcm_mb": 8}],
              "fp16": False, "outputs": {"dir": str(folder), "report": str(folder / "multi_soc.json")}}
    values = multi_soc.run(params)
    report = json.loads((folder / "multi_soc.json").read_text())
    assert values["error"] == report["error"] and report["error"].startswith(
        "encoder: RuntimeError: onnxruntime-qnn could not make a multi-SoC binary of "), report
    assert sorted(p.name for p in folder.iterdir()) == ["multi_soc.json"]
    # The bundle's index says so, and the summary prints it.
    index = tmp_path / "index.json"
    index.write_text(json.dumps({"chips": {"SM8550": {"files": {}}}, "tarball": "m-v.tar.gz",
                                 "multi_soc": {"chips": [], "error": report["error"], "graphs": {}}}))
    assert dist.describe(index)[1] == f"  multi-SoC: not made: {report['error']}"


# ---------------------------------------------------------------------------------------------- config, load

def test_dist_config_errors_name_file_and_key(tmp_path):
    chips = load_chips(ROOT / "chips.toml")
    folder = tmp_path / "tinynet"
    shutil.copytree(TEST_MODELS / "tinynet", folder)
    write_tinynet_checkpoints(folder)
    toml = folder / "model.toml"
    original = toml.read_text()
    cases = {
        "[dist]\nmulti_soc = true\n": None,
        "[dist]\nshipping = true\n": "[dist] shipping: unknown key (allowed: multi_soc, cpu_fallback, verify_samples, "
                                     "license_file)",
        "[dist]\nlicense_file = \"LICENSE\"\n": f"[dist] license_file: 'LICENSE' not found (a path relative to "
                                                f"{folder}, or pkg:<module>/<path>)",
        "[dist]\nverify_samples = -1\n": "[dist] verify_samples: must be 0 (do not run the emulator) or more, got -1",
    }
    for text, message in cases.items():
        toml.write_text(original + "\n" + text)
        if message is None:
            assert load_model(folder, chips).dist.multi_soc is True
            continue
        with pytest.raises(ConfigError) as failure:
            load_model(folder, chips)
        assert str(failure.value) == f"{toml}: {message}"
    (folder / "LICENSE").write_text("Apache License 2.0 text\n")
    toml.write_text(original + "\n[dist]\nlicense_file = \"LICENSE\"\n")
    assert load_model(folder, chips).dist.license_file == folder / "LICENSE"


def test_a_variant_named_dist_is_refused(tmp_path):
    from conftest import make_repo
    repo = make_repo(tmp_path / "repo", {"tinynet": TEST_MODELS / "tinynet"})
    write_tinynet_checkpoints(repo / "models" / "tinynet")
    toml = repo / "models" / "tinynet" / "model.toml"
    toml.write_text(toml.read_text().replace("[variants.fp16]", "[variants.dist]"))
    result = run_doit(repo, "list")
    assert result.code == 3
    assert ("error: models/tinynet/model.toml: [variants.dist]: 'dist' is reserved (it is a folder of out/<model>/); "
            "choose another variant name") in result.output


def test_loading_dist_tasks_stays_light(dist_built):
    code = ("import runpy, sys, json; runpy.run_path('dodo.py'); "
            "from build_rules import tasks, dist; tasks.project(); "
            "names = [t['name'] for t in tasks.task_dist()] + [t['name'] for t in tasks.task_multi_soc()]; "
            "print(json.dumps([names, sorted(m for m in sys.modules if m.split('.')[0] in "
            "('numpy', 'onnx', 'onnxruntime', 'torch', 'onnxruntime_qnn'))]))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=dist_built, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [["tinynet/fp16", "tinynet/w8a16", "tinynet"], []]


# ---------------------------------------------------------------------------------------------- qairt

def test_qairt_bundle_ships_the_sdk_runtime_and_reads_the_contract_from_the_manifest(built_tinynet, tmp_path,
                                                                                      monkeypatch):
    """With the stand-in SDK: the contract comes from manifest.json graphs.<graph>.io (written by the qairt package
    stage from <graph>_net.json); without that field dist fails naming manifest and field."""
    from fake_qairt.make_sdk import make_sdk
    from test_qairt_toolchain import use_sdk

    from build_rules.stages import qairt_package

    sdk = make_sdk(tmp_path / "qairt" / "2.40.0.251030")
    repo = tmp_path / "repo"  # the float models are shared by both toolchains: only the SDK stages run
    shutil.copytree(built_tinynet, repo, symlinks=True)
    toml = repo / "models" / "tinynet" / "model.toml"
    toml.write_text(toml.read_text().replace("[variants.fp16]\nprecision = \"fp16\"\n", "") + "\n[dist]\nmulti_soc = true\n")
    use_sdk(monkeypatch, sdk, tmp_path / "calls.jsonl")

    original = qairt_package.run

    def package_without_io(params):  # a manifest as an older build_rules wrote it
        values = original(params)
        manifest = Path(params["outputs"]["manifest"])
        data = json.loads(manifest.read_text())
        for graph in data["graphs"].values():
            graph.pop("io", None)
        manifest.write_text(json.dumps(data))
        return values
    monkeypatch.setattr(qairt_package, "run", package_without_io)
    result = run_doit(repo, "dist")
    assert result.code != 0
    assert ("dist:tinynet/w8a16: out/tinynet/w8a16/SM8550/manifest.json: no I/O contract for graph 'encoder' "
            "(field graphs.encoder.io with inputs and outputs)") in result.output
    assert not (repo / "out" / "tinynet" / "dist").exists()

    monkeypatch.setattr(qairt_package, "run", original)
    for manifest in (repo / "out" / "tinynet" / "w8a16").glob("*/manifest.json"):
        manifest.unlink()
    result = run_doit(repo, "dist")
    assert result.code == 0, result.output
    assert result.ran == {"package:tinynet/w8a16@SM8550", "package:tinynet/w8a16@SM8750", "dist:tinynet/w8a16"}
    bundle = bundle_of(repo, "w8a16")
    runtime = ["runtime/aarch64-android/libQnnHtp.so", "runtime/aarch64-android/libQnnHtpV73Stub.so",
               "runtime/aarch64-android/libQnnHtpV79Stub.so", "runtime/aarch64-android/libQnnSystem.so",
               "runtime/hexagon-v73/libQnnHtpV73Skel.so", "runtime/hexagon-v79/libQnnHtpV79Skel.so"]
    assert dist.bundle_files(bundle) == sorted(
        ["LICENSES/MODEL.txt", "LICENSES/QNN-RUNTIME.txt", "index.json", *runtime,
         *[f"{c}/{g}.bin" for c in CHIPS for g in GRAPHS], *[f"cpu/{g}.onnx" for g in GRAPHS]])
    for rel in runtime:  # the SDK's own files, as the package stage copied them
        name = rel.rsplit("/", 1)[1]
        source = next(sdk.rglob(name)) if "Skel" in name or "Stub" in name else sdk / "lib" / "aarch64-android" / name
        assert (bundle / rel).read_bytes() == source.read_bytes()
    index = json.loads((bundle / "index.json").read_text())
    manifest = json.loads((repo / "out/tinynet/w8a16/SM8550/manifest.json").read_text())
    assert {g: index["graphs"][g]["io"] for g in GRAPHS} == {g: manifest["graphs"][g]["io"] for g in GRAPHS}
    assert index["graphs"]["encoder"]["io"]["inputs"][0]["dtype"] == "UFIXED_POINT_16"
    assert index["toolchain"]["oldest_device_runtime"]["qairt"] == "2.40.0"
    assert index["chips"]["SM8750"]["runtime"]["shipped"] is True
    assert index["chips"]["SM8750"]["runtime"]["libraries"] == {
        "aarch64-android": ["runtime/aarch64-android/libQnnHtp.so", "runtime/aarch64-android/libQnnSystem.so",
                            "runtime/aarch64-android/libQnnHtpV79Stub.so"],
        "hexagon-v79": ["runtime/hexagon-v79/libQnnHtpV79Skel.so"]}
    assert index["multi_soc"]["error"].startswith("the qairt toolchain makes no multi-SoC binaries")
    assert "runtime/ holds QNN runtime libraries copied from that SDK" in (bundle / "LICENSES" / "QNN-RUNTIME.txt").read_text()
    lines = []
    assert dist.verify(bundle, say=lines.append)["binaries"] == 4
    assert lines[-1].startswith("I/O contract: not run on the emulator: a qairt bundle has no <graph>_ctx.onnx")
    proc = subprocess.run(["sha256sum", "-c", "--quiet", "SHA256SUMS"], cwd=bundle, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


@pytest.mark.slow
def test_one_task_per_variant_so_a_change_or_a_failed_gate_touches_only_that_variant(dist_built, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(dist_built, repo, symlinks=True)
    toml = repo / "models" / "tinynet" / "model.toml"
    fp16_tarball = repo / "out/tinynet/dist/tinynet-fp16.tar.gz"
    fp16_before = fp16_tarball.read_bytes()
    toml.write_text(toml.read_text().replace('weights = "uint8"', 'weights = "int8"'))  # w8a16 only
    result = run_doit(repo, "dist")
    assert result.code == 0, result.output
    assert "dist:tinynet/w8a16" in result.ran and "dist:tinynet/fp16" not in result.ran, result.output
    assert fp16_tarball.read_bytes() == fp16_before

    # A gate only w8a16 misses (the head's SQNR: fp16 ~70 dB, w8a16 ~18 dB): --continue still makes the fp16 bundle.
    toml.write_text(toml.read_text().replace('gate = { metric = "cosine", min = 0.98 }', 'gate = { metric = "sqnr", min = 40 }'))
    shutil.rmtree(repo / "out/tinynet/dist")
    result = run_doit(repo, "--continue", "dist")
    assert result.code != 0
    assert "dist:tinynet/fp16" in result.ran
    assert "   not run: dist:tinynet/w8a16 (it needs " in result.output
    assert (repo / "out/tinynet/dist/fp16/index.json").is_file() and fp16_tarball.is_file()
    assert not (repo / "out/tinynet/dist/w8a16").exists()
    assert sorted(p.name for p in (repo / "out/tinynet/dist").iterdir()) == ["fp16", "tinynet-fp16.tar.gz"]


def test_a_variant_taken_out_of_model_toml_leaves_no_bundle(dist_built, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(dist_built, repo, symlinks=True)
    toml = repo / "models" / "tinynet" / "model.toml"
    toml.write_text(toml.read_text().replace('[variants.fp16]\nprecision = "fp16"\n', ""))
    result = run_doit(repo, "dist")
    assert result.code == 0, result.output
    # its key names the model's variants; w8a16's packages record their fp16 sibling's sizes, so they run again
    assert result.ran == {"dist:tinynet/w8a16", "package:tinynet/w8a16@SM8550", "package:tinynet/w8a16@SM8750"}, \
        result.output
    assert sorted(p.name for p in (repo / "out/tinynet/dist").iterdir()) == ["tinynet-w8a16.tar.gz", "w8a16"]
