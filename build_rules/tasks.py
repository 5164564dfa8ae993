"""The task graph: doit task dicts from chips.toml + models/, one small generator per stage.

dodo.py imports the task_* functions from here. Loading must stay light (no torch, onnx,
onnxruntime, not even numpy): every heavy stage runs in its own process via runner.run_stage.
"""
from __future__ import annotations

import functools
import importlib.metadata
import os
import sys
from pathlib import Path

from . import dist_tasks, layout, remote_cache
from .config import Chip, ChipTable, ConfigError, Graph, Model, Variant, load_chips, load_models, package_folder
from .hashing import ContentChecker, TaskKey, use_stat_cache
from .records import record
from .runner import remove_stale_staging, run_stage

# Bump a stage's number when its output for the same inputs changes: it re-runs that stage everywhere.
STAGE_VERSIONS = {"data": 1, "evaluate": 1, "evaluate_float": 1, "export": 2, "simplify": 2, "verify": 2, "calibrate": 1, "quantize": 2, "compile": 1,
                  "check": 2, "package": 2, "calibration_stats": 1, "report": 1, "sensitivity": 1, "tune": 1,
                  "multi_soc": 1, "dist": 1}
# The Python packages whose version can change each stage's output.
STAGE_TOOLS = {
    "data": (),
    "evaluate": ("onnxruntime", "numpy"),
    "evaluate_float": ("onnxruntime", "numpy"),
    "export": ("torch", "onnxscript", "numpy"),
    "simplify": ("onnx", "onnxsim"),
    "verify": ("onnxruntime", "torch", "numpy"),
    "calibrate": ("numpy",),
    "quantize": ("onnxruntime", "onnx", "numpy"),
    "compile": ("onnxruntime", "onnx"),
    "check": ("onnxruntime", "numpy"),
    "package": (),
    "calibration_stats": ("onnxruntime", "onnx", "numpy"),
    "report": ("onnxruntime", "numpy", "matplotlib"),
    "sensitivity": ("onnxruntime", "onnx", "numpy", "matplotlib"),
    "tune": ("onnxruntime", "onnx", "numpy"),
    "multi_soc": ("onnxruntime", "onnx"),
    "dist": ("onnxruntime", "onnx", "numpy"),
}
SDK_STAGES = ("compile", "check", "evaluate", "package", "report", "sensitivity", "tune", "multi_soc", "dist")
STATE_DIR = f"{layout.OUT}/.build-state"

# What dodo.py imports: every stage and group generator in pipeline order (the order of `doit list`), plus
# the doit configuration.
__all__ = ["doit_config", "task_data", "task_export", "task_simplify", "task_verify", "task_calibrate",
           "task_calibration_stats", "task_quantize", "task_convert", "task_model_libs", "task_htp_config",
           "task_compile", "task_check", "task_evaluate", "task_package", "task_report", "task_sensitivity",
           "task_tune", "task_multi_soc", "task_dist", "task_chips", "task_models"]


@functools.cache
def tool_version(package: str) -> str | None:
    # importlib.metadata.version() parses the whole METADATA file with the email parser (~1.5 ms a
    # package, on every doit load); the version is in its first lines.
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        return None
    for line in (dist.read_text("METADATA") or dist.read_text("PKG-INFO") or "").splitlines():
        if line.startswith("Version:"):
            return line[len("Version:"):].strip()
        if not line:
            break
    return dist.version


@record
class Project:
    root: Path
    chips: ChipTable
    models: list[Model]
    toolchain: dict  # identity: name, versions, build id

    def chips_for(self, model: Model) -> list[Chip]:
        return [self.chips.chips[name] for name in model.chips]


@functools.cache
def project() -> Project:
    _python_files.cache_clear()  # a new load may be another repo or another file set (in-process runs)
    package_folder.cache_clear()
    root = Path(".")  # doit runs in the dodo file's folder; relative paths keep messages and keys short
    chips = load_chips(root / "chips.toml")
    models = load_models(root / "models", chips)
    _check_names(models, chips)
    from . import toolchains  # light: only the chosen toolchain's identity() runs here, from a cache file
    name, _ = toolchains.choose(chips.toolchain)
    identity = toolchains.identity(name, Path(STATE_DIR), chips.qairt_flow)
    return Project(root=root, chips=chips, models=models, toolchain=identity)


def _check_names(models: list[Model], chips: ChipTable) -> None:
    taken = set(STAGE_VERSIONS) | set(chips.chips) | {"report", "convert", "model_libs", "htp_config", "tuning"}
    for model in models:
        if model.name in taken:
            raise ConfigError(f"{model.toml_path}: model folder name '{model.name}' clashes with a stage or chip "
                              "task name; rename the folder")
        for name in model.variants:
            if name in layout.RESERVED_VARIANT_NAMES:
                raise ConfigError(f"{model.toml_path}: [variants.{name}]: '{name}' is reserved (it is a folder of "
                                  "out/<model>/); choose another variant name")


def _key(stage: str, params) -> TaskKey:
    """params: a dict, or a function making it (the key is made only when doit or the cache asks)."""
    return TaskKey(functools.partial(_key_dict, stage, params))


def _key_dict(stage: str, params) -> dict:
    key = {"stage": stage, "version": STAGE_VERSIONS[stage], "params": params() if callable(params) else params,
           "tools": {t: tool_version(t) for t in STAGE_TOOLS[stage]}}
    if stage in SDK_STAGES:
        key["toolchain"] = project().toolchain
    return key


def _stage_task(stage: str, name: str, params: dict, file_dep: list, targets: list[str], log: str,
                doc: str | None = None, key_stage: str | None = None) -> dict:
    """A doit task that runs `stage` in a subprocess; params are both the stage's input and its key
    (key_stage: the stage name the key is made for, when it differs from the module's)."""
    params = dict(params, name=f"{stage}:{name}")
    key = _key(key_stage or stage, params)
    file_dep = [str(p) for p in file_dep]
    cache = {"cache_key": key, "file_dep": file_dep}
    if stage in RELOCATABLE_STAGES:
        cache = {"cache_key": _key(key_stage or stage, functools.partial(_relocatable, params, file_dep, targets)),
                 "file_dep": file_dep, "relocatable": True}
    task = {
        "name": name,
        # cache_key + file_dep: the build cache (build_rules/cache.py) restores outputs made with this key before
        "actions": [(run_stage, [stage, params, targets, log], cache)],
        "file_dep": file_dep,
        "targets": targets,
        "uptodate": [key],
        "clean": True,
    }
    if doc:
        task["doc"] = doc
    return task


# Stages whose outputs do not depend on where their inputs and outputs live (no path is written into them): the
# build cache keys them by content alone, so e.g. a new variant whose pnet quantizes to the same bytes as another
# variant's gets that variant's pnet binaries from the cache.
RELOCATABLE_STAGES = ("simplify", "verify", "calibration_stats", "quantize", "compile", "check")


def _relocatable(params, file_dep: list[str], targets: list[str]):
    """params with input paths replaced by their position in file_dep (whose contents are in the cache key),
    output paths by their file names, and without the task name."""
    deps = {path: f"@dep{i}" for i, path in enumerate(file_dep)}
    outs = set(targets)

    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k != "name" or value is not params}
        if isinstance(value, (list, tuple)):
            return [strip(v) for v in value]
        if isinstance(value, str):
            if value in deps:
                return deps[value]
            if value in outs:
                return "@out/" + value.rsplit("/", 1)[-1]
        return value
    return strip(params)


def _inputs(graph: Graph) -> dict:
    return {name: {"shape": list(s.shape), "dtype": s.dtype} for name, s in graph.inputs.items()}


def _source_onnx(model: Model, graph: Graph) -> str:
    return _rel(model.onnx) if model.onnx else layout.float_file(model.name, graph.name, ".onnx")


def _rel(path: Path) -> str:
    """Paths in task dicts are relative to the repo (doit compares them as strings); a checkpoint
    inside an installed package stays absolute."""
    if not path.is_absolute():
        return str(path)
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _graphs():
    for model in project().models:
        for graph in model.graphs.values():
            yield model, graph


def _quantized_variants(model: Model):
    return [v for v in model.variants.values() if not v.is_fp16]


def _variant_builds(model: Model):
    """(variant, chip) pairs to build; fp16 on a chip without fp16 is skipped (noted in the summary)."""
    for variant in model.variants.values():
        for chip in project().chips_for(model):
            if variant.is_fp16 and not chip.fp16:
                continue
            yield variant, chip


def skipped_builds() -> list[str]:
    notes = []
    for model in project().models:
        for variant in model.variants.values():
            for chip in project().chips_for(model):
                if variant.is_fp16 and not chip.fp16:
                    notes.append(f"{model.name}/{variant.name}@{chip.name}: skipped, {chip.name} "
                                 f"({chip.dsp_arch}) has no fp16 support")
    from . import toolchains
    return notes + toolchains.notes(project().toolchain["name"])


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


def _float_model(model: Model, graph: Graph, variant: Variant) -> str:
    if variant.is_fp16:
        return layout.float_file(model.name, graph.name, ".sim.onnx")
    return layout.variant_file(model.name, variant.name, graph.name, ".qdq.onnx")


def _hook_files(model: Model) -> list[str]:
    """The hooks file and every Python file beside it (hooks often import helpers by path)."""
    return list(_python_files(model.folder, model.hooks))


@functools.cache
def _python_files(folder: Path, hooks: Path) -> tuple[str, ...]:
    # Asked once per task on every doit load: list the folder once per process.
    return tuple(sorted({_rel(hooks), *(_rel(p) for p in folder.glob("*.py"))}))


def _data(model: Model) -> tuple[dict, list[str]]:
    """(params, file_dep) that give a stage the model's data folder, for models with a data stage."""
    if model.data is None:
        return {}, []
    return {"data_dir": layout.data_dir(model.name)}, [f"{layout.data_dir(model.name)}/data.json"]


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
        sources = [_rel(model.folder / ref) for ref in model.data]
        params = {"hooks": _rel(model.hooks), "sources": sources,
                  "tools": {tool: _program_stamp(tool) for tool in model.data_tools},
                  "outputs": {"dir": folder, "manifest": f"{folder}/data.json"}}
        task = _stage_task("data", model.name, params, [*_hook_files(model), *sources], [f"{folder}/data.json"],
                           f"{layout.model_dir(model.name)}/data.log")
        task["actions"] = [(run_stage, task["actions"][0][1], {"publish_dirs": (folder,)})]
        yield task


def task_export():
    """1 export: checkpoint + build hook -> ONNX (static shapes, int32, batch 1)"""
    return _export_tasks()


def _export_tasks():
    for model, graph in _graphs():
        if model.onnx:
            continue  # ONNX-file models enter at simplify
        checkpoints = [_rel(p) for p in model.checkpoint_paths(graph)]
        target = layout.float_file(model.name, graph.name, ".onnx")
        params = {"hooks": _rel(model.hooks), "graph": graph.name, "checkpoints": checkpoints,
                  "inputs": _inputs(graph), "output_names": list(graph.outputs), "outputs": {"onnx": target},
                  "export": graph.export.as_dict(), "model_toml": _rel(model.toml_path),
                  "trusted_checkpoints": model.trusted_checkpoints}
        yield _stage_task("export", f"{model.name}/{graph.name}", params, [*_hook_files(model), *checkpoints],
                          [target], layout.float_file(model.name, graph.name, ".export.log"))


def task_simplify():
    """2 simplify: onnxsim, then check static shapes and no int64 on graph I/O; I/O summary + op inventory"""
    return _simplify_tasks()


def _simplify_tasks():
    for model, graph in _graphs():
        source = _source_onnx(model, graph)
        outputs = {"onnx": layout.float_file(model.name, graph.name, ".sim.onnx"),
                   "io": layout.float_file(model.name, graph.name, ".io.json")}
        params = {"onnx": source, "inputs": _inputs(graph), "output_names": list(graph.outputs), "outputs": outputs,
                  "where": f"{_rel(model.toml_path)} [graphs.{graph.name}]"}
        yield _stage_task("simplify", f"{model.name}/{graph.name}", params, [source], list(outputs.values()),
                          layout.float_file(model.name, graph.name, ".simplify.log"))


def task_verify():
    """3 verify: ONNX Runtime CPU vs PyTorch on real inputs, within the model's tolerance"""
    return _verify_tasks()


def _verify_tasks():
    for model, graph in _graphs():
        sim = layout.float_file(model.name, graph.name, ".sim.onnx")
        checkpoints = [] if model.onnx else [_rel(p) for p in model.checkpoint_paths(graph)]
        outputs = {"report": layout.float_file(model.name, graph.name, ".verify.json"),
                   "evaluation": layout.float_file(model.name, graph.name, ".evaluation.npz")}
        params = {"hooks": _rel(model.hooks), "graph": graph.name, "onnx": sim, "checkpoints": checkpoints,
                  "source_onnx": _source_onnx(model, graph) if model.onnx else None,
                  "inputs": _inputs(graph), "output_names": list(graph.outputs),
                  "verify": graph.verify.as_dict(), "default_evaluation_count": 8, "outputs": outputs,
                  "model_toml": _rel(model.toml_path), "trusted_checkpoints": model.trusted_checkpoints}
        data_params, data_dep = _data(model)
        params.update(data_params)
        file_dep = [sim, *_hook_files(model), *checkpoints, *data_dep] + ([params["source_onnx"]] if model.onnx else [])
        yield _stage_task("verify", f"{model.name}/{graph.name}", params, file_dep, list(outputs.values()),
                          layout.float_file(model.name, graph.name, ".verify.log"))


def _calibration_files(model: Model, graph: Graph, count: int) -> list[str]:
    folder = layout.calibration_dir(model.name, graph.name)
    return [f"{folder}/{layout.raw_name(i, name)}" for i in range(count) for name in graph.inputs]


def task_calibrate():
    """4 calibrate: real calibration inputs -> raw files + input_list.txt (QNN format, shared by variants)"""
    return _calibrate_tasks()


def _calibrate_tasks():
    for model, graph in _graphs():
        if not _quantized_variants(model):
            continue
        folder = layout.calibration_dir(model.name, graph.name)
        input_list = f"{folder}/input_list.txt"
        data_params, data_dep = _data(model)
        # Calibration inputs may come from the model itself (a decoder's from its encoder): weights are a dep.
        checkpoints = [] if model.onnx else [_rel(p) for p in model.checkpoint_paths(graph)]
        params = {"hooks": _rel(model.hooks), "graph": graph.name, "count": graph.calibration_samples,
                  "inputs": _inputs(graph), "outputs": {"dir": folder, "input_list": input_list},
                  "checkpoints": checkpoints, **data_params}
        targets = [input_list, *_calibration_files(model, graph, graph.calibration_samples)]
        yield _stage_task("calibrate", f"{model.name}/{graph.name}", params,
                          [*_hook_files(model), *checkpoints, *data_dep],
                          targets, f"{folder}.calibrate.log")


def _ranges(model: Model, graph: Graph, variant: Variant) -> str:
    return layout.calibration_ranges(model.name, graph.name, variant.calibration_method, variant.calibration_samples)


def task_calibration_stats():
    """4b calibration stats: tensor ranges per float model, method and sample count (ort-qnn; shared by variants)"""
    return _calibration_stats_tasks()


def _calibration_stats_tasks():
    if project().toolchain["name"] != "ort-qnn":
        return  # qairt calibrates inside qnn-onnx-converter
    for model, graph in _graphs():
        done = set()
        for variant in _quantized_variants(model):
            method, samples = variant.calibration_method, variant.calibration_samples
            if (method, samples) in done:
                continue
            done.add((method, samples))
            sim = layout.float_file(model.name, graph.name, ".sim.onnx")
            input_list = f"{layout.calibration_dir(model.name, graph.name)}/input_list.txt"
            target = _ranges(model, graph, variant)
            params = {"onnx": sim, "input_list": input_list, "inputs": _inputs(graph), "method": method,
                      "samples": samples, "outputs": {"ranges": target}}
            yield _stage_task("calibration_stats", f"{model.name}/{graph.name}/{method}-{samples}", params,
                              [sim, input_list, *_calibration_files(model, graph, samples)], [target],
                              f"{layout.calibration_dir(model.name, graph.name)}.{method}-{samples}.stats.log")


def task_quantize():
    """5 quantize: QDQ model per precision variant from the shared calibration ranges (fp16 variants skip this)"""
    return _quantize_tasks()


@_toolchain_stage("quantize")
def _quantize_tasks():
    for model, graph in _graphs():
        for variant in _quantized_variants(model):
            sim = layout.float_file(model.name, graph.name, ".sim.onnx")
            ranges = _ranges(model, graph, variant)
            target = layout.variant_file(model.name, variant.name, graph.name, ".qdq.onnx")
            params = {"onnx": sim, "ranges": ranges, "variant": variant.settings_for(graph.name),
                      "outputs": {"onnx": target}}
            yield _stage_task("quantize", f"{model.name}/{graph.name}/{variant.name}", params,
                              [sim, ranges], [target],
                              layout.variant_file(model.name, variant.name, graph.name, ".quantize.log"))


def _chip_params(chip: Chip) -> dict:
    return {"name": chip.name, "soc_id": chip.soc_id, "dsp_arch": chip.dsp_arch, "vtcm_mb": chip.vtcm_mb}


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
        for variant, chip in _variant_builds(model):
            for graph in model.graphs.values():
                source = _float_model(model, graph, variant)
                outputs = {"binary": layout.chip_file(model.name, variant.name, chip.name, f"{graph.name}.bin"),
                           "ctx_model": layout.chip_file(model.name, variant.name, chip.name, f"{graph.name}_ctx.onnx"),
                           "report": layout.chip_file(model.name, variant.name, chip.name, f"{graph.name}.compile.json")}
                params = {"onnx": source, "graph": graph.name, "chip": _chip_params(chip), "fp16": variant.is_fp16,
                          "outputs": outputs}
                yield _stage_task("compile", f"{model.name}/{graph.name}/{variant.name}@{chip.name}", params,
                                  [source], list(outputs.values()),
                                  layout.chip_file(model.name, variant.name, chip.name, f"{graph.name}.compile.log"))


def task_check():
    """7 check: run each binary on the HTP emulator vs the float model; fail below the graph's gate"""
    return _check_tasks()


@_toolchain_stage("check")
def _check_tasks():
    for model in project().models:
        for variant, chip in _variant_builds(model):
            for graph in model.graphs.values():
                ctx = layout.chip_file(model.name, variant.name, chip.name, f"{graph.name}_ctx.onnx")
                binary = layout.chip_file(model.name, variant.name, chip.name, f"{graph.name}.bin")
                evaluation = layout.float_file(model.name, graph.name, ".evaluation.npz")
                report = layout.chip_file(model.name, variant.name, chip.name, f"{graph.name}.check.json")
                data_params, data_dep = _data(model)
                params = {"ctx_model": ctx, "evaluation": evaluation, "hooks": _rel(model.hooks),
                          "graph": graph.name, "gate": graph.gate.as_dict() if graph.gate else None,
                          "outputs": {"report": report}, **data_params}
                yield _stage_task("check", f"{model.name}/{graph.name}/{variant.name}@{chip.name}", params,
                                  [ctx, binary, evaluation, *_hook_files(model), *data_dep], [report],
                                  layout.chip_file(model.name, variant.name, chip.name, f"{graph.name}.check.log"))


def _evaluate_params(model: Model, graphs: dict, on: str, report: str) -> tuple[dict, list[str]]:
    data_params, data_dep = _data(model)
    params = {"hooks": _rel(model.hooks), "graphs": graphs, "on": on, "outputs": {"report": report},
              "gate": model.evaluate_gate.as_dict() if model.evaluate_gate else None, **data_params}
    return params, [*graphs.values(), *_hook_files(model), *data_dep]


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
        params["gate"] = None  # the float model is the reference, not gated
        yield _stage_task("evaluate", f"{model.name}/float", params, file_dep, [float_report],
                          layout.float_file(model.name, "model", ".evaluate.log"), key_stage="evaluate_float")
        for variant, chip in _variant_builds(model):
            report = layout.chip_file(model.name, variant.name, chip.name, "evaluate.json")
            graphs = {g: layout.chip_file(model.name, variant.name, chip.name, f"{g}_ctx.onnx") for g in model.graphs}
            params, file_dep = _evaluate_params(model, graphs, "emulator", report)
            params["float_report"] = float_report
            file_dep += [float_report] + [layout.chip_file(model.name, variant.name, chip.name, f"{g}.bin")
                                          for g in model.graphs]
            yield _stage_task("evaluate", f"{model.name}/{variant.name}@{chip.name}", params, file_dep, [report],
                              layout.chip_file(model.name, variant.name, chip.name, "evaluate.log"))


def _package(params: dict):
    from .stages import package
    return package.run(params)


def task_package():
    """8 package: manifest.json per model, variant and chip (SDK identity, hashes, metrics)"""
    return _package_tasks()


@_toolchain_stage("package")
def _package_tasks():
    for model in project().models:
        for variant, chip in _variant_builds(model):
            graphs = {g: {"binary": layout.chip_file(model.name, variant.name, chip.name, f"{g}.bin"),
                          "ctx_model": layout.chip_file(model.name, variant.name, chip.name, f"{g}_ctx.onnx"),
                          "check": layout.chip_file(model.name, variant.name, chip.name, f"{g}.check.json")}
                      for g in model.graphs}
            checkpoints = sorted({_rel(p) for g in model.graphs.values() for p in model.checkpoint_paths(g)})
            manifest = layout.chip_file(model.name, variant.name, chip.name, "manifest.json")
            params = {"model": {"name": model.name, "description": model.description, "license": model.license},
                      "model_folder": _rel(model.folder), "variant": {"name": variant.name, **variant.settings()},
                      "chip": {**_chip_params(chip), "marketing_name": chip.marketing_name},
                      "toolchain": project().toolchain,
                      "tools": {t: tool_version(t) for t in ("onnxruntime", "onnx", "onnxsim", "torch")},
                      "checkpoints": checkpoints, "graphs": graphs, "outputs": {"manifest": manifest}}
            evaluation = []
            if model.evaluate and project().toolchain["name"] == "ort-qnn":
                evaluation = [layout.chip_file(model.name, variant.name, chip.name, "evaluate.json")]
                params["evaluate"] = evaluation[0]
            yield {
                "name": f"{model.name}/{variant.name}@{chip.name}",
                "actions": [(_package, [params])],
                "file_dep": [f for files in graphs.values() for f in files.values()] + checkpoints + evaluation,
                "targets": [manifest],
                "uptodate": [_key("package", params)],
                "clean": True,
            }


# --- tuning: report, sensitivity, tune (not default tasks: `doit report`, `doit sensitivity`, `doit tune`) ---

def task_report():
    """9 report: variants x chips per model (size, compile time, emulator metrics) -> out/<model>/report.md + .png"""
    return _report_tasks()


def _report_tasks():
    if project().toolchain["name"] != "ort-qnn":
        return  # reads <graph>.compile.json and measures with the emulator runner of onnxruntime-qnn
    for model in project().models:
        data_params, data_dep = _data(model)
        cells, file_dep = [], []
        for variant, chip in _variant_builds(model):
            for graph in model.graphs.values():
                def chip_file(suffix, g=graph.name, v=variant.name, c=chip.name):
                    return layout.chip_file(model.name, v, c, f"{g}{suffix}")
                cells.append({"variant": variant.name, "chip": chip.name, "graph": graph.name,
                              "compile": chip_file(".compile.json"), "ctx_model": chip_file("_ctx.onnx"),
                              "check": chip_file(".check.json"), "memo": chip_file(".measure.json"),
                              "evaluation": layout.float_file(model.name, graph.name, ".evaluation.npz"),
                              "gate": graph.gate.as_dict() if graph.gate else None})
                file_dep += [chip_file(".compile.json"), chip_file("_ctx.onnx"), chip_file(".bin")]
        file_dep += [layout.float_file(model.name, g, ".evaluation.npz") for g in model.graphs]
        evaluations = {f"{v.name}@{c.name}": layout.chip_file(model.name, v.name, c.name, "evaluate.json")
                       for v, c in _variant_builds(model)} if model.evaluate else {}
        outputs = {"markdown": layout.report_file(model.name, ".md"), "png": layout.report_file(model.name, ".png"),
                   "json": layout.report_file(model.name, ".json")}
        params = {"model": model.name, "cells": cells, "hooks": _rel(model.hooks), "toolchain": project().toolchain,
                  "variants": {v.name: v.settings() for v in model.variants.values()}, "evaluations": evaluations,
                  "outputs": outputs, **data_params}
        yield _stage_task("report", model.name, params, [*file_dep, *_hook_files(model), *data_dep],
                          list(outputs.values()), layout.report_file(model.name, ".log"))


def _tuning_chip(model: Model) -> Chip:
    name = model.tuning.chip if model.tuning and model.tuning.chip else model.chips[0]
    return project().chips.chips[name]


def _tuning_graph(model: Model, graph: Graph, variant: Variant) -> dict:
    return {"name": graph.name, "onnx": layout.float_file(model.name, graph.name, ".sim.onnx"),
            "ranges": _ranges(model, graph, variant),
            "evaluation": layout.float_file(model.name, graph.name, ".evaluation.npz"),
            "variant": variant.settings_for(graph.name)}


def _tuning_deps(g: dict) -> list[str]:
    return [g["onnx"], g["ranges"], g["evaluation"]]


def task_sensitivity():
    """10 sensitivity: rank each graph's activation tensors by what 8 bit costs (HTP emulator) -> table + plot"""
    return _sensitivity_tasks()


def _sensitivity_tasks():
    if project().toolchain["name"] != "ort-qnn":
        return
    for model, graph in _graphs():
        data_params, data_dep = _data(model)
        for variant in _quantized_variants(model):
            g = _tuning_graph(model, graph, variant)
            outputs = {key: layout.tuning_file(model.name, variant.name, f"{graph.name}.sensitivity.{ext}")
                       for key, ext in (("json", "json"), ("markdown", "md"), ("png", "png"))}
            params = {"graph": g, "chip": _chip_params(_tuning_chip(model)), "variant_name": variant.name,
                      "samples": model.tuning.samples if model.tuning else 32, "hooks": _rel(model.hooks),
                      "outputs": outputs, **data_params}
            yield _stage_task("sensitivity", f"{model.name}/{graph.name}/{variant.name}", params,
                              [*_tuning_deps(g), *_hook_files(model), *data_dep], list(outputs.values()),
                              layout.tuning_file(model.name, variant.name, f"{graph.name}.sensitivity.log"))


def task_tune():
    """11 tune: fewest 16-bit tensors meeting each graph's target -> out/<model>/tuning/<variant>.tuned.toml"""
    return _tune_tasks()


def _tune_tasks():
    if project().toolchain["name"] != "ort-qnn":
        return
    for model in project().models:
        data_params, data_dep = _data(model)
        for variant in _quantized_variants(model):
            graphs, file_dep = [], []
            for graph in model.graphs.values():
                g = _tuning_graph(model, graph, variant)
                target = (model.tuning.targets.get(graph.name) if model.tuning else None) or graph.gate
                # The sensitivity result is reused when present and made from the same inputs (its key says),
                # else tune measures the ranking itself: no dependency, so graphs that already meet their
                # target cost one emulator run, not a sensitivity analysis.
                g.update(target=target.as_dict() if target else None,
                         sensitivity=layout.tuning_file(model.name, variant.name, f"{graph.name}.sensitivity.json"))
                graphs.append(g)
                file_dep += _tuning_deps(g)
            new_name = f"{variant.name}_tuned"
            number = 2
            while new_name in model.variants:
                new_name, number = f"{variant.name}_tuned{number}", number + 1
            outputs = {"toml": layout.tuning_file(model.name, variant.name, ".tuned.toml"),
                       "json": layout.tuning_file(model.name, variant.name, ".tuned.json")}
            params = {"model": model.name, "variant": variant.name, "new_name": new_name, "graphs": graphs,
                      "chip": _chip_params(_tuning_chip(model)), "model_toml": _rel(model.toml_path),
                      "samples": model.tuning.samples if model.tuning else 32, "hooks": _rel(model.hooks),
                      "outputs": outputs, **data_params}
            yield _stage_task("tune", f"{model.name}/{variant.name}", params, [*file_dep, *_hook_files(model), *data_dep],
                              list(outputs.values()), layout.tuning_file(model.name, variant.name, ".tune.log"))


def task_multi_soc():
    """12 multi_soc: [dist] multi_soc = true: one Flexible Context Binary per graph for all the variant's chips"""
    return dist_tasks.multi_soc_tasks()


def task_dist():
    """13 dist: a device bundle per variant (index, checksums, licences; contract checked) + reproducible .tar.gz"""
    return dist_tasks.dist_tasks()


# --- groups -------------------------------------------------------------------------------------

def task_chips():
    """Per-chip groups: `doit SM8750` builds every model for that chip only"""
    return _chips_tasks()


def _chips_tasks():
    for chip in project().chips.chips.values():
        packages = [f"package:{model.name}/{variant.name}@{chip.name}" for model in project().models
                    for variant, c in _variant_builds(model) if c.name == chip.name]
        if packages:
            yield {"basename": chip.name, "actions": None, "task_dep": packages, "uptodate": [True],
                   "doc": f"all models for {chip.marketing_name} ({chip.name}, {chip.dsp_arch}, soc {chip.soc_id}) "
                          f"with {project().toolchain['name']}"}


def task_models():
    """Per-model groups: `doit mtcnn` builds that model for all its chips"""
    return _models_tasks()


def _models_tasks():
    for model in project().models:
        packages = [f"package:{model.name}/{variant.name}@{chip.name}" for variant, chip in _variant_builds(model)]
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

def _interrupt_on_sigterm() -> None:
    """doit saves its state only when a Python exception unwinds it: Ctrl-C does, SIGTERM (CI timeouts,
    `kill`) would not, and every finished task would be forgotten. Treat SIGTERM like Ctrl-C."""
    import signal

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, interrupt)


_startup_frozen = False


def _freeze_startup_objects() -> None:
    """Creating the task dicts allocates enough to trigger full collections of the cyclic GC, and each
    one walks every object the imports made (doit, importlib.metadata, email, ...): ~15 ms of a ~150 ms
    no-op build. Those objects live as long as the process, so they are moved out of the collector's
    sight (gc.freeze). Once per process: tests load the build file many times in one."""
    global _startup_frozen
    if not _startup_frozen:
        import gc
        gc.freeze()
        _startup_frozen = True


def doit_config() -> dict:
    from .summary import SummaryReporter
    try:
        models = project().models
        remote_cache.settings()  # a malformed remote cache setting stops the build before any task runs
    except ConfigError as e:
        # A config mistake is the user's to fix: the message, not a traceback through doit's loader.
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(3) from None
    os.makedirs(STATE_DIR, exist_ok=True)
    _interrupt_on_sigterm()
    remove_stale_staging()
    use_stat_cache(f"{STATE_DIR}/stat-cache.json")
    _freeze_startup_objects()
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

