"""The CPU QDQ model as the mixed-precision search's judge of first instance (not a stage): the CPU searches, the
emulator judges (issue 45).

A measurement of a candidate set on the CPU switch model (cpu_ranking.SwitchModel: one session, no quantize or
compile) takes seconds where the emulator takes minutes on a transformer (Whisper tiny.en's encoder: ~3.6 s for 4
clips on the CPU, ~2.8 min on the emulator). It is not the emulator's number: the HTP rounds, fuses and converts
otherwise (research/ort-qnn.md §4). So every point measured on both, on the same samples (the variant at 8 bit and
every candidate at 16 bit first, then each proposal the emulator confirms), gives the difference emulator - CPU of
each target metric, and a CPU number is judged with the least favourable difference seen so far added (the margin):
a CPU measurement "meets" only where the emulator, off by as much as it has been, would meet too. When the emulator
misses a proposal the CPU passed, that point widens the margin and the search runs again, stricter.
"""
from __future__ import annotations

from ...measuring import gates


class Judge:
    """CPU measurements judged against a target with margins learnt from the points measured on both."""

    def __init__(self, switched, target):
        self.cpu, self.target = switched, target  # switched: a cpu_ranking.SwitchModel, or None (record() only)
        self.metrics = gates.metrics(target)
        self.deltas: dict[str, list[float]] = {m: [] for m in self.metrics}
        self.points: list[dict] = []  # {"point", "samples", metric: {"cpu", "emulator"}}

    def learn(self, point: str, sixteen, emulator: dict, indices: list[int]) -> None:
        """The emulator's summary of `sixteen` on `indices` (a partial one: on its first samples): the CPU's on the same
        samples, and their differences."""
        if "not_built" in emulator:
            return
        indices = on_samples(emulator, indices)
        self.record(point, self.cpu.measure(sixteen, indices), emulator, len(indices))

    def record(self, point: str, on_cpu: dict, emulator: dict, samples: int) -> None:
        """One point measured on both, on the same `samples` samples. A binary that does not repeat itself teaches no
        margin (its numbers are the worst of runs that differ: YOLOv8n's all-16-bit cosine 0.9745 where the CPU gave
        0.99965 would have failed every set the CPU tried); it is listed, marked."""
        entry = {"point": point, "samples": samples}
        if emulator.get("unstable"):
            entry["unstable"] = True
        for metric in self.metrics:
            if metric in emulator and metric in on_cpu:
                entry[metric] = {"cpu": on_cpu[metric], "emulator": emulator[metric]}
                if not emulator.get("unstable"):
                    self.deltas[metric].append(emulator[metric] - on_cpu[metric])
        self.points.append(entry)

    def margin(self) -> dict[str, float]:
        """metric -> the difference (emulator - CPU) a CPU number is judged with: the least favourable seen."""
        found = {}
        for gate in gates.as_list(self.target):
            seen = self.deltas.get(gate["metric"]) or [0.0]
            better = gates.higher_is_better(gate)
            found[gate["metric"]] = min(seen) if better else max(seen) if better is False else \
                max(seen, key=abs)
        return found

    def predicted(self, summary: dict) -> dict:
        """The CPU summary with the margin added to each target metric: what the emulator may give at worst."""
        margin = self.margin()
        shifted = dict(summary)
        for metric, delta in margin.items():
            if metric in shifted and isinstance(shifted[metric], (int, float)):
                shifted[metric] = shifted[metric] + delta
        return shifted

    def optimistic(self, summary: dict) -> dict:
        """The CPU summary moved in its favour by the largest difference seen, whatever its sign: what the emulator
        may give at best (a CPU number that misses even so rules the candidate out). Not the most favourable signed
        difference: the points measured on both are of the variant's format, and a rung of another format can be off
        the other way (PP-OCRv4's detector: its W8A8 gave text_iou 0.032 lower on the emulator than on the CPU, its
        LPBQ rung with 33 weights at int8 0.031 higher, 0.906 against 0.874; the signed rule ruled that rung out and
        tune proposed W8A16, 1916.9 KB, where the rung with 17 at int8, 1454.1 KB, met)."""
        shifted = dict(summary)
        for gate in gates.as_list(self.target):
            metric, seen = gate["metric"], self.deltas.get(gate["metric"]) or [0.0]
            better = gates.higher_is_better(gate)
            widest = max(abs(d) for d in seen)
            delta = widest if better else -widest if better is False else min(seen, key=abs)
            if metric in shifted and isinstance(shifted[metric], (int, float)):
                shifted[metric] = shifted[metric] + delta
        return shifted

    def meets(self, sixteen, indices=None) -> bool:
        from .precision import meets
        return meets(self.target, self.predicted(self.cpu.measure(sixteen, indices)))

    def describe(self) -> str:
        return points_text(self.target, self.points)


def points_text(target, points: list[dict]) -> str:
    """'the variant at 8 bit (4 samples): cosine CPU 0.4649 / emulator 0.4704; all at 16 bit (4 samples): ...': how
    well the CPU predicted the emulator, for the log and the proposal's comment."""
    parts = []
    for entry in points:
        values = [f"{m} CPU {entry[m]['cpu']:.5g} / emulator {entry[m]['emulator']:.5g}"
                  for m in gates.metrics(target) if m in entry]
        if values:
            marked = ", does not repeat itself: no margin from it" if entry.get("unstable") else ""
            parts.append(f"{entry['point']} ({entry['samples']} samples{marked}): {', '.join(values)}")
    return "; ".join(parts)


def on_samples(emulator: dict, indices) -> list[int]:
    """The samples an emulator summary was measured on: `indices`, or its first k when it stopped early."""
    partial = emulator.get("partial")
    return list(indices)[:partial["samples"]] if partial else list(indices)


def float_weights(qdq_model, float_model) -> bytes:
    """The QDQ model with every quantized weight and bias of a Conv, ConvTranspose, MatMul or Gemm back in float (the
    float model's, by node name): its activations as quantized, its weights as no weight technique can beat (SeqMSE,
    AdaRound only choose how weights round). Not 16-bit weights: their int32 bias, at the activation scale times the
    weight scale, overflows (YOLOv8n W16A16 gave cosine 0.984 on the CPU, below W4A16 SeqMSE's 0.994)."""
    import onnx

    from ...toolchains import ort_qnn
    model = onnx.load(str(qdq_model))
    source = ort_qnn.preprocessed_model(float_model)
    by_name = {n.name: n for n in source.graph.node if n.name}
    float_inits = {i.name: i for i in source.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    have = {i.name for i in model.graph.initializer}
    added: set[str] = set()
    for node in model.graph.node:
        original = by_name.get(node.name)
        if node.op_type not in ("Conv", "ConvTranspose", "MatMul", "Gemm") or original is None:
            continue
        for k in (1, 2):
            if k >= len(node.input) or k >= len(original.input) or original.input[k] not in float_inits:
                continue
            dq = producers.get(node.input[k])
            if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in have:
                continue
            weight, name = original.input[k], f"{original.input[k]}_build_rules_float"  # (the DQ may have its name)
            if name not in added:
                tensor = onnx.TensorProto()
                tensor.CopyFrom(float_inits[weight])
                tensor.name = name
                model.graph.initializer.append(tensor)
                added.add(name)
            node.input[k] = name
    return model.SerializeToString()


def qdq_summary(c, model, indices: list[int]) -> dict:
    """Summary metrics (as Candidates.measure) of a QDQ model (a file, or bytes) on onnxruntime's CPU EP, on the samples
    `indices` of `c` (a precision.Candidates): a whole-variant rung's CPU number, in seconds."""
    import onnxruntime as ort

    from ..check import summarize
    from ...measuring.samples import compare
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model if isinstance(model, bytes) else str(model), sess_options=options,
                                   providers=["CPUExecutionProvider"])
    names = list(c.reference[0])
    outputs = [dict(zip(names, session.run(names, c.inputs[i]))) for i in indices]
    try:
        metrics = c.metrics(indices, outputs)
    except Exception:  # a score hook that needs the whole set: the comparison metrics only
        metrics = {"samples": len(indices), "outputs": compare([c.reference[i] for i in indices], outputs)}
    summary = summarize(metrics)
    summary["_float_score"] = metrics.get("float_score", {})
    return summary


# What AIMET's SeqMSE recovered over onnxruntime's min-max of the same format, at best, where both were measured
# (Whisper tiny.en's encoder, LPBQ int4 blocks of 64 at 16-bit activations, on the emulator: cosine 0.858 -> 0.955,
# so 1 - cosine shrank 3.2x; W8A8: 0.470 -> 0.469, nothing). A rung whose onnxruntime counterpart misses its
# cosine target by more than RECOVERY times (its 1 - cosine over the target's) is not worth minutes of SeqMSE.
RECOVERY = 4.0


def beyond_recovery(target, counterpart: dict) -> str | None:
    """Why an AIMET SeqMSE rung cannot meet `target` when its onnxruntime counterpart gives `counterpart` (on the
    CPU, margin added): only for cosine and SQNR gates, whose errors SeqMSE shrinks by a bounded factor (RECOVERY,
    measured); None when it might."""
    import math
    for gate in gates.as_list(target):
        metric, low = gate["metric"], gate.get("min")
        if low is None or metric not in counterpart or metric not in ("cosine", "sqnr"):
            continue
        value = counterpart[metric]
        if metric == "cosine" and 1 - value > RECOVERY * (1 - low):
            return (f"its onnxruntime counterpart gives cosine {value:.5g} on the CPU (margin added): 1 - cosine is "
                    f"{(1 - value) / max(1 - low, 1e-12):.1f}x what cosine >= {low:g} allows, more than SeqMSE was "
                    f"seen to recover ({RECOVERY:g}x)")
        if metric == "sqnr" and value < low - 10 * math.log10(RECOVERY):
            return (f"its onnxruntime counterpart gives SQNR {value:.4g} dB on the CPU, more than "
                    f"{10 * math.log10(RECOVERY):.1f} dB below {low:g} dB (SeqMSE was seen to recover at most that)")
    return None
