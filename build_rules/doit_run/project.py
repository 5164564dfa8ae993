"""The loaded project (chips.toml, models/, the toolchain) and the pieces every task generator shares: task keys,
the stage task dict, which variant x chip pairs are built, and where a graph's inputs come from.

the task generators (build_rules/tasks/) and summary.py import
this module; it imports none of them. Loading must stay light (no torch, onnx, onnxruntime, not even numpy).
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

from .. import stage_table
from ..build_state import layout
from ..configuration.config import (Chip, ChipTable, ConfigError, Graph, Model, TomlCache, Variant, load_chips, load_models,
                     package_folder)
from ..build_state.hashing import TaskKey
from ..plumbing.records import record
from ..runner import run_stage
from ..build_state.state import STATE_DIR, TOML_CACHE
from ..plumbing.tool_versions import tool_version



@record
class Project:
    root: Path
    chips: ChipTable
    models: list[Model]
    toolchain: dict  # identity: name, versions, build id
    toolchain_why: str = ""  # why this toolchain (toolchains.choose): the build's first line says it

    def chips_for(self, model: Model) -> list[Chip]:
        return [self.chips.chips[name] for name in model.chips]


@functools.cache
def project() -> Project:
    _python_files.cache_clear()  # a new load may be another repo or another file set (in-process runs)
    _checkpoint_files.clear()
    package_folder.cache_clear()
    root = Path(".")  # doit runs in the dodo file's folder; relative paths keep messages and keys short
    toml_cache = TomlCache(TOML_CACHE)
    try:
        chips = load_chips(root / "chips.toml", toml_cache)
        models = load_models(root / "models", chips, toml_cache)
    finally:
        toml_cache.save()  # also what parsed before an error: the next run reads the fixed file only
    _check_names(models, chips)
    from .. import toolchains  # light: only the chosen toolchain's identity() runs here, from a cache file
    name, why = toolchains.choose(chips.toolchain)
    identity = toolchains.identity(name, Path(STATE_DIR), chips.qairt_flow)
    _check_toolchain_support(models, identity)
    return Project(root=root, chips=chips, models=models, toolchain=identity, toolchain_why=why)


def _check_toolchain_support(models: list[Model], identity: dict) -> None:
    """Splitting runs on ort-qnn only (the qairt converter calibrates each graph itself, so a cut tensor would get
    two encodings); weight-shared contexts need qnn-context-binary-generator's --dlc_path list (the DLC flow)."""
    for model in models:
        split = [g.name for g in model.graphs.values() if g.split]
        if split and identity["name"] != "ort-qnn":
            raise ConfigError(f"{model.toml_path}: [graphs.{split[0]}] split: the {identity['name']} toolchain does "
                              "not split graphs (ort-qnn does: toolchain = \"ort-qnn\" in chips.toml, or "
                              "BUILD_RULES_TOOLCHAIN=ort-qnn)")
        if model.share_weights and identity["name"] == "qairt" and identity.get("flow") != "dlc":
            raise ConfigError(f"{model.toml_path}: [model] share_weights: the qairt model-lib flow compiles one "
                              "model library per binary; weight-shared contexts need the DLC flow (qairt_flow = "
                              "\"dlc\" in chips.toml, or BUILD_RULES_QAIRT_FLOW=dlc)")


def _check_names(models: list[Model], chips: ChipTable) -> None:
    taken = stage_table.TASK_NAMES | set(chips.chips)
    for model in models:
        if model.name in taken:
            raise ConfigError(f"{model.toml_path}: model folder name '{model.name}' clashes with a stage or chip "
                              "task name; rename the folder")
        for name in model.variants:
            if name in layout.RESERVED_VARIANT_NAMES:
                raise ConfigError(f"{model.toml_path}: [variants.{name}]: '{name}' is reserved (it is a folder of "
                                  "out/<model>/); choose another variant name")


def task_key(stage: str, params) -> TaskKey:
    """params: a dict, or a function making it (the key is made only when doit or the cache asks)."""
    return TaskKey(functools.partial(_key_dict, stage, params))


def _key_dict(stage: str, params) -> dict:
    worker = stage_table.BY_KEY[stage]  # stage_table.py: the key's version, tools, SDK dependence
    key = {"stage": stage, "version": worker.version, "params": params() if callable(params) else params,
           "tools": {t: tool_version(t) for t in worker.tools}}
    if worker.sdk:
        key["toolchain"] = project().toolchain
    return key


def stage_task(stage: str, name: str, params: dict, file_dep: list, targets: list[str], log: str,
                doc: str | None = None, key_stage: str | None = None, names: dict | None = None) -> dict:
    """A doit task that runs `stage`'s worker (stage_table.py) in a subprocess; params are both the stage's input and
    its key (key_stage: the key's stage name, when it differs from the stage's). names: what the task builds
    ({"model", "graph", "variant", "chip"}, as values), handed to the worker as params["names"]; not in the key,
    which holds them already in the task's name."""
    params = dict(params, name=f"{stage}:{name}")
    worker = stage_table.BY_KEY[key_stage or stage]
    key = task_key(worker.key, params)
    file_dep = [str(p) for p in file_dep]
    cache = {"cache_key": key, "file_dep": file_dep}
    if worker.relocatable:
        cache = {"cache_key": task_key(key_stage or stage, functools.partial(_relocatable, params, file_dep, targets)),
                 "file_dep": file_dep, "relocatable": True}
    if names:
        cache["names"] = names
    task = {
        "name": name,
        # cache_key + file_dep: the build cache (build_rules/cache.py) restores outputs made with this key before
        "actions": [(run_stage, [worker.module, params, targets, log], cache)],
        "file_dep": file_dep,
        "targets": targets,
        "uptodate": [key],
        "clean": True,
    }
    if doc:
        task["doc"] = doc
    return task


def in_process_stage(stage: str, params: dict):
    """doit action of a stage light enough to run inside doit (a size check, qairt's package): its BuildError is the
    user's to fix, so the task fails with the message, not a traceback."""
    import importlib

    from doit.exceptions import TaskFailed

    from ..errors import BuildError
    try:
        return importlib.import_module(f"build_rules.stages.{stage}").run(params)
    except BuildError as e:
        return TaskFailed(str(e))


def _relocatable(params, file_dep: list[str], targets: list[str]):
    """For a relocatable stage (its outputs do not depend on where its inputs and outputs live: no path is written
    into them; e.g. a new variant whose pnet quantizes to the same bytes as another variant's gets that variant's
    pnet binaries from the build cache): params with input paths replaced by their position in file_dep (whose contents are in the cache key),
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


def input_specs(graph: Graph) -> dict:
    return {name: {"shape": list(s.shape), "dtype": s.dtype} for name, s in graph.inputs.items()}


def source_onnx(model: Model, graph: Graph) -> str:
    return rel(model.onnx) if model.onnx else layout.float_file(model.name, graph.name, ".onnx")


def rel(path: Path) -> str:
    """Paths in task dicts are relative to the repo (doit compares them as strings); a checkpoint
    inside an installed package stays absolute."""
    if not path.is_absolute():
        return str(path)
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def model_graphs():
    for model in project().models:
        for graph in model.graphs.values():
            yield model, graph


def quantized_variants(model: Model):
    return [v for v in model.variants.values() if not v.is_fp16]


def variant_builds(model: Model):
    """(variant, chip) pairs to build; fp16 on a chip without fp16 is skipped (noted in the summary)."""
    for variant in model.variants.values():
        for chip in project().chips_for(model):
            if variant.is_fp16 and not chip.fp16:
                continue
            yield variant, chip


EVERY_CHIP_ENV = "BUILD_RULES_CHECK_EVERY_CHIP"  # =1: a full emulator check on every chip, for every model


def reference_chip(model: Model, variant: Variant) -> Chip | None:
    """The chip whose binaries of `variant` the emulator checks in full; the other chips' checks prove their outputs
    equal to its on a few samples and take its metrics (stages/check.py). None: every chip is checked in full."""
    if model.check.every_chip or os.environ.get(EVERY_CHIP_ENV, "").strip() not in ("", "0"):
        return None
    chips = [chip for v, chip in variant_builds(model) if v.name == variant.name]
    if len(chips) < 2:
        return None
    wanted = model.check.reference_chip or DEFAULT_REFERENCE
    return next((c for c in chips if c.name == wanted), chips[0])


DEFAULT_REFERENCE = "SM8750"


def preferred_reference(model: Model) -> str:
    """The name of the chip the checks take as reference ([check] reference_chip, else SM8750) when the model builds
    for it, else its first chip: also where tune and sensitivity measure unless [tuning] chip says otherwise, so a
    proposal is judged on the chip whose check judges the variant in full."""
    wanted = model.check.reference_chip or DEFAULT_REFERENCE
    return wanted if wanted in model.chips else model.chips[0]


def skipped_builds() -> list[str]:
    notes = []
    for model in project().models:
        for variant in model.variants.values():
            for chip in project().chips_for(model):
                if variant.is_fp16 and not chip.fp16:
                    notes.append(f"{model.name}/{variant.name}@{chip.name}: skipped, {chip.name} "
                                 f"({chip.dsp_arch}) has no fp16 support")
    from .. import toolchains
    return notes + toolchains.notes(project().toolchain)


def compile_input(model: Model, graph: Graph, variant: Variant) -> str:
    if variant.is_fp16:
        return layout.float_file(model.name, graph.name, ".sim.onnx")
    return layout.variant_file(model.name, variant.name, graph.name, ".qdq.onnx")


def hook_files(model: Model) -> list[str]:
    """The hooks file and every Python file beside it (hooks often import helpers by path)."""
    return list(_python_files(model.folder, model.hooks))


@functools.cache
def _python_files(folder: Path, hooks: Path) -> tuple[str, ...]:
    # Asked once per task on every doit load: list the folder once per process.
    return tuple(sorted({rel(hooks), *(rel(p) for p in folder.glob("*.py"))}))


_checkpoint_files: dict[tuple, tuple[str, ...]] = {}


def checkpoint_files(model: Model, graph: Graph | None = None) -> list[str]:
    """A graph's checkpoints as task paths, or with graph=None every graph's (sorted, once each); made once per
    load: several stages ask for each graph, and a pkg: checkpoint is an absolute path that rel() tries against
    the working folder."""
    key = (model.name, graph.name if graph else None)
    files = _checkpoint_files.get(key)
    if files is None:
        if graph is None:
            files = tuple(sorted({f for g in model.graphs.values() for f in checkpoint_files(model, g)}))
        else:
            files = tuple(rel(p) for p in model.checkpoint_paths(graph))
        _checkpoint_files[key] = files
    return list(files)


def model_data(model: Model) -> tuple[dict, list[str]]:
    """(params, file_dep) that give a stage the model's data folder, for models with a data stage."""
    if model.data is None:
        return {}, []
    return {"data_dir": layout.data_dir(model.name)}, [f"{layout.data_dir(model.name)}/data.json"]


def calibration_files(model: Model, graph: Graph, count: int) -> list[str]:
    folder = layout.calibration_dir(model.name, graph.name)
    return [f"{folder}/{layout.raw_name(i, name)}" for i in range(count) for name in graph.inputs]


def ranges_file(model: Model, graph: Graph, variant: Variant) -> str:
    return layout.calibration_ranges(model.name, graph.name, variant.quant.calibration_method, variant.quant.calibration_samples)


def chip_params(chip: Chip) -> dict:
    return {"name": chip.name, "soc_id": chip.soc_id, "dsp_arch": chip.dsp_arch, "vtcm_mb": chip.vtcm_mb}
