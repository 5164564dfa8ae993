"""The pipeline's task generators, in its order: float graph (data, export, simplify, verify), quantization
(calibrate, calibration_stats, quantize, fp16_lint), compile and check (compile, check, evaluate, package), and the
per-chip and per-model groups.

Each stage's generator _<stage>_tasks yields its task dicts; stage_table.py names it, and tasks/__init__.py makes the
doit creator task_<stage> from that row. The pieces every generator shares (the loaded project, task keys, the stage
task dict) are in project.py. Loading must stay light (no torch, onnx, onnxruntime, not even numpy): every heavy
stage runs in its own process via runner.run_stage.
"""
from __future__ import annotations

import os

from ..build_state import layout
from ..measuring import gates
from ..configuration.config import COMPARISON_METRICS, Model, gate_dicts
from ..doit_run.project import (chip_params, calibration_files, checkpoint_files, model_data,
                       hook_files, input_specs, model_graphs, project, quantized_variants, ranges_file, reference_chip,
                       rel, source_onnx, stage_task, task_key, variant_builds)
from ..runner import run_stage
from ..plumbing.tool_versions import tool_version
from . import aimet as aimet_tasks, split as split_tasks


# --- float graph ----------------------------------------------------------------------------------

def _program_stamp(name: str) -> list | None:
    """Where a program on PATH is and its file's size and mtime: an upgrade (e.g. a new espeak-ng from
    apt) changes them, and the data made with it is made again. A stat, not `--version`: doit loads
    this on every run."""
    import shutil
    path = shutil.which(name)
    if path is None:
        return None  # the hook says what to install when it runs
    real = os.path.realpath(path)
    st = os.stat(real)
    return [real, st.st_size, st.st_mtime_ns]


def _data_tasks():
    for model in project().models:
        if model.data is None:
            continue
        folder = layout.data_dir(model.name)
        sources = [rel(model.folder / ref) for ref in model.data]
        params = {"hooks": rel(model.hooks), "sources": sources,
                  "tools": {tool: _program_stamp(tool) for tool in model.data_tools},
                  "outputs": {"dir": folder, "manifest": f"{folder}/data.json"}}
        task = stage_task("data", model.name, params, [*hook_files(model), *sources], [f"{folder}/data.json"],
                           f"{layout.model_dir(model.name)}/data.log")
        task["actions"] = [(run_stage, task["actions"][0][1], {"publish_dirs": (folder,)})]
        yield task


def _export_tasks():
    for model, graph in model_graphs():
        if model.onnx:
            continue  # ONNX-file models enter at simplify
        checkpoints = checkpoint_files(model, graph)
        target = layout.float_file(model.name, graph.name, ".onnx")
        params = {"hooks": rel(model.hooks), "graph": graph.name, "checkpoints": checkpoints,
                  "inputs": input_specs(graph), "output_names": list(graph.outputs), "outputs": {"onnx": target},
                  "export": graph.export.as_dict(), "model_toml": rel(model.toml_path),
                  "trusted_checkpoints": model.trusted_checkpoints}
        yield stage_task("export", f"{model.name}/{graph.name}", params, [*hook_files(model), *checkpoints],
                          [target], layout.float_file(model.name, graph.name, ".export.log"))


def _simplify_tasks():
    for model, graph in model_graphs():
        source = source_onnx(model, graph)
        outputs = {"onnx": layout.float_file(model.name, graph.name, ".sim.onnx"),
                   "io": layout.float_file(model.name, graph.name, ".io.json")}
        params = {"onnx": source, "inputs": input_specs(graph), "output_names": list(graph.outputs), "outputs": outputs,
                  "where": f"{rel(model.toml_path)} [graphs.{graph.name}]"}
        file_dep = [source]
        if model.onnx:  # its hooks may patch the file (transform(model)) before simplify
            params["hooks"] = rel(model.hooks)
            file_dep += hook_files(model)
        if graph.state:  # a step graph: its state outputs must fit the inputs they feed
            params["step"] = graph.step_contract()
        yield stage_task("simplify", f"{model.name}/{graph.name}", params, file_dep, list(outputs.values()),
                          layout.float_file(model.name, graph.name, ".simplify.log"))


def _verify_tasks():
    for model, graph in model_graphs():
        sim = layout.float_file(model.name, graph.name, ".sim.onnx")
        checkpoints = [] if model.onnx else checkpoint_files(model, graph)
        outputs = {"report": layout.float_file(model.name, graph.name, ".verify.json"),
                   "evaluation": layout.float_file(model.name, graph.name, ".evaluation.npz")}
        params = {"hooks": rel(model.hooks), "graph": graph.name, "onnx": sim, "checkpoints": checkpoints,
                  "source_onnx": source_onnx(model, graph) if model.onnx else None,
                  "inputs": input_specs(graph), "output_names": list(graph.outputs),
                  "verify": graph.verify.as_dict(), "default_evaluation_count": 8, "outputs": outputs,
                  "model_toml": rel(model.toml_path), "trusted_checkpoints": model.trusted_checkpoints}
        task_metrics = [m for m in gates.metrics(gate_dicts(graph.gates)) if m not in COMPARISON_METRICS]
        if task_metrics:  # the score hook must return them: verify asks it of the float model, before any binary
            params["gate_metrics"] = task_metrics  # names only: a new bound does not re-run verify
        data_params, data_dep = model_data(model)
        params.update(data_params)
        file_dep = [sim, *hook_files(model), *checkpoints, *data_dep] + ([params["source_onnx"]] if model.onnx else [])
        yield stage_task("verify", f"{model.name}/{graph.name}", params, file_dep, list(outputs.values()),
                          layout.float_file(model.name, graph.name, ".verify.log"))


# --- quantization ----------------------------------------------------------------------------------

def _calibrate_tasks():
    for model, graph in model_graphs():
        if not quantized_variants(model):
            continue
        folder = layout.calibration_dir(model.name, graph.name)
        input_list = f"{folder}/input_list.txt"
        data_params, data_dep = model_data(model)
        # Calibration inputs may come from the model itself (a decoder's from its encoder): weights are a dep.
        checkpoints = [] if model.onnx else checkpoint_files(model, graph)
        params = {"hooks": rel(model.hooks), "graph": graph.name, "count": graph.calibration_samples,
                  "inputs": input_specs(graph), "outputs": {"dir": folder, "input_list": input_list},
                  "checkpoints": checkpoints, **data_params}
        targets = [input_list, *calibration_files(model, graph, graph.calibration_samples)]
        yield stage_task("calibrate", f"{model.name}/{graph.name}", params,
                          [*hook_files(model), *checkpoints, *data_dep],
                          targets, f"{folder}.calibrate.log")


def _calibration_stats_tasks():
    if project().toolchain["name"] != "ort-qnn":
        return  # qairt calibrates inside qnn-onnx-converter
    for model, graph in model_graphs():
        done = set()
        for variant in quantized_variants(model):
            if variant.is_aimet:
                continue  # AIMET calibrates inside its own stage
            method, samples = variant.quant.calibration_method, variant.quant.calibration_samples
            if (method, samples) in done:
                continue
            done.add((method, samples))
            sim = layout.float_file(model.name, graph.name, ".sim.onnx")
            input_list = f"{layout.calibration_dir(model.name, graph.name)}/input_list.txt"
            target = ranges_file(model, graph, variant)
            params = {"onnx": sim, "input_list": input_list, "inputs": input_specs(graph), "method": method,
                      "samples": samples, "outputs": {"ranges": target}}
            yield stage_task("calibration_stats", f"{model.name}/{graph.name}/{method}-{samples}", params,
                              [sim, input_list, *calibration_files(model, graph, samples)], [target],
                              f"{layout.calibration_dir(model.name, graph.name)}.{method}-{samples}.stats.log")


def _quantize_tasks():
    for model, graph in model_graphs():
        for variant in quantized_variants(model):
            if variant.is_aimet:
                continue  # its QDQ model comes from the aimet stage
            sim = layout.float_file(model.name, graph.name, ".sim.onnx")
            ranges = ranges_file(model, graph, variant)
            target = layout.variant_file(model.name, variant.name, graph.name, ".qdq.onnx")
            # report: the Concats of differently ranged inputs (the check splits a graph output made by one)
            report = layout.variant_file(model.name, variant.name, graph.name, ".quantize.json")
            params = {"onnx": sim, "ranges": ranges, "variant": variant.settings_for(graph.name),
                      "model_toml": rel(model.toml_path), "outputs": {"onnx": target, "report": report}}
            if graph.state:  # each state output is quantized as the input it feeds (the app copies it over)
                params["tied"] = sorted(graph.state.items())
            task = stage_task("quantize", f"{model.name}/{graph.name}/{variant.name}", params,
                              [sim, ranges], [target, report],
                              layout.variant_file(model.name, variant.name, graph.name, ".quantize.log"),
                              names={"model": model.name, "graph": graph.name, "variant": variant.name})
            task["task_dep"] = split_tasks.checked_first(model, graph, variant)  # the size check fails before this
            yield task


def _fp16_lint_tasks():
    """Chip-independent, both toolchains: the float model and its evaluation inputs, once per fp16 variant and graph
    (not part of compile: new evaluation data must not re-make binaries). The groups depend on it."""
    for model, graph in model_graphs():
        for variant in model.variants.values():
            if variant.is_fp16:
                evaluation = layout.float_file(model.name, graph.name, ".evaluation.npz")
                sim = layout.float_file(model.name, graph.name, ".sim.onnx")
                report = layout.variant_file(model.name, variant.name, graph.name, ".fp16_lint.json")
                params = {"onnx": sim, "evaluation": evaluation, "where": f"{model.name}/{graph.name}/{variant.name}",
                          "outputs": {"report": report}}
                yield stage_task("fp16_lint", f"{model.name}/{graph.name}/{variant.name}", params, [sim, evaluation],
                                 [report], layout.variant_file(model.name, variant.name, graph.name, ".fp16_lint.log"))


def _fp16_lints(model: Model, chip_name: str | None = None) -> list[str]:
    """The fp16 lint tasks a group runs: those of the fp16 variants it builds (for one chip, or all)."""
    built = {v.name for v, c in variant_builds(model) if v.is_fp16 and chip_name in (None, c.name)}
    return [f"fp16_lint:{model.name}/{g}/{v}" for v in sorted(built) for g in model.graphs]


# --- compile and check -----------------------------------------------------------------------------

def _compile_tasks():
    for model in project().models:
        for variant, chip in variant_builds(model):
            for graph in model.graphs.values():
                for unit in split_tasks.units(model, graph):  # the graph, or each of its parts
                    source = split_tasks.compile_input(model, graph, unit, variant)
                    outputs = {"binary": layout.chip_file(model.name, variant.name, chip.name, f"{unit}.bin"),
                               "ctx_model": layout.chip_file(model.name, variant.name, chip.name, f"{unit}_ctx.onnx"),
                               "report": layout.chip_file(model.name, variant.name, chip.name, f"{unit}.compile.json")}
                    params = {"onnx": source, "graph": unit, "chip": chip_params(chip), "fp16": variant.is_fp16,
                              "outputs": outputs}
                    task = stage_task("compile", f"{model.name}/{unit}/{variant.name}@{chip.name}", params,
                                      [source], list(outputs.values()),
                                      layout.chip_file(model.name, variant.name, chip.name, f"{unit}.compile.log"),
                                      names={"model": model.name, "graph": graph.name, "variant": variant.name,
                                             "chip": chip.name})
                    task["task_dep"] = split_tasks.checked_first(model, graph, variant)
                    yield task


def _check_tasks():
    for model in project().models:
        for variant, chip in variant_builds(model):
            for graph in model.graphs.values():
                ctx = split_tasks.chip_files(model, graph, variant, chip, "_ctx.onnx")  # a list for a split graph
                binary = split_tasks.chip_files(model, graph, variant, chip, ".bin")
                evaluation = layout.float_file(model.name, graph.name, ".evaluation.npz")
                report = layout.chip_file(model.name, variant.name, chip.name, f"{graph.name}.check.json")
                data_params, data_dep = model_data(model)
                # compile_report: the stage reads what the binary runs in float from <unit>.compile.json beside each
                # _ctx.onnx. Not a file_dep: it also holds the compile's seconds, so a compile that made the same
                # bytes again (a cache miss, a forgotten task) would re-run the check on the emulator for nothing
                params = {"ctx_model": ctx, "evaluation": evaluation, "hooks": rel(model.hooks),
                          "graph": graph.name, "gates": gate_dicts(graph.gates), "compile_report": True,
                          "outputs": {"report": report}, **data_params}
                if not graph.split:  # where a binary that does not repeat itself starts to differ (read on failure)
                    params["locate"] = {"onnx": layout.float_file(model.name, graph.name, ".sim.onnx"),
                                        "qdq": None if variant.is_fp16 else split_tasks.compile_input(
                                            model, graph, graph.name, variant),
                                        "chip": chip_params(chip)}
                binaries = [*ctx, *binary] if graph.split else [ctx, binary]
                if not variant.is_fp16 and not variant.is_aimet:  # its quantize report: outputs to measure per slice
                    params["concats"] = layout.variant_file(model.name, variant.name, graph.name, ".quantize.json")
                    binaries.append(params["concats"])
                reference = reference_chip(model, variant)
                if reference is not None and reference.name != chip.name:
                    # another chip's binary: proven equal to the reference chip's on a few samples, it takes that
                    # chip's full measurement (which runs here, under a lock, when its own check has not run yet)
                    ref_ctx = split_tasks.chip_files(model, graph, variant, reference, "_ctx.onnx")
                    ref_binary = split_tasks.chip_files(model, graph, variant, reference, ".bin")
                    ref_report = layout.chip_file(model.name, variant.name, reference.name, f"{graph.name}.check.json")
                    params["reference"] = {"chip": reference.name, "ctx_model": ref_ctx, "check": ref_report,
                                           "samples": model.check.proof_samples}
                    binaries += [*ref_ctx, *ref_binary] if graph.split else [ref_ctx, ref_binary]
                task = stage_task("check", f"{model.name}/{graph.name}/{variant.name}@{chip.name}", params,
                                  [*binaries, evaluation, *hook_files(model), *data_dep], [report],
                                  layout.chip_file(model.name, variant.name, chip.name, f"{graph.name}.check.log"))
                # the time left (build_rules/doit_run/plan.py): the memo that keeps its numbers, and what it is timed like
                task["meta"] = {"memo": layout.memo_file(report), "gates": params["gates"]}
                if "reference" in params:
                    task["meta"].update(estimate_as="check (equality proof)", proof=layout.proof_memo(report))
                    # After the reference's check, in doit's order: while it measures, a worker (-n 2) takes other
                    # work instead of waiting on its memo's lock (docs/models.md, "Checks on several chips")
                    task["task_dep"] = [*task.get("task_dep", []),
                                        f"check:{model.name}/{graph.name}/{variant.name}@{reference.name}"]
                yield task


def _evaluate_params(model: Model, graphs: dict, on: str, report: str) -> tuple[dict, list[str]]:
    data_params, data_dep = model_data(model)
    params = {"hooks": rel(model.hooks), "graphs": graphs, "on": on, "outputs": {"report": report},
              "gates": gate_dicts(model.evaluate_gates), **data_params}
    return params, [*graphs.values(), *hook_files(model), *data_dep]


def _evaluate_tasks():
    if project().toolchain["name"] != "ort-qnn":
        return  # the emulator runner is onnxruntime-qnn's; qairt checks per graph only
    for model in project().models:
        if not model.evaluate:
            continue
        float_report = layout.float_file(model.name, "model", ".evaluate.json")
        graphs = {g: layout.float_file(model.name, g, ".sim.onnx") for g in model.graphs}
        params, file_dep = _evaluate_params(model, graphs, "cpu", float_report)
        params["gates"] = []  # the float model is the reference, not gated
        yield stage_task("evaluate", f"{model.name}/float", params, file_dep, [float_report],
                          layout.float_file(model.name, "model", ".evaluate.log"), key_stage="evaluate_float",
                          names={"model": model.name, "variant": "float"})
        for variant, chip in variant_builds(model):
            report = layout.chip_file(model.name, variant.name, chip.name, "evaluate.json")
            graphs = {g.name: split_tasks.chip_files(model, g, variant, chip, "_ctx.onnx") for g in model.graphs.values()}
            params, file_dep = _evaluate_params(model, graphs, "emulator", report)
            params["float_report"] = float_report
            binaries = [split_tasks.chip_files(model, g, variant, chip, ".bin") for g in model.graphs.values()]
            file_dep = [f for dep in file_dep for f in (dep if isinstance(dep, list) else [dep])]
            file_dep += [float_report] + [f for b in binaries for f in (b if isinstance(b, list) else [b])]
            reference = reference_chip(model, variant)
            task_dep = []
            if reference is not None and reference.name != chip.name:
                # another chip: when every graph's check proved its outputs equal to the reference chip's, it takes
                # the reference's evaluation (stages/evaluate.py); after those checks and that evaluation
                ref_graphs = {g.name: split_tasks.chip_files(model, g, variant, reference, "_ctx.onnx")
                              for g in model.graphs.values()}
                params["reference"] = {
                    "chip": reference.name, "graphs": ref_graphs,
                    "report": layout.chip_file(model.name, variant.name, reference.name, "evaluate.json"),
                    "proofs": {g: layout.proof_memo(layout.chip_file(model.name, variant.name, chip.name,
                                                                     f"{g}.check.json")) for g in model.graphs},
                    "evaluations": {g: layout.float_file(model.name, g, ".evaluation.npz") for g in model.graphs}}
                file_dep += [f for ctx in ref_graphs.values() for p in (ctx if isinstance(ctx, list) else [ctx])
                             for f in (p, p.replace("_ctx.onnx", ".bin"))]
                task_dep = [f"evaluate:{model.name}/{variant.name}@{reference.name}",
                            *(f"check:{model.name}/{g}/{variant.name}@{chip.name}" for g in model.graphs)]
            task = stage_task("evaluate", f"{model.name}/{variant.name}@{chip.name}", params, file_dep, [report],
                              layout.chip_file(model.name, variant.name, chip.name, "evaluate.log"),
                              names={"model": model.name, "variant": variant.name, "chip": chip.name})
            if task_dep:
                task["task_dep"] = [*task.get("task_dep", []), *task_dep]
            yield task


def _fp16_sibling(model: Model, variant, chip) -> dict:
    """The binaries of the model's first fp16 variant on the same chip, for a quantized variant ({} if none)."""
    if variant.is_fp16 or not chip.fp16:
        return {}
    fp16 = next((v for v in model.variants.values() if v.is_fp16), None)
    if fp16 is None:
        return {}
    return {"variant": fp16.name,
            "binaries": {g.name: split_tasks.chip_files(model, g, fp16, chip, ".bin") for g in model.graphs.values()}}


def _package(params: dict):
    from ..stages import package
    return package.run(params)


def _package_tasks():
    for model in project().models:
        for variant, chip in variant_builds(model):
            graphs = {g: {"binary": layout.chip_file(model.name, variant.name, chip.name, f"{g}.bin"),
                          "ctx_model": layout.chip_file(model.name, variant.name, chip.name, f"{g}_ctx.onnx"),
                          "check": layout.chip_file(model.name, variant.name, chip.name, f"{g}.check.json")}
                      for g in model.graphs}
            for graph in model.graphs.values():  # a split graph ships its parts, in order
                if graph.split:
                    graphs[graph.name] = {"parts": split_tasks.chip_files(model, graph, variant, chip, ".bin"),
                                          "ctx_parts": split_tasks.chip_files(model, graph, variant, chip, "_ctx.onnx"),
                                          "check": graphs[graph.name]["check"]}
            checkpoints = checkpoint_files(model)
            manifest = layout.chip_file(model.name, variant.name, chip.name, "manifest.json")
            params = {"model": {"name": model.name, "description": model.description, "license": model.license},
                      "model_folder": rel(model.folder), "variant": {"name": variant.name, **variant.settings()},
                      "chip": {**chip_params(chip), "marketing_name": chip.marketing_name},
                      "toolchain": project().toolchain,
                      "tools": {t: tool_version(t) for t in ("onnxruntime", "onnx", "onnxsim", "torch")},
                      "checkpoints": checkpoints, "graphs": graphs, "outputs": {"manifest": manifest}}
            reports = aimet_tasks.package_reports(model, variant, params)  # an aimet variant's QuantSim settings
            if model.evaluate and project().toolchain["name"] == "ort-qnn":
                reports.append(layout.chip_file(model.name, variant.name, chip.name, "evaluate.json"))
                params["evaluate"] = reports[-1]
            sibling = _fp16_sibling(model, variant, chip)
            if sibling:  # a quantized variant's binaries must be smaller than fp16's: the package stage says if not
                params["fp16_sibling"] = sibling
            yield {
                "name": f"{model.name}/{variant.name}@{chip.name}",
                "actions": [(_package, [params])],
                "file_dep": [f for files in graphs.values() for v in files.values()
                             for f in (v if isinstance(v, list) else [v])] + checkpoints + reports
                            + [f for b in sibling.get("binaries", {}).values() for f in (b if isinstance(b, list) else [b])],
                "targets": [manifest],
                "uptodate": [task_key("package", params)],
                "clean": True,
            }


# --- groups -------------------------------------------------------------------------------------

def _chips_tasks():
    for chip in project().chips.chips.values():
        packages = [f"package:{model.name}/{variant.name}@{chip.name}" for model in project().models
                    for variant, c in variant_builds(model) if c.name == chip.name]
        packages += [lint for model in project().models for lint in _fp16_lints(model, chip.name)]
        if packages:
            yield {"basename": chip.name, "actions": None, "task_dep": packages, "uptodate": [True],
                   "doc": f"all models for {chip.marketing_name} ({chip.name}, {chip.dsp_arch}, soc {chip.soc_id}) "
                          f"with {project().toolchain['name']}"}


def _models_tasks():
    for model in project().models:
        packages = [f"package:{model.name}/{variant.name}@{chip.name}" for variant, chip in variant_builds(model)]
        packages += _fp16_lints(model)
        yield {"basename": model.name, "actions": None, "task_dep": packages, "uptodate": [True],
               "doc": f"{model.description or model.name}: {len(model.graphs)} graph(s) x "
                      f"{len(model.variants)} variant(s) x {len(model.chips)} chip(s)"}
