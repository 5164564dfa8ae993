"""Task generators of the tuning loop (not default tasks): report:<model>, sensitivity:<model>/<graph>/<variant> and
tune:<model>/<variant>. The stages themselves are build_rules/stages/report.py, sensitivity.py and tune.py; tasks.py's
task_report / task_sensitivity / task_tune creators call these. Loaded with the build file: stays light.
"""
from __future__ import annotations

from ..build_state import layout
from ..configuration.config import Chip, Graph, Model, Tuning, Variant, gate_dicts
from ..build_state.hashing import OptionalFiles
from ..doit_run.plan import SetupsCurrent
from ..doit_run.project import (chip_params, compile_input, model_data, hook_files, model_graphs, preferred_reference,
                       project, ranges_file, rel, stage_task, variant_builds)
from . import aimet as aimet_tasks, device as device_tasks, split as split_tasks


def report_tasks():
    if project().toolchain["name"] != "ort-qnn":
        return  # reads <graph>.compile.json and measures with the emulator runner of onnxruntime-qnn
    for model in project().models:
        data_params, data_dep = model_data(model)
        # The binaries are made by the compile tasks, the report's setup tasks (not file_dep): doit runs them first
        # when the report is to run, and under --continue one that fails (a variant QNN refuses) does not keep the
        # report from showing every other variant, the broken one marked (their files are optional inputs).
        cells, file_dep, built, compiles = [], [], [], []
        for variant, chip in variant_builds(model):
            for graph in model.graphs.values():
                def chip_file(suffix, g=graph.name, v=variant.name, c=chip.name):
                    return layout.chip_file(model.name, v, c, f"{g}{suffix}")

                def unit_files(suffix, g=graph, v=variant, c=chip):  # a list of the parts' files for a split graph
                    return split_tasks.chip_files(model, g, v, c, suffix)
                units = split_tasks.units(model, graph)
                cells.append({"variant": variant.name, "chip": chip.name, "graph": graph.name,
                              "compile": unit_files(".compile.json"), "ctx_model": unit_files("_ctx.onnx"),
                              "check": chip_file(".check.json"), "memo": chip_file(".measure.json"),
                              "evaluation": layout.float_file(model.name, graph.name, ".evaluation.npz"),
                              "gates": gate_dicts(graph.gates),
                              "qdq": None if variant.is_fp16 else compile_input(model, graph, variant),
                              # what makes the binary, with its log: a cell without it says which failed and why
                              "made_by": [{"task": f"compile:{model.name}/{u}/{variant.name}@{chip.name}",
                                           "log": layout.chip_file(model.name, variant.name, chip.name,
                                                                   f"{u}.compile.log")} for u in units]})
                compiles += [m["task"] for m in cells[-1]["made_by"]]
                for suffix in (".compile.json", "_ctx.onnx", ".bin"):
                    files = unit_files(suffix)
                    built += files if isinstance(files, list) else [files]
                built += [cells[-1]["qdq"]] if cells[-1]["qdq"] and cells[-1]["qdq"] not in built else []
        file_dep += [layout.float_file(model.name, g, ".evaluation.npz") for g in model.graphs]
        if device_tasks.devices():  # issue 29: a new device result re-makes the report (no phone named: no look)
            from ..device import results as device_results
            file_dep += [f for v, c in variant_builds(model)
                         for f in device_results.report_files(layout.chip_dir(model.name, v.name, c.name), model.graphs)]
        evaluations = {f"{v.name}@{c.name}": layout.chip_file(model.name, v.name, c.name, "evaluate.json")
                       for v, c in variant_builds(model)} if model.evaluate else {}
        outputs = {"markdown": layout.report_file(model.name, ".md"), "png": layout.report_file(model.name, ".png"),
                   "json": layout.report_file(model.name, ".json")}
        params = {"model": model.name, "cells": cells, "hooks": rel(model.hooks), "toolchain": project().toolchain,
                  "variants": {v.name: v.settings() for v in model.variants.values()}, "evaluations": evaluations,
                  "outputs": outputs, **data_params}
        if model.evaluate:  # the float model's value beside each variant's
            params["float_evaluation"] = layout.float_file(model.name, "model", ".evaluate.json")
        built += aimet_tasks.report_reports(model, params)  # which QuantSim config each aimet variant used
        task = stage_task("report", model.name, params, [*file_dep, *hook_files(model), *data_dep],
                          list(outputs.values()), layout.report_file(model.name, ".log"))
        # What was measured so far, without running what was not: a check or evaluation that ends later re-runs it
        measured = [path for cell in cells for path in (cell["check"], cell["memo"])]
        measured += [p for path in evaluations.values() for p in (path, layout.memo_file(path))]
        measured += [params["float_evaluation"]] if model.evaluate else []
        task["uptodate"] += [OptionalFiles(measured + built), SetupsCurrent(compiles)]
        task["setup"] = compiles
        action, args, _ = task["actions"][0]
        task["actions"] = [(action, args)]  # not from the build cache: its key cannot hold what was measured since
        yield task


def _tuning_chip(model: Model) -> Chip:
    """[tuning] chip, else the checks' reference chip (SM8750 when the model builds it: project.preferred_reference)."""
    name = model.tuning.chip if model.tuning and model.tuning.chip else preferred_reference(model)
    return project().chips.chips[name]


def _search(model: Model) -> dict:
    """How sensitivity and tune search ([tuning] search, max_measurements): part of both tasks' parameters."""
    tuning = model.tuning or Tuning()
    return {"method": tuning.search, "max_measurements": tuning.max_measurements}


def _tuning_graph(model: Model, graph: Graph, variant: Variant) -> dict:
    found = {"name": graph.name, "onnx": layout.float_file(model.name, graph.name, ".sim.onnx"),
             "ranges": ranges_file(model, graph, variant),
             "evaluation": layout.float_file(model.name, graph.name, ".evaluation.npz"),
             "variant": variant.settings_for(graph.name)}
    if graph.state:  # measured as built: each state output quantized as the input it feeds (quantize's "tied")
        found["tied"] = sorted(graph.state.items())
    if not variant.is_fp16 and not variant.is_aimet:  # the quantize stage's Concat warnings: their fixes go first
        found["concats"] = layout.variant_file(model.name, variant.name, graph.name, ".quantize.json")
    return found


def _tuning_deps(g: dict) -> list[str]:
    return [g["onnx"], g["ranges"], g["evaluation"], *([g["concats"]] if g.get("concats") else [])]


def sensitivity_tasks():
    if project().toolchain["name"] != "ort-qnn":
        return
    for model, graph in model_graphs():
        data_params, data_dep = model_data(model)
        for variant in aimet_tasks.ort_variants(model):
            g = _tuning_graph(model, graph, variant)
            outputs = {key: layout.tuning_file(model.name, variant.name, f"{graph.name}.sensitivity.{ext}")
                       for key, ext in (("json", "json"), ("markdown", "md"), ("png", "png"))}
            params = {"graph": g, "chip": chip_params(_tuning_chip(model)), "variant_name": variant.name,
                      "samples": model.tuning.samples if model.tuning else 32, "search": _search(model),
                      "hooks": rel(model.hooks), "outputs": outputs, **data_params}
            yield stage_task("sensitivity", f"{model.name}/{graph.name}/{variant.name}", params,
                              [*_tuning_deps(g), *hook_files(model), *data_dep], list(outputs.values()),
                              layout.tuning_file(model.name, variant.name, f"{graph.name}.sensitivity.log"))


def tune_tasks():
    if project().toolchain["name"] != "ort-qnn":
        return
    for model in project().models:
        data_params, data_dep = model_data(model)
        for variant in aimet_tasks.ort_variants(model):
            graphs, file_dep = [], []
            for graph in model.graphs.values():
                g = _tuning_graph(model, graph, variant)
                targets = (model.tuning.targets.get(graph.name) if model.tuning else None) or graph.gates
                # The sensitivity result is reused when present and made from the same inputs (its key says),
                # else tune measures the ranking itself: no dependency, so graphs that already meet their
                # target cost one emulator run, not a sensitivity analysis.
                g.update(target=gate_dicts(targets) or None,  # every target must be met
                         sensitivity=layout.tuning_file(model.name, variant.name, f"{graph.name}.sensitivity.json"))
                graphs.append(g)
                file_dep += _tuning_deps(g) + aimet_tasks.tune_calibration(model, graph, variant, g)
            new_name = f"{variant.name}_tuned"
            number = 2
            while new_name in model.variants:
                new_name, number = f"{variant.name}_tuned{number}", number + 1
            outputs = {"toml": layout.tuning_file(model.name, variant.name, ".tuned.toml"),
                       "json": layout.tuning_file(model.name, variant.name, ".tuned.json")}
            params = {"model": model.name, "variant": variant.name, "new_name": new_name, "graphs": graphs,
                      "chip": chip_params(_tuning_chip(model)), "model_toml": rel(model.toml_path),
                      "samples": model.tuning.samples if model.tuning else 32, "search": _search(model),
                      "try_variants": (model.tuning or Tuning()).try_variants,
                      "hooks": rel(model.hooks), "outputs": outputs, **data_params}
            if model.evaluate and model.evaluate_gates:
                # the model's own gate (e.g. WER) on the proposal's binaries: tune_model_gate.py
                params["evaluate"] = {"gates": gate_dicts(model.evaluate_gates),
                                      "float_report": layout.float_file(model.name, "model", ".evaluate.json")}
                file_dep.append(params["evaluate"]["float_report"])
            yield stage_task("tune", f"{model.name}/{variant.name}", params, [*file_dep, *hook_files(model), *data_dep],
                              list(outputs.values()), layout.tuning_file(model.name, variant.name, ".tune.log"))
