"""How big a graph's QNN HTP context binary will be, before anything is compiled, and the budget it must fit.

The estimate is the graph's weights at the variant's bit widths plus an overhead fitted to the binaries this repo
builds (docs/split.md: the measurements and the fit). Weights at their bit width, as the QDQ quantizer and QNN
store them:
  - Conv / ConvTranspose / MatMul / Gemm weights, normalization scales: the variant's `weights` type;
  - their biases: 32-bit;
  - Gather tables (embeddings) and every other float constant: the variant's `activations` type (the QDQ quantizer
    treats them as activations, docs/models.md);
  - fp16 variants: every float constant at 16 bit.
A constant several nodes read counts once. Integer constants (shapes, indices) count at their own size.

The budget of one context binary: `max_context_mb` of [graphs.X] in model.toml, else of [chips.X] in chips.toml, else
config.DEFAULT_MAX_CONTEXT_MB. The size and split stages use this; only the standard library at import (doit loads
the budget part with the build file), onnx inside the functions that read models.
"""
from __future__ import annotations

from ..configuration.config import DEFAULT_MAX_CONTEXT_MB, Chip, Graph
from ..quantization.dtypes import TYPES

# binary bytes = OVERHEAD_BYTES + OVERHEAD_PER_NODE * nodes + WEIGHT_FACTOR * weight bytes, fitted to this repo's
# binaries (bench/context_size_fit.py; the table is in docs/split.md): least squares over the four Whisper tiny.en
# binaries (10-100 MB) gives 0.97 x weights + ~15 KB a node; rounded to 1.0 x and 12 KB, every binary of 10 MB or
# more is within -7 % / +2 %; small ones (MTCNN, 0.1-0.9 MB) are overestimated, up to 2 x: never under.
OVERHEAD_BYTES = 40_000
OVERHEAD_PER_NODE = 12_000
WEIGHT_FACTOR = 1.0

WEIGHT_OPS = {"Conv": (1,), "ConvTranspose": (1,), "MatMul": (0, 1), "Gemm": (0, 1), "LayerNormalization": (1,),
              "InstanceNormalization": (1,), "BatchNormalization": (1,), "GroupNormalization": (1,)}
BIAS_OPS = {"Conv": (2,), "ConvTranspose": (2,), "Gemm": (2,), "LayerNormalization": (2,),
            "InstanceNormalization": (2,), "BatchNormalization": (2,), "GroupNormalization": (2,)}
BYTES = {t.name: t.nbytes for t in TYPES if t.weight}  # dtypes.py: the quantized types


def widths(settings: dict) -> dict:
    """What of a variant's settings the estimate depends on, spelled one way (int8 and uint8 weights take a byte
    alike): a task keyed on it re-runs when a bit width changes, not when an override or a calibration setting does."""
    if settings.get("precision") == "fp16":
        return {"precision": "fp16"}
    by_bytes = {1.0: "uint8", 2.0: "uint16", 0.5: "int4"}
    return {"precision": "quantized", "weights": by_bytes[BYTES[settings["weights"]]],
            "activations": settings["activations"]}


def budget_mb(graph: Graph, chip: Chip) -> tuple[float, str]:
    """(MB, where it was set) for one graph's context binary on one chip."""
    if graph.max_context_mb is not None:
        return graph.max_context_mb, f"[graphs.{graph.name}] max_context_mb"
    if chip.max_context_mb is not None:
        return chip.max_context_mb, f"[chips.{chip.name}] max_context_mb of chips.toml"
    return DEFAULT_MAX_CONTEXT_MB, (f"the default; set max_context_mb in [chips.{chip.name}] of chips.toml or "
                                    f"[graphs.{graph.name}] of model.toml")


def role(op_type: str, index: int) -> str:
    """How a node reads a constant input: "weight", "bias" or "other" (an activation-typed constant)."""
    if index in WEIGHT_OPS.get(op_type, ()):
        return "weight"
    if index in BIAS_OPS.get(op_type, ()):
        return "bias"
    return "other"


def constant_bytes(model, variant: dict, nodes=None) -> dict[str, float]:
    """Initializer name -> bytes it takes in the context binary at the variant's precision (see the module doc).
    nodes: only the constants these nodes read (a part of a split graph); default: the whole graph."""
    import numpy as np
    from onnx import helper

    initializers = {i.name: i for i in model.graph.initializer}

    def roles_of(node_list) -> dict[str, set[str]]:
        found: dict[str, set[str]] = {}
        for node in node_list:
            for index, name in enumerate(node.input):
                if name in initializers:
                    found.setdefault(name, set()).add(role(node.op_type, index))
        return found
    whole = roles_of(model.graph.node)  # the quantizer types a constant by all its readers in the whole graph
    roles = whole if nodes is None else roles_of(nodes)
    fp16 = variant.get("precision") == "fp16"
    sizes = {}
    for name, kinds in roles.items():
        tensor = initializers[name]
        count = int(np.prod(tensor.dims)) if tensor.dims else 1
        dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
        # A constant read both as a weight and otherwise (a tied embedding: Gather table and output MatMul) is
        # quantized once, as a weight, and stored once per use (measured: Whisper's decoder holds token_matrix twice)
        copies = len(kinds & {"weight", "other"}) or 1
        typed = whole[name]
        if not np.issubdtype(dtype, np.floating):
            sizes[name] = count * dtype.itemsize
        elif fp16:
            sizes[name] = count * 2.0 * copies
        elif "weight" in typed:
            sizes[name] = count * BYTES[variant["weights"]] * copies
        elif "bias" in typed:
            sizes[name] = count * 4.0
        else:
            sizes[name] = count * BYTES[variant["activations"]]
    return sizes


def estimate(model, variant: dict, nodes=None) -> dict:
    """{"bytes": estimated binary size, "weight_bytes": constants at the variant's precision, "nodes": n}."""
    node_list = list(model.graph.node if nodes is None else nodes)
    weights = sum(constant_bytes(model, variant, node_list).values())
    return {"bytes": int(OVERHEAD_BYTES + OVERHEAD_PER_NODE * len(node_list) + WEIGHT_FACTOR * weights),
            "weight_bytes": int(weights), "nodes": len(node_list)}


def mb(value: float) -> str:
    if value >= 1e7:
        return f"{value / 1e6:.1f} MB"
    return f"{value / 1e6:.2f} MB" if value >= 1e5 else f"{value / 1e3:.1f} KB"
