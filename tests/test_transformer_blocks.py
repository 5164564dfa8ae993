"""Quantized transformer blocks compile for HTP with either quantizer: what onnxruntime's and AIMET's recipes would
write that HTP refuses, the build writes otherwise. Test model: tests/models/ffn (LayerNorm, Linear, GELU, Linear).

- `weights = "int4"` (or "int8") with per-channel weights: onnxruntime's recipe gives LayerNormalization's scale the
  signed weight type too, and HTP rejects every such node (QNN error 0xc26: Whisper tiny.en's 65 decoder and 45
  encoder LayerNorms); the quantize stage keeps that scale uint8 (a few hundred values).
- `quantizer = "aimet"`: a GELU written with erf (Whisper's) exports as Erf, Mul and Add; QNN has no Erf, and
  AIMET quantized it as it was, so the compile failed (Whisper: 18 encoder and 12 decoder nodes on the CPU). The aimet
  stage starts from the model as qnn_preprocess_model writes it, with the Gelu fused back, as onnxruntime's recipe does.
"""
from __future__ import annotations

import importlib.util
import json
import runpy
from pathlib import Path

import pytest

from conftest import TEST_MODELS, make_repo, run_doit

AIMET = importlib.util.find_spec("aimet_onnx") is not None


def ffn_repo(dest: Path, aimet: bool = AIMET) -> Path:
    import torch
    repo = make_repo(dest, {"ffn": TEST_MODELS / "ffn"})
    folder = repo / "models/ffn"
    torch.manual_seed(0)
    torch.save(runpy.run_path(str(folder / "hooks.py"))["module_class"]()().state_dict(), folder / "block.pt")
    if not aimet:  # the aimet variant needs the `aimet` extra; the int4 one does not
        toml = folder / "model.toml"
        toml.write_text(toml.read_text().split("[variants.w8a16_aimet]")[0])
    return repo


@pytest.fixture(scope="module")
def built_ffn(tmp_path_factory):
    repo = ffn_repo(tmp_path_factory.mktemp("ffn"))
    result = run_doit(repo)
    assert result.code == 0, result.output
    return repo


def _weight_types(qdq: Path) -> dict[str, tuple[str, int]]:
    """node name -> (op type, ONNX element type of its quantized weight) for the weighted nodes of a QDQ model."""
    import onnx
    model = onnx.load(str(qdq), load_external_data=False)
    initializers = {i.name: i.data_type for i in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    found = {}
    for node in model.graph.node:
        if node.op_type in ("LayerNormalization", "MatMul", "Gemm") and len(node.input) > 1:
            dequantize = producers.get(node.input[1])
            if dequantize is not None and dequantize.op_type == "DequantizeLinear" and dequantize.input[0] in initializers:
                found[node.name] = (node.op_type, initializers[dequantize.input[0]])
    return found


@pytest.mark.slow
def test_int4_weights_compile_with_the_layernorm_scale_kept_uint8(built_ffn):
    import onnx
    repo = built_ffn
    types = _weight_types(repo / "out/ffn/w4a16/block.qdq.onnx")
    assert {t for op, t in types.values() if op == "LayerNormalization"} == {onnx.TensorProto.UINT8}, types
    linear = [t for op, t in types.values() if op != "LayerNormalization"]
    assert len(linear) == 2 and set(linear) == {onnx.TensorProto.INT4}, types
    check = json.loads((repo / "out/ffn/w4a16/SM8750/block.check.json").read_text())
    assert [g["passed"] for g in check["gated"]] == [True] and check["summary"]["cosine"] >= 0.98, check["gated"]


@pytest.mark.skipif(not AIMET, reason="aimet-onnx is not installed (pip install -e '.[aimet]')")
def test_an_aimet_variant_of_a_gelu_block_compiles_with_the_gelu_fused(built_ffn):
    import onnx
    repo = built_ffn
    float_ops = {n.op_type for n in onnx.load(str(repo / "out/ffn/float/block.sim.onnx")).graph.node}
    assert "Erf" in float_ops and "Gelu" not in float_ops  # what the exporter wrote
    qdq_ops = {n.op_type for n in onnx.load(str(repo / "out/ffn/w8a16_aimet/block.qdq.onnx")).graph.node}
    assert "Gelu" in qdq_ops and "Erf" not in qdq_ops
    check = json.loads((repo / "out/ffn/w8a16_aimet/SM8750/block.check.json").read_text())
    assert [g["passed"] for g in check["gated"]] == [True] and check["float_ops"]["count"] == 0, check
