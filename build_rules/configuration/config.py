"""chips.toml and models/<name>/model.toml, parsed once into typed objects (the records: config_types.py; the TOML
reading helpers: toml_table.py).

Every error names the file and the key, so a user can fix it without reading this code.
Only the standard library is used: this runs every time doit loads the build file.
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path

from ..quantization.aimet_techniques import PARAMS as TECHNIQUE_PARAMS  # aimet-onnx's defaults of each technique's parameters
from ..quantization.dtypes import ACTIVATION_TYPES, WEIGHT_TYPES
# The typed records (config_types.py) and the TOML reading helpers (toml_table.py), importable from here too.
from .config_types import (BOUND_KEYS, Cache, CheckPolicy, Chip, ChipTable, Dist, ExportSettings, Graph,  # noqa: F401
                           Greedy, Model, Split, TensorSpec, Threshold, Tuning, Variant, gate_dicts)
from ..errors import BuildError, ConfigError  # noqa: F401
from ..quantization.quant_spec import CALIBRATION_METHODS, GRAPH_OVERRIDE_KEYS, QUANTIZERS, QuantSpec
from .toml_table import (BARE_KEY, SAFE_NAME, TYPE_NAMES, TomlCache, _Table, package_folder, read_toml,  # noqa: F401
                         resolve_file, shown_key)

# Names become folder and task names: keep them to one safe path component.
# Upper bounds that keep a typo (a stray digit, 2**63) from exhausting memory or time at load or in a stage.
MAX_CALIBRATION_SAMPLES = 10_000  # one file per sample and input; calibration saturates long before this
MAX_INPUT_ELEMENTS = 1 << 28  # per graph input: 1 GiB of float32 (Whisper's mel input is 240,000)
TENSOR_DTYPES = ("float32", "float16", "int32", "uint8", "int8", "bool")
TOOLCHAINS = ("ort-qnn", "qairt", "auto")
EXPORTERS = ("dynamo", "torchscript")
TUNING_SEARCHES = ("bisect", "exhaustive")  # [tuning] search: how sensitivity and tune measure (see Tuning)
QAIRT_FLOWS = ("model-lib", "dlc")  # qairt toolchain only: model libraries (the seeds' flow) or DLC files
# QNN converter input layouts (qnn-onnx-converter --input_layout); one letter per dim.
INPUT_LAYOUTS = ("NCDHW", "NDHWC", "NCHW", "NHWC", "NCF", "NFC", "NTF", "TNF", "NF", "NC", "F")
# Metrics the tool measures against the float model itself (verify, check), and the direction of well-known
# names (a `cosine` with `max` is a mistake); any other name a hook returns gates by its bound key.
COMPARISON_METRICS = ("cosine", "sqnr", "max_abs", "frame_cosine")
METRICS_HIGHER_IS_BETTER = ("accuracy", "cosine", "sqnr", "frame_cosine")
METRICS_LOWER_IS_BETTER = ("max_abs", "wer")
METRIC_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
# The budget of one context binary when neither chips.toml nor model.toml sets `max_context_mb` (docs/split.md: the
# seed guide's ~1B parameters at fp16, the Hexagon DSP's 32-bit address space, AI Hub's LLM parts of under 1 GB).
DEFAULT_MAX_CONTEXT_MB = 1024.0


# --- chips.toml ------------------------------------------------------------------------------

def load_chips(path: Path, cache: TomlCache | None = None) -> ChipTable:
    root = _Table(path, "", read_toml(path, cache))
    root.check_keys(("default", "toolchain", "qairt_flow", "chips"))
    chips = {}
    for name, data in root.table("chips").data.items():
        t = root.table("chips").table(name)
        root.name(f"[chips.{shown_key(name)}]", name)
        t.check_keys(("marketing_name", "soc_id", "dsp_arch", "vtcm_mb", "fp16", "max_context_mb"))
        arch = t.get("dsp_arch", str)
        if not re.fullmatch(r"v\d\d", arch):
            raise t.error("dsp_arch", f"expected 'v' and two digits like 'v79', got {arch!r}")
        chips[name] = Chip(name=name, marketing_name=t.get("marketing_name", str, ""),
                           soc_id=t.number("soc_id", int, low=1, high=65535, why=" (QNN's numeric SoC id, e.g. 69)"),
                           dsp_arch=arch, vtcm_mb=t.number("vtcm_mb", int, low=1, high=1024, why=" (MB of VTCM, e.g. 8)"),
                           fp16=t.get("fp16", bool), max_context_mb=_megabytes(t, "max_context_mb"))
    default = tuple(root.strings("default", list(chips), what="chip names"))
    table = ChipTable(path=path, chips=chips, default=default,
                      toolchain=root.get("toolchain", str, "auto", choices=TOOLCHAINS),
                      qairt_flow=root.get("qairt_flow", str, "model-lib", choices=QAIRT_FLOWS))
    for name in default:
        table.get(name, f"{path}: default")
    return table


# --- models/<name>/model.toml ----------------------------------------------------------------

def _threshold(t: _Table, key: str, comparison_only: bool = False) -> Threshold | None:
    """One bound on a metric (`verify`), or None when the key is absent."""
    if key not in t.data:
        return None
    return _bound(t.table(key), comparison_only)


def _gates(t: _Table, key: str) -> tuple[Threshold, ...]:
    """`gate = { ... }` or a list of them, `gate = [{ ... }, { ... }]` (all must pass); () when the key is absent."""
    if key not in t.data:
        return ()
    value = t.data[key]
    if isinstance(value, dict):
        return (_bound(t.table(key)),)
    if not isinstance(value, list) or not value:
        raise t.error(key, f"expected a table {{ metric = ..., min = ... }} or a list of them, got {value!r}")
    place = f"{t.where} {key}" if t.where else key
    return tuple(_bound(_Table(t.path, f"{place}[{i}]", item)) for i, item in enumerate(value))


def _bound(s: _Table, comparison_only: bool = False) -> Threshold:
    """A bound on a metric: any metric the check measures or a hook returns, or with comparison_only (verify: ONNX vs
    source) the comparison metrics. The bound key gives the direction (build_rules/measuring/gates.py); relative bounds need
    a float-model value, which only task metrics have."""
    s.check_keys(("metric",) + BOUND_KEYS)
    if comparison_only:
        metric = s.get("metric", str, choices=COMPARISON_METRICS)
    else:
        metric = s.get("metric", str)
        if not METRIC_NAME.match(metric):
            raise s.error("metric", f"{metric!r} is not a metric name (letters, digits, '_', '.', '-')")
    given = [k for k in BOUND_KEYS if k in s.data]
    if len(given) != 1:
        raise s.error(" and ".join(given) or "min", ("two bounds" if given else "missing") + ": give exactly one of "
                      "min (higher is better), max (lower is better), max_decrease / max_increase (against the float "
                      "model), max_change (either way from the float model); several bounds: a list of gates")
    bound_key = given[0]
    relative = bound_key in ("max_decrease", "max_increase", "max_change")
    natural = None
    if metric in METRICS_HIGHER_IS_BETTER + METRICS_LOWER_IS_BETTER:
        natural = metric in METRICS_HIGHER_IS_BETTER
        higher = bound_key in ("min", "max_decrease")
        if bound_key != "max_change" and natural != higher:
            right = ("min" if natural else "max") + (" or max_decrease" if natural else " or max_increase")
            raise s.error(bound_key, f"{metric!r} is {'higher' if natural else 'lower'}-is-better: use {right}")
    if relative and metric in COMPARISON_METRICS:
        raise s.error(bound_key, f"{metric!r} is already measured against the float model: give an absolute "
                                 f"{'min' if natural else 'max'}")
    value = s.get(bound_key, (int, float))
    if not math.isfinite(value):
        raise s.error(bound_key, f"expected a finite number, got {value!r}")
    value = float(value)
    if bound_key in ("max_decrease", "max_increase", "max_change") and value < 0:
        raise s.error(bound_key, f"must be 0 or more (how far from the float model's value), got {value:g}")
    return Threshold(metric=metric, key=bound_key, bound=value)


def _graph(t: _Table, name: str, onnx_entry: bool, default_samples: int, default_export: dict) -> Graph:
    """default_samples: the most calibration samples any variant asks for (32 when none asks);
    default_export: the model-wide [model] export table, which the graph's own keys override."""
    t.check_keys(("checkpoints", "inputs", "outputs", "calibration_samples", "verify", "gate", "export", "state",
                  "cache", "greedy", "max_context_mb", "split"))
    inputs = {}
    input_tables = t.table("inputs", {})
    for input_name in input_tables.data:
        s = input_tables.table(input_name)
        s.check_keys(("shape", "dtype", "layout"))
        shape = s.get("shape", list)
        if not shape or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
            raise s.error("shape", f"every dim must be a positive integer (the NPU runs static shapes), got {shape!r}")
        if math.prod(shape) > MAX_INPUT_ELEMENTS:
            raise s.error("shape", f"{shape!r} is {math.prod(shape):,} elements, more than the {MAX_INPUT_ELEMENTS:,} "
                                   "an input may have; check the dims")
        dtype = s.get("dtype", str)
        if dtype == "int64":
            raise s.error("dtype", "int64 is not supported on QNN HTP: export the input as int32")
        if dtype not in TENSOR_DTYPES:
            raise s.error("dtype", f"expected one of {', '.join(TENSOR_DTYPES)}, got {dtype!r}")
        layout = s.get("layout", str, None, choices=INPUT_LAYOUTS)
        if layout is not None and len(layout) != len(shape):
            raise s.error("layout", f"{layout!r} names {len(layout)} dims, the input has {len(shape)} ({shape!r})")
        inputs[input_name] = TensorSpec(tuple(shape), dtype, layout)
    if not inputs and not onnx_entry:
        raise t.error("inputs", "missing (name = { shape = [...], dtype = \"float32\" } per input)")
    outputs = t.strings("outputs", [], what="output names")
    samples = t.number("calibration_samples", int, default_samples, low=1, high=MAX_CALIBRATION_SAMPLES)
    verify = _threshold(t, "verify", comparison_only=True) or Threshold("max_abs", "max", 1e-4)
    export = _export_settings(_Table(t.path, t._sub("export"), {**default_export, **t.table("export", {}).data}))
    if onnx_entry and "export" in t.data:
        raise t.error("export", "this model enters as an ONNX file ([model] onnx): there is no export to configure")
    state, cache, greedy = _step_contract(t, inputs, tuple(outputs))
    return Graph(name=name, checkpoints=tuple(t.strings("checkpoints", [], what="file names")), inputs=inputs,
                 outputs=tuple(outputs), calibration_samples=samples, verify=verify, gates=_gates(t, "gate"),
                 export=export, state=state, cache=cache, greedy=greedy, max_context_mb=_megabytes(t, "max_context_mb"),
                 split=_split(t))


def _elements(shape: tuple[int, ...]) -> int:
    count = 1
    for d in shape:
        count *= d
    return count


def _step_contract(t: _Table, inputs: dict[str, TensorSpec], outputs: tuple[str, ...]):
    """state (output -> input it feeds), cache and greedy of a step graph, checked against its declared I/O."""
    for key in ("cache", "greedy"):
        if key in t.data and "state" not in t.data:
            raise t.error(key, "only with `state` (which outputs feed which inputs at the next step)")
    if "state" not in t.data:
        return {}, None, None
    table = t.table("state")
    if not table.data:
        raise t.error("state", "empty: give output = \"input\" for each output that feeds an input at the next step")
    if not outputs:
        raise t.error("state", "needs `outputs` (the graph's output names, in order)")
    state = {}
    for output in table.data:
        target = table.get(output, str)
        if output not in outputs:
            raise table.error(output, f"not an output of the graph (outputs: {', '.join(outputs)})")
        if target not in inputs:
            raise table.error(output, f"feeds {target!r}, which is not an input (inputs: {', '.join(inputs)})")
        if target in state.values():
            raise table.error(output, f"input {target!r} is fed by two outputs")
        if inputs[target].dtype not in ("float32", "float16"):
            raise table.error(output, f"feeds {target!r}, a {inputs[target].dtype} input: state is float32 or float16")
        state[output] = target
    cache = _cache(t, inputs, state) if "cache" in t.data else None
    greedy = None
    if "greedy" in t.data:
        g = t.table("greedy")
        g.check_keys(("logits", "token"))
        logits, token = g.get("logits", str), g.get("token", str)
        if logits not in outputs:
            raise g.error("logits", f"{logits!r} is not an output of the graph (outputs: {', '.join(outputs)})")
        if logits in state:
            raise g.error("logits", f"{logits!r} is a state output")
        _int32_scalar(g, "token", token, inputs)
        greedy = Greedy(logits=logits, token=token)
    return state, cache, greedy


def _int32_scalar(t: _Table, key: str, name: str, inputs: dict[str, TensorSpec]) -> None:
    if name not in inputs:
        raise t.error(key, f"{name!r} is not an input of the graph (inputs: {', '.join(inputs)})")
    spec = inputs[name]
    if spec.dtype != "int32" or _elements(spec.shape) != 1:
        raise t.error(key, f"input {name!r} is {spec.dtype}{list(spec.shape)}: it must be one int32 value, e.g. "
                           f"{name} = {{ shape = [1], dtype = \"int32\" }}")


def _cache(t: _Table, inputs: dict[str, TensorSpec], state: dict[str, str]) -> Cache:
    c = t.table("cache")
    c.check_keys(("length", "axis", "offset", "mask"))
    length, axis = c.get("length", int), c.get("axis", int)
    if length < 1:
        raise c.error("length", f"must be at least 1, got {length}")
    for target in state.values():
        shape = inputs[target].shape
        if not 0 <= axis < len(shape):
            raise c.error("axis", f"{axis} is not an axis of state input {target!r} {list(shape)} (0..{len(shape) - 1})")
        if shape[axis] != length:
            raise c.error("length", f"{length}, but state input {target!r} {list(shape)} has {shape[axis]} positions "
                                    f"along axis {axis}")
    offset = c.get("offset", str)
    _int32_scalar(c, "offset", offset, inputs)
    mask = c.get("mask", str, None)
    if mask is not None:
        if mask not in inputs:
            raise c.error("mask", f"{mask!r} is not an input of the graph (inputs: {', '.join(inputs)})")
        spec = inputs[mask]
        if spec.dtype != "int32" or _elements(spec.shape) != length:
            raise c.error("mask", f"input {mask!r} is {spec.dtype}{list(spec.shape)}: it must hold one int32 per "
                                  f"cache position ({length} values, 1 = not written yet, 0 = written)")
    for key, name in (("offset", offset), ("mask", mask)):
        if name in state.values():
            raise c.error(key, f"{name!r} is a state input")
    return Cache(length=length, axis=axis, offset=offset, mask=mask)


def _export_settings(t: _Table) -> ExportSettings:
    t.check_keys(("exporter", "opset"))
    opset = t.get("opset", int, None)
    if opset is not None and not 7 <= opset <= 30:
        raise t.error("opset", f"expected an ONNX opset number such as 17 or 20, got {opset}")
    return ExportSettings(exporter=t.get("exporter", str, "dynamo", choices=EXPORTERS), opset=opset)


def _asked_samples(raw_variants: dict, where: str) -> int | None:
    """The most calibration samples any variant asks for (after `inherits`), or None: a graph calibrates that many
    unless it says otherwise. Wrong types are left for the variant's own parser to report."""
    asked = []
    for name in raw_variants:
        if not isinstance(raw_variants[name], dict):
            continue
        calibration = _merged_variant(name, raw_variants, where).get("calibration")
        samples = calibration.get("samples") if isinstance(calibration, dict) else None
        if isinstance(samples, int) and not isinstance(samples, bool) and 1 <= samples <= MAX_CALIBRATION_SAMPLES:
            asked.append(samples)
    return max(asked, default=None)





VARIANT_KEYS = ("inherits", "precision", "activations", "weights", "per_channel", "calibration", "overrides",
                "node_overrides", "graphs", "quantizer", "techniques", *TECHNIQUE_PARAMS, "block_size",
                "weight_overrides")
# Tables a variant adds to the ones it inherits (key by key) instead of replacing them.
MERGED_VARIANT_TABLES = ("overrides", "node_overrides", "graphs", *TECHNIQUE_PARAMS, "weight_overrides")


def _merged_variant(name: str, raw_variants: dict, where: str, seen: tuple = ()) -> dict:
    """The variant's table with the tables it inherits from underneath it."""
    data = raw_variants[name]
    parent = data.get("inherits")
    if parent is None:
        return dict(data)
    if parent not in raw_variants or parent in seen + (name,):
        raise ConfigError(f"{where}: [variants.{name}] inherits: no such variant {parent!r} (or a cycle)")
    merged = _merged_variant(parent, raw_variants, where, seen + (name,))
    for key, value in data.items():
        if key in MERGED_VARIANT_TABLES and isinstance(value, dict) and isinstance(merged.get(key), dict):
            value = _merge_tables(merged[key], value)
        if key != "inherits":
            merged[key] = value
    return merged


def _merge_tables(base: dict, extra: dict) -> dict:
    merged = dict(base)
    for key, value in extra.items():
        merged[key] = _merge_tables(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) \
            else value
    return merged


def _override_table(t: _Table, key: str) -> dict[str, str]:
    """overrides / node_overrides: tensor or node name -> activation type it keeps."""
    table = t.table(key, {})
    for name in table.data:
        table.get(name, str, choices=ACTIVATION_TYPES)
    return dict(table.data)


def _variant(t: _Table, name: str, raw_variants: dict, graphs: dict[str, Graph]) -> Variant:
    t.check_keys(VARIANT_KEYS)
    data = _merged_variant(name, raw_variants, str(t.path))
    t = _Table(t.path, t.where, data)
    precision = t.get("precision", str, "quantized", choices=("fp16", "quantized"))
    if precision == "fp16":
        extra = [k for k in data if k != "precision"]
        if extra:
            raise t.error(extra[0], "an fp16 variant takes no quantization settings")
        return Variant(name=name, precision="fp16")
    calibration = t.table("calibration", {})
    calibration.check_keys(("method", "samples"))
    smallest = min((g.calibration_samples for g in graphs.values()), default=1)
    samples = calibration.number("samples", int, smallest, low=1, high=MAX_CALIBRATION_SAMPLES)
    for g in graphs.values():
        if samples > g.calibration_samples:
            raise calibration.error("samples", f"{samples} is more than graph {g.name!r} calibrates "
                                               f"(calibration_samples = {g.calibration_samples})")
    graph_overrides = {}
    per_graph = t.table("graphs", {})
    for graph_name in per_graph.data:
        if graph_name not in graphs:
            raise per_graph.error(shown_key(graph_name), f"no graph {graph_name!r} (graphs: {', '.join(graphs)})")
        g = per_graph.table(graph_name)
        g.check_keys(GRAPH_OVERRIDE_KEYS)
        own = {k: _override_table(g, k) for k in ("overrides", "node_overrides") if k in g.data}
        if "weight_overrides" in g.data:  # per-layer weight bits of this graph only (block_quant.py)
            own["weight_overrides"] = _weight_table(g)
        if any(own.values()):
            graph_overrides[graph_name] = own
    techniques = t.get("techniques", list, [])
    spec = QuantSpec(activations=t.get("activations", str, choices=ACTIVATION_TYPES),
                     weights=t.get("weights", str, choices=WEIGHT_TYPES),
                     per_channel=t.get("per_channel", bool, True),
                     calibration_method=calibration.get("method", str, "minmax", choices=CALIBRATION_METHODS),
                     calibration_samples=samples, overrides=_override_table(t, "overrides"),
                     node_overrides=_override_table(t, "node_overrides"), weight_overrides=_weight_table(t),
                     graph_overrides=graph_overrides, quantizer=t.get("quantizer", str, "ort", choices=QUANTIZERS),
                     techniques=tuple(techniques), technique_params=_technique_params(t, techniques),
                     block_size=t.data.get("block_size"))
    for path, message in spec.problems()[:1]:  # quant_spec.py judges the combination; the first names its key
        table = t
        for key in path[:-1]:
            table = table.table(key)
        raise table.error(shown_key(path[-1]), message)
    return Variant(name=name, precision="quantized", quant=spec)


def _weight_table(t: _Table) -> dict[str, str]:
    """weight_overrides: node -> the type of its weight (per-layer weight bits; quant_spec.py checks the types)."""
    table = t.table("weight_overrides", {})
    for node in table.data:
        table.get(node, str)
    return dict(table.data)


def _technique_params(t: _Table, techniques: list) -> dict[str, dict[str, int]]:
    """Each listed AIMET technique's parameters (aimet_techniques.py: its table and defaults)."""
    params = {}
    for name, defaults in TECHNIQUE_PARAMS.items():
        if name not in t.data:
            continue
        table = t.table(name)
        if name not in techniques:
            raise table.error(next(iter(table.data), "iterations"),
                              f"parameters for {name!r}, which is not in techniques = {techniques!r}")
        table.check_keys(tuple(defaults))
        given = {}
        for key in defaults:
            value = table.get(key, int, defaults[key])
            if value < 1:
                raise table.error(key, f"must be at least 1, got {value}")
            given[key] = value
        params[name] = given
    for name in techniques:
        if not isinstance(name, str):
            raise t.error("techniques", f"expected a list of technique names, got {name!r} in it")
        if name in TECHNIQUE_PARAMS:
            params.setdefault(name, dict(TECHNIQUE_PARAMS[name]))
    return params


def load_model(folder: Path, chips: ChipTable, cache: TomlCache | None = None) -> Model:
    path = folder / "model.toml"
    root = _Table(path, "", read_toml(path, cache))
    root.check_keys(("model", "graphs", "variants", "evaluate", "tuning", "dist", "check"))
    m = root.table("model")
    m.check_keys(("description", "license", "hooks", "onnx", "checkpoints", "chips", "trusted_checkpoints", "data",
                  "data_tools", "export", "share_weights"))
    name = folder.name
    root.name("model folder", name)
    onnx_ref = m.get("onnx", str, None)
    hooks = folder / m.get("hooks", str, "export.py")
    if hooks.suffix != ".py":
        raise m.error("hooks", f"expected a Python file (.py) in the model folder, got {hooks.name!r}")
    if not hooks.is_file():
        raise m.error("hooks", f"file not found: {hooks}")
    onnx_path = None
    if onnx_ref is not None:
        onnx_path = resolve_file(onnx_ref, folder, f"{path}: [model] onnx", "ONNX file")
        if "export" in m.data:
            raise m.error("export", "this model enters as an ONNX file (onnx = ...): there is no export to configure")
    default_export = m.table("export", {}).data
    _export_settings(m.table("export", {}))  # a mistake in the model-wide table is reported there
    raw_variants = root.data.get("variants") if isinstance(root.data.get("variants"), dict) else {}
    default_samples = _asked_samples(raw_variants, str(path)) or 32
    model_chips = tuple(m.strings("chips", list(chips.default), what="chip names"))
    if not model_chips:
        raise m.error("chips", f"no chips: name at least one (chips in {chips.path.name}: {', '.join(sorted(chips.chips))})"
                      if "chips" in m.data else f"no chips: {chips.path.name} has an empty `default`; name the model's "
                      "chips here or there")
    for chip in model_chips:
        chips.get(chip, f"{path}: [model] chips")
    graphs = {}
    graph_tables = root.table("graphs")
    if not graph_tables.data:
        raise root.error("[graphs]", "no graphs: add a [graphs.<name>] table")
    for graph_name in graph_tables.data:
        root.name(f"[graphs.{shown_key(graph_name)}]", graph_name)
        graphs[graph_name] = _graph(graph_tables.table(graph_name), graph_name, onnx_path is not None,
                                    default_samples, default_export)
    if onnx_path is not None and len(graphs) != 1:
        raise m.error("onnx", "an ONNX-file model has exactly one graph")
    variants = {}
    variant_tables = root.table("variants")
    if not variant_tables.data:
        raise root.error("[variants]", "no variants: add e.g. [variants.fp16] precision = \"fp16\"")
    for variant_name in variant_tables.data:
        root.name(f"[variants.{shown_key(variant_name)}]", variant_name)
        variants[variant_name] = _variant(variant_tables.table(variant_name), variant_name,
                                          variant_tables.data, graphs)
    checkpoints = tuple(m.strings("checkpoints", [], what="file names"))
    # found now, naming the file, rather than in the middle of a build (and once: every stage's tasks ask)
    checkpoint_files = {g.name: tuple(resolve_file(ref, folder, f"{path}: [graphs.{shown_key(g.name)}] checkpoints")
                                      for ref in checkpoints + g.checkpoints) for g in graphs.values()}
    model = Model(name=name, folder=folder, toml_path=path, description=m.get("description", str, ""),
                  license=m.get("license", str, "unknown"), hooks=hooks, onnx=onnx_path,
                  checkpoints=checkpoints, chips=model_chips, graphs=graphs,
                  variants=variants, trusted_checkpoints=m.get("trusted_checkpoints", bool, False),
                  data=_data_sources(m, folder), data_tools=_data_tools(m), evaluate="evaluate" in root.data,
                  evaluate_gates=_evaluate_gates(root), tuning=_tuning(root, graphs, model_chips),
                  dist=_dist(root, folder), share_weights=_share_weights(m, graphs), checkpoint_files=checkpoint_files,
                  check=_check_policy(root, model_chips))
    return model


def _data_sources(m: _Table, folder: Path) -> tuple[str, ...] | None:
    if "data" not in m.data:
        return None
    sources = m.get("data", list)
    for ref in sources:
        if not isinstance(ref, str) or not (folder / ref).is_file():
            raise m.error("data", f"source {ref!r} not found in {folder}")
    return tuple(sources)


def _data_tools(m: _Table) -> tuple[str, ...]:
    if "data_tools" not in m.data:
        return ()
    if "data" not in m.data:
        raise m.error("data_tools", "only with `data` (the programs the prepare_data hook runs)")
    tools = m.get("data_tools", list)
    for tool in tools:
        if not isinstance(tool, str) or not tool or "/" in tool:
            raise m.error("data_tools", f"{tool!r} is not a program name (looked up on PATH)")
    return tuple(tools)


def _tuning(root: _Table, graphs: dict[str, Graph], model_chips: tuple[str, ...]) -> Tuning | None:
    if "tuning" not in root.data:
        return None
    t = root.table("tuning")
    t.check_keys(("chip", "samples", "targets", "search", "max_measurements", "try_variants"))
    chip = t.get("chip", str, None)
    if chip is not None and chip not in model_chips:
        raise t.error("chip", f"{chip!r} is not one of the model's chips ({', '.join(model_chips)})")
    samples = t.get("samples", int, 32)
    if samples < 1:
        raise t.error("samples", f"must be at least 1, got {samples}")
    search = t.get("search", str, "bisect", choices=TUNING_SEARCHES)
    max_measurements = t.get("max_measurements", int, 48)
    if max_measurements < 8:
        raise t.error("max_measurements", f"must be at least 8, got {max_measurements}")
    targets_table = t.table("targets", {})
    targets = {}
    for graph_name in targets_table.data:
        if graph_name not in graphs:
            raise targets_table.error(shown_key(graph_name), f"no graph {graph_name!r} (graphs: {', '.join(graphs)})")
        targets[graph_name] = _gates(targets_table, graph_name)
    return Tuning(chip=chip, samples=samples, targets=targets, search=search, max_measurements=max_measurements,
                  try_variants=t.get("try_variants", bool, True))


def _check_policy(root: _Table, model_chips: tuple[str, ...]) -> CheckPolicy:
    if "check" not in root.data:
        return CheckPolicy()
    t = root.table("check")
    t.check_keys(("every_chip", "reference_chip", "proof_samples"))
    chip = t.get("reference_chip", str, None)
    if chip is not None and chip not in model_chips:
        raise t.error("reference_chip", f"{chip!r} is not one of the model's chips ({', '.join(model_chips)})")
    samples = t.get("proof_samples", int, 3)
    if samples < 1:
        raise t.error("proof_samples", f"must be at least 1, got {samples}")
    return CheckPolicy(every_chip=t.get("every_chip", bool, False), reference_chip=chip, proof_samples=samples)


def _dist(root: _Table, folder: Path) -> Dist:
    if "dist" not in root.data:
        return Dist()
    t = root.table("dist")
    t.check_keys(("multi_soc", "cpu_fallback", "verify_samples", "license_file"))
    multi_soc = t.get("multi_soc", bool, False)  # with one chip it makes nothing, and the bundle's index says so
    samples = t.get("verify_samples", int, 4)
    if samples < 0:
        raise t.error("verify_samples", f"must be 0 (do not run the emulator) or more, got {samples}")
    license_file = t.get("license_file", str, None)
    if license_file is not None:
        try:
            license_file = resolve_file(license_file, folder, "")
        except ConfigError:
            raise t.error("license_file", f"{license_file!r} not found (a path relative to {folder}, or "
                                          "pkg:<module>/<path>)") from None
    return Dist(multi_soc=multi_soc, cpu_fallback=t.get("cpu_fallback", bool, True), verify_samples=samples,
                license_file=license_file)


def _evaluate_gates(root: _Table) -> tuple[Threshold, ...]:
    if "evaluate" not in root.data:
        return ()
    t = root.table("evaluate")
    t.check_keys(("gate",))
    return _gates(t, "gate")


def load_models(models_dir: Path, chips: ChipTable, cache: TomlCache | None = None) -> list[Model]:
    if not models_dir.is_dir():
        return []
    folders = sorted(models_dir.iterdir())
    for folder in folders:  # a model folder copied as a link to a path that is not there would vanish silently
        if folder.is_symlink() and not folder.exists():
            raise ConfigError(f"{folder}: a link to {os.readlink(folder)}, which does not exist; copy the folder "
                              f"itself (cp -rL) or remove the link")
    return [load_model(folder, chips, cache) for folder in folders if (folder / "model.toml").is_file()]


# --- context size: max_context_mb, split, share_weights (docs/split.md) ------------------------------------------

def _megabytes(t: _Table, key: str) -> float | None:
    value = t.get(key, (int, float), None)
    if value is not None and not value > 0:
        raise t.error(key, f"must be a positive number of MB, got {value!r}")
    return None if value is None else float(value)


def _split(t: _Table) -> Split | None:
    if "split" not in t.data:
        return None
    s = t.table("split")
    s.check_keys(("parts", "max_part_mb", "cuts"))
    given = [k for k in ("parts", "max_part_mb", "cuts") if k in s.data]
    if len(given) != 1:
        raise s.error(" and ".join(given) or "parts", ("give exactly one of" if given else "missing: give one of")
                      + " parts = N, max_part_mb = M or cuts = [[...], ...] (the pinned plan)")
    if "parts" in s.data:
        parts = s.get("parts", int)
        if parts < 2:
            raise s.error("parts", f"must be at least 2 (1 is the unsplit graph: remove `split`), got {parts}")
        return Split(parts=parts)
    if "max_part_mb" in s.data:
        return Split(max_part_mb=_megabytes(s, "max_part_mb"))
    cuts = s.get("cuts", list)
    if not cuts or not all(isinstance(c, list) and c and all(isinstance(n, str) and n for n in c) for c in cuts):
        raise s.error("cuts", "expected a list of cuts, each a list of the tensor names that cross it, as "
                              f"out/<model>/float/<graph>.split.json writes them (e.g. [[\"relu_2\"]]), got {cuts!r}")
    return Split(cuts=tuple(tuple(c) for c in cuts))


def _share_weights(m: _Table, graphs: dict[str, Graph]) -> tuple[tuple[str, ...], ...]:
    groups = m.get("share_weights", list, [])
    seen = {}
    for group in groups:
        if not isinstance(group, list) or len(group) < 2 or not all(isinstance(g, str) for g in group):
            raise m.error("share_weights", f"expected groups of two or more graph names, e.g. [[\"prompt\", "
                                           f"\"step\"]], got {group!r}")
        for g in group:
            if g not in graphs:
                raise m.error("share_weights", f"no graph {g!r} (graphs: {', '.join(graphs)})")
            if g in seen or group.count(g) > 1:
                raise m.error("share_weights", f"graph {g!r} is in two groups (or twice in one): a graph is in "
                                               "one shared context at most")
            if graphs[g].split is not None:
                raise m.error("share_weights", f"graph {g!r} is split ([graphs.{g}] split): its parts are "
                                               "separate contexts; share weights between unsplit graphs")
            seen[g] = group
    return tuple(tuple(g) for g in groups)
