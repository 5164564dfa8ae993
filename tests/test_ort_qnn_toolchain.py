"""Tests for build_rules.toolchains.ort_qnn (the onnxruntime-qnn toolchain) on tiny models built in tmp_path."""

from __future__ import annotations

import importlib.metadata
import json
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime_qnn")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from build_rules.emulator import emulator_runs  # noqa: E402
from build_rules.toolchains import ort_qnn  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------------------------- models and data

def _save(graph, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def make_tiny(path: Path) -> Path:
    """Conv -> Relu -> Reshape -> Gemm on a 1x3x8x8 input, 10 outputs."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "w"),
        numpy_helper.from_array((rng.standard_normal(8) * 0.1).astype(np.float32), "b"),
        numpy_helper.from_array((rng.standard_normal((8 * 8 * 8, 10)) * 0.05).astype(np.float32), "fw"),
        numpy_helper.from_array((rng.standard_normal(10) * 0.1).astype(np.float32), "fb"),
        numpy_helper.from_array(np.array([1, -1], np.int64), "shape"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Reshape", ["r1", "shape"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "fw", "fb"], ["y"], name="fc"),
    ]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    return _save(graph, path)


def make_hardmax(path: Path) -> Path:
    """Conv -> Reshape -> Hardmax: Hardmax is not supported by QNN HTP."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([1, -1], np.int64), "shape")]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Reshape", ["c1", "shape"], ["flat"], name="flatten"),
        helper.make_node("Hardmax", ["flat"], ["y"], name="hardmax_1"),
    ]
    graph = helper.make_graph(nodes, "hm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])], inits)
    return _save(graph, path)


def samples(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(n)]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ort_qnn")


@pytest.fixture(scope="module")
def tiny(work) -> Path:
    return make_tiny(work / "tiny.onnx")


@pytest.fixture(scope="module")
def tiny_w8a16(work, tiny) -> Path:
    out = work / "tiny.w8a16.onnx"
    ort_qnn.quantize(tiny, out, samples(8, 0), activations="uint16", weights="uint8", per_channel=False)
    return out


@pytest.fixture(scope="module")
def compiled_43(work, tiny_w8a16) -> dict:
    return ort_qnn.compile_context_binary(tiny_w8a16, work / "out43", "tiny", soc_model=43, vtcm_mb=8, fp16=False)


def qdq_zero_point_types(path: Path) -> tuple[int, set[int]]:
    model = onnx.load(str(path))
    inits = {i.name: i for i in model.graph.initializer}
    qdq = [n for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    zp_types = {inits[n.input[2]].data_type for n in qdq if n.op_type == "QuantizeLinear" and len(n.input) > 2}
    return len(qdq), zp_types


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


# ----------------------------------------------------------------------------------------------------- identity

def test_identity_fields_and_cache(tmp_path, monkeypatch):
    ort_qnn._identity_memo.clear()
    ident = ort_qnn.identity(tmp_path)
    assert set(ident) == {"name", "package_version", "qnn_version", "build_id"}
    assert ident["name"] == ort_qnn.NAME == "ort-qnn"
    assert ident["package_version"] == importlib.metadata.version("onnxruntime-qnn")
    assert ident["qnn_version"].count(".") == 2
    # e.g. v2.51.0.260929181845 for qnn_version 2.51.0
    assert ident["build_id"].startswith(f"v{ident['qnn_version']}.")
    cache_files = list(tmp_path.glob("ort-qnn-identity-*.json"))
    assert len(cache_files) == 1
    assert json.loads(cache_files[0].read_text())["probe"]["build_id"] == ident["build_id"]

    # A second call (even in a fresh process, hence the memo reset) must come from the cache file, never the lib.
    ort_qnn._identity_memo.clear()

    def must_not_probe(lib):
        raise AssertionError(f"identity() loaded {lib} although the cache is warm")

    monkeypatch.setattr(ort_qnn, "_probe_build_id", must_not_probe)
    assert ort_qnn.identity(tmp_path) == ident


def test_identity_does_not_import_onnxruntime(tmp_path):
    code = (
        "import sys, json; from build_rules.toolchains import ort_qnn; "
        f"i = ort_qnn.identity({str(tmp_path)!r}); "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('onnxruntime', 'onnxruntime_qnn', 'onnx', 'numpy')); "
        "print(json.dumps({'identity': i, 'imported': bad}))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["imported"] == []
    assert result["identity"]["name"] == "ort-qnn"


def test_identity_not_installed(tmp_path, monkeypatch):
    real_find_spec = ort_qnn.importlib.util.find_spec
    monkeypatch.setattr(ort_qnn.importlib.util, "find_spec",
                        lambda name, *a: None if name == "onnxruntime_qnn" else real_find_spec(name, *a))
    with pytest.raises(ModuleNotFoundError, match="pip install onnxruntime-qnn"):
        ort_qnn.identity(tmp_path)


# ----------------------------------------------------------------------------------------------------- quantize

def test_quantize_u16_and_u8(work, tiny, tiny_w8a16):
    count, zp_types = qdq_zero_point_types(tiny_w8a16)
    assert count > 0 and TensorProto.UINT16 in zp_types

    u8 = work / "tiny.u8.onnx"
    ort_qnn.quantize(tiny, u8, samples(8, 0), activations="uint8", weights="int8", per_channel=True, method="minmax")
    count, zp_types = qdq_zero_point_types(u8)
    assert count > 0 and zp_types == {TensorProto.UINT8}
    assert not [p for p in work.iterdir() if p.name.startswith(".")], "temporary files left behind"


def test_quantize_overrides(tmp_path, tiny):
    mixed = tmp_path / "mixed.onnx"
    ort_qnn.quantize(tiny, mixed, samples(4, 0), activations="uint8", weights="uint8", per_channel=False,
                     overrides={"r1": "uint16"})
    _, zp_types = qdq_zero_point_types(mixed)
    assert zp_types == {TensorProto.UINT8, TensorProto.UINT16}

    bad = tmp_path / "bad.onnx"
    with pytest.raises(ValueError, match="no_such_tensor"):
        ort_qnn.quantize(tiny, bad, samples(2, 0), activations="uint8", weights="uint8", per_channel=False,
                         overrides={"no_such_tensor": "uint16"})
    with pytest.raises(ValueError, match="'fw'"):
        ort_qnn.quantize(tiny, bad, samples(2, 0), activations="uint8", weights="uint8", per_channel=False,
                         overrides={"fw": "uint16"})
    with pytest.raises(ValueError, match="activation type"):
        ort_qnn.quantize(tiny, bad, samples(2, 0), activations="int8", weights="uint8", per_channel=False)
    assert not bad.exists()


def test_quantize_model_with_metadata_props(tmp_path, tiny):
    # onnxsim writes metadata_props, which crash qnn_preprocess_model unless stripped first.
    model = onnx.load(str(tiny))
    helper.set_model_props(model, {"producer.tool": "onnxsim", "author": "tests"})
    src = tmp_path / "with_props.onnx"
    onnx.save(model, str(src))
    out = tmp_path / "with_props.qdq.onnx"
    ort_qnn.quantize(src, out, samples(2, 0), activations="uint16", weights="uint8", per_channel=False)
    props = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    assert props["author"] == "tests"


# ------------------------------------------------------------------------------------------------------ compile

@pytest.mark.parametrize("soc_model, soc_type, arch", [(43, "SM8550", "73"), (69, "SM8750", "79")])
def test_compile_targets(work, tiny_w8a16, compiled_43, soc_model, soc_type, arch):
    out_dir = work / f"out{soc_model}"
    res = compiled_43 if soc_model == 43 else ort_qnn.compile_context_binary(
        tiny_w8a16, out_dir, "tiny", soc_model=soc_model, vtcm_mb=8, fp16=False)
    assert res["target"] == {"soc_type": soc_type, "arch": arch, "vtcm_size": 8 * 1024 * 1024}
    assert ort_qnn.read_binary_target(res["binary"]) == res["target"]
    assert sorted(p.name for p in out_dir.iterdir()) == ["tiny.bin", "tiny_ctx.onnx"]
    assert res["binary"] == out_dir / "tiny.bin" and res["ctx_model"] == out_dir / "tiny_ctx.onnx"
    assert res["seconds"] > 0
    assert res["ops"]["cpu_io"] == ["x_QuantizeLinear", "y_DequantizeLinear"]
    assert res["ops"]["qnn"] == len(onnx.load(str(tiny_w8a16)).graph.node) - 2

    ctx = onnx.load(str(res["ctx_model"]))
    ep_nodes = [n for n in ctx.graph.node if n.op_type == "EPContext"]
    assert len(ep_nodes) == 1
    attrs = {a.name: helper.get_attribute_value(a) for a in ep_nodes[0].attribute}
    assert attrs["ep_cache_context"] == b"tiny.bin" and attrs["embed_mode"] == 0
    # Graph-I/O Q/DQ were offloaded to the CPU, so the binary itself takes and returns uint16 (UFIXED_16).
    value_types = {v.name: v.type.tensor_type.elem_type for v in ctx.graph.value_info}
    for name in list(ep_nodes[0].input) + list(ep_nodes[0].output):
        assert value_types[name] == TensorProto.UINT16


def test_compile_is_deterministic_and_path_independent(work, tiny_w8a16, compiled_43):
    # Same bytes under another file name and folder must give byte-identical outputs.
    copy = work / "elsewhere" / "renamed.onnx"
    copy.parent.mkdir()
    shutil.copyfile(tiny_w8a16, copy)
    again = ort_qnn.compile_context_binary(copy, work / "again", "tiny", soc_model=43, vtcm_mb=8, fp16=False)
    assert again["binary"].read_bytes() == compiled_43["binary"].read_bytes()
    assert again["ctx_model"].read_bytes() == compiled_43["ctx_model"].read_bytes()


def test_a_compile_forked_from_the_fork_server_gives_the_same_bytes(work, tiny_w8a16, compiled_43, monkeypatch):
    """A build's compile runs in a stage process forked from the fork server, whose compile child is forked from it too
    (plumbing/fork_server.py): the same bytes as the fresh interpreters here (the HTP backend's state between
    compiles of one process changes them: ort_qnn._compile_in_child)."""
    from build_rules.plumbing import fork_server
    monkeypatch.delenv(fork_server.SWITCH, raising=False)
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r}); "
            "from pathlib import Path; from build_rules.toolchains import ort_qnn; "
            f"ort_qnn.compile_context_binary(Path({str(tiny_w8a16)!r}), Path({str(work / 'forked')!r}), 'tiny', "
            "soc_model=43, vtcm_mb=8, fp16=False)")
    proc = fork_server.python_process(["-c", code], start_server=True, stderr=subprocess.PIPE)
    assert not isinstance(proc, subprocess.Popen)
    _, err = proc.communicate()
    assert proc.returncode == 0, err.decode()
    for name in ("binary", "ctx_model"):
        assert (work / "forked" / compiled_43[name].name).read_bytes() == compiled_43[name].read_bytes()


def test_a_compile_stage_compiles_in_its_own_process_once_then_in_children_with_the_same_bytes(work, tiny_w8a16,
                                                                                             compiled_43, monkeypatch):
    """here=True (the compile stage: a process that ends after its compile): its first compile runs in the process
    itself, no QNN library being loaded yet, and gives the child's bytes; once QNN is loaded (a second compile) each
    goes to a child, whose bytes are the same again. A compile the HTP refuses fails alike in the process, naming the
    node, and leaves nothing."""
    from build_rules.plumbing import fork_server
    monkeypatch.delenv(fork_server.SWITCH, raising=False)
    hardmax = make_hardmax(work / "hm-here.onnx")
    code = textwrap.dedent(f"""
        import sys, json
        sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
        from pathlib import Path
        from build_rules.toolchains import ort_qnn
        children = []
        real = ort_qnn._compile_in_child
        ort_qnn._compile_in_child = lambda *a, **k: children.append(a[0]) or real(*a, **k)
        seen = {{}}
        try:
            ort_qnn.compile_context_binary(Path({str(hardmax)!r}), Path({str(work / 'here-hm')!r}), "hm",
                                           soc_model=43, vtcm_mb=8, fp16=True, here=True)
        except ort_qnn.UnsupportedOpsError as e:
            seen["refused"] = [str(e).splitlines()[0], len(children)]
        seen["loaded"] = ort_qnn._qnn_loaded()
        for folder in ("here-1", "here-2"):
            ort_qnn.compile_context_binary(Path({str(tiny_w8a16)!r}), Path({str(work)!r}) / folder, "tiny",
                                           soc_model=43, vtcm_mb=8, fp16=False, here=True)
            seen[folder] = len(children)
        print("SEEN " + json.dumps(seen))
    """)
    proc = fork_server.python_process(["-c", code], start_server=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate()
    assert proc.returncode == 0, err.decode()
    seen = json.loads(next(line for line in out.decode().splitlines() if line.startswith("SEEN "))[5:])
    # the refused compile ran here (its one child is the verbose rerun for QNN's log), and loaded QNN
    refused, children = seen["refused"]
    assert refused.startswith("QNN HTP cannot run ") and f"of {hardmax}: " in refused, refused
    assert "Hardmax (node 'hardmax_1')" in refused and children == 1 and seen["loaded"] is True
    assert not (work / "here-hm").exists() or list((work / "here-hm").iterdir()) == []
    assert seen["here-1"] == seen["here-2"] - 1  # QNN loaded: each compile in a child
    for folder in ("here-1", "here-2"):
        for name in ("binary", "ctx_model"):
            assert (work / folder / compiled_43[name].name).read_bytes() == compiled_43[name].read_bytes()


def test_a_clean_compile_stage_compiles_in_its_own_process_and_gives_the_childs_bytes(work, tiny_w8a16, compiled_43,
                                                                                      monkeypatch):
    """The compile stage's usual case: one compile in a process that has loaded no QNN library: no child."""
    from build_rules.plumbing import fork_server
    monkeypatch.delenv(fork_server.SWITCH, raising=False)
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
        from pathlib import Path
        from build_rules.toolchains import ort_qnn
        assert not ort_qnn._qnn_loaded()
        ort_qnn._compile_in_child = None  # a child would fail here
        ort_qnn.compile_context_binary(Path({str(tiny_w8a16)!r}), Path({str(work / 'clean')!r}), "tiny",
                                       soc_model=43, vtcm_mb=8, fp16=False, here=True)
        assert ort_qnn._qnn_loaded()
    """)
    proc = fork_server.python_process(["-c", code], start_server=True, stderr=subprocess.PIPE)
    _, err = proc.communicate()
    assert proc.returncode == 0, err.decode()
    for name in ("binary", "ctx_model"):
        assert (work / "clean" / compiled_43[name].name).read_bytes() == compiled_43[name].read_bytes()


def test_compile_accepts_output_dq_renamed_by_layout_transform(tmp_path):
    # A 4-D (NCHW) output makes the EP's layout transform re-create the output DQ under a new name
    # ("DequantizeLinear_token_N"); it is still an allowed graph-output DQ.
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["c1"], ["y"], name="gap")]
    graph = helper.make_graph(nodes, "gap", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 1, 1])], [w])
    model = _save(graph, tmp_path / "gap.onnx")
    qdq = tmp_path / "gap.qdq.onnx"
    ort_qnn.quantize(model, qdq, samples(2, 0), activations="uint16", weights="uint8", per_channel=False)
    res = ort_qnn.compile_context_binary(qdq, tmp_path / "out", "gap", soc_model=43, vtcm_mb=8, fp16=False,
                                         trace_dir=tmp_path / "trace")
    assert len(res["ops"]["cpu_io"]) == 2 and res["ops"]["cpu_io"][0] == "x_QuantizeLinear"
    assert (tmp_path / "trace" / "gap_qnn_op_trace.json").is_file()


def test_compile_rejects_unsupported_ops(tmp_path):
    model = make_hardmax(tmp_path / "hm.onnx")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "hm.bin").write_bytes(b"stale")  # an old output must not survive a failed compile
    trace_dir = tmp_path / "trace"
    with pytest.raises(ort_qnn.UnsupportedOpsError) as info:
        ort_qnn.compile_context_binary(model, out_dir, "hm", soc_model=43, vtcm_mb=8, fp16=True, trace_dir=trace_dir)
    err = info.value
    assert ("Hardmax", "hardmax_1") in err.nodes
    assert "Hardmax (node 'hardmax_1')" in str(err)
    assert str(err).startswith(f"QNN HTP cannot run {len(err.nodes)} node(s) of {model}: ")
    assert "Hardmax" in err.reasons.get("hardmax_1", "")
    assert list(out_dir.iterdir()) == []
    assert (trace_dir / "hm_qnn_op_trace.json").is_file()
    copy = pickle.loads(pickle.dumps(err))
    assert str(copy) == str(err) and copy.nodes == err.nodes


def test_compile_rejects_unsupported_ops_qdq(tmp_path):
    model = make_hardmax(tmp_path / "hm.onnx")
    qdq = tmp_path / "hm.qdq.onnx"
    ort_qnn.quantize(model, qdq, samples(2, 0), activations="uint16", weights="uint8", per_channel=False)
    with pytest.raises(ort_qnn.UnsupportedOpsError) as info:
        ort_qnn.compile_context_binary(qdq, tmp_path / "out", "hm", soc_model=69, vtcm_mb=0, fp16=False)
    names = [n for _, n in info.value.nodes]
    assert "hardmax_1" in names
    # The graph-I/O Q/DQ are allowed on the CPU and must not be reported.
    assert "x_QuantizeLinear" not in names and "y_DequantizeLinear" not in names
    assert list((tmp_path / "out").iterdir()) == []


def test_compile_argument_checks(tmp_path, tiny):
    with pytest.raises(ValueError, match="soc_model"):
        ort_qnn.compile_context_binary(tiny, tmp_path, "t", soc_model="SM8550", vtcm_mb=8, fp16=False)
    with pytest.raises(ValueError, match="graph name"):
        ort_qnn.compile_context_binary(tiny, tmp_path, "../t", soc_model=43, vtcm_mb=8, fp16=False)


# ------------------------------------------------------------------------------------------------ read / run

def test_read_binary_target_across_chunk_boundary(tmp_path):
    config = b"\x00\x0aAis_hard=true;soc_type=SM8650;arch=75;non_uniform_mem_arch=0;vtcm_size=8388608;x=1\x00"
    blob = tmp_path / "fake.bin"
    start = (1 << 20) - 4  # the marker straddles the first 1 MiB chunk
    blob.write_bytes(b"\x01" * start + config + b"\x02" * 100)
    assert ort_qnn.read_binary_target(blob) == {"soc_type": "SM8650", "arch": "75", "vtcm_size": 8388608}
    (tmp_path / "none.bin").write_bytes(b"\x00" * 1000)
    with pytest.raises(ValueError):
        ort_qnn.read_binary_target(tmp_path / "none.bin")


def test_run_quantized_on_emulator_matches_cpu(tiny, compiled_43):
    import onnxruntime as ort

    feeds = samples(3, 42)
    got = emulator_runs.run_outputs(compiled_43["ctx_model"], feeds)
    cpu = ort.InferenceSession(str(tiny), providers=["CPUExecutionProvider"])
    assert len(got) == len(feeds)
    for feed, out in zip(feeds, got):
        assert set(out) == {"y"} and out["y"].shape == (1, 10) and out["y"].dtype == np.float32
        assert cosine(out["y"], cpu.run(["y"], feed)[0]) > 0.99


def test_run_fp16_float_model_on_emulator(tmp_path, tiny):
    res = ort_qnn.compile_context_binary(tiny, tmp_path / "fp", "tiny_fp", soc_model=69, vtcm_mb=8, fp16=True)
    assert res["ops"]["cpu_io"] == [] and res["target"]["arch"] == "79"
    feed = samples(1, 7)
    got = emulator_runs.run_outputs(res["ctx_model"], feed)[0]["y"]
    import onnxruntime as ort

    ref = ort.InferenceSession(str(tiny), providers=["CPUExecutionProvider"]).run(["y"], feed[0])[0]
    assert cosine(got, ref) > 0.999
