"""Task generators of `doit dist` (not default tasks): multi_soc:<model>/<variant>, dist:<model>/<variant> and the
group dist:<model>.

dist:<model>/<variant> turns one built variant into a bundle (build_rules/stages/dist.py); it depends on that
variant's package tasks, so `doit dist` first brings the binaries up to date, a change to one variant re-makes
only its bundle, and a variant failing its gate does not hold back the others' (`doit --continue dist`). multi_soc makes the
optional Flexible Context Binaries ([dist] multi_soc = true; ort-qnn only). Loaded with the build file: stays
light, like tasks.py.
"""
from __future__ import annotations

from ..build_state import layout
from ..doit_run.project import chip_params, compile_input, project, rel, stage_task, variant_builds
from ..runner import run_stage
from . import device as device_tasks, split as split_tasks


def _multi_soc_chips(model, variant):
    return [c for v, c in variant_builds(model) if v.name == variant.name]


def multi_soc_tasks():
    if project().toolchain["name"] != "ort-qnn":
        return  # a Flexible Context Binary is onnxruntime-qnn's; the dist index says so for qairt
    for model in project().models:
        if not model.dist.multi_soc:
            continue
        for variant in model.variants.values():
            chips = _multi_soc_chips(model, variant)
            if len(chips) < 2:
                continue  # e.g. fp16 on a model whose other chips have no fp16: the index says so
            folder = layout.multi_soc_dir(model.name, variant.name)
            graphs = {g.name: {"onnx": compile_input(model, g, variant),
                               "reference_ctx": layout.chip_file(model.name, variant.name, chips[0].name,
                                                                 f"{g.name}_ctx.onnx")}
                      for g in model.graphs.values() if not g.split}  # a split graph's parts: per chip only
            if not graphs:
                continue
            report = f"{folder}/multi_soc.json"
            params = {"graphs": graphs, "chips": [chip_params(c) for c in chips], "fp16": variant.is_fp16,
                      "outputs": {"dir": folder, "report": report}}
            file_dep = [f for files in graphs.values() for f in files.values()]
            task = stage_task("multi_soc", f"{model.name}/{variant.name}", params, file_dep, [report],
                                     f"{layout.model_dir(model.name)}/{variant.name}/multi_soc.log")
            # The folder is replaced as a whole: a graph whose file could not be made leaves no stale one behind.
            task["actions"] = [(run_stage, task["actions"][0][1], {"publish_dirs": (folder,)})]
            yield task


def shared_folder(model, variant, chip) -> str:
    return layout.chip_file(model.name, variant.name, chip.name, "shared")


def shared_context_tasks():
    """[model] share_weights: per group, variant and chip one context binary holding the group's graphs."""
    if project().toolchain["name"] != "ort-qnn":
        return  # the qairt DLC flow: tasks/qairt.py
    for model in project().models:
        for group in model.share_weights:
            name = "+".join(group)
            for variant, chip in variant_builds(model):
                folder = shared_folder(model, variant, chip)
                graphs = {g: {"onnx": compile_input(model, model.graphs[g], variant),
                              "apart_binary": layout.chip_file(model.name, variant.name, chip.name, f"{g}.bin")}
                          for g in group}
                outputs = {"report": f"{folder}/{name}.json", "binary": f"{folder}/{name}.bin",
                           **{g: f"{folder}/{g}_ctx.onnx" for g in group}}
                params = {"group": name, "graphs": graphs, "chip": chip_params(chip), "fp16": variant.is_fp16,
                          "outputs": outputs}
                file_dep = [f for files in graphs.values() for f in files.values()]
                yield stage_task("shared_context", f"{model.name}/{name}/{variant.name}@{chip.name}", params,
                                 file_dep, list(outputs.values()), f"{folder}/{name}.log")


def dist_tasks():
    loaded = project()
    ort = loaded.toolchain["name"] == "ort-qnn"
    for model in loaded.models:
        variants, file_dep, packages = {}, {}, {}
        for variant in model.variants.values():
            chips, deps, needs = {}, [], []
            for v, chip in variant_builds(model):
                if v.name != variant.name:
                    continue
                m, vn, c = model.name, variant.name, chip.name
                built = {g: {"binary": layout.chip_file(m, vn, c, f"{g}.bin")} for g in model.graphs}
                if ort:
                    for g in model.graphs:
                        built[g]["ctx_model"] = layout.chip_file(m, vn, c, f"{g}_ctx.onnx")
                for graph in model.graphs.values():  # a split graph: its parts in order
                    if graph.split:
                        built[graph.name] = {"parts": [
                            {"name": u, "binary": layout.chip_file(m, vn, c, f"{u}.bin"),
                             "ctx_model": layout.chip_file(m, vn, c, f"{u}_ctx.onnx")}
                            for u in split_tasks.units(model, graph)]}
                runtime = {}
                if not ort:
                    from ..toolchains import qairt
                    runtime = {name: f"{layout.runtime_dir(m, vn, c)}/{name}"
                               for name in qairt.find_sdk().runtime_libs(chip.dsp_arch)}
                manifest = layout.chip_file(m, vn, c, "manifest.json")
                chips[c] = {"manifest": manifest, "graphs": built, "runtime": runtime,
                            "chip": {**chip_params(chip), "marketing_name": chip.marketing_name}}
                deps += [manifest, *runtime.values()] + [f for files in built.values() for f in _files(files)]
                if device_tasks.devices():  # issue 29: index.json lists the device checks (no phone named: no look)
                    from ..device import results as device_results
                    deps += device_results.result_files(layout.chip_dir(m, vn, c), model.graphs)
                needs.append(f"package:{m}/{vn}@{c}")
            if not chips:
                continue
            spec = {"settings": variant.settings(), "chips": chips}
            if model.share_weights:  # one weight-shared context per group and chip, beside the per-graph binaries
                spec["shared"] = _shared_spec(model, variant, ort, loaded.toolchain["name"])
                deps += [f for per_chip in spec["shared"].get("chips", {}).values() for f in per_chip.values()]
            if model.dist.multi_soc and not ort:
                spec["multi_soc"] = {"error": f"the {loaded.toolchain['name']} toolchain makes no multi-SoC "
                                              "binaries (onnxruntime-qnn's Flexible Context Binary)"}
            elif model.dist.multi_soc and all(g.split for g in model.graphs.values()):
                spec["multi_soc"] = {"error": "every graph is split ([graphs.X] split): no multi-SoC file is made of "
                                              "parts"}
            elif model.dist.multi_soc and len(chips) < 2:
                spec["multi_soc"] = {"error": f"variant {variant.name} builds for one chip only ({', '.join(chips)})"}
            elif model.dist.multi_soc:
                spec["multi_soc"] = f"{layout.multi_soc_dir(model.name, variant.name)}/multi_soc.json"
                deps.append(spec["multi_soc"])
            variants[variant.name], file_dep[variant.name], packages[variant.name] = spec, deps, needs
        graphs = {g: {"float": layout.float_file(model.name, g, ".sim.onnx"),
                      "evaluation": layout.float_file(model.name, g, ".evaluation.npz")} for g in model.graphs}
        shared = [f for files in graphs.values() for f in files.values()]
        for g, graph in model.graphs.items():
            if graph.state:  # a step graph: the index says how the app feeds the state back
                graphs[g]["step"] = graph.step_contract()
        license_file = rel(model.dist.license_file) if model.dist.license_file else None
        if license_file:
            shared.append(license_file)
        folder = layout.dist_dir(model.name)
        names = []
        for name, spec in variants.items():
            bundle = f"{folder}/{name}"
            outputs = {"dir": bundle, "index": f"{bundle}/index.json",
                       "tarball": f"{folder}/{model.name}-{name}.tar.gz"}
            params = {"model": {"name": model.name, "description": model.description, "license": model.license},
                      "toolchain": loaded.toolchain, "variant": name, "spec": spec, "variants": sorted(variants),
                      "graphs": graphs,
                      "dist": {"cpu_fallback": model.dist.cpu_fallback, "verify_samples": model.dist.verify_samples,
                               "license_file": license_file, "multi_soc": model.dist.multi_soc},
                      "outputs": outputs}
            task = stage_task("dist", f"{model.name}/{name}", params, file_dep[name] + shared,
                                     [outputs["index"], outputs["tarball"]],
                                     f"{layout.model_dir(model.name)}/{name}/dist.log")  # dist/ holds only bundles
            # The bundle folder is replaced as a whole: a file the new bundle does not have is not left behind.
            task["actions"] = [(run_stage, task["actions"][0][1], {"publish_dirs": (bundle,)})]
            task["task_dep"] = packages[name]
            names.append(f"dist:{task['name']}")
            yield task
        if names:  # `doit dist:<model>`: every variant's bundle
            yield {"name": model.name, "actions": None, "task_dep": names,
                   "doc": f"device bundles of {model.name}'s variants (out/{model.name}/dist/)"}


def _shared_spec(model, variant, ort: bool, toolchain: str) -> dict:
    """Where each chip's weight-shared contexts are (their reports), or why there are none."""
    if not ort and project().toolchain.get("flow") != "dlc":
        return {"error": f"the {toolchain} model-lib flow makes no weight-shared contexts"}
    chips = {}
    for v, chip in variant_builds(model):
        if v.name != variant.name:
            continue
        folder = shared_folder(model, variant, chip)
        chips[chip.name] = {"+".join(group): f"{folder}/{'+'.join(group)}.json" for group in model.share_weights}
    return {"chips": chips}


def _files(built: dict) -> list[str]:
    """The files of one graph's entry: binary and ctx model, or every part's."""
    if "parts" in built:
        return [f for part in built["parts"] for k, f in part.items() if k != "name"]
    return list(built.values())
