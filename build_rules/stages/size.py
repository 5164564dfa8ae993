"""Stage size: will each variant of a graph fit one context binary on each of its chips? Checked before anything is
quantized or compiled, from the float graph: the estimate (build_rules/context_size.py: weights at the variant's bit
widths plus the overhead fitted to this repo's binaries) against the budget (`max_context_mb` of the graph, else of
the chip, else the default). Over it, the build stops here naming graph, variant, chip, estimate and budget, and the
fixes: lower-bit weights, or `split`. -> out/<model>/float/<graph>.size.json (each variant's estimate).

Graphs with [graphs.X] split are checked part by part in the split stage instead.
"""
from __future__ import annotations

import math

from .. import context_size
from ..errors import BuildError
from ..files import atomic_write_json

VERSION = 1


def run(params: dict) -> dict:
    import onnx
    model = onnx.load(params["onnx"])
    estimates = {v: context_size.estimate(model, settings) for v, settings in params["variants"].items()}
    atomic_write_json(params["outputs"]["report"], {"graph": params["graph"], "estimates": estimates,
                                                    "budgets": params["budgets"]})
    for variant, chips in params["budgets"].items():
        estimate = estimates[variant]
        for chip, (budget_mb, source) in chips.items():
            if estimate["bytes"] > budget_mb * 1e6:
                raise BuildError(_over_budget(params, model, variant, chip, estimate, budget_mb, source))
    return {v: e["bytes"] for v, e in estimates.items()}


def _over_budget(params: dict, model, variant: str, chip: str, estimate: dict, budget_mb: float, source: str) -> str:
    graph, settings = params["graph"], params["variants"][variant]
    fixes = []
    lower = {"precision": "quantized", "weights": "uint8", "activations": "uint8"}
    if settings.get("precision") == "fp16" or settings.get("weights") in ("uint16", "uint8", "int8"):
        bits = "int4" if settings.get("weights") in ("uint8", "int8") else "uint8"
        smaller = context_size.estimate(model, {**lower, "activations": settings.get("activations") or "uint16",
                                                "weights": bits})
        if smaller["bytes"] <= budget_mb * 1e6:
            fixes.append(f"lower-bit weights (a variant with weights = \"{bits}\": about "
                         f"{context_size.mb(smaller['bytes'])})")
        elif smaller["bytes"] < estimate["bytes"]:
            fixes.append(f"lower-bit weights do not suffice alone (weights = \"{bits}\": about "
                         f"{context_size.mb(smaller['bytes'])})")
    parts = max(2, math.ceil(estimate["bytes"] / (budget_mb * 1e6 * 0.9)))
    fixes.append(f"split the graph: [graphs.{graph}] split = {{ parts = {parts} }} (or split = {{ max_part_mb = "
                 f"{budget_mb:g} }})")
    return (f"{params['name']}: graph '{graph}' at variant {variant} on {chip}: estimated context binary "
            f"{context_size.mb(estimate['bytes'])} (weights {context_size.mb(estimate['weight_bytes'])} at this "
            f"variant's bit widths, {estimate['nodes']} node(s)), over the budget of {budget_mb:g} MB ({source}). "
            "Fix: " + "; or ".join(fixes))
