"""The task graph: doit task dicts from chips.toml + models/, one small generator per stage.

dodo.py imports the task_* functions from here. The pieces every generator shares (the loaded project, task keys,
the stage task dict) are in project.py; the tuning loop's generators in tuning_tasks.py, `doit dist`'s in
dist_tasks.py, the qairt toolchain's in toolchains/qairt_tasks.py. Loading must stay light (no torch, onnx,
onnxruntime, not even numpy): every heavy stage runs in its own process via runner.run_stage.
"""
from __future__ import annotations

import functools
import os
import sys

from . import (aimet_tasks, collector, device_tasks, diagnose_tasks, dist_tasks, interrupt, layout, split_tasks,
               tuning_tasks)
from .config import ConfigError, Model, gate_dicts
from .hashing import ContentChecker, use_key_digests, use_stat_cache
from .project import (STATE_DIR, chip_params, calibration_files, checkpoint_files, model_data,
                      hook_files, input_specs, model_graphs, project, quantized_variants, ranges_file, rel, source_onnx,
                      stage_task, task_key, tool_version, variant_builds)
from .runner import remove_stale_staging, run_stage

# What dodo.py imports: every stage and group generator in pipeline order (the order of `doit list`), plus
# the doit configuration.
__all__ = ["doit_config", "task_data", "task_export", "task_simplify", "task_verify", "task_size", "task_split",
           "task_calibrate", "task_calibration_stats", "task_quantize", "task_aimet", "task_fp16_lint", "task_convert",
           "task_model_libs", "task_htp_config", "task_compile", "task_check", "task_evaluate", "task_package",
           "task_report", "task_sensitivity", "task_tune", "task_diagnose", "task_multi_soc", "task_shared_context",
           "task_dist", "task_device_check", "task_profile", "task_power", "task_chips", "task_models"]


def _toolchain_stage(stage: str):
    """The seam between toolchains: where the selected toolchain generates `stage` itself (qairt, see
    toolchains/qairt_tasks.py), its generator replaces the decorated one, which is the ort-qnn version.
    A stage the toolchain does not have (quantize under qairt, convert under ort-qnn) makes no task."""
    def decorate(default):
        @functools.wraps(default)
        def creator():
            from . import toolchains
            own = toolchains.stage_tasks(project().toolchain["name"], stage)
            if own is ...:
                return default()
            return own() if own is not None else None
        return creator
    return decorate


# --- stages -------------------------------------------------------------------------------------
# Each stage is a doit creator task_<stage> (its doc is the `doit list` line) and the generator of its task
# dicts, _<stage>_tasks. The creators are three lines on purpose: doit's loader reads every creator's source
# on each load to sort them by line (inspect.getsourcelines tokenizes the whole function: ~0.5 ms for a
# generator body, a tenth of a no-op build when it was 19 of them).

def task_data():
    """0 data: the model's prepare_data hook makes its real inputs (e.g. speech clips) -> data/"""
    return _data_tasks()


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


def task_export():
    """1 export: checkpoint + build hook -> ONNX (static shapes, int32, batch 1)"""
    return _export_tasks()


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


def task_simplify():
    """2 simplify: onnxsim, then check static shapes and no int64 on graph I/O; I/O summary + op inventory"""
    return _simplify_tasks()


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


def task_verify():
    """3 verify: ONNX Runtime CPU vs PyTorch on real inputs, within the model's tolerance"""
    return _verify_tasks()


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
        data_params, data_dep = model_data(model)
        params.update(data_params)
        file_dep = [sim, *hook_files(model), *checkpoints, *data_dep] + ([params["source_onnx"]] if model.onnx else [])
        yield stage_task("verify", f"{model.name}/{graph.name}", params, file_dep, list(outputs.values()),
                          layout.float_file(model.name, graph.name, ".verify.log"))


def task_size():
    """3b size: a graph's estimated context binary per variant against the budget (max_context_mb), before compiling"""
    return split_tasks.size_tasks()


def task_split():
    """3c split: [graphs.X] split: cut into sequential parts (plan + float parts; per quantized variant, QDQ parts)"""
    return split_tasks.split_tasks()


def task_calibrate():
    """4 calibrate: real calibration inputs -> raw files + input_list.txt (QNN format, shared by variants)"""
    return _calibrate_tasks()


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


def task_calibration_stats():
    """4b calibration stats: tensor ranges per float model, method and sample count (ort-qnn; shared by variants)"""
    return _calibration_stats_tasks()


def _calibration_stats_tasks():
    if project().toolchain["name"] != "ort-qnn":
        return  # qairt calibrates inside qnn-onnx-converter
    for model, graph in model_graphs():
        done = set()
        for variant in quantized_variants(model):
            if variant.is_aimet:
                continue  # AIMET calibrates inside its own stage
            method, samples = variant.calibration_method, variant.calibration_samples
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


def task_quantize():
    """5 quantize: QDQ model per precision variant from the shared calibration ranges (fp16 variants skip this)"""
    return _quantize_tasks()


@_toolchain_stage("quantize")
def _quantize_tasks():
    for model, graph in model_graphs():
        for variant in quantized_variants(model):
            if variant.is_aimet:
                continue  # its QDQ model comes from the aimet stage
            sim = layout.float_file(model.name, graph.name, ".sim.onnx")
            ranges = ranges_file(model, graph, variant)
            target = layout.variant_file(model.name, variant.name, graph.name, ".qdq.onnx")
            params = {"onnx": sim, "ranges": ranges, "variant": variant.settings_for(graph.name),
                      "outputs": {"onnx": target}}
            if graph.state:  # each state output is quantized as the input it feeds (the app copies it over)
                params["tied"] = sorted(graph.state.items())
            task = stage_task("quantize", f"{model.name}/{graph.name}/{variant.name}", params,
                              [sim, ranges], [target],
                              layout.variant_file(model.name, variant.name, graph.name, ".quantize.log"))
            task["task_dep"] = split_tasks.checked_first(model, graph, variant)  # the size check fails before this
            yield task


def task_fp16_lint():
    """5 fp16 lint: where an fp16 variant's float model cannot be represented in fp16 (build summary warnings)"""
    return _fp16_lint_tasks()


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


def task_aimet():
    """5 aimet: QDQ model + encodings JSON per variant with quantizer = "aimet" (AIMET's techniques, HTP config)"""
    return aimet_tasks.aimet_tasks()


def task_convert():
    """5 convert (qairt): qnn-onnx-converter per graph and variant -> <graph>.cpp, .bin, _net.json"""
    return _convert_tasks()


@_toolchain_stage("convert")
def _convert_tasks():
    return None  # only qairt has this stage


def task_model_libs():
    """5 model libs (qairt): qnn-model-lib-generator -> model_libs/<target>/lib<graph>.so"""
    return _model_libs_tasks()


@_toolchain_stage("model_libs")
def _model_libs_tasks():
    return None  # only qairt has this stage


def task_htp_config():
    """6 HTP config (qairt): htp_backend_extensions.json + htp_config.json per graph and chip"""
    return _htp_config_tasks()


@_toolchain_stage("htp_config")
def _htp_config_tasks():
    return None  # only qairt has this stage


def task_compile():
    """6 compile: one QNN HTP context binary per graph, variant and chip"""
    return _compile_tasks()


@_toolchain_stage("compile")
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
                                      layout.chip_file(model.name, variant.name, chip.name, f"{unit}.compile.log"))
                    task["task_dep"] = split_tasks.checked_first(model, graph, variant)
                    yield task


def task_check():
    """7 check: run each binary on the HTP emulator vs the float model; fail below the graph's gate"""
    return _check_tasks()


@_toolchain_stage("check")
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
                binaries = [*ctx, *binary] if graph.split else [ctx, binary]
                yield stage_task("check", f"{model.name}/{graph.name}/{variant.name}@{chip.name}", params,
                                  [*binaries, evaluation, *hook_files(model), *data_dep], [report],
                                  layout.chip_file(model.name, variant.name, chip.name, f"{graph.name}.check.log"))


def _evaluate_params(model: Model, graphs: dict, on: str, report: str) -> tuple[dict, list[str]]:
    data_params, data_dep = model_data(model)
    params = {"hooks": rel(model.hooks), "graphs": graphs, "on": on, "outputs": {"report": report},
              "gates": gate_dicts(model.evaluate_gates), **data_params}
    return params, [*graphs.values(), *hook_files(model), *data_dep]


def task_evaluate():
    """7b evaluate: the model's evaluate hook over all graphs (e.g. WER): float on CPU, each binary on the emulator"""
    return _evaluate_tasks()


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
                          layout.float_file(model.name, "model", ".evaluate.log"), key_stage="evaluate_float")
        for variant, chip in variant_builds(model):
            report = layout.chip_file(model.name, variant.name, chip.name, "evaluate.json")
            graphs = {g.name: split_tasks.chip_files(model, g, variant, chip, "_ctx.onnx") for g in model.graphs.values()}
            params, file_dep = _evaluate_params(model, graphs, "emulator", report)
            params["float_report"] = float_report
            binaries = [split_tasks.chip_files(model, g, variant, chip, ".bin") for g in model.graphs.values()]
            file_dep = [f for dep in file_dep for f in (dep if isinstance(dep, list) else [dep])]
            file_dep += [float_report] + [f for b in binaries for f in (b if isinstance(b, list) else [b])]
            yield stage_task("evaluate", f"{model.name}/{variant.name}@{chip.name}", params, file_dep, [report],
                              layout.chip_file(model.name, variant.name, chip.name, "evaluate.log"))


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
    from .stages import package
    return package.run(params)


def task_package():
    """8 package: manifest.json per model, variant and chip (SDK identity, hashes, metrics)"""
    return _package_tasks()


@_toolchain_stage("package")
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


# --- tuning: report, sensitivity, tune (not default tasks; generators in tuning_tasks.py) -------------------

def task_report():
    """9 report: variants x chips per model (size, compile time, emulator metrics) -> out/<model>/report.md + .png"""
    return tuning_tasks.report_tasks()


def task_sensitivity():
    """10 sensitivity: rank each graph's activation tensors by what 8 bit costs (HTP emulator) -> table + plot"""
    return tuning_tasks.sensitivity_tasks()


def task_tune():
    """11 tune: fewest 16-bit tensors meeting each graph's target -> out/<model>/tuning/<variant>.tuned.toml"""
    return tuning_tasks.tune_tasks()


def task_diagnose():
    """7c diagnose: where a binary loses accuracy, tensor by tensor (emulator vs CPU QDQ vs float) -> <graph>.diagnose.md"""
    return diagnose_tasks.diagnose_tasks()


def task_multi_soc():
    """12 multi_soc: [dist] multi_soc = true: one Flexible Context Binary per graph for all the variant's chips"""
    return dist_tasks.multi_soc_tasks()


def task_shared_context():
    """12b shared_context: [model] share_weights: each group's graphs in one context storing shared weights once"""
    return _shared_context_tasks()


@_toolchain_stage("shared_context")
def _shared_context_tasks():
    return dist_tasks.shared_context_tasks()


def task_dist():
    """13 dist: a device bundle per variant (index, checksums, licences; contract checked) + reproducible .tar.gz"""
    return dist_tasks.dist_tasks()


# --- on the phone (issue 29; not default tasks; generators in device_tasks.py, actions in device/) -------------

def task_device_check():
    """14 device_check: [devices.<name>] in devices.toml: the binary on the phone's NPU, judged by the graph's gates"""
    return device_tasks.device_check_tasks()


def task_profile():
    """14b profile: on the phone: context load, first and steady-state latency (qnn-profile-viewer), vs CPU"""
    return device_tasks.profile_tasks()


def task_power():
    """14c power: on the phone: NPU then CPU loops, CPU share and battery drain (BUILD_RULES_POWER_SECONDS)"""
    return device_tasks.power_tasks()


# --- groups -------------------------------------------------------------------------------------

def task_chips():
    """Per-chip groups: `doit SM8750` builds every model for that chip only"""
    return _chips_tasks()


def _chips_tasks():
    for chip in project().chips.chips.values():
        packages = [f"package:{model.name}/{variant.name}@{chip.name}" for model in project().models
                    for variant, c in variant_builds(model) if c.name == chip.name]
        packages += [lint for model in project().models for lint in _fp16_lints(model, chip.name)]
        if packages:
            yield {"basename": chip.name, "actions": None, "task_dep": packages, "uptodate": [True],
                   "doc": f"all models for {chip.marketing_name} ({chip.name}, {chip.dsp_arch}, soc {chip.soc_id}) "
                          f"with {project().toolchain['name']}"}


def task_models():
    """Per-model groups: `doit mtcnn` builds that model for all its chips"""
    return _models_tasks()


def _models_tasks():
    for model in project().models:
        packages = [f"package:{model.name}/{variant.name}@{chip.name}" for variant, chip in variant_builds(model)]
        packages += _fp16_lints(model)
        yield {"basename": model.name, "actions": None, "task_dep": packages, "uptodate": [True],
               "doc": f"{model.description or model.name}: {len(model.graphs)} graph(s) x "
                      f"{len(model.variants)} variant(s) x {len(model.chips)} chip(s)"}



# doit sorts task creators by their line number, from inspect.getsourcelines(), which tokenizes each creator's source
# (~7 ms of every load, most of it compiling tokenize's patterns). __all__ is in pipeline order already: pointing
# each creator's __wrapped__ (which inspect follows) at this module gives line 0 without reading any source, and
# the stable sort keeps __all__'s order (`doit list`, and a user's own task_ functions after these).
for _creator in __all__:
    if _creator.startswith("task_"):
        globals()[_creator].__wrapped__ = sys.modules[__name__]

def doit_config() -> dict:
    from .summary import SummaryReporter
    try:
        models = project().models
        if os.environ.get("BUILD_RULES_REMOTE_CACHE", "").strip():  # remote_cache.ENV (its module is not light)
            from . import remote_cache
            remote_cache.settings()  # a malformed remote cache setting stops the build before any task runs
    except ConfigError as e:
        # A config mistake is the user's to fix: the message, not a traceback through doit's loader.
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(3) from None
    os.makedirs(STATE_DIR, exist_ok=True)
    interrupt.install()  # Ctrl-C and SIGTERM: state kept, one line, stages stopped
    remove_stale_staging()
    use_stat_cache(f"{STATE_DIR}/stat-cache.json")
    use_key_digests(f"{STATE_DIR}/key-digests.json")
    collector.pause()  # no garbage collection while doit loads and checks the tasks (collector.py)
    return {
        "default_tasks": [m.name for m in models],
        "check_file_uptodate": ContentChecker,
        # doit's own backends write once, at exit (a kill -9 forgets every finished task), and its
        # default dbm is dbm.dumb on many Pythons: build_rules/journal.py commits per change and
        # lets one doit at a time work on a repo.
        "backend": "build_rules_journal",
        "dep_file": f"{STATE_DIR}/doit.json",
        "reporter": SummaryReporter,
        "verbosity": 0,
        "sort": "definition",  # `doit list` in pipeline order
    }

