"""Early verdicts: stop a binary's emulator runs once the samples measured so far decide that a gate fails.

A Tally keeps, per output, running sums of a binary's outputs against the float reference, sample by sample; from
them and the reference outputs of the samples not yet run (all known up front: verify saved them) it gives the
interval each comparison metric of samples.compare can still reach over all samples. gates.early_failure judges
those intervals (which metrics stop early, and why: gates.py). A passing verdict always measures every sample; a
failed one after k of N reports the numbers of the k, marked partial.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

from . import gates


class Tally:
    """What the comparison metrics (cosine, SQNR, max abs, frame cosine; worst over outputs) of all samples can still
    become, after the first k samples' outputs."""

    def __init__(self, reference: list[dict], frames: bool = True):
        import numpy as np
        self.reference, self.frames = reference, frames
        self.done = 0
        self.sums = {name: {"dot": 0.0, "ref": 0.0, "act": 0.0, "noise": 0.0, "max_abs": 0.0, "frame_cosine": 1.0,
                            "ref_total": float(sum(float(np.dot(r[name].astype(np.float64).ravel(),
                                                                r[name].astype(np.float64).ravel()))
                                                   for r in reference))}
                     for name in reference[0]}

    def add(self, outputs: dict) -> None:
        """The next sample's outputs (samples come in order)."""
        import numpy as np

        from .samples import _frame_cosine
        expected = self.reference[self.done]
        for name, s in self.sums.items():
            ref = expected[name].astype(np.float64).ravel()
            act = outputs[name].astype(np.float64).ravel()
            noise = ref - act
            s["dot"] += float(ref @ act)
            s["ref"] += float(ref @ ref)
            s["act"] += float(act @ act)
            s["noise"] += float(noise @ noise)
            s["max_abs"] = max(s["max_abs"], float(np.max(np.abs(noise))) if noise.size else 0.0)
            if self.frames:
                s["frame_cosine"] = min(s["frame_cosine"], _frame_cosine(expected[name], outputs[name]))
        self.done += 1

    def ranges(self) -> dict:
        """metric -> (lowest, highest) its summary value (the worst output's) can still take over all samples."""
        per_output = [_output_ranges(s, self.frames) for s in self.sums.values()]
        found = {}
        for metric in per_output[0]:
            lows = [r[metric][0] for r in per_output]
            highs = [r[metric][1] for r in per_output]
            if metric == "max_abs":  # the worst is the largest
                found[metric] = (max(lows), None)
            else:  # the worst is the smallest
                found[metric] = (None, min(highs))
        return found


def _output_ranges(s: dict, frames: bool) -> dict:
    """One output's intervals (see gates.EARLY_METRICS for why each holds)."""
    total = s["ref_total"]
    rest = max(total - s["ref"], 0.0)
    # cosine of the pooled outputs: the reference so far r1, the rest r2 (known), the actual so far a1, the rest
    # a2 (free). Its supremum over a2 is reached with a2 along r2: with p = <r1,a1>/|a1| (r1's part along a1) and
    # q^2 = |r1|^2 - p^2, it is sqrt(1 - q^2/|r|^2) when p > 0, else |r2|/|r|.
    if total <= 0:
        cosine = 1.0
    else:
        p = s["dot"] / math.sqrt(s["act"]) if s["act"] > 0 else 0.0
        q2 = max(s["ref"] - p * p, 0.0)
        cosine = math.sqrt(max(0.0, 1.0 - q2 / total)) if p > 0 else math.sqrt(rest / total)
    if s["noise"] <= 0:
        sqnr = math.inf
    else:
        sqnr = 10 * math.log10(total / s["noise"]) if total > 0 else -math.inf
    found = {"cosine": (None, cosine), "sqnr": (None, sqnr), "max_abs": (s["max_abs"], None)}
    if frames:
        found["frame_cosine"] = (None, s["frame_cosine"])
    return found


def run_until_decided(runs: Iterator[tuple[int, dict]], reference: list[dict], gate_list,
                      frames: bool = True) -> tuple[list[dict], dict | None]:
    """(the outputs of the samples run, in order; the early verdict, with the "ranges" it was judged on, or None).
    `runs` yields (index, outputs) in
    sample order (emulator_runs.iter_outputs); it is closed at the first sample after which a gate fails whatever
    the other samples give, so those never run. Without a gate on a metric that can stop early, every sample runs."""
    outputs: list[dict] = []
    early = [g for g in gates.as_list(gate_list) if g["metric"] in gates.EARLY_METRICS]
    tally = Tally(reference, frames) if early and reference else None
    with _closing(runs):
        for _, sample in runs:
            outputs.append(sample)
            if tally is None:
                continue
            tally.add(sample)
            ranges = tally.ranges()
            verdict = gates.early_failure(early, ranges, len(outputs), len(reference))
            if verdict is not None:  # the intervals too: a later run judges them against its gates
                return outputs, {**verdict, "ranges": {m: list(r) for m, r in ranges.items()}}
    return outputs, None


def results_until_decided(results: Iterator, bound, gate_list, total: int,
                          reference: dict | None = None) -> tuple[list, dict | None]:
    """The per-sample results of a model-level evaluate hook in its per-sample form (evaluate_sample, in sample
    order), stopped once its optional bound(results, total) -> {metric: (lowest, highest)} (what the metric can still
    be over all `total` samples, given the results so far; None on an open side) decides that a gate fails. Without
    a bound hook, every sample runs: evaluate metrics are opaque (gates.py). reference: the float model's metrics,
    for relative gates. Returns (the results, the early verdict with its "ranges", or None)."""
    done: list = []
    with _closing(results):
        for result in results:
            done.append(result)
            if bound is None or len(done) >= total:
                continue
            ranges = {m: tuple(r) for m, r in bound(list(done), total).items()}
            verdict = gates.early_failure(gate_list, ranges, len(done), total, reference)
            if verdict is not None:
                return done, {**verdict, "ranges": {m: list(r) for m, r in ranges.items()}}
    return done, None


@contextlib.contextmanager
def _closing(iterator):
    """Closes a generator on the way out (its samples not yet run never run); a plain iterable needs nothing."""
    try:
        yield iterator
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
