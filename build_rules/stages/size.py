"""Stage size: will a graph at one variant fit one context binary on each of the variant's chips? Checked before the
variant is quantized or compiled, from the float graph: the estimate (build_rules/measuring/context_size.py: weights at the
variant's bit widths plus the overhead fitted to this repo's binaries) against the budget (`max_context_mb` of the
graph, else of the chip, else the default). Over it, the build stops here naming graph, variant, chip, estimate and
budget, and the fixes: lower-bit weights, or `split`. -> out/<model>/<variant>/<graph>.size.json.

It runs inside doit (split_tasks.py: reading initializer shapes is light). Graphs with [graphs.X] split are checked
part by part in the split stage instead.
"""
from __future__ import annotations

import math
from pathlib import Path

from ..measuring import context_size
from ..errors import BuildError
from ..plumbing.files import atomic_write_json


def run(params: dict) -> dict:
    import onnx
    model = onnx.load(params["onnx"], load_external_data=False)
    estimate = context_size.estimate(model, params["widths"])
    over = [(chip, budget_mb, source) for chip, (budget_mb, source) in params["budgets"].items()
            if estimate["bytes"] > budget_mb * 1e6]
    if over:
        Path(params["outputs"]["report"]).unlink(missing_ok=True)  # no stale pass is left behind
        raise BuildError(_over_budget(params, model, params["variant"], *over[0], estimate))
    atomic_write_json(params["outputs"]["report"], {"graph": params["graph"], "variant": params["variant"],
                                                    "estimate": estimate, "budgets": params["budgets"]})
    return {"bytes": estimate["bytes"]}


def _over_budget(params: dict, model, variant: str, chip: str, budget_mb: float, source: str, estimate: dict) -> str:
    graph, settings = params["graph"], params["widths"]
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
