"""The constant inputs of element-wise ops in a mixed-precision variant (not a stage): quantized at the type their
op runs at, as a W8A16 variant has them.

The HTP takes an element-wise op's inputs in one type: a constant at 8 bit beside 16-bit activations, or at 16 bit
beside 8-bit ones, and QNN runs the op in float. onnxruntime's quantizer gives a constant the variant's type whatever
its op runs at, and one type per initializer however many ops read it. Measured on Whisper tiny.en: the encoder with
every activation at 16 bit over W8A8 kept its positional Add and 4 attention-scale Muls (6.1 % of its weights) in
float; tune's proposal for the decoder (90 of 184 tensors at 16 bit) kept 7 Muls in float, each reading a head-mask
constant shared with Muls of the other type.
"""
from __future__ import annotations

ELEMENTWISE = ("Add", "Sub", "Mul", "Div")


def _node_type(node, override_names: dict[str, str], act_name: str) -> str | None:
    """The one activation type an element-wise node's overridden tensors give it (the variant's when none is
    overridden), or None when they disagree (onnxruntime's fixer converts then; left alone)."""
    types = {override_names[t] for t in (*node.input, *node.output) if t in override_names}
    return act_name if not types else next(iter(types)) if len(types) == 1 else None


def _constant_readers(model, override_names: dict[str, str], initializers: set, act_name: str):
    """(node, the type it runs at, a constant input it reads) of each element-wise node with one type."""
    for node in model.graph.node:
        kind = _node_type(node, override_names, act_name) if node.op_type in ELEMENTWISE else None
        for name in node.input if kind else ():
            if name in initializers and name not in override_names:
                yield node, kind, name


def split_shared(model, override_names: dict[str, str], initializers: set, act_name: str) -> list[str]:
    """Gives each activation type its own copy of a constant that element-wise nodes of different types read (a copy
    for a type other than the variant's is named `<constant>_<onnxruntime type>`, e.g. `mask_QUInt16`); returns the
    new names. Changes `model` and `initializers` in place."""
    from onnx import TensorProto
    readers: dict[str, dict[str, list]] = {}
    for node, kind, name in list(_constant_readers(model, override_names, initializers, act_name)):
        readers.setdefault(name, {}).setdefault(kind, []).append(node)
    by_name = {i.name: i for i in model.graph.initializer}
    added = []
    for name, kinds in readers.items():
        if len(kinds) < 2 or name not in by_name:
            continue
        for kind, nodes in kinds.items():
            if kind == act_name:
                continue
            copy = TensorProto()
            copy.CopyFrom(by_name[name])
            copy.name = f"{name}_{kind}"
            model.graph.initializer.append(copy)
            initializers.add(copy.name)
            added.append(copy.name)
            for node in nodes:
                node.input[:] = [copy.name if i == name else i for i in node.input]
    return added


def like_their_node(model, override_names: dict[str, str], initializers: set, act_name: str) -> dict[str, str]:
    """constant -> the type its element-wise readers run at, where that is not the variant's (after split_shared:
    one type per constant)."""
    return {name: kind for _, kind, name in _constant_readers(model, override_names, initializers, act_name)
            if kind != act_name}
