"""Mixed precision on the CPU (not a stage): rank activation tensors in seconds, before the emulator confirms.

One onnxruntime CPU session of the variant's QDQ model with every candidate tensor at 8 bit, in which each
candidate's 8-bit Quantize/DequantizeLinear pair gets a switch: a boolean scalar graph input `s` and
    y = where(s, clip(x, lo, hi), dq8)
where x is the float tensor the pair quantizes, dq8 its 8-bit value and [lo, hi] the 8-bit grid's range. s = false
is the 8-bit tensor (the QDQ model exactly as quantize() wrote it); s = true is the tensor at 16 bit, taken as its value
clipped to the same range (a 16-bit step is 1/257 of the 8-bit one: its rounding is left out, the clipping, which
a folded Relu relies on, is kept). So one session measures any set of 16-bit tensors in one run per sample,
without quantizing or compiling anything: 0.13 s of CPU a sample on PP-OCRv4's detector (297 tensors), where the
emulator takes 0.8 s (activations at 8 bit) to 20 s (at 16 bit) a sample, plus 5-10 s to quantize and compile
each set. The quantizer's own rule decides which tensors a set makes 16 bit (precision.Candidates.effective).

What it cannot see: anything the HTP does differently from the CPU (research/ort-qnn.md §4: HTP u8 deviates more
than CPU QDQ, fused ops, the converts between 8- and 16-bit neighbours). Its numbers order the emulator's work;
they never decide a result.
"""
from __future__ import annotations

import time

from . import tune_memo

SWITCH = "build_rules_16bit_switch_"  # prefix of the switch inputs (one scalar per candidate tensor)


class SwitchModel:
    """The all-8-bit CPU QDQ model of a Candidates object, with one 8/16-bit switch per candidate tensor."""

    def __init__(self, c):
        import numpy as np
        import onnx
        from onnx import helper, numpy_helper

        from ...toolchains import ort_qnn

        self.c = c
        self.evaluations = 0
        self.seconds = 0.0
        self.ranked_on = None  # samples the ranking ran on (costs())
        self._memo: dict = {}
        started = time.perf_counter()
        model = onnx.load(str(c.base()))
        graph = model.graph
        inits = {i.name: i for i in graph.initializer}
        consumers: dict[str, list] = {}
        for node in graph.node:
            for i in node.input:
                consumers.setdefault(i, []).append(node)
        by_name = {n.name: n for n in graph.node}
        outputs = {o.name for o in graph.output}
        self.switches: dict[str, str] = {}  # candidate tensor -> its switch input
        after: dict[str, list] = {}  # DequantizeLinear node name -> the switch nodes that follow it
        for j, tensor in enumerate(c.candidates):
            q = by_name.get(f"{tensor}_QuantizeLinear")
            if q is None or q.op_type != "QuantizeLinear" or len(q.input) < 3 or q.input[1] not in inits:
                continue  # not quantized as one pair (e.g. fused away): the emulator still measures it
            dqs = [n for n in consumers.get(q.output[0], []) if n.op_type == "DequantizeLinear"]
            if len(dqs) != 1 or not dqs[0].name:
                continue
            dq = dqs[0]
            scale = numpy_helper.to_array(inits[q.input[1]]).astype(np.float64)
            zero = numpy_helper.to_array(inits[q.input[2]])
            if scale.size != 1:
                continue  # per-channel activations: not written by the QNN recipe
            info = np.iinfo(zero.dtype)
            zero = int(zero.reshape(-1)[0])
            lo, hi = float((info.min - zero) * scale.reshape(-1)[0]), float((info.max - zero) * scale.reshape(-1)[0])
            switch = f"{SWITCH}{j}"
            value, mixed = dq.output[0], f"{dq.output[0]}_build_rules_mixed"
            if value in outputs:  # keep the graph output's name on the switched value
                dq.output[0] = f"{value}_build_rules_8bit"
                value, mixed = dq.output[0], value
            else:
                for node in consumers.get(value, []):
                    node.input[:] = [mixed if i == value else i for i in node.input]
            lo_name, hi_name = f"{switch}_lo", f"{switch}_hi"
            graph.initializer.extend([numpy_helper.from_array(np.array(lo, np.float32), lo_name),
                                      numpy_helper.from_array(np.array(hi, np.float32), hi_name)])
            clipped = f"{switch}_clip"
            after[dq.name] = [helper.make_node("Clip", [q.input[0], lo_name, hi_name], [clipped], name=clipped),
                              helper.make_node("Where", [switch, clipped, value], [mixed], name=f"{switch}_where")]
            graph.input.append(helper.make_tensor_value_info(switch, onnx.TensorProto.BOOL, []))
            self.switches[tensor] = switch
        nodes = [n for node in graph.node for n in [node, *after.get(node.name, [])]]
        del graph.node[:]
        graph.node.extend(nodes)  # each switch right after its pair: the graph stays topologically sorted
        ort = ort_qnn._ort()
        options = ort.SessionOptions()
        options.log_severity_level = 3
        serialized = model.SerializeToString()
        self.session = ort.InferenceSession(serialized, sess_options=options, providers=["CPUExecutionProvider"])
        self.names = list(c.reference[0])
        # measured by an earlier tune of the same switch model, samples, hooks and runtime: not run again
        self.disk = tune_memo.TuneMemo(tune_memo.cpu_key(serialized, c.graph["evaluation"], c.hooks, c.data_dir))
        self.remembered = 0  # measurements taken from it (they count as evaluations: the search takes one path)
        self.last_seconds = 0.0  # what the last measurement took (a remembered one: when it ran)
        self.clock = 0.0  # the measurements' seconds as they ran (remembered ones too): what time budgets read
        self.build_seconds = time.perf_counter() - started

    def measure(self, sixteen, indices=None) -> dict:
        """Summary metrics (as Candidates.measure) with `sixteen` asked for at 16 bit (and the neighbours the
        quantizer adds, Candidates.effective), on the CPU, on the tuning samples (or the evaluation samples
        `indices`)."""
        import numpy as np

        from ..check import summarize
        from ...measuring.samples import compare

        c = self.c
        indices = list(c.subset if indices is None else indices)
        key = (frozenset(t for t in c.effective(sixteen) if t in self.switches), tuple(indices))
        if key in self._memo:
            summary, self.last_seconds = self._memo[key]
            return summary
        kept = self.disk.get(*key)
        if kept is not None:
            self.evaluations += 1
            self.remembered += 1
            self._memo[key] = kept
            summary, self.last_seconds = kept
            self.clock += self.last_seconds
            return summary
        started = time.perf_counter()
        switches = {s: np.array(t in key[0]) for t, s in self.switches.items()}
        outputs = [dict(zip(self.names, self.session.run(self.names, {**c.inputs[i], **switches}))) for i in indices]
        try:
            metrics = c.metrics(indices, outputs)
        except Exception:  # as on the emulator: a score hook that needs the whole set gives no task metric here
            metrics = {"samples": len(indices), "outputs": compare([c.reference[i] for i in indices], outputs)}
        summary = summarize(metrics)
        summary["_float_score"] = metrics.get("float_score", {})
        self.evaluations += 1
        self.last_seconds = time.perf_counter() - started
        self.seconds += self.last_seconds
        self.clock += self.last_seconds
        self._memo[key] = (summary, self.last_seconds)
        self.disk.put(*key, summary, self.last_seconds)
        return summary


# A ranking expected to take longer than this on the tuning samples runs on the first of them: the ranking only
# orders the search, which the CPU then runs on every tuning sample. Measured on Whisper tiny.en's encoder (135 CPU
# runs, docs/benchmarks.md): 1 clip 384 s, 4 clips 1002 s (loaded machine); Spearman 0.743 against 4 clips' order,
# 19 of its top 32 shared, and the top-k steps that order serves all missed there on either.
RANKING_SECONDS = 300.0


def costs(switched: SwitchModel, tensors: list[str], target=None) -> dict[str, dict]:
    """Per tensor on the CPU: cpu_gain_db (SQNR won when only it is asked for at 16 bit) and cpu_cost_db (SQNR lost
    when only it is left at 8 bit). A tensor whose neighbours make it 16 bit anyway (Candidates.effective) costs 0
    without a run: in the graphs tried, all but the first tensor after an input. None: no switch (not quantized
    as one Q/DQ pair). With a `target` whose task metric the 8-bit model misses (a score hook's det_f1, say), also
    cpu_gain_target: how much of that metric this tensor alone at 16 bit wins. An output's SQNR can hide what a task
    metric sees: YOLOv8n's class scores share one output with boxes 320x their range, and the score Sigmoid ranked
    182nd of 242 by SQNR while it alone at 16 bit (with the output) lifts det_f1 from 0.69 to 0.97.
    On the first tuning sample only when the ranking would take longer than RANKING_SECONDS on all of them and no
    task metric is missed (switched.ranked_on says on how many it ran)."""
    from ...plumbing import progress
    from .precision import delta_db
    c = switched.c
    out = {}
    # Two CPU runs a tensor over the tuning samples: Whisper's encoder took 954.6 s for 132 tensors, which the
    # console showed as "1 emulator measurements" for 16 minutes. The count stays on the line after the ranking, until
    # the next graph's search starts (mixed_precision.search clears it).
    progress.watch(lambda: len(out), f"tensors of {c.graph['name']} ranked on the CPU", len(tensors), slot="cpu ranking",
                   time_left=True)
    everything = set(tensors)
    top = switched.measure(everything)
    base = switched.measure(set())
    missed = _missed_task_gate(target, base) if target else None
    indices = None  # the tuning samples
    # (the pace of a run when it ran, also when it comes from an earlier tune: the same samples as then)
    if not missed and len(c.subset) > 1 and 2 * len(tensors) * switched.last_seconds > RANKING_SECONDS:
        indices = list(c.subset[:1])  # (a task metric's gain needs every tuning sample: kept on them all)
        top, base = switched.measure(everything, indices), switched.measure(set(), indices)
    switched.ranked_on = len(indices or c.subset)
    all_16 = c.effective(everything)
    for t in tensors:
        if t not in switched.switches and not (c.effective({t}) & set(switched.switches)):
            out[t] = {"cpu_cost_db": None, "cpu_gain_db": None}
            continue
        covered = c.effective(everything - {t}) == all_16
        cost = 0.0 if covered else delta_db(top["sqnr"], switched.measure(everything - {t}, indices)["sqnr"])
        alone = switched.measure({t}, indices)
        out[t] = {"cpu_cost_db": round(cost, 3),
                  "cpu_gain_db": round(delta_db(alone["sqnr"], base["sqnr"]), 3)}
        if missed:
            out[t]["cpu_gain_target"] = round(_gained(missed, alone, base), 6)
    return out


def _missed_task_gate(target, base: dict):
    """The first gate of `target` on a task metric (not cosine / SQNR / max abs / frame cosine) that the all-8-bit
    CPU model misses, or None."""
    from ...measuring import gates
    comparison = ("cosine", "sqnr", "max_abs", "frame_cosine")
    for gate in gates.as_list(target):
        if gate["metric"] in comparison or gate["metric"] not in base:
            continue
        try:
            if not gates.passes(gate, base[gate["metric"]], (base.get("_float_score") or {}).get(gate["metric"])):
                return gate
        except ValueError:  # relative to the float model, whose value is unknown here
            continue
    return None


def _gained(gate: dict, alone: dict, base: dict) -> float:
    """How far `alone` moved the gate's metric the right way from `base` (0: not measured)."""
    from ...measuring import gates
    metric = gate["metric"]
    if metric not in alone:
        return 0.0
    better = gates.higher_is_better(gate)
    moved = alone[metric] - base[metric]
    return moved if better is not False else -moved


def order(tensors: list[str], cpu: dict[str, dict]) -> list[str]:
    """The tensors that alone win a missed task metric (cpu_gain_target > 0) first, most first; then most costly at
    8 bit (then most gained at 16 bit alone, then graph order); tensors the CPU could not switch last, in graph
    order."""
    position = {t: i for i, t in enumerate(tensors)}

    def key(t):
        row = cpu.get(t) or {}
        if row.get("cpu_cost_db") is None:
            return (2, 0.0, 0.0, 0.0, position[t])
        task = row.get("cpu_gain_target") or 0.0
        return (0 if task > 0 else 1, -task, -row["cpu_cost_db"], -(row.get("cpu_gain_db") or 0.0), position[t])
    return sorted(tensors, key=key)

