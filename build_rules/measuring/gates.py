"""Whether measured metrics meet their bounds: the one place a gate is judged (verify, check, evaluate, report, tune).

A gate is the dict `Threshold.as_dict()` writes: {"metric": name, <bound key>: number}. The bound key gives the
direction, so any metric a hook returns can gate:
  min           higher is better, absolute         max           lower is better, absolute
  max_decrease  higher is better, at most this much below the float model's value
  max_increase  lower is better, at most this much above the float model's value
  max_change    two-sided: within this much of the float model's value, either way
A graph (or [evaluate]) may have several gates; all must pass. Every function taking `gates` takes a list of gates,
one gate dict, or None (no gate), so callers never branch on the form. Standard library only: the report and the
tuning stages import this too.
"""
from __future__ import annotations

from ..errors import BuildError, did_you_mean

BOUND_KEYS = ("min", "max", "max_decrease", "max_increase", "max_change")
RELATIVE_KEYS = ("max_decrease", "max_increase", "max_change")


def as_list(gates) -> list[dict]:
    """None -> [], one gate -> [gate], a list -> the list."""
    if not gates:
        return []
    return [gates] if isinstance(gates, dict) else list(gates)


def metrics(gates) -> list[str]:
    """The metrics these gates bound, each once, in order."""
    return list(dict.fromkeys(g["metric"] for g in as_list(gates)))


def bound_key(gate: dict) -> str:
    return next(k for k in BOUND_KEYS if k in gate)


def is_relative(gate: dict) -> bool:
    return bound_key(gate) in RELATIVE_KEYS


def needs_float(gates) -> bool:
    """Whether judging these gates needs the float model's task metrics."""
    return any(is_relative(g) for g in as_list(gates))


def higher_is_better(gate: dict) -> bool | None:
    """True for min / max_decrease, False for max / max_increase, None for the two-sided max_change."""
    key = bound_key(gate)
    return None if key == "max_change" else key in ("min", "max_decrease")


def limits(gate: dict, reference: float | None = None) -> tuple[float | None, float | None]:
    """(lowest, highest) value that passes; None on an open side. A relative gate needs the float model's value."""
    key = bound_key(gate)
    if key == "min":
        return float(gate["min"]), None
    if key == "max":
        return None, float(gate["max"])
    if reference is None:
        raise ValueError(f"gate {describe(gate)} is relative to the float model, whose {gate['metric']} is unknown")
    if key == "max_increase":
        return None, reference + gate["max_increase"]
    if key == "max_decrease":
        return reference - gate["max_decrease"], None
    return reference - gate["max_change"], reference + gate["max_change"]


def bound(gate: dict, reference: float | None = None) -> tuple[float, str]:
    """(the value the metric must reach, ">=" or "<=") of a one-sided gate."""
    low, high = limits(gate, reference)
    if low is not None and high is not None:
        raise ValueError(f"gate {describe(gate)} is two-sided: use limits()")
    return (low, ">=") if low is not None else (high, "<=")


def passes(gate: dict, value: float, reference: float | None = None) -> bool:
    low, high = limits(gate, reference)
    # A relative limit is computed (0.8 - 0.1 = 0.7000000000000001): a value exactly at it must pass.
    slack = 1e-9 * max(1.0, abs(reference)) if is_relative(gate) else 0.0
    return (low is None or value >= low - slack) and (high is None or value <= high + slack)


def describe(gate: dict) -> str:
    """'accuracy >= 0.98', 'wer <= float + 0.05', 'f1 within 0.1 of float'."""
    key = bound_key(gate)
    if key == "max_change":
        return f"{gate['metric']} within {gate[key]:g} of float"
    relation = ">=" if higher_is_better(gate) else "<="
    if key in RELATIVE_KEYS:
        sign = "+" if key == "max_increase" else "-"
        return f"{gate['metric']} {relation} float {sign} {gate[key]:g}"
    return f"{gate['metric']} {relation} {gate[key]:g}"


def describe_all(gates) -> str:
    """'accuracy >= 0.98 and f1 within 0.1 of float'."""
    return " and ".join(describe(g) for g in as_list(gates))


def results(gates, measured: dict, reference: dict | None = None, stopped: dict | None = None) -> list[dict]:
    """One entry per gate: {"gate": its text, "metric", "value", "float" (relative gates), "low", "high", "passed"},
    and "failure" (the reason, for a message) when it did not pass. passed is None when the gate cannot be judged
    (its metric, or the float model's value of it, was not measured). stopped: the early verdict of a measurement
    that stopped after k of N samples (metrics["partial"]): a metric it did not measure says so (stopped_before)."""
    found = []
    for gate in as_list(gates):
        metric = gate["metric"]
        entry = {"gate": describe(gate), "metric": metric, "value": None, "passed": None}
        found.append(entry)
        if metric not in measured:
            entry["failure"] = stopped_before(metric, stopped) if stopped else not_measured(metric, measured)
            continue
        value = entry["value"] = float(measured[metric])
        ref = None
        if is_relative(gate):
            if not reference or metric not in reference:
                entry["failure"] = (f"gate {describe(gate)} is relative to the float model, but the float model's "
                                    f"{metric} is unknown (the hook returned it only for the compiled model)")
                continue
            ref = entry["float"] = float(reference[metric])
        low, high = limits(gate, ref)
        entry.update(low=low, high=high, passed=passes(gate, value, ref))
        if not entry["passed"]:
            entry["failure"] = _failure(gate, value, low, high, ref)
    return found


def not_measured(metric: str, measured) -> str:
    """Why a gate on `metric` cannot be judged when only `measured` (metric names) were: verify says it before any
    binary is made (the float model's score on the CPU), check on the binary's."""
    return (f"gate metric '{metric}' was not measured (measured: {', '.join(measured) or 'none'})"
            f"{did_you_mean(metric, measured)}; a task metric needs a score() hook (per graph) or "
            "evaluate() (per model) that returns it")


def stopped_before(metric: str, stopped: dict) -> str:
    """Why a gate on `metric` was not judged by a measurement stopped early: the samples it ran had already decided
    that another gate fails, and a score() hook's metrics are measured on every sample or not at all."""
    decided = list(dict.fromkeys(f["metric"] if isinstance(f, dict) else str(f) for f in stopped.get("failed", [])))
    return (f"{metric} not measured: the measurement stopped after {stopped['samples']} of {stopped['of']} samples, "
            f"once {' and '.join(decided) or 'a comparison gate'} failed whatever the other samples give; score() "
            "runs only on a measurement of every sample")


def _failure(gate: dict, value: float, low: float | None, high: float | None, ref: float | None) -> str:
    metric = gate["metric"]
    against = f"; float model {ref:.4g}, {describe(gate)}" if ref is not None else ""
    if low is not None and high is not None:
        gap = f"below by {low - value:.4g}" if value < low else f"above by {value - high:.4g}"
        return f"{metric} = {value:.4f}, needs {low:.6g} to {high:.6g} ({gap}{against})"
    if low is not None:
        return f"{metric} = {value:.4f}, needs >= {low:.6g} (short by {low - value:.4g}{against})"
    return f"{metric} = {value:.4f}, needs <= {high:.6g} (over by {value - high:.4g}{against})"


def passes_all(gates, measured: dict, reference: dict | None = None) -> bool | None:
    """True when every gate passes, False when one fails, None when there is no gate or one cannot be judged."""
    found = results(gates, measured, reference)
    if not found:
        return None
    if any(r["passed"] is False for r in found):
        return False
    return None if any(r["passed"] is None for r in found) else True


def judge(where: str, gates, measured: dict, reference: dict | None = None) -> list[dict]:
    """The gated values (results()); raises BuildError naming every gate that failed: its metric, the value, the
    bound and the gap. measured: every metric the stage measured; reference: the float model's task metrics."""
    found = results(gates, measured, reference)
    failed = [r for r in found if not r["passed"]]
    if len(failed) == 1:  # a gate that could not be judged says why, without "gate failed"
        prefix = "" if failed[0]["passed"] is None else "gate failed: "
        raise BuildError(f"{where}: {prefix}{failed[0]['failure']}")
    if failed:
        raise BuildError(f"{where}: {len(failed)} of {len(found)} gates failed: "
                         + "; ".join(r["failure"] for r in failed))
    return [{k: v for k, v in r.items() if k != "failure"} for r in found]



# --- early verdicts: a gate that fails whatever the samples not yet measured give -----------------------------------
# A measurement over N samples may stop after k of them when the k already decide that a gate FAILS (never that it
# passes: a passing verdict measures every sample). That needs the interval the final value can still take after k
# samples, which follows from the metric (docs/model-toml.md, "Early verdicts"):
#   max_abs       the largest error of any sample: it only grows, so at least its value so far
#   frame_cosine  the lowest cosine of any frame: it only falls, so at most its value so far
#   sqnr          reference power (all N known up front: the float outputs) / noise power, which only grows:
#                 at most 10 log10(all reference power / the noise so far)
#   cosine        of all samples' outputs pooled, the rest unknown but their reference known: at most the largest
#                 cosine any continuation can reach (early_verdicts.py computes it)
# A score hook's task metrics are opaque: they measure every sample unless the hook bounds them (an evaluate hook's
# bound(results, total), stages/evaluate.py). So a min gate on max_abs, or a max gate on cosine, never stops early.
EARLY_METRICS = ("max_abs", "frame_cosine", "sqnr", "cosine")


def early_failure(gates, ranges: dict, done: int, total: int, reference: dict | None = None) -> dict | None:
    """The verdict of a measurement stopped after `done` of `total` samples, when it is already decided: some gate
    fails whatever the other samples give. ranges: metric -> (lowest, highest) value the metric can still take over
    all `total` samples (None on an open side), from what was measured so far. Returns {"samples": done, "of": total,
    "failed": [{"gate", "metric", "low", "high", "failure"}]} or None (not decided, or every sample was measured:
    then the full verdict is judged as always). reference: the float model's values, for relative gates."""
    if done >= total:
        return None
    failed = []
    for gate in as_list(gates):
        metric = gate["metric"]
        if metric not in ranges or (is_relative(gate) and (not reference or metric not in reference)):
            continue
        ref = float(reference[metric]) if is_relative(gate) else None
        low, high = limits(gate, ref)
        can_low, can_high = ranges[metric]
        slack = 1e-9 * max(1.0, abs(low if low is not None else high))  # rounding between a tally and a pooled sum
        short = low is not None and can_high is not None and can_high < low - slack
        over = high is not None and can_low is not None and can_low > high + slack
        if short or over:
            rest = total - done
            where = (f"at most {can_high:.6g}" if short else f"at least {can_low:.6g}") + \
                f" whatever the other {rest} sample{'s' if rest != 1 else ''} give"
            need = f"needs >= {low:.6g}" if short else f"needs <= {high:.6g}"
            failed.append({"gate": describe(gate), "metric": metric, "low": can_low, "high": can_high,
                           "failure": f"{metric} {where}, {need}"})
    return {"samples": done, "of": total, "failed": failed} if failed else None


def describe_early(verdict: dict, so_far: dict) -> str:
    """'failed after 3 of 16 samples (partial: cosine = 0.8412 on those 3; cosine at most 0.879 whatever the
    other 13 samples give, needs >= 0.98)'. so_far: the gated metrics' values on the samples measured."""
    values = ", ".join(f"{f['metric']} = {so_far[f['metric']]:.4f}" for f in verdict["failed"] if f["metric"] in so_far)
    done = verdict["samples"]
    return (f"failed after {done} of {verdict['of']} samples (partial: {values + ' on those ' + str(done) + '; ' if values else ''}"
            + "; ".join(f["failure"] for f in verdict["failed"]) + ")")


def still_decided(metrics: dict, gate_list) -> dict | None:
    """The early verdict of a measurement stopped after k of N samples (metrics["partial"], stages/check.py), judged
    again with `gate_list`: None when it no longer decides that a gate fails (a relaxed gate measures again)."""
    partial = metrics["partial"]
    ranges = {m: tuple(r) for m, r in partial.get("ranges", {}).items()}
    return early_failure(gate_list, ranges, partial["samples"], partial["of"])
