"""Task generation for models too big for one context: the size check (size:<model>/<graph>), the split stage
(split:<model>/<graph> and split:<model>/<graph>/<variant>) and what the rest of the pipeline needs to treat a split
graph's parts as graphs: a compile task per part (compile:<model>/<graph>.part2/<variant>@<chip>), while export,
simplify, verify, calibrate and quantize run once on the whole graph and check, evaluate and package take the parts
in order. The stages are build_rules/stages/size.py and split.py. Loaded with the build file: stays light.

How many parts a graph has must be known when doit loads the tasks: `parts = N` and pinned `cuts` say it; with
`max_part_mb` it is the last plan's count (<graph>.split-parts.json beside the plan; 2 before the first plan). When a
new plan has another count, the split task says so and the next doit builds that many.
"""
from __future__ import annotations

import json

from ..build_state import layout
from ..measuring import context_size
from ..configuration.config import Graph, Model
from ..doit_run.project import in_process_stage, project, quantized_variants, stage_task, task_key, variant_builds


def parts(model: Model, graph: Graph) -> int | None:
    """The number of parts of a split graph, None for a whole one."""
    split = graph.split
    if split is None:
        return None
    if split.parts:
        return split.parts
    if split.cuts is not None:
        return len(split.cuts) + 1
    try:
        memo = json.loads(open(_memo(model, graph)).read())
        if memo.get("split") == split.as_dict() and isinstance(memo.get("parts"), int) and memo["parts"] >= 2:
            return memo["parts"]
    except (OSError, ValueError):
        pass
    return 2


def units(model: Model, graph: Graph) -> list[str]:
    """What one context binary is made of for this graph: the graph, or each of its parts, in order."""
    count = parts(model, graph)
    return [graph.name] if count is None else [f"{graph.name}.part{k}" for k in range(1, count + 1)]


def compile_input(model: Model, graph: Graph, unit: str, variant) -> str:
    """The model a unit's binary is compiled from: the float or QDQ graph, or the part of it."""
    if variant.is_fp16:
        return layout.float_file(model.name, unit, ".sim.onnx")
    return layout.variant_file(model.name, variant.name, unit, ".qdq.onnx")


def checked_first(model: Model, graph: Graph, variant) -> list[str]:
    """The task that checks the graph's size at this variant (or its parts') against the budget: quantize and compile
    wait for it."""
    return [f"split:{model.name}/{graph.name}" if graph.split else f"size:{model.name}/{graph.name}/{variant.name}"]


def chip_files(model: Model, graph: Graph, variant, chip, suffix: str) -> str | list[str]:
    """<chip>/<graph><suffix>, or the parts' files in order for a split graph."""
    files = [layout.chip_file(model.name, variant.name, chip.name, f"{u}{suffix}") for u in units(model, graph)]
    return files if graph.split else files[0]


def plan_file(model: Model, graph: Graph) -> str:
    return layout.float_file(model.name, graph.name, ".split.json")


def _memo(model: Model, graph: Graph) -> str:
    return layout.float_file(model.name, graph.name, ".split-parts.json")


def _variant_settings(model: Model) -> dict:
    """The bit widths of the variants that build for at least one chip (what the estimates are made for)."""
    built = {v.name for v, _ in variant_builds(model)}
    return {v.name: context_size.widths(v.settings()) for v in model.variants.values() if v.name in built}


def _budgets(model: Model, graph: Graph) -> dict:
    budgets: dict[str, dict] = {}
    for variant, chip in variant_builds(model):
        budgets.setdefault(variant.name, {})[chip.name] = list(context_size.budget_mb(graph, chip))
    return budgets


def size_tasks():
    for model in project().models:
        budgets = {}
        for graph in model.graphs.values():
            budgets[graph.name] = _budgets(model, graph)
        widths = _variant_settings(model)
        for graph in model.graphs.values():
            if graph.split:
                continue  # its parts are checked by the split stage
            sim = layout.float_file(model.name, graph.name, ".sim.onnx")
            for variant, chips in budgets[graph.name].items():
                report = layout.variant_file(model.name, variant, graph.name, ".size.json")
                params = {"name": f"size:{model.name}/{graph.name}/{variant}", "onnx": sim, "graph": graph.name,
                          "variant": variant, "widths": widths[variant], "budgets": chips,
                          "outputs": {"report": report}}
                # in-process: reading a model's initializer shapes is light, a process per check would not be
                yield {"name": f"{model.name}/{graph.name}/{variant}",
                       "actions": [(in_process_stage, ["size", params])], "file_dep": [sim], "targets": [report],
                       "uptodate": [task_key("size", params)], "clean": True}


def split_tasks():
    for model in project().models:
        for graph in model.graphs.values():
            if not graph.split:
                continue
            m, g = model.name, graph.name
            sim = layout.float_file(m, g, ".sim.onnx")
            names = units(model, graph)
            plan = plan_file(model, graph)
            outputs = {"plan": plan, **{u: layout.float_file(m, u, ".sim.onnx") for u in names}}
            split = graph.split.as_dict()
            text = "split = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in split.items() if v is not None) + " }"
            params = {"mode": "plan", "onnx": sim, "graph": g, "split": split, "split_text": text,
                      "parts": len(names), "memo": _memo(model, graph), "variants": _variant_settings(model),
                      "budgets": _budgets(model, graph), "outputs": outputs}
            yield stage_task("split", f"{m}/{g}", params, [sim], list(outputs.values()),
                             layout.float_file(m, g, ".split.log"))
            for variant in quantized_variants(model):
                qdq = layout.variant_file(m, variant.name, g, ".qdq.onnx")
                outputs = {u: layout.variant_file(m, variant.name, u, ".qdq.onnx") for u in names}
                params = {"mode": "variant", "onnx": qdq, "plan": plan, "outputs": outputs}
                yield stage_task("split", f"{m}/{g}/{variant.name}", params, [qdq, plan], list(outputs.values()),
                                 layout.variant_file(m, variant.name, g, ".split.log"))
