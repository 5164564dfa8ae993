"""Task generator of the aimet stage: aimet:<model>/<graph>/<variant> for each variant with quantizer = "aimet"
(build_rules/stages/aimet.py). It takes the place of the quantize stage for those variants: its QDQ model is at the
path the ort-qnn compile reads (<variant>/<graph>.qdq.onnx), and its encodings JSON is what the qairt converters get
as --quantization_overrides. Toolchain-independent (AIMET runs on the CPU), so both toolchains have it.

Loaded with the build file: aimet-onnx is never imported here. Whether it is installed is read from its
distribution metadata; without it, the task fails at once naming the extra (no stage process starts), and every
other task works as before.
"""
from __future__ import annotations

from doit.exceptions import TaskFailed

from ..build_state import layout
from ..configuration.config import Model, Variant
from ..errors import AIMET_INSTALL
from ..doit_run.project import calibration_files, input_specs, model_graphs, project, stage_task
from ..plumbing.tool_versions import tool_version
from . import split as split_tasks

DIST = "aimet-onnx"
INSTALL = AIMET_INSTALL


def aimet_variants(model: Model) -> list[Variant]:
    return [v for v in model.variants.values() if not v.is_fp16 and v.is_aimet]


def ort_variants(model: Model) -> list[Variant]:
    """Quantized variants of onnxruntime's recipe (the ones `doit sensitivity` and `doit tune` start from)."""
    return [v for v in model.variants.values() if not v.is_fp16 and not v.is_aimet]


def oldest_arch(model: Model) -> str:
    """The QuantSim config follows the chips: the oldest dsp_arch among the model's chips ("v73")."""
    return min((chip.dsp_arch for chip in project().chips_for(model)), key=lambda a: int(a[1:]))


def qdq_file(model: str, variant: str, graph: str) -> str:
    return layout.variant_file(model, variant, graph, ".qdq.onnx")


def encodings_file(model: str, variant: str, graph: str) -> str:
    return layout.variant_file(model, variant, graph, ".encodings.json")


def float_file(model: str, variant: str, graph: str) -> str:
    """The float model the encodings belong to (its weights as cle / adaround left them)."""
    return layout.variant_file(model, variant, graph, ".aimet.onnx")


def report_file(model: str, variant: str, graph: str) -> str:
    return layout.variant_file(model, variant, graph, ".aimet.json")


def missing_message(variant: str, model: Model) -> str:
    return (f"{model.toml_path}: [variants.{variant}] quantizer = \"aimet\" needs the Python package {DIST}, which is "
            f"not installed: {INSTALL}")


def _require_aimet(message: str):
    """doit action before the stage's: fails the task with the install line when aimet-onnx is missing."""
    if tool_version(DIST) is None:
        return TaskFailed(message)
    return None


def aimet_tasks():
    installed = tool_version(DIST)
    note = f"aimet-onnx {installed}" if installed else f"aimet-onnx not installed: {INSTALL}"
    yield {"name": None, "doc": f"5 aimet: QDQ model + encodings per variant with quantizer = \"aimet\" ({note})"}
    for model, graph in model_graphs():
        for variant in aimet_variants(model):
            m, g, v = model.name, graph.name, variant.name
            input_list = f"{layout.calibration_dir(m, g)}/input_list.txt"
            sim = layout.float_file(m, g, ".sim.onnx")
            outputs = {"onnx": qdq_file(m, v, g), "encodings": encodings_file(m, v, g), "float_onnx": float_file(m, v, g),
                       "report": report_file(m, v, g)}
            params = {"onnx": sim, "input_list": input_list, "inputs": input_specs(graph),
                      "variant": variant.settings_for(g), "htp_arch": oldest_arch(model), "outputs": outputs}
            if graph.state:  # each state output takes the encoding of the input it feeds (the app copies it over)
                params["tied"] = sorted(graph.state.items())
            task = stage_task("aimet", f"{m}/{g}/{v}", params,
                              [sim, input_list, *calibration_files(model, graph, variant.quant.calibration_samples)],
                              list(outputs.values()), layout.variant_file(m, v, g, ".aimet.log"),
                              names={"model": m, "graph": g, "variant": v})
            task["actions"] = [(_require_aimet, [missing_message(v, model)]), *task["actions"]]
            task["task_dep"] = split_tasks.checked_first(model, graph, variant)  # the size check fails before this
            yield task


def package_reports(model: Model, variant: Variant, params: dict) -> list[str]:
    """An aimet variant's manifest lists each graph's aimet report: adds them to the package task's params, returns
    them for its file_dep (none for other variants)."""
    if not variant.is_aimet:
        return []
    params["aimet"] = {g: report_file(model.name, variant.name, g) for g in model.graphs}
    return list(params["aimet"].values())


def report_reports(model: Model, params: dict) -> list[str]:
    """`doit report` names each aimet variant's QuantSim config: adds {variant: {graph: report}} to its params."""
    params["aimet"] = {v.name: {g: report_file(model.name, v.name, g) for g in model.graphs}
                       for v in aimet_variants(model)}
    return [path for reports in params["aimet"].values() for path in reports.values()]


def tune_calibration(model: Model, graph, variant: Variant, tuning_graph: dict) -> list[str]:
    """The tune stage's whole-variant ladder quantizes with AIMET too: the calibration files and QuantSim arch it
    needs go into the graph's tuning params; returns them for the task's file_dep."""
    input_list = f"{layout.calibration_dir(model.name, graph.name)}/input_list.txt"
    tuning_graph["calibration"] = {"input_list": input_list, "inputs": input_specs(graph), "htp_arch": oldest_arch(model)}
    return [input_list, *calibration_files(model, graph, variant.quant.calibration_samples)]
