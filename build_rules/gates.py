"""Whether a measured metric meets its bound: the one place a gate is judged (verify, check, evaluate, report, tune).

A gate is the dict `Threshold.as_dict()` writes: {"metric": name, <bound key>: number}. The bound key gives the
direction, so any metric a hook returns can gate:
  min           higher is better, absolute         max           lower is better, absolute
  max_decrease  higher is better, at most this much below the float model's value
  max_increase  lower is better, at most this much above the float model's value
Standard library only: the report and the tuning stages import this too.
"""
from __future__ import annotations

from .errors import BuildError, did_you_mean

BOUND_KEYS = ("min", "max", "max_decrease", "max_increase")
RELATIVE_KEYS = ("max_decrease", "max_increase")


def bound_key(gate: dict) -> str:
    return next(k for k in BOUND_KEYS if k in gate)


def is_relative(gate: dict) -> bool:
    return bound_key(gate) in RELATIVE_KEYS


def higher_is_better(gate: dict) -> bool:
    return bound_key(gate) in ("min", "max_decrease")


def bound(gate: dict, reference: float | None = None) -> tuple[float, str]:
    """(the value the metric must reach, ">=" or "<="); a relative gate needs the float model's value."""
    key = bound_key(gate)
    if key == "min":
        return float(gate["min"]), ">="
    if key == "max":
        return float(gate["max"]), "<="
    if reference is None:
        raise ValueError(f"gate {describe(gate)} is relative to the float model, whose {gate['metric']} is unknown")
    if key == "max_increase":
        return reference + gate["max_increase"], "<="
    return reference - gate["max_decrease"], ">="


def passes(gate: dict, value: float, reference: float | None = None) -> bool:
    limit, relation = bound(gate, reference)
    return value >= limit if relation == ">=" else value <= limit


def describe(gate: dict) -> str:
    """'accuracy >= 0.98', 'wer <= float + 0.05'."""
    key = bound_key(gate)
    relation = ">=" if higher_is_better(gate) else "<="
    if key in RELATIVE_KEYS:
        sign = "+" if key == "max_increase" else "-"
        return f"{gate['metric']} {relation} float {sign} {gate[key]:g}"
    return f"{gate['metric']} {relation} {gate[key]:g}"


def judge(where: str, gate: dict, measured: dict, reference: dict | None = None) -> float:
    """The gated value; raises BuildError naming the metric, the value, the bound and the gap when it fails.
    measured: every metric the stage measured; reference: the float model's task metrics (relative gates)."""
    metric = gate["metric"]
    if metric not in measured:
        raise BuildError(f"{where}: gate metric '{metric}' was not measured (measured: {', '.join(measured) or 'none'})"
                         f"{did_you_mean(metric, measured)}; a task metric needs a score() hook (per graph) or "
                         "evaluate() (per model) that returns it")
    value = float(measured[metric])
    ref = None
    if is_relative(gate):
        if not reference or metric not in reference:
            raise BuildError(f"{where}: gate {describe(gate)} is relative to the float model, but the float model's "
                             f"{metric} is unknown (the hook returned it only for the compiled model)")
        ref = float(reference[metric])
    limit, relation = bound(gate, ref)
    if (value >= limit) if relation == ">=" else (value <= limit):
        return value
    gap = f"short by {limit - value:.4g}" if relation == ">=" else f"over by {value - limit:.4g}"
    against = f"; float model {ref:.4g}, {describe(gate)}" if ref is not None else ""
    raise BuildError(f"{where}: gate failed: {metric} = {value:.4f}, needs {relation} {limit:.6g} ({gap}{against})")
