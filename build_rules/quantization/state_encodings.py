"""One encoding for each state pair of a step graph, whichever quantizer wrote the QDQ model.

A state output (a decoder step's K/V, a recurrent cell's next state) and the input it feeds at the next step get one
scale and zero point, so the app copies the fixed-point output buffer into the input as it is (the bundle's index says
`same_encoding`; dist verify walks greedy steps that way). The encoding is the union of the two calibrated ranges, set
on each tensor and on the tensors its parameters come from: up through ops that pass their input's parameters on (the
Reshape an exporter writes after a Linear), whose ranges join the union so that no shared tensor is clipped.

onnxruntime's quantizer takes the union as tensor overrides before it quantizes (`ort_ranges`); AIMET's QuantSim gets
it as encodings loaded and frozen after its calibration (`tie_aimet`), before the export writes the QDQ model and the
encodings JSON the qairt converters read. Neither quantizer's module imports the other's packages through this one.
"""
from __future__ import annotations

import json
from pathlib import Path

# Ops whose output the QDQ quantizers give their input's scale and zero point (onnxruntime's QDQ registry: Direct8Bit
# ops, Split, Gather...; AIMET's HTP configs leave these outputs unquantized): an override or encoding on such an
# output does not reach it, only one on the tensor it shares with.
PASS_THROUGH_OPS = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Slice", "Split", "Gather",
                    "GatherElements", "Resize", "Pad", "MaxPool", "AveragePool", "TopK")


def chain(model, tensor: str, known, through: tuple[str, ...] = PASS_THROUGH_OPS) -> list[str]:
    """tensor, then the tensors up through pass-through producers that share its parameters, while known(t)."""
    producers = {o: n for n in model.graph.node for o in n.output}
    found = []
    while known(tensor) and tensor not in found:
        found.append(tensor)
        node = producers.get(tensor)
        if node is None or node.op_type not in through or not node.input:
            break
        tensor = node.input[0]
    return found


def tied_tensors(model, pair: tuple[str, str], known) -> list[str]:
    """Every tensor that takes the pair's one encoding: both tensors and their chains (while known(t))."""
    return [t for tensor in pair for t in chain(model, tensor, known)]


def retyped_with(model) -> dict[str, set[str]]:
    """tensor -> the tensors onnxruntime's QNN fixer (MixedPrecisionTensorQuantOverridesFixer) gives its type when
    it is overridden to one other than the default: itself, the outputs of its producer and those of its consumers
    (each such node takes one type on all its tensors, with a convert on an input produced at another type). The
    fixer refuses to retype an output with an override of its own, as each tied tensor has."""
    producer, consumers = {}, {}
    for node in model.graph.node:
        outs = [o for o in node.output if o]
        for o in outs:
            producer[o] = outs
        for i in node.input:
            consumers.setdefault(i, []).append(outs)
    return {t: {t, *producer.get(t, ()), *(o for outs in consumers.get(t, ()) for o in outs)}
            for t in {*producer, *consumers}}


def ort_ranges(model, tied: list[tuple[str, str]], ranges: Path, override_names: dict[str, str], act_name: str,
               activations_known: set[str]) -> dict[str, dict]:
    """onnxruntime: tensor -> {"quant_type", "rmin", "rmax"} overrides that give both tensors of each pair one scale
    and zero point, from the calibrated ranges (onnxruntime's TensorsData JSON) of every tensor in their chains."""
    import numpy as np

    data = json.loads(Path(ranges).read_text()).get("data", {})
    reach = retyped_with(model)
    found = {}
    for pair in tied:
        for tensor in pair:
            if tensor not in activations_known or tensor not in data:
                raise ValueError(f"state tensor {tensor!r} has no calibrated range in {ranges}: it is not an "
                                 "activation of the model (a state input and output must be float graph I/O)")
        tensors = tied_tensors(model, pair, lambda t: t in data)
        types = {override_names.get(t, act_name) for t in tensors}
        if len(types) > 1:
            raise ValueError(f"state tensors {pair[0]!r} and {pair[1]!r} have different override types "
                             f"({', '.join(sorted(types))}): a state output and the input it feeds take one type")
        qtype = types.pop()
        for other, otype in override_names.items():
            hit = [t for t in reach.get(other, ()) if t in tensors]
            if otype not in (qtype, act_name) and hit:  # an override at the default type retypes nothing
                raise ValueError(f"override {other!r} = {otype} makes state tensor {hit[0]!r} {otype} too (it is an "
                                 f"output of a node next to {other!r}), but the state pair {pair[0]!r} -> {pair[1]!r} "
                                 f"is {qtype}: set {', '.join(repr(t) for t in tensors)} to {otype} as well, or "
                                 f"leave {other!r} at {qtype}")
        low = min(float(data[t]["lowest"]["data"][0]) for t in tensors)
        high = max(float(data[t]["highest"]["data"][0]) for t in tensors)
        for tensor in tensors:
            found[tensor] = {"quant_type": qtype, "rmin": np.array(low, dtype=np.float32),
                             "rmax": np.array(high, dtype=np.float32)}
    return found


def tie_aimet(sim, tied: list[tuple[str, str]], where: str) -> list[dict]:
    """AIMET, after compute_encodings: the union of the pair's quantizers' ranges is loaded into each and frozen
    (a later compute_encodings keeps it). Returns {"output", "input", "calibrated" (each quantized tensor's range
    before), "min", "max"} per pair for the stage's report. where: the task, for errors."""
    from ..errors import BuildError
    from aimet_onnx.common.quantsim import create_encoding_from_min_max

    quantizers = sim.qc_quantize_op_dict
    enabled = lambda t: t in quantizers and quantizers[t].enabled  # noqa: E731
    model = sim.model.model  # the sim's graph: a QcQuantizeOp node before each quantized tensor's readers
    report = []
    for output, target in tied:
        tensors = []
        for tensor in (output, target):
            # a graph output behind a pass-through op has a disabled quantizer of its own: its encoding is its
            # producer's input's
            walked = chain(model, tensor, lambda t: True, PASS_THROUGH_OPS + ("QcQuantizeOp",))
            quantized = [t for t in walked if enabled(t)]
            if not quantized:
                raise BuildError(f"{where}: AIMET does not quantize state tensor {tensor!r} (nor a tensor it shares "
                                 "parameters with): a state output and the input it feeds must be float activations")
            tensors += quantized
        kinds = {(quantizers[t].bitwidth, quantizers[t].use_symmetric_encodings, quantizers[t].use_strict_symmetric)
                 for t in tensors}
        if len(kinds) > 1:
            raise BuildError(f"{where}: state tensors {output!r} and {target!r} are quantized differently "
                             f"({', '.join(f'{t}: {quantizers[t].bitwidth} bit' for t in tensors)}): a state output "
                             "and the input it feeds take one type (fix the overrides of the variant)")
        bitwidth, symmetric, strict = kinds.pop()
        encodings = [quantizers[t].get_encodings() for t in tensors]
        if any(not e for e in encodings):
            raise BuildError(f"{where}: state tensor {output!r} or {target!r} has no encoding after calibration")
        calibrated = {t: [float(e[0].min), float(e[0].max)] for t, e in zip(tensors, encodings)}
        low, high = min(r[0] for r in calibrated.values()), max(r[1] for r in calibrated.values())
        for tensor in tensors:
            quantizers[tensor].load_encodings([create_encoding_from_min_max(low, high, bitwidth, symmetric, strict)])
            quantizers[tensor].freeze_encodings()
        report.append({"output": output, "input": target, "calibrated": calibrated, "min": low, "max": high})
    return report
