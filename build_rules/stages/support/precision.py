"""Mixed-precision measurements shared by the sensitivity and tune stages (not a stage itself).

A candidate precision is a set of activation tensors kept at 16 bit, the rest at 8 bit, on top of a variant's
weights, per-channel and calibration settings. Each candidate is quantized from the shared calibration ranges
(no calibration pass), compiled in-process for the tuning chip and run on the HTP emulator: the numbers are
the ones the compiled binary gives (research/ort-qnn.md §4: tune against the emulator, not CPU QDQ).
"""
from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

from ...plumbing.files import scratch_folder
from ...quantization.quant_spec import QuantSpec
from ...measuring import gates
from ..check import measure, summarize, worst_of_runs
from ...emulator.repeats import CANDIDATE_SAMPLES, samples_to_check, shown
from ...emulator.repeats import describe as describe_repeats
from ...measuring.samples import compare, evenly_spaced, load_evaluation, load_labels

SIXTEEN = "uint16"


def delta_db(a: float, b: float) -> float:
    """a - b in dB (SQNRs), 0 when both are infinite (identical tensors), bounded to +-999."""
    if math.isinf(a) and math.isinf(b):
        return 0.0
    return max(min(a - b, 999.0), -999.0)


describe = gates.describe_all


def values(target, summary: dict) -> str:
    """'cosine = 0.99912' (one per gate of the target); 'cosine = 0.91 (stopped after 2 of 8 samples: ...)' when
    the measurement stopped at a decided miss; 'not built: ...' for a candidate the HTP does not build."""
    if "not_built" in summary:
        return f"not built: {summary['not_built']}"
    text = ", ".join(f"{m} = {summary[m]:.5g}" for m in gates.metrics(target) if m in summary)
    partial = summary.get("partial")
    if partial:
        text += f" (stopped after {partial['samples']} of {partial['of']} samples: {'; '.join(partial['failed'])})"
    if summary.get("unstable"):
        text += f" (the worst of its runs: it does not repeat itself, {summary['unstable']})"
    return text


def meets(target, summary: dict) -> bool:
    """Whether every gate of `target` (one gate, a list of them, or None) holds for these measurements. A partial
    summary (measured with this target, stopped once it missed: measured_until_missed) is a miss."""
    if not target:
        return True
    if "partial" in summary or "not_built" in summary:  # a binary that does not build cannot ship: a miss
        return False
    if summary.get("unstable"):  # other outputs on another run: whatever one run gave, it cannot be relied on
        return False
    for gate in gates.as_list(target):
        if gate["metric"] not in summary:
            raise KeyError(f"target metric {gate['metric']!r} was not measured (measured: {', '.join(summary)})")
    verdict = gates.passes_all(target, summary, summary.get("_float_score", {}))
    if verdict is None:  # a relative target without the float model's value: never count it as met
        raise ValueError(f"target {describe(target)} cannot be judged: the float model's value is unknown")
    return verdict


class _Once(logging.Filter):
    """Lets each message through once: onnxruntime's quantizer warns the same lines (pre-processing, opset 21,
    'Axis 1 is out-of-range' for each LayerNorm weight) at every candidate it quantizes, which was 392-708 of the
    600-1679 lines of a Whisper tune log."""

    def __init__(self):
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in self.seen:
            return False
        self.seen.add(message)
        return True


def _warn_once() -> None:
    root = logging.getLogger()  # onnxruntime.quantization warns through the root logger (logging.warning)
    if not any(isinstance(f, _Once) for f in root.filters):
        root.addFilter(_Once())


class Candidates:
    """Quantize + emulate one graph of one variant under different sets of 16-bit activation tensors."""

    def __init__(self, graph: dict, chip: dict, samples: int, hooks: str, data_dir=None):
        _warn_once()
        self.graph = graph  # {"name", "onnx", "ranges", "evaluation", "variant": settings_for(graph)}
        self.chip = chip
        self.hooks, self.data_dir = hooks, data_dir
        self.inputs, self.reference = load_evaluation(graph["evaluation"])
        self.labels = load_labels(graph["evaluation"])
        self.subset = evenly_spaced(len(self.inputs), samples)
        self.work = scratch_folder(self, f"tuning-{graph['name']}-")
        self.evaluations = 0
        self.seconds = 0.0
        self.clock = 0.0  # the measurements' seconds as they ran (remembered ones too): what time budgets read
        self.remembered = 0  # measurements an earlier tune made (tune_memo.py), counted in evaluations
        self._memo: dict = {}
        self._disk = None  # tune_memo's emulator memo of this graph's candidates (disk())
        self._base: Path | None = None  # the all-8-bit QDQ model (base())
        self.score_on_subset = True
        variant = graph["variant"]
        # Tensors the variant itself pins to a type keep it; every other tensor is 8 or 16 bit as asked.
        self.pinned = dict(variant.get("overrides", {}))
        # A step graph's state pairs: quantized with one encoding, as the build's quantize does (state_encodings.py)
        self.tied = [tuple(pair) for pair in graph.get("tied") or []]
        # A search judged by a target (mixed_precision.py) counts a candidate the HTP does not build as a miss;
        # a ranking (sensitivity) cannot place it and stops with the message (measure()).
        self.not_built_is_a_miss = False
        self.candidates = self._candidates()
        # Graph inputs that go to 16 bit with their consumers: the HTP refused a mix with them at 8 bit beside a
        # 16-bit consumer (QNN_COMMON_ERROR_MEM_ALLOC: the labelled classifier's x into its first Gemm) and built it
        # with them at 16 bit, as W8A16 has them. Learnt by measure(); closed() adds them.
        self.inputs_at_16: set[str] = set()
        # Samples a full-set trial runs twice (None: as many as a binary's). A search lowers it to
        # repeats.CANDIDATE_SAMPLES once both ends repeated themselves on every sample (ends_repeat()).
        self.full_repeats: int | None = None

    def _candidates(self) -> list[str]:
        """Activation tensors the quantizer calibrates, except graph inputs (the binary's input format stays;
        a state input goes with its output, closed() below) and tensors the variant already pins."""
        from ...toolchains import ort_qnn
        from ...quantization.state_encodings import retyped_with, tied_tensors
        model = ort_qnn.preprocessed_model(self.graph["onnx"])
        ranges = json.loads(Path(self.graph["ranges"]).read_text())
        calibrated = set((ranges.get("data") or ranges.get("tensors") or {}).keys()) if isinstance(ranges, dict) else set()
        self._neighbours = retyped_with(model)
        self._tied_groups = [set(tied_tensors(model, pair, lambda t: t in calibrated)) for pair in self.tied]
        self.graph_inputs = [i.name for i in model.graph.input]
        fixed = set(self.graph_inputs) | set(self.pinned)
        order = []
        for node in model.graph.node:
            for out in node.output:
                if out and out in calibrated and out not in fixed and out not in order:
                    order.append(out)
        return order

    def closed(self, sixteen) -> set[str]:
        """`sixteen` with every state pair it touches at 16 bit too: the state output, the input it feeds and the
        tensors sharing their encoding take one type (state_encodings.py), and a 16-bit tensor next to one of them
        retypes it (onnxruntime's fixer, effective(), which refuses to where the tensor has an override of its own:
        the pair's). The state input of the binary is then 16 bit, as the app's copy of its output."""
        found = set(sixteen)
        while True:
            reach = set().union(*(self._neighbours.get(t, {t}) for t in found)) if found else set()
            more = set().union(*(g for g in self._tied_groups if g & reach and not g <= found)) - found
            more |= {i for i in self.inputs_at_16 - found if self._neighbours.get(i, set()) & reach}
            if not more:
                return found
            found |= more

    def inputs_beside(self, sixteen) -> list[str]:
        """The graph inputs kept at the variant's type next to a 16-bit node of `sixteen`."""
        effective, closed = self.effective(sixteen), self.closed(sixteen)
        return [i for i in self.graph_inputs if i not in self.pinned and i not in closed
                and self._neighbours.get(i, set()) & effective]

    def effective(self, sixteen) -> set[str]:
        """The candidate tensors the quantizer writes at 16 bit when `sixteen` are asked for: a 16-bit tensor makes
        every output of its producer and of its consumers 16 bit too (onnxruntime's
        MixedPrecisionTensorQuantOverridesFixer gives such a node the same type on all inputs and outputs, with a
        convert on an input whose producer stays 8-bit: that input's values keep 8-bit precision)."""
        candidates = set(self.candidates)
        return set().union(*(candidates & self._neighbours.get(t, {t}) for t in self.closed(sixteen)))

    def producers(self) -> dict[str, tuple[str, str]]:
        """tensor -> (node name, op type)."""
        from ...toolchains import ort_qnn
        model = ort_qnn.preprocessed_model(self.graph["onnx"])
        return {o: (n.name, n.op_type) for n in model.graph.node for o in n.output if o}

    def quantize(self, sixteen, path: Path, extra_outputs=None) -> Path:
        """The graph at 8-bit activations with `sixteen` (and the variant's pinned overrides) at 16 bit, by
        onnxruntime from the shared ranges; the weights as the variant has them (its weight overrides and LPBQ
        blocks too): the search is over activation types only."""
        from ..quantize import write_qdq
        overrides = dict(self.pinned)
        overrides.update({t: SIXTEEN for t in self.closed(sixteen)})
        spec = QuantSpec.from_settings(self.graph["variant"]).replace(
            activations="uint8", overrides=overrides, quantizer="ort", techniques=(), technique_params={})
        write_qdq(spec, self.graph["onnx"], path, [], ranges=self.graph["ranges"], tied=self.tied or None,
                  extra_outputs=extra_outputs)
        return path

    def run(self, model: Path, indices: list[int], repeat_samples: int | None = None) -> list[dict]:
        """The model's outputs on the samples, on the emulator (across its workers, through its output memo)."""
        return [outputs for _, outputs in self.iter_run(model, indices, repeat_samples)]

    def iter_run(self, model: Path, indices: list[int], repeat_samples: int | None = None):
        """(position, repeats.Outputs) of each sample in `indices`, in order; closing it stops the rest (an early
        miss). repeat_samples: how many of the candidate's samples run twice (repeats.py; default: a whole binary's)."""
        from ...emulator.emulator_runs import iter_model_outputs
        kept = list(self.reference[0])  # the graph's outputs (a QDQ model may have more)
        runs = iter_model_outputs(model, [self.inputs[i] for i in indices], soc_model=self.chip["soc_id"],
                                  vtcm_mb=self.chip["vtcm_mb"], repeat_samples=repeat_samples)
        try:
            for position, outputs in runs:
                yield position, outputs.only(kept)
        finally:
            runs.close()

    def metrics(self, indices: list[int], outputs: list[dict]) -> dict:
        """check.measure of `outputs` (for the evaluation samples `indices`: a binary's, a candidate's on the CPU)
        against the float reference, the score hook given those samples' inputs and labels. Every measurement of
        tune and sensitivity goes through here, so none can leave the labels out."""
        inputs, reference = [self.inputs[i] for i in indices], [self.reference[i] for i in indices]
        labels = None if self.labels is None else [self.labels[i] for i in indices]
        return measure(self.hooks, self.graph["name"], self.data_dir, inputs, reference, outputs, labels)

    def measure(self, sixteen, full: bool = False, target=None, end: bool = False) -> dict:
        """Summary metrics (cosine, sqnr, max_abs, task metrics) with `sixteen` at 16 bit. With `target`, the runs
        stop once the samples so far decide that it is missed: then the summary is partial (meets() says a miss).
        Whether it repeats itself is checked on its first few samples (repeats.CANDIDATE_SAMPLES), on as many as a
        binary's for an `end` (all at 8 or 16 bit: what everything else is compared with) and for the full set
        unless the ends repeated themselves (full_repeats)."""
        key = (frozenset(self.closed(sixteen)), full)
        if key in self._memo and answers(self._memo[key], target):
            return self._memo[key]
        started = time.perf_counter()
        indices = list(range(len(self.inputs))) if full else self.subset
        if key in self._memo and "not_built" in self._memo[key]:
            return self._not_built(self._memo[key])
        # every sample of the full set can decide; a trial on the subset checks its first few (repeats.py)
        repeat = None if end else self.full_repeats if full else CANDIDATE_SAMPLES
        twice = min(len(indices), samples_to_check() if repeat is None else repeat)
        kept = self.disk().get(key[0], tuple(indices), twice)
        if kept is not None and answers(kept[0], target):  # an earlier tune measured it: not quantized nor run
            self.evaluations += 1
            self.remembered += 1
            self.clock += kept[1]
            self._memo[key] = kept[0]
            return kept[0]
        from ...emulator.emulator_runs import EmulatorCompileError
        model = self.quantize(sixteen, self.work / "candidate.onnx")
        reference = [self.reference[i] for i in indices]
        try:
            outputs, missed = measured_until_missed(self.iter_run(model, indices, repeat), reference, target)
        except EmulatorCompileError as e:  # QNN refused the candidate's graph (seen: a graph input kept 8 bit
            self.evaluations += 1          # converted to 16 bit for a Gemm fails to finalize, MEM_ALLOC)
            self.seconds += time.perf_counter() - started
            beside = self.inputs_beside(sixteen)
            if beside:  # the inputs beside go to 16 bit with their consumers, from now on, and it is tried again
                refused = self.why_not_built(sixteen, e)
                self.inputs_at_16 |= set(beside)
                print(f"{self.graph['name']}: {refused}; measured with graph input"
                      f"{'s' if len(beside) > 1 else ''} {', '.join(beside)} at 16 bit too, as W8A16 has "
                      f"{'them' if len(beside) > 1 else 'it'} (from now on, whenever a consumer is at 16 bit)",
                      flush=True)
                return self.measure(sixteen, full=full, target=target, end=end)
            self._memo[key] = {"not_built": self.why_not_built(sixteen, e)}
            return self._not_built(self._memo[key])
        summary = unstable_marked(missed, outputs) if missed is not None else \
            self.summary(indices, outputs, target, full)
        took = time.perf_counter() - started
        self.evaluations += 1
        self.seconds += took
        self.clock += took
        self._memo[key] = summary
        self.disk().put(key[0], tuple(indices), summary, took, twice)
        return summary

    def base(self) -> Path:
        """The graph quantized with every candidate at 8 bit, once (the memo's key and the CPU switch model's start:
        a quantize of Whisper's decoder takes seconds). Read it, do not write it."""
        if self._base is None:
            self._base = self.quantize(set(), self.work / "base.qdq.onnx")
        return self._base

    def disk(self):
        """tune_memo's emulator memo of this graph's candidates: keyed by the all-8-bit QDQ model every candidate
        is quantized from (and the chip, samples, hooks, runtime)."""
        if self._disk is None:
            from . import tune_memo
            self._disk = tune_memo.emulator_memo(tune_memo.emulator_key(
                self.base().read_bytes(), self.graph["evaluation"], self.hooks, self.data_dir, self.chip))
        return self._disk

    def listed(self, kept, order: list[str]) -> tuple[list[str], list[str], list[str]]:
        """(the candidates of `kept` in `order`, the state tensors and the graph inputs closed() adds to them): what
        a proposal lists at 16 bit, in that order."""
        closed = self.closed(kept)
        inputs = [i for i in self.graph_inputs if i in closed]
        return [t for t in order if t in closed], sorted(closed - set(order) - set(inputs)), inputs

    def ends_repeat(self, *ends: dict) -> None:
        """The ends' summaries (measured with end=True): when none was marked unstable, the full-set trials from now
        on run only their first CANDIDATE_SAMPLES samples twice. The proposal is judged again as built, every sample
        of its binary twice (tune_confirm.py); twice on every trial doubled each of Whisper's encoder measurements
        (4 clips of 27 s on 2 workers: 108 s, against 81 s). A graph whose 16-bit end does not repeat itself
        (YOLOv8n's w8a16) keeps every trial on as many as a binary's."""
        if all("unstable" not in end for end in ends):
            self.full_repeats = CANDIDATE_SAMPLES

    def summary(self, indices: list[int], outputs: list, target, full: bool) -> dict:
        """The summary metrics of `outputs` (repeats.Outputs of the samples `indices`): of each run and the worst of
        them when a sample gave other outputs on another run (marked "unstable": a miss); the score hook's task
        metrics unless the hook insists on the whole evaluation set (then on the full set only)."""
        found = shown(outputs)
        runs = found["runs"] if found and found["repeats"] is False else 1
        reference = [self.reference[i] for i in indices]
        per_run = []
        for r in range(runs):
            run = [o.run(r) for o in outputs]
            metrics = None
            if full or self.score_on_subset:
                try:
                    metrics = self.metrics(indices, run)
                except Exception as e:  # a score hook may insist on the whole evaluation set
                    if full:
                        raise
                    print(f"score hook on {len(indices)} of {len(self.inputs)} samples failed ({e}): task metrics "
                          "are measured on the full set only", flush=True)
                    self.score_on_subset = False
            per_run.append(metrics or {"samples": len(indices), "outputs": compare(reference, run)})
        metrics = worst_of_runs(per_run, target)
        summary = summarize(metrics)
        summary["_float_score"] = metrics.get("float_score", {})
        return unstable_marked(summary, outputs)

    def why_not_built(self, sixteen, error) -> str:
        """One line: what was at 16 bit, the graph inputs kept at the variant's type beside 16-bit nodes, and QNN's
        error (its first line)."""
        effective = sorted(self.effective(sixteen))
        names = ", ".join(effective[:4]) + (f" and {len(effective) - 4} more" if len(effective) > 4 else "")
        beside = self.inputs_beside(sixteen)
        raised = sorted(self.inputs_at_16 & self.closed(sixteen))
        inputs = (f"; graph input{'s' if len(beside) > 1 else ''} {', '.join(beside)} kept at 8 bit beside them"
                  if beside else f"; graph input{'s' if len(raised) > 1 else ''} {', '.join(raised)} at 16 bit too"
                  if raised else "")
        qnn = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return (f"the HTP of {self.chip['name']} does not build {self.graph['name']} with {len(effective)} activation "
                f"tensor{'s' if len(effective) != 1 else ''} at 16 bit ({names}){inputs}: {qnn}")

    def _not_built(self, summary: dict) -> dict:
        if self.not_built_is_a_miss:
            return summary
        from ...errors import BuildError
        raise BuildError(f"{summary['not_built']}; this candidate cannot be measured")


def unstable_marked(summary: dict, outputs: list) -> dict:
    """`summary` marked "unstable" (why, in words) when a sample of `outputs` gave other outputs on another run."""
    found = shown(outputs)
    if found and found["repeats"] is False:
        summary["unstable"] = describe_repeats(found)
    return summary


def answers(summary: dict, target) -> bool:
    """Whether a remembered summary answers a measurement for `target`: a full one always; a partial one while its
    numbers still decide that `target` is missed."""
    if "partial" not in summary:
        return True
    partial = summary["partial"]
    ranges = {m: tuple(r) for m, r in summary["_ranges"].items()}
    return target is not None and gates.early_failure(target, ranges, partial["samples"], partial["of"]) is not None


def measured_until_missed(runs, reference: list[dict], target) -> tuple[list[dict], dict | None]:
    """(the outputs run; the partial summary of a decided miss, or None when every sample ran). `runs` yields
    (position, outputs) in order and is closed at the first sample after which `target` is missed whatever the
    other samples give (early_verdicts.py): a rung or probe that misses stops there, one that meets runs them all."""
    from ...measuring.early_verdicts import run_until_decided
    outputs, early = run_until_decided(runs, reference, target)
    if early is None:
        return outputs, None
    done = len(outputs)
    summary = summarize({"samples": done, "outputs": compare(reference[:done], outputs, frames=True)})
    summary.update(_float_score={}, _ranges=early["ranges"],
                   partial={"samples": done, "of": early["of"], "failed": [f["failure"] for f in early["failed"]]})
    return outputs, summary


def search(c: "Candidates", target) -> bool:
    """Whether searching for `target` must use the full evaluation set (the subset cannot measure its metrics)."""
    metrics = [g["metric"] for g in gates.as_list(target) if g["metric"] not in ("cosine", "sqnr", "max_abs")]
    if not metrics:
        return False
    return any(m not in c.measure(set()) for m in metrics) or not c.score_on_subset


def clean(summary: dict) -> dict:
    """Summary without private keys, JSON-safe (inf -> a large number)."""
    out = {}
    for k, v in summary.items():
        if k.startswith("_"):
            continue
        out[k] = 999.0 if v == float("inf") else v
    return out
