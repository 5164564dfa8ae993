"""Stage 5 (quantizer = "aimet"), aimet: float model + the shared calibration raw files -> QDQ model + encodings JSON,
with Qualcomm's AIMET (aimet-onnx, the `aimet` extra).

Steps: the float model as onnxruntime's quantizer prepares it (qnn_preprocess_model: the exporters' Erf form of Gelu
fused back into Gelu, which QNN runs and Erf it does not), cross-layer equalization with batch-norm folding ("cle"), a
QuantSim with the HTP QuantSim config of the oldest dsp_arch among the model's chips, the variant's per-tensor
overrides as AIMET tensor precisions, then "seq_mse" / "adaround" on the weights in the order the variant lists them,
activation encodings from the calibration samples, and the export:
- <graph>.qdq.onnx: to_onnx_qdq(prequantize_constants=True, export_int32_bias=True), the model the ort-qnn compile
  takes (the default export keeps float weights behind a Q/DQ pair, which does not compile for HTP);
- <graph>.encodings.json: the same encodings in AIMET's format (1.0.0), which the qairt converters take as
  --quantization_overrides, with
- <graph>.aimet.onnx: the float model those encodings belong to (cle and adaround change the weights), which the
  qairt converters then convert instead of the simplified model;
- <graph>.aimet.json: the config used, what each technique cost, aimet-onnx's version (the manifest lists it), and
  for a step graph the encoding each state pair shares (build_rules/quantization/state_encodings.py, as onnxruntime's quantize).
The HTP configs fuse Conv+PRelu, Conv+Relu, ... into supergroups, which leaves the Conv output unquantized:
onnxruntime's QNN EP then puts that node on the CPU and the compile fails. The config is copied with its
supergroups emptied, so every op output gets its own encoding (the emulator then matched the CPU QDQ model).
"""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from ..plumbing import lean_imports, progress
from ..errors import BuildError
from ..quantization.aimet_techniques import BY_NAME
from ..quantization.dtypes import TYPES
from ..plumbing.files import atomic_write_json
from ..quantization.quant_spec import QuantSpec
from ..measuring.samples import read_input_list

# AIMET's type per model.toml type (dtypes.py). Its activation quantizers are asymmetric: exported unsigned
# (force_activation_as="unsigned").
ACTIVATION_TYPES = {t.name: t.aimet for t in TYPES if t.activation}
WEIGHT_TYPES = {t.name: t.aimet for t in TYPES if t.weight and t.signed}
SCHEMES = {"minmax": "min_max", "percentile": "percentile"}


def config_file(arch: str) -> Path:
    """AIMET's HTP QuantSim config for a dsp_arch ("v73"): that arch's file, else the newest one before it."""
    folder = _aimet_folder() / "common" / "quantsim_config"
    wanted = int(arch.lstrip("v"))
    found = {}
    for path in folder.glob("htp_quantsim_config_v*.json"):
        number = path.stem.removeprefix("htp_quantsim_config_v")
        if number.isdigit():
            found[int(number)] = path
    usable = [n for n in found if n <= wanted]
    if not usable:
        raise BuildError(f"aimet-onnx has no HTP QuantSim config for {arch} or older (it has "
                         f"{', '.join(f'v{n}' for n in sorted(found)) or 'none'} in {folder})")
    return found[max(usable)]


def _aimet_folder() -> Path:
    return Path(lean_imports.aimet_onnx().__file__).parent


def htp_config(arch: str, per_channel: bool, folder: Path) -> tuple[Path, dict]:
    """A copy of the arch's config with no supergroups and the variant's per-channel choice; (path, what changed)."""
    source = config_file(arch)
    config = json.loads(source.read_text())
    changes = {"supergroups_removed": len(config.get("supergroups", []))}
    config["supergroups"] = []  # see the module doc: a fused Conv output would be left unquantized
    if not per_channel:
        config["defaults"]["per_channel_quantization"] = "False"
        for settings in config.get("op_type", {}).values():
            if settings.get("per_channel_quantization") == "True":
                settings["per_channel_quantization"] = "False"
        changes["per_channel"] = "off"
    target = folder / source.name
    target.write_text(json.dumps(config, indent=1))
    return target, {"file": source.name, "hw_version": config["defaults"].get("hw_version"), **changes}


def run(params: dict) -> dict:
    report = quantize(params)
    atomic_write_json(params["outputs"]["report"], report)
    values = {"config": report["config"]["file"],
              **{f"{t}_seconds": r["seconds"] for t, r in report["techniques"].items()}}
    if report.get("int4_kept"):  # the summary's note: these weights are not int4
        from .quantize import int4_note
        values["notes"] = [int4_note(params["name"], report["int4_kept"])]
        print(f"note: {values['notes'][0]}", flush=True)
    return values


def quantize(params: dict) -> dict:
    """Writes outputs "onnx" (QDQ), "encodings" and "float_onnx"; returns the report. params: name, onnx, input_list,
    inputs, variant (settings_for the graph), htp_arch, outputs (the tune stage calls this for its candidates)."""
    import numpy as np
    import onnx
    import torch

    spec = QuantSpec.from_settings(params["variant"])
    torch.manual_seed(0)  # AdaRound's optimisation starts from seeded state: the same inputs give the same result
    np.random.seed(0)
    samples = read_input_list(params["input_list"], params["inputs"], spec.calibration_samples)
    if len(samples) < spec.calibration_samples:
        raise BuildError(f"{params['input_list']}: {len(samples)} calibration samples, "
                         f"{params['name']} needs {spec.calibration_samples}")
    aimet_onnx = lean_imports.aimet_onnx()
    from aimet_onnx.quantsim import QuantizationSimModel

    steps = {"done": 0}
    techniques = list(spec.techniques)
    if params.get("progress", True):  # the tune stage keeps its own counter on the console
        progress.watch(lambda: steps["done"], "steps (techniques, encodings, export)", len(techniques) + 2)
    report = {"aimet_onnx": aimet_onnx.__version__, "htp_arch": params["htp_arch"], "techniques": {},
              "samples": len(samples)}
    # as onnxruntime's quantizer sees it: qnn_preprocess_model fuses the exporters' Erf form of Gelu (and LayerNorm
    # patterns) back into the ops QNN runs; the Erf left as it is falls to the CPU and fails the compile (Whisper)
    from ..toolchains import ort_qnn
    model = ort_qnn.preprocessed_model(params["onnx"])
    with tempfile.TemporaryDirectory(prefix="aimet-") as tmp:
        config, report["config"] = htp_config(params["htp_arch"], spec.per_channel, Path(tmp))
        print(f"QuantSim config: {report['config']['file']} ({report['config']['supergroups_removed']} supergroups "
              f"removed), weights {spec.weights}, activations {spec.activations}, {len(samples)} calibration samples",
              flush=True)
        # A weight two ops share (Whisper's tied token embedding: a Gather table and the logits MatMul) is one
        # quantizer to AIMET, which refuses two consumer kinds: each consumer gets its own copy (the binary has
        # them apart anyway).
        from aimet_onnx.utils import duplicate_shared_initializers
        report["shared_initializers_copied"] = duplicate_shared_initializers(model.graph)
        for technique in [t for t in techniques if BY_NAME[t].before_quantsim]:
            model = _timed(report, technique, lambda t=technique: _equalize(model, t))
            steps["done"] += 1
        sim = QuantizationSimModel(model, param_type=WEIGHT_TYPES[spec.weights],
                                   activation_type=ACTIVATION_TYPES[spec.activations],
                                   quant_scheme=SCHEMES[spec.calibration_method], config_file=str(config),
                                   path=str(Path(tmp) / "sim"))
        _apply_overrides(sim, params, model)
        if spec.weights == "int4":  # weights the HTP takes at no int4 stay 8 bit, as the quantize stage keeps them
            from ..quantization.block_quant import INT4_FALLBACK, int4_refused
            kept = {n: why for n, why in int4_refused(model, spec.per_channel).items()
                    if n not in spec.weight_overrides}
            if kept:
                spec = spec.replace(weight_overrides={**{n: INT4_FALLBACK for n in kept}, **spec.weight_overrides})
                report["int4_kept"] = kept
        if spec.block_size or spec.weight_overrides:  # LPBQ, per-layer weight bits: block_quant.py
            from .support.aimet_blocks import set_weight_precisions
            report["lpbq"] = set_weight_precisions(sim, model, spec)
        for technique in techniques:
            if BY_NAME[technique].before_quantsim:
                continue
            settings = spec.technique_params.get(technique, {})
            _timed(report, technique, lambda t=technique, s=settings: _apply(t, s, sim, samples), settings)
            steps["done"] += 1
        _timed(report, "compute_encodings", lambda: sim.compute_encodings(samples))
        if params.get("tied"):  # a step graph: each state output takes the encoding of the input it feeds
            from ..quantization.state_encodings import tie_aimet
            report["tied"] = tie_aimet(sim, [tuple(pair) for pair in params["tied"]], params["name"])
        steps["done"] += 1
        qdq = sim.to_onnx_qdq(prequantize_constants=True, export_int32_bias=True)
        Path(params["outputs"]["onnx"]).parent.mkdir(parents=True, exist_ok=True)
        onnx.save(qdq, params["outputs"]["onnx"])
        if spec.block_size:  # AIMET writes Gemms, which onnxruntime-qnn does not fuse into LPBQ: MatMul + Add
            from ..quantization.block_quant import matmul_for_blocked_gemms
            report["lpbq"]["as_matmul"] = matmul_for_blocked_gemms(Path(params["outputs"]["onnx"]))
        # the same load check as onnxruntime's QDQ models get: a model the CPU EP refuses fails here, named, and
        # not minutes later in the compile with no node to blame
        from .quantize import check_quantized
        check_quantized(params["outputs"]["onnx"], params["onnx"], params["name"],
                        params.get("final_outputs", params["outputs"])["onnx"], ("AIMET's QDQ export", "AIMET"))
        sim.export(tmp, "model", export_int32_bias=True)
        encodings = json.loads((Path(tmp) / "model.encodings").read_text())
        onnx.save(onnx.load(str(Path(tmp) / "model.onnx")), params["outputs"]["float_onnx"])  # weights inline
        steps["done"] += 1
    atomic_write_json(params["outputs"]["encodings"], encodings)
    report["encodings"] = {"version": encodings.get("version"), "activations": len(encodings["activation_encodings"]),
                           "params": len(encodings["param_encodings"])}
    return report


def _timed(report: dict, name: str, action, settings: dict | None = None):
    started = time.perf_counter()
    print(f"{name}{' ' + json.dumps(settings) if settings else ''} ...", flush=True)
    result = action()
    seconds = round(time.perf_counter() - started, 2)
    report["techniques"][name] = {"seconds": seconds, **(settings or {})}
    print(f"{name}: {seconds} s", flush=True)
    return result


def _function(technique: str):
    """The aimet-onnx function of a technique (aimet_techniques.py)."""
    import importlib
    if technique not in BY_NAME:
        raise BuildError(f"{technique}: not an aimet technique")
    module, name = BY_NAME[technique].function.split(":")
    return getattr(importlib.import_module(module), name)


def _equalize(model, technique: str = "cle"):
    """A technique that edits the float model before QuantSim is made (cross-layer equalization: it folds batch
    norms into the convolutions before it scales them)."""
    _function(technique)(model)
    return model


def _apply(technique: str, settings: dict, sim, samples) -> None:
    """A technique that works on QuantSim's weights (seq_mse, adaround), with the variant's parameters."""
    arguments = BY_NAME[technique].arguments if technique in BY_NAME else {}
    _function(technique)(sim, samples, **{arguments[key]: value for key, value in settings.items()})


def _apply_overrides(sim, params: dict, model) -> None:
    """The variant's overrides / node_overrides (this graph's) as AIMET tensor precisions; a name the float model
    does not have fails with the closest one and the model.toml table to fix."""
    from ..toolchains import qairt
    names = params.get("names")  # absent for tune's candidates, which are no variant of model.toml yet
    where = params["name"] + (f" (fix overrides / node_overrides of [variants.{names['variant']}] in "
                              f"models/{names['model']}/model.toml)" if names else "")
    for tensor, qtype in qairt.tensor_overrides(params["onnx"], params["variant"], where, model).items():
        try:
            sim.set_tensor_precision(tensor, ACTIVATION_TYPES[qtype])
        except ValueError as e:  # a tensor AIMET does not quantize (e.g. an int32 index)
            raise BuildError(f"{where}: override of {tensor!r}: {e}") from None
        print(f"override: {tensor} -> {qtype}", flush=True)
