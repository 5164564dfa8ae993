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

from .errors import BuildError, did_you_mean

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


def results(gates, measured: dict, reference: dict | None = None) -> list[dict]:
    """One entry per gate: {"gate": its text, "metric", "value", "float" (relative gates), "low", "high", "passed"},
    and "failure" (the reason, for a message) when it did not pass. passed is None when the gate cannot be judged
    (its metric, or the float model's value of it, was not measured)."""
    found = []
    for gate in as_list(gates):
        metric = gate["metric"]
        entry = {"gate": describe(gate), "metric": metric, "value": None, "passed": None}
        found.append(entry)
        if metric not in measured:
            entry["failure"] = not_measured(metric, measured)
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

