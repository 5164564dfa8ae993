"""The float model as onnxruntime's QNN recipe sees it: after qnn_preprocess_model (what quantize() quantizes, and the
tensor names overrides, sensitivity and diagnose must use), and the helpers that read and extend its tensors.
toolchains/ort_qnn.py re-exports these; onnx and onnxruntime are imported inside the functions.
"""
from __future__ import annotations

import tempfile
from pathlib import Path


def _preprocessed(float_model: Path, tmp: Path):
    """(model after qnn_preprocess_model with its metadata back, (activation names, initializer names) before)."""
    import onnx

    from ..plumbing.lean_imports import onnxruntime_tools_without_torch
    onnxruntime_tools_without_torch()
    from onnxruntime.quantization.execution_providers.qnn import qnn_preprocess_model

    model = onnx.load(str(float_model))
    # qnn_preprocess_model crashes on models that carry metadata_props (onnxsim writes some; see
    # research/models-and-data.md fact 3). So strip them for preprocessing and put them back before quantizing.
    props = [(p.key, p.value) for p in model.metadata_props]
    del model.metadata_props[:]
    original_tensors = _tensor_names(model)
    # Pass a path, not the proto: qnn_preprocess_model saves its input with save_as_external_data, which
    # rewrites the given proto in place to point at a temp folder that is gone afterwards.
    stripped_path, pre_path = tmp / "stripped.onnx", tmp / "preprocessed.onnx"
    onnx.save(model, str(stripped_path))
    if qnn_preprocess_model(str(stripped_path), pre_path):
        model = onnx.load(str(pre_path))
    if props:
        kept = {p.key: p.value for p in model.metadata_props}
        onnx.helper.set_model_props(model, {**dict(props), **kept})
    return model, original_tensors


def _expose(model, tensors: list[str]) -> None:
    """Add activation tensors as graph outputs (type left to shape inference)."""
    import onnx
    have = {o.name for o in model.graph.output}
    elem = {v.name: v.type.tensor_type.elem_type for v in list(model.graph.value_info) + list(model.graph.output)}
    for name in tensors:
        if name not in have:
            model.graph.output.append(onnx.helper.make_tensor_value_info(name, elem.get(name, onnx.TensorProto.FLOAT),
                                                                         None))


def preprocessed_model(float_model: Path):
    """The float model as quantize() sees it (after qnn_preprocess_model): tensor names for overrides."""
    with tempfile.TemporaryDirectory(prefix="ort-qnn-pre-") as tmp:
        return _preprocessed(Path(float_model), Path(tmp))[0]


def _tensor_names(model) -> tuple[set[str], set[str]]:
    """(activation tensor names, initializer names) of a model's main graph."""
    initializers = {i.name for i in model.graph.initializer}
    values = {i.name for i in model.graph.input} | {o.name for o in model.graph.output}
    for node in model.graph.node:
        values.update(n for n in node.output if n)
    return values - initializers, initializers
