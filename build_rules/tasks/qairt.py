"""Stage tasks of the qairt toolchain, behind tasks.py's `_toolchain_stage` seam.

export, simplify, verify and calibrate are shared with ort-qnn. From there, per graph, in the model-lib flow:
  convert:<model>/<graph>/<variant>            qnn-onnx-converter (quantizes when the variant is not fp16)
  model_libs:<model>/<graph>/<variant>         qnn-model-lib-generator
and in the DLC flow:
  convert:<model>/<graph>/<variant>            qairt-converter -> a float (or fp16) DLC
  quantize:<model>/<graph>/<variant>           qairt-quantizer (quantized variants)
then in both:
  htp_config:<model>/<graph>/<variant>@<chip>  htp_backend_extensions.json + htp_config.json (in-process)
  compile:<model>/<graph>/<variant>@<chip>     qnn-context-binary-generator (--model lib<graph>.so, or --dlc_path)
  check:<model>/<graph>/<variant>@<chip>       qnn-net-run on the x86 HTP emulator, when the SDK has it
  package:<model>/<variant>@<chip>             manifest.json + the SDK's device runtime libraries
Every task's key holds the toolchain identity (SDK version and build id, HTP build id, flow): another SDK or the
other flow re-runs exactly these.
"""
from __future__ import annotations

from pathlib import Path

from .. import stage_table
from ..build_state import layout
from ..configuration.config import ConfigError, gate_dicts
from ..doit_run.project import (calibration_files, checkpoint_files, chip_params, in_process_stage, model_data, project,
                       reference_chip, rel, variant_builds)
from ..build_state.hashing import TaskKey
from ..runner import run_stage
from ..toolchains import qairt
from ..plumbing.tool_versions import tool_version
from . import aimet as aimet_tasks

def flow() -> str:
    return project().toolchain["flow"]


# Where the SDK is does not shape these outputs (its identity, in every key, does): a moved SDK re-runs nothing
# but the HTP configs, which name files in it by absolute path.
LOCATION_PARAMS = ("sdk", "runtime_libs")


def _key(stage: str, params: dict) -> TaskKey:
    if stage != "htp_config":
        params = {k: v for k, v in params.items() if k not in LOCATION_PARAMS}
    worker = stage_table.worker(stage, "qairt", flow())  # its key's stage name, version and tools
    return TaskKey({"stage": worker.key, "version": worker.version, "params": params,
                    "tools": {t: tool_version(t) for t in worker.tools}, "toolchain": project().toolchain})


def _stage_task(stage: str, name: str, params: dict, file_dep: list[str], targets: list[str], log: str) -> dict:
    params = dict(params, name=f"{stage}:{name}")
    module = stage_table.worker(stage, "qairt", flow()).module
    return {"name": name, "actions": [(run_stage, [module, params, targets, log])],
            "file_dep": list(file_dep), "targets": targets, "uptodate": [_key(stage, params)], "clean": True}


def _group(doc: str) -> dict:
    """The stage's line in `doit list`, naming the SDK and flow in use."""
    ident = project().toolchain
    return {"name": None, "doc": f"{doc} [qairt {qairt.release_name(ident)}, {ident['flow']} flow]"}


def input_specs(graph) -> dict:
    return {name: {"shape": list(s.shape), "dtype": s.dtype, "layout": s.layout} for name, s in graph.inputs.items()}


def _variants():
    for model in project().models:
        for graph in model.graphs.values():
            for variant in model.variants.values():
                yield model, graph, variant


def _chip_builds():
    for model in project().models:
        for variant, chip in variant_builds(model):
            for graph in model.graphs.values():
                yield model, graph, variant, chip


def _lib_targets() -> list[str]:
    return [qairt.HOST, qairt.DEVICE] if qairt.ndk_build() else [qairt.HOST]


def _config_files(model, graph, variant, chip) -> tuple[str, str]:
    folder = layout.htp_config_dir(model.name, variant.name, chip.name, graph.name)
    return f"{folder}/htp_backend_extensions.json", f"{folder}/htp_config.json"


def _per_row(model, variant) -> bool:
    archs = {chip.dsp_arch for v, chip in variant_builds(model) if v.name == variant.name}
    return qairt.needs_per_row(variant.settings(), archs)


def _dlc(m: str, v: str, g: str) -> str:
    """The DLC a chip's binary is compiled from (quantized, or fp16)."""
    return layout.variant_file(m, v, g, ".dlc")


def _float_dlc(m: str, v: str, g: str) -> str:
    """A quantized variant's float DLC, the quantizer's input; named <graph>.dlc like the quantized one, since
    the graph takes its name from a DLC's file name (docs/qairt.md)."""
    return f"{layout.OUT}/{m}/{v}/float_dlc/{g}.dlc"


def io_contract(m: str, v: str, c: str, g: str) -> str:
    """Where a binary's I/O contract is read from: the converter's _net.json, or the DLC flow's binary dump."""
    return layout.variant_file(m, v, g, "_net.json") if flow() == "model-lib" else layout.chip_file(m, v, c, f"{g}.info.json")


# --- stages -------------------------------------------------------------------------------------

def convert():
    dlc = flow() == "dlc"
    tool = "qairt-converter per graph and variant -> <graph>.dlc" if dlc else \
        "qnn-onnx-converter per graph and variant -> <graph>.cpp, .bin, _net.json"
    yield _group(f"5 convert: {tool}")
    sdk = qairt.find_sdk()
    for model, graph, variant in _variants():
        m, g, v = model.name, graph.name, variant.name
        sim = layout.float_file(m, g, ".sim.onnx")
        report = layout.variant_file(m, v, g, ".convert.json")
        if dlc:
            outputs = {"dlc": _dlc(m, v, g) if variant.is_fp16 else _float_dlc(m, v, g), "report": report}
        else:
            outputs = {"cpp": layout.variant_file(m, v, g, ".cpp"), "bin": layout.variant_file(m, v, g, ".bin"),
                       "net_json": layout.variant_file(m, v, g, "_net.json"), "report": report}
        file_dep, input_list = [sim], None
        if not variant.is_fp16:
            if not dlc:  # qnn-onnx-converter calibrates; in the DLC flow the quantizer does
                input_list = f"{layout.calibration_dir(m, g)}/input_list.txt"
                file_dep += [input_list, *calibration_files(model, graph, variant.quant.calibration_samples)]
        settings = variant.settings_for(g)  # the graph's own overrides and node_overrides too
        encodings = None
        if variant.is_aimet:  # AIMET's encodings (overrides applied in them) for the float model they belong to
            sim, encodings = aimet_tasks.float_file(m, v, g), aimet_tasks.encodings_file(m, v, g)
            file_dep = [sim, encodings, *file_dep[1:]]
        elif settings.get("block_size") or settings.get("weight_overrides"):
            # onnxruntime's quantizer (block_quant.py) writes the blocks into a QDQ model the converters never see
            raise ConfigError(f"{model.toml_path}: [variants.{v}] block_size / weight_overrides: the qairt "
                              "toolchain takes block encodings from AIMET's encodings only: add quantizer = \"aimet\" "
                              "to the variant, or build it with the ort-qnn toolchain (docs/block_quantization.md)")
        elif settings.get("overrides") or settings.get("node_overrides"):
            outputs["overrides"] = layout.variant_file(m, v, g, ".quantization_overrides.json")
        params = {"sdk": str(sdk.root), "onnx": sim, "graph": g, "inputs": input_specs(graph),
                  "variant": settings, "input_list": input_list, "outputs": outputs,
                  "per_row": False if dlc else _per_row(model, variant), **({"encodings": encodings} if encodings else {})}
        yield _stage_task("convert", f"{m}/{g}/{v}", params, file_dep, list(outputs.values()),
                          layout.variant_file(m, v, g, ".convert.log"))


def quantize():
    """The DLC flow's quantizer; the model-lib flow has no such stage (the converter quantizes)."""
    return _quantize_tasks() if flow() == "dlc" else None


def _quantize_tasks():
    yield _group("5b quantize: qairt-quantizer per graph and quantized variant -> <graph>.dlc")
    sdk = qairt.find_sdk()
    for model, graph, variant in _variants():
        if variant.is_fp16:
            continue
        m, g, v = model.name, graph.name, variant.name
        input_list = f"{layout.calibration_dir(m, g)}/input_list.txt"
        outputs = {"dlc": _dlc(m, v, g), "report": layout.variant_file(m, v, g, ".quantize.json")}
        params = {"sdk": str(sdk.root), "float_dlc": _float_dlc(m, v, g), "graph": g, "inputs": input_specs(graph),
                  "variant": variant.settings(), "input_list": input_list, "outputs": outputs,
                  "per_row": _per_row(model, variant)}
        file_dep = [params["float_dlc"], input_list, *calibration_files(model, graph, variant.quant.calibration_samples)]
        yield _stage_task("quantize", f"{m}/{g}/{v}", params, file_dep, list(outputs.values()),
                          layout.variant_file(m, v, g, ".quantize.log"))


def model_libs():
    """The model-lib flow's libraries; the DLC flow has none."""
    return _model_libs_tasks() if flow() == "model-lib" else None


def _model_libs_tasks():
    targets = _lib_targets()
    note = "" if qairt.DEVICE in targets else " (no ndk-build on PATH: x86_64 only)"
    yield _group(f"5 model libs: qnn-model-lib-generator -> model_libs/<target>/lib<graph>.so{note}")
    sdk = qairt.find_sdk()
    for model, graph, variant in _variants():
        m, g, v = model.name, graph.name, variant.name
        cpp, bin_ = layout.variant_file(m, v, g, ".cpp"), layout.variant_file(m, v, g, ".bin")
        outputs = {t: layout.model_lib(m, v, t, g) for t in targets}
        params = {"sdk": str(sdk.root), "cpp": cpp, "bin": bin_, "graph": g,
                  "lib_targets": None if qairt.DEVICE in targets else [qairt.HOST], "outputs": outputs}
        yield _stage_task("model_libs", f"{m}/{g}/{v}", params, [cpp, bin_], list(outputs.values()),
                          layout.variant_file(m, v, g, ".model_libs.log"))


def htp_config():
    yield _group("6 HTP config: htp_backend_extensions.json + htp_config.json per graph, variant and chip")
    sdk = qairt.find_sdk()
    for model, graph, variant, chip in _chip_builds():
        extensions, config = _config_files(model, graph, variant, chip)
        params = {"sdk": str(sdk.root), "graph_name": qairt.qnn_graph_name(graph.name),
                  "chip": chip_params(chip), "config_abs": str(Path(config).absolute()),
                  "outputs": {"extensions": extensions, "config": config}}
        yield {"name": f"{model.name}/{graph.name}/{variant.name}@{chip.name}",
               "actions": [(in_process_stage, ["htp_config", params])], "file_dep": [], "targets": [extensions, config],
               "uptodate": [_key("htp_config", params)], "clean": True}


def compile():
    dlc = flow() == "dlc"
    source = "--dlc_path <graph>.dlc" if dlc else "--model lib<graph>.so"
    yield _group(f"6 compile: qnn-context-binary-generator {source}, one context binary per graph, variant and chip")
    sdk = qairt.find_sdk()
    for model, graph, variant, chip in _chip_builds():
        m, g, v, c = model.name, graph.name, variant.name, chip.name
        extensions, config = _config_files(model, graph, variant, chip)
        binary = layout.chip_file(m, v, c, f"{g}.bin")
        params = {"sdk": str(sdk.root), "config_file": extensions, "graph": g, "graph_name": qairt.qnn_graph_name(g),
                  "onnx": layout.float_file(m, g, ".sim.onnx"),
                  "inputs": input_specs(graph), "chip": chip_params(chip), "outputs": {"binary": binary}}
        if dlc:
            params["dlc"] = _dlc(m, v, g)
            params["outputs"]["info"] = io_contract(m, v, c, g)
        else:
            params["model_lib"] = layout.model_lib(m, v, qairt.HOST, g)
        # htp_config.json, not the extensions file: that one holds absolute paths, so a moved repo would
        # otherwise recompile every binary although nothing that shapes them changed.
        task = _stage_task("compile", f"{m}/{g}/{v}@{c}", params, [params.get("dlc") or params["model_lib"], config],
                           list(params["outputs"].values()), layout.chip_file(m, v, c, f"{g}.compile.log"))
        task["task_dep"] = [f"size:{m}/{g}/{v}"]  # the size check (build_rules/stages/size.py) fails before this
        yield task


def check():
    sdk = qairt.find_sdk()
    how = "qnn-net-run on the x86 HTP emulator" if sdk.net_run else "not run: this SDK has no qnn-net-run"
    yield _group(f"7 check: each context binary vs the float model ({how})")
    for model, graph, variant, chip in _chip_builds():
        m, g, v, c = model.name, graph.name, variant.name, chip.name
        binary = layout.chip_file(m, v, c, f"{g}.bin")
        io = io_contract(m, v, c, g)
        evaluation = layout.float_file(m, g, ".evaluation.npz")
        hooks = rel(model.hooks)
        params = {"sdk": str(sdk.root), "net_run": sdk.net_run is not None, "binary": binary, "io": io,
                  "flow": flow(), "evaluation": evaluation, "hooks": hooks, "graph": g, "inputs": input_specs(graph),
                  "gates": gate_dicts(graph.gates),
                  "outputs": {"report": layout.chip_file(m, v, c, f"{g}.check.json")}}
        data_params, data_dep = model_data(model)  # score() finds the data folder in DATA_DIR, as with ort-qnn
        params.update(data_params)
        file_dep = [binary, io, evaluation, hooks, *data_dep]
        reference = reference_chip(model, variant) if sdk.net_run else None
        if reference is not None and reference.name != c:
            # as with ort-qnn (pipeline._check_tasks): proven equal to the reference chip's binary on a few samples,
            # it takes that chip's metrics; after the reference's check in doit's order
            r = reference.name
            params["reference"] = {"chip": r, "ctx_model": layout.chip_file(m, v, r, f"{g}.bin"),
                                   "io": io_contract(m, v, r, g), "check": layout.chip_file(m, v, r, f"{g}.check.json"),
                                   "samples": model.check.proof_samples}
            file_dep += [params["reference"]["ctx_model"], params["reference"]["io"]]
        task = _stage_task("check", f"{m}/{g}/{v}@{c}", params, list(dict.fromkeys(file_dep)), [params["outputs"]["report"]],
                           layout.chip_file(m, v, c, f"{g}.check.log"))
        if "reference" in params:
            task["task_dep"] = [f"check:{m}/{g}/{v}@{params['reference']['chip']}"]
            task["meta"] = {"estimate_as": "check (equality proof)"}  # the time left: build_rules/doit_run/plan.py
        yield task


def package():
    yield _group("8 package: context binaries + device runtime libraries + manifest.json per variant and chip")
    sdk, dlc = qairt.find_sdk(), flow() == "dlc"
    for model in project().models:
        for variant, chip in variant_builds(model):
            m, v, c = model.name, variant.name, chip.name
            graphs = {}
            for g in model.graphs:
                files = {"binary": layout.chip_file(m, v, c, f"{g}.bin"),
                         "check": layout.chip_file(m, v, c, f"{g}.check.json"),
                         "convert": layout.variant_file(m, v, g, ".convert.json"), "io": io_contract(m, v, c, g)}
                if dlc and not variant.is_fp16:
                    files["quantize"] = layout.variant_file(m, v, g, ".quantize.json")
                if not dlc:
                    files["model_libs"] = {t: layout.model_lib(m, v, t, g) for t in _lib_targets()}
                graphs[g] = files
            checkpoints = checkpoint_files(model)
            runtime = {name: str(path) for name, path in sdk.runtime_libs(chip.dsp_arch).items()}
            manifest = layout.chip_file(m, v, c, "manifest.json")
            outputs = {"manifest": manifest,
                       "runtime": {name: f"{layout.runtime_dir(m, v, c)}/{name}" for name in runtime}}
            params = {"model": {"name": m, "description": model.description, "license": model.license},
                      "model_folder": rel(model.folder), "variant": {"name": v, **variant.settings()},
                      "chip": {**chip_params(chip), "marketing_name": chip.marketing_name},
                      "toolchain": project().toolchain, "sdk": str(sdk.root),
                      "tools": {t: tool_version(t) for t in ("onnx", "onnxsim", "torch", "numpy")},
                      "checkpoints": checkpoints, "graphs": graphs, "runtime_libs": runtime, "outputs": outputs}
            file_dep = [f for files in graphs.values() for k, f in files.items() if k != "model_libs"]
            file_dep += [f for files in graphs.values() for f in files.get("model_libs", {}).values()] + checkpoints
            file_dep += aimet_tasks.package_reports(model, variant, params)
            yield {"name": f"{m}/{v}@{c}", "actions": [(in_process_stage, ["qairt_package", params])],
                   "file_dep": file_dep, "targets": [manifest, *outputs["runtime"].values()],
                   "uptodate": [_key("package", params)], "clean": True}


def shared_context():
    """[model] share_weights, DLC flow (project.py refuses the model-lib flow): one context per group and chip."""
    if flow() != "dlc" or not any(model.share_weights for model in project().models):
        return None
    return _shared_context_tasks()


def _shared_context_tasks():
    yield _group("12b shared_context: [model] share_weights: the group's DLCs in one weight-shared context binary")
    sdk = qairt.find_sdk()
    for model in project().models:
        for group in model.share_weights:
            name = "+".join(group)
            for variant, chip in variant_builds(model):
                m, v, c = model.name, variant.name, chip.name
                folder = layout.chip_file(m, v, c, "shared")
                graphs = {g: {"dlc": _dlc(m, v, g), "apart_binary": layout.chip_file(m, v, c, f"{g}.bin"),
                              "onnx": layout.float_file(m, g, ".sim.onnx")} for g in group}
                outputs = {"report": f"{folder}/{name}.json", "binary": f"{folder}/{name}.bin",
                           "info": f"{folder}/{name}.info.json"}
                params = {"sdk": str(sdk.root), "group": name, "graphs": graphs, "chip": chip_params(chip),
                          "outputs": outputs}
                yield _stage_task("shared_context", f"{m}/{name}/{v}@{c}", params,
                                  [f for files in graphs.values() for f in files.values()], list(outputs.values()),
                                  f"{folder}/{name}.log")
