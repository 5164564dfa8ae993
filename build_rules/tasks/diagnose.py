"""Task generator of `doit diagnose:<model>/<graph>/<variant>@<chip>` (not a default task): where a binary loses
accuracy, tensor by tensor (build_rules/stages/diagnose.py). tasks.py's task_diagnose calls it. Loaded with the
build file: stays light.
"""
from __future__ import annotations

from ..build_state import layout
from ..configuration.config import ConfigError
from ..plumbing.env_settings import number
from ..doit_run.project import chip_params, compile_input, project, ranges_file, rel, stage_task, variant_builds

SAMPLES_ENV = "BUILD_RULES_DIAGNOSE_SAMPLES"  # evaluation samples diagnose runs (default 4; the key has it)


def task_name(model: str, graph: str, variant: str, chip: str) -> str:
    return f"diagnose:{model}/{graph}/{variant}@{chip}"


def diagnose_tasks():
    if project().toolchain["name"] != "ort-qnn":
        return  # the emulator and the in-process compile are onnxruntime-qnn's
    samples = evaluation_samples()
    for model in project().models:
        for variant, chip in variant_builds(model):
            for graph in model.graphs.values():
                if graph.split:
                    continue  # diagnose compiles and compares one whole graph; a split graph's binaries are parts
                def chip_file(suffix, g=graph.name, v=variant.name, c=chip.name):
                    return layout.chip_file(model.name, v, c, f"{g}{suffix}")
                sim = layout.float_file(model.name, graph.name, ".sim.onnx")
                evaluation = layout.float_file(model.name, graph.name, ".evaluation.npz")
                settings = variant.settings_for(graph.name)
                if not variant.is_fp16:
                    settings["activation_bits"] = 8 if variant.quant.activations == "uint8" else 16
                    settings["graph_overrides"] = variant.quant.graph_overrides.get(graph.name, {})
                outputs = {"markdown": chip_file(".diagnose.md"), "png": chip_file(".diagnose.png"),
                           "json": chip_file(".diagnose.json")}
                params = {"model": model.name, "graph_name": graph.name, "variant_name": variant.name,
                          "variant": settings, "chip": chip_params(chip), "onnx": sim,
                          "qdq": None if variant.is_fp16 else compile_input(model, graph, variant),
                          "ctx_model": chip_file("_ctx.onnx"), "evaluation": evaluation, "samples": samples,
                          "model_toml": rel(model.toml_path), "outputs": outputs}
                file_dep = [sim, evaluation, chip_file("_ctx.onnx"), chip_file(".bin")]
                if params["qdq"]:
                    file_dep.append(params["qdq"])
                    # a binary that does not repeat itself: candidate precisions are quantized again from these
                    params["ranges"] = ranges_file(model, graph, variant)
                    file_dep.append(params["ranges"])
                    if graph.state:
                        params["tied"] = sorted(graph.state.items())
                yield stage_task("diagnose", f"{model.name}/{graph.name}/{variant.name}@{chip.name}", params,
                                  file_dep, list(outputs.values()), chip_file(".diagnose.log"))


def evaluation_samples() -> int:
    """BUILD_RULES_DIAGNOSE_SAMPLES (checked at load with the other settings: tasks/__init__.py)."""
    return number(SAMPLES_ENV, 4, whole=True, least=1, what="a whole number of evaluation samples >= 1",
                  error=ConfigError)
