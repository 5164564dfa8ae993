"""chips.toml and models/<name>/model.toml, parsed once into typed objects.

Every error names the file and the key, so a user can fix it without reading this code.
Only the standard library is used: this runs every time doit loads the build file.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import math
import os
import re
from pathlib import Path

from .errors import BuildError
from .records import factory, record

# Names become folder and task names: keep them to one safe path component.
SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")  # TOML's bare keys; any other key is shown quoted, as TOML writes it
# Upper bounds that keep a typo (a stray digit, 2**63) from exhausting memory or time at load or in a stage.
MAX_CALIBRATION_SAMPLES = 10_000  # one file per sample and input; calibration saturates long before this
MAX_INPUT_ELEMENTS = 1 << 28  # per graph input: 1 GiB of float32 (Whisper's mel input is 240,000)
TENSOR_DTYPES = ("float32", "float16", "int32", "uint8", "int8", "bool")
ACTIVATION_TYPES = ("uint8", "uint16")
WEIGHT_TYPES = ("uint8", "int8", "uint16", "int4")
CALIBRATION_METHODS = ("minmax", "entropy", "percentile")
# Who quantizes a variant: onnxruntime.quantization's min-max recipe ("ort"), or Qualcomm's AIMET ("aimet", the
# aimet-onnx package of the `aimet` extra) with its HTP QuantSim config and the techniques below.
QUANTIZERS = ("ort", "aimet")
TECHNIQUES = ("seq_mse", "adaround", "cle")  # aimet only; applied in the order given (cle first: it edits the model)
TECHNIQUE_PARAMS = {"seq_mse": {"candidates": 20}, "adaround": {"iterations": 10000}}  # aimet-onnx's defaults
AIMET_WEIGHTS = ("int8", "int4")  # AIMET's HTP configs quantize weights symmetrically: signed types only
AIMET_CALIBRATION = ("minmax", "percentile")
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
BOUND_KEYS = ("min", "max", "max_decrease", "max_increase", "max_change")
METRIC_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
# The budget of one context binary when neither chips.toml nor model.toml sets `max_context_mb` (docs/split.md: the
# seed guide's ~1B parameters at fp16, the Hexagon DSP's 32-bit address space, AI Hub's LLM parts of under 1 GB).
DEFAULT_MAX_CONTEXT_MB = 1024.0


class ConfigError(BuildError):
    """A config file is wrong; the message names the file and the key."""


@record
class Chip:
    name: str
    marketing_name: str
    soc_id: int
    dsp_arch: str  # "v79"
    vtcm_mb: int
    fp16: bool
    max_context_mb: float | None = None  # the budget of one context binary on this chip (None: the default)


@record
class ChipTable:
    path: Path
    chips: dict[str, Chip]
    default: tuple[str, ...]
    toolchain: str = "auto"  # top-level `toolchain = "qairt" | "ort-qnn" | "auto"` of chips.toml
    qairt_flow: str = "model-lib"  # top-level `qairt_flow = "model-lib" | "dlc"` ($BUILD_RULES_QAIRT_FLOW overrides)

    def get(self, name: str, where: str) -> Chip:
        if not isinstance(name, str):
            raise ConfigError(f"{where}: expected chip names (strings), got {name!r}")
        if name not in self.chips:
            known = ", ".join(sorted(self.chips))
            raise ConfigError(f"{where}: unknown chip '{name}' (chips in {self.path.name}: {known})")
        return self.chips[name]


@record
class TensorSpec:
    shape: tuple[int, ...]
    dtype: str
    layout: str | None = None  # QNN --input_layout (qairt only), e.g. "NTF": keep the ONNX order of a rank-3 input


@record
class Threshold:
    """A metric with a bound (build_rules/gates.py): `min` / `max` absolute; `max_decrease` / `max_increase` the
    most it may lose against the float model's value; `max_change` within that much of it, either way."""
    metric: str
    key: str  # one of BOUND_KEYS
    bound: float

    @property
    def relative(self) -> bool:
        return self.key in ("max_decrease", "max_increase", "max_change")

    def as_dict(self) -> dict:
        return {"metric": self.metric, self.key: self.bound}


def gate_dicts(thresholds) -> list[dict]:
    """The gates as the stages take them (task keys, reports): one dict per gate, [] for none."""
    return [t.as_dict() for t in thresholds]


@record
class ExportSettings:
    """How the build hook's module becomes ONNX: torch.onnx.export with the torch.export-based exporter
    ("dynamo", torch's default and recommendation) or the TorchScript tracer ("torchscript")."""
    exporter: str = "dynamo"
    opset: int | None = None  # None: the exporter's own default (the key holds torch's version, so it is fixed)

    def as_dict(self) -> dict:
        return {"exporter": self.exporter, "opset": self.opset}


@record
class Cache:
    """A graph's state inputs are caches (e.g. a decoder's self-attention K/V): each state output is the step's
    slice, one position along `axis`, which the caller writes into its input at the position the int32 input
    `offset` holds; `length` positions in all. With `mask`, an int32 input of `length` values: 1 for a position
    not written yet, 0 once written (the caller clears it after each write)."""
    length: int
    axis: int
    offset: str
    mask: str | None = None

    def as_dict(self) -> dict:
        return {"length": self.length, "axis": self.axis, "offset": self.offset, "mask": self.mask}


@record
class Greedy:
    """Greedy decoding: the argmax of output `logits` over its last axis is the next step's int32 input `token`."""
    logits: str
    token: str

    def as_dict(self) -> dict:
        return {"logits": self.logits, "token": self.token}


@record
class Split:
    """[graphs.X] split: cut the graph into sequential parts, each its own context binary (stages/split.py).
    One of: `parts` (that many, balancing weight bytes), `max_part_mb` (as few as keep every part's estimated
    context within it), `cuts` (pinned: the tensors that cross each cut, as the split plan lists them)."""
    parts: int | None = None
    max_part_mb: float | None = None
    cuts: tuple[tuple[str, ...], ...] | None = None

    def as_dict(self) -> dict:
        return {"parts": self.parts, "max_part_mb": self.max_part_mb,
                "cuts": [list(c) for c in self.cuts] if self.cuts is not None else None}


@record
class Graph:
    name: str
    checkpoints: tuple[str, ...]
    inputs: dict[str, TensorSpec]
    outputs: tuple[str, ...]
    calibration_samples: int
    verify: Threshold
    gates: tuple[Threshold, ...]  # all must pass; () for none
    export: ExportSettings = ExportSettings()
    max_context_mb: float | None = None  # the budget of one context binary of this graph (None: the chip's)
    split: Split | None = None
    # A step graph (recurrent cell, decoder step): output -> the input it feeds at the next step. Without a cache
    # the output replaces the input (same shape); with one it is written into it at the offset.
    state: dict[str, str] = factory(dict)
    cache: Cache | None = None
    greedy: Greedy | None = None

    def step_contract(self) -> dict | None:
        """The step contract as plain data (task keys, the bundle's index), or None for a graph without state."""
        if not self.state:
            return None
        return {"state": dict(self.state), "cache": self.cache.as_dict() if self.cache else None,
                "greedy": self.greedy.as_dict() if self.greedy else None}


@record
class Variant:
    name: str
    precision: str  # "fp16" or "quantized"
    activations: str | None = None
    weights: str | None = None
    per_channel: bool = True
    calibration_method: str = "minmax"
    calibration_samples: int = 0
    overrides: dict[str, str] = factory(dict)  # tensor -> activation type
    node_overrides: dict[str, str] = factory(dict)  # node -> activation type of its outputs
    # graph -> {"overrides": {...}, "node_overrides": {...}}: only that graph's quantize sees them
    graph_overrides: dict[str, dict[str, dict[str, str]]] = factory(dict)
    quantizer: str = "ort"  # "aimet": the aimet stage makes the QDQ model and an encodings JSON
    techniques: tuple[str, ...] = ()  # aimet techniques, in the order they are applied
    technique_params: dict[str, dict[str, int]] = factory(dict)  # e.g. {"seq_mse": {"candidates": 20}}
    block_size: int | None = None  # LPBQ: int4 weights in blocks of this many input channels (block_quant.py)
    weight_overrides: dict[str, str] = factory(dict)  # node -> type of its weight (per-layer weight bits)

    @property
    def is_aimet(self) -> bool:
        return self.quantizer == "aimet"

    @property
    def is_fp16(self) -> bool:
        return self.precision == "fp16"

    def settings_for(self, graph: str) -> dict:
        """What changes one graph's quantized model (the quantize task's key): the variant-wide overrides
        with the graph's own on top, so tuning one graph re-quantizes only that graph."""
        settings = self.settings()
        if not self.is_fp16:
            own = self.graph_overrides.get(graph, {})
            settings.pop("graphs", None)
            settings["overrides"] = dict(sorted({**self.overrides, **own.get("overrides", {})}.items()))
            settings["node_overrides"] = dict(sorted({**self.node_overrides, **own.get("node_overrides", {})}.items()))
            weight_overrides = {**self.weight_overrides, **own.get("weight_overrides", {})}
            if weight_overrides:
                settings["weight_overrides"] = dict(sorted(weight_overrides.items()))
        return settings

    def settings(self) -> dict:
        """What changes the quantized model: goes into task keys and manifests."""
        if self.is_fp16:
            return {"precision": "fp16"}
        return {"precision": "quantized", "activations": self.activations, "weights": self.weights,
                "per_channel": self.per_channel, "calibration_method": self.calibration_method,
                "calibration_samples": self.calibration_samples, "overrides": dict(sorted(self.overrides.items())),
                **({"node_overrides": dict(sorted(self.node_overrides.items()))} if self.node_overrides else {}),
                **({"graphs": self.graph_overrides} if self.graph_overrides else {}),
                # only for aimet variants: an ort variant's settings (and so its task keys) stay as they were
                **({"quantizer": "aimet", "techniques": list(self.techniques),
                    "technique_params": {t: self.technique_params[t] for t in self.techniques
                                         if t in self.technique_params}} if self.is_aimet else {}),
                # only when set: other variants' task keys stay as they were
                **({"block_size": self.block_size} if self.block_size else {}),
                **({"weight_overrides": dict(sorted(self.weight_overrides.items()))} if self.weight_overrides else {})}


@record
class Tuning:
    """[tuning] of model.toml: where and how the sensitivity and tune tasks measure (HTP emulator)."""
    chip: str | None = None  # default: the model's first chip
    samples: int = 32  # evaluation samples per candidate during the search (evenly spaced); the final check uses all
    targets: dict[str, tuple[Threshold, ...]] = factory(dict)  # graph -> targets (all met); default: its gates
    # "bisect": rank on the CPU QDQ model, then confirm and search over groups of tensors on the emulator (scales to
    # hundreds of tensors); "exhaustive": every tensor on the emulator, one at a time (2 runs a tensor)
    search: str = "bisect"
    max_measurements: int = 48  # bisect: emulator measurements per graph and task (16-bit ones are slow); then it stops
    # tune tries whole variants (W4A16 SeqMSE, W8A8 ort / AIMET) before 16-bit tensors; false skips them: AIMET's
    # SeqMSE took about a minute for one Conv of PP-OCRv4's detector here (loaded machine), long on a big graph
    try_variants: bool = True


@record
class Dist:
    """[dist] of model.toml: what `doit dist` puts in the model's device bundles."""
    multi_soc: bool = False  # also one Flexible Context Binary per graph for all the model's chips (ort-qnn)
    cpu_fallback: bool = True  # ship the float ONNX graphs (cpu/<graph>.onnx) for SoCs without a binary
    verify_samples: int = 4  # evaluation samples per graph and chip the stage checks the I/O contract with
    license_file: Path | None = None  # the model's licence text, copied to LICENSES/


@record
class Model:
    name: str
    folder: Path
    toml_path: Path
    description: str
    license: str
    hooks: Path
    onnx: Path | None
    checkpoints: tuple[str, ...]
    chips: tuple[str, ...]
    graphs: dict[str, Graph]
    variants: dict[str, Variant]
    trusted_checkpoints: bool = False  # allow torch.load(weights_only=False): pickles can run code
    data: tuple[str, ...] | None = None  # sources of the prepare_data hook (a data stage), if any
    data_tools: tuple[str, ...] = ()  # programs that hook runs (e.g. espeak-ng): their files are in its key
    evaluate_gates: tuple[Threshold, ...] = ()  # [evaluate] gate: all must pass
    evaluate: bool = False  # [evaluate]: the evaluate(run_graph) hook scores all graphs together
    tuning: "Tuning | None" = None  # [tuning]: chip, samples and targets of `doit sensitivity` / `doit tune`
    dist: Dist = Dist()  # [dist]: what `doit dist` ships
    share_weights: tuple[tuple[str, ...], ...] = ()  # groups of graphs compiled into one weight-shared context
    checkpoint_files: dict[str, tuple[Path, ...]] = factory(dict)  # graph -> its checkpoints, found at load

    def checkpoint_paths(self, graph: Graph) -> list[Path]:
        return list(self.checkpoint_files[graph.name])


# --- reading helpers -------------------------------------------------------------------------

def shown_key(key: str) -> str:
    """A key as TOML writes it, for messages: bare, or quoted with anything unprintable escaped (so an error stays one
    readable line whatever the key holds: empty, spaces, newlines, control or direction characters)."""
    if BARE_KEY.match(key):
        return key
    body = "".join(c if c.isprintable() and c not in '"\\' else
                   f"\\{c}" if c in '"\\' else f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}"
                   for c in key)
    return f'"{body}"'


def read_toml(path: Path, cache: "TomlCache | None" = None) -> dict:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a folder, not a TOML file") from None
    if cache is not None:
        found = cache.get(path, raw)
        if found is not None:
            return found
    import tomllib  # pure Python, as is its parse: a no-op build takes the parsed files from the cache instead
    try:
        doc = tomllib.loads(raw.decode())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8: byte {e.object[e.start]:#04x} at offset {e.start} (TOML files are "
                          "UTF-8 text)") from None
    if cache is not None:
        cache.put(path, raw, doc)
    return doc


class TomlCache:
    """Parsed TOML files by the xxh3 of their bytes, kept as JSON (out/.build-state/toml-cache.json): tomllib is pure
    Python, and its import and a parse of each model.toml were most of the config's share of a no-op build. Keyed by
    content, so an edit is never missed however fast it follows the last one; a file's old entry is replaced."""

    def __init__(self, path: str):
        self.path = path
        self.dirty = False
        try:
            with open(path) as f:
                self.entries = json.load(f)
            if not isinstance(self.entries, dict):
                self.entries = {}
        except (OSError, ValueError):
            self.entries = {}  # none yet, or damaged: the files are parsed again

    @staticmethod
    def _digest(raw: bytes) -> str:
        import xxhash
        return xxhash.xxh3_128_hexdigest(raw)

    def get(self, path: Path, raw: bytes) -> dict | None:
        entry = self.entries.get(str(path))
        if isinstance(entry, list) and len(entry) == 2 and entry[0] == self._digest(raw):
            return entry[1]
        return None

    def put(self, path: Path, raw: bytes, doc: dict) -> None:
        try:
            json.dumps(doc)
        except (TypeError, ValueError):
            return  # TOML dates and times have no JSON form: such a file is parsed every time
        self.entries[str(path)] = [self._digest(raw), doc]
        self.dirty = True

    def save(self) -> None:
        if self.dirty:
            from .files import atomic_write_text
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            try:
                atomic_write_text(self.path, json.dumps(self.entries, separators=(",", ":")))
            except OSError:
                pass  # a read-only or full out/: parsing again next time is the only cost
            self.dirty = False


TYPE_NAMES = {dict: "a table", list: "a list", str: "a string", int: "an integer", float: "a number",
              bool: "true or false"}


class _Table:
    """One TOML table with the file and key path it came from, for error messages."""

    def __init__(self, path: Path, where: str, data: object):
        self.path, self.where = path, where
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: {where or 'top level'}: expected a table, got {data!r}")
        self.data = data

    def error(self, key: str, message: str) -> ConfigError:
        place = f"{self.where} {key}" if self.where else key
        return ConfigError(f"{self.path}: {place}: {message}")

    def check_keys(self, allowed: tuple[str, ...]) -> None:
        for key in self.data:
            if key not in allowed:
                raise self.error(shown_key(key), f"unknown key (allowed: {', '.join(allowed)})")

    def get(self, key: str, kind: type | tuple, default=..., choices: tuple | None = None):
        if key not in self.data:
            if default is ...:
                raise self.error(shown_key(key), "missing")
            return default
        value = self.data[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        # TOML booleans are ints in Python; do not let `true` pass as a number.
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            names = " or ".join(TYPE_NAMES.get(k, k.__name__) for k in kinds)
            raise self.error(shown_key(key), f"expected {names}, got {value!r}")
        if choices is not None and value not in choices:
            raise self.error(shown_key(key), f"expected one of {', '.join(map(repr, choices))}, got {value!r}")
        return value

    def strings(self, key: str, default=..., what: str = "strings") -> list[str]:
        """A list of strings (file names, chip names, tensor names)."""
        value = self.get(key, list, default)
        for item in value:
            if not isinstance(item, str):
                raise self.error(shown_key(key), f"expected a list of {what}, got {item!r} in it")
        return value

    def number(self, key: str, kind: type | tuple, default=..., low=None, high=None, why: str = ""):
        """An int or float within [low, high] (NaN never is)."""
        value = self.get(key, kind, default)
        if value is None:
            return value
        if value != value or (low is not None and value < low) or (high is not None and value > high):
            bounds = f"at least {low}" if high is None else f"at most {high}" if low is None else \
                f"between {low} and {high}"
            raise self.error(shown_key(key), f"must be {bounds}{why}, got {value!r}")
        return value

    def table(self, key: str, default=...) -> "_Table":
        if key not in self.data and default is not ...:
            return _Table(self.path, self._sub(key), default)
        return _Table(self.path, self._sub(key), self.get(key, dict))

    def _sub(self, key: str) -> str:
        key = shown_key(key)
        return f"[{key}]" if not self.where else f"{self.where[:-1]}.{key}]"

    def name(self, key: str, value: str) -> str:
        if not SAFE_NAME.match(value) or value in (".", ".."):
            raise self.error(key, f"name {value!r} is not allowed: use letters, digits, '_', '-' or '.', "
                                  "no slashes (it becomes a folder under out/)")
        return value


def resolve_file(ref: str, folder: Path, where: str, what: str = "checkpoint") -> Path:
    """A path relative to the model folder, or pkg:<module>/<path> inside an installed package."""
    if ref.startswith("pkg:"):
        module, _, inner = ref[4:].partition("/")
        package = package_folder(module) if module else None
        if package is None:
            raise ConfigError(f"{where}: {ref}: package '{module}' is not installed")
        path = package / inner
    else:
        path = folder / ref
    if not path.is_file():
        raise ConfigError(f"{where}: {what} {ref} not found (looked for {path})")
    return path


@functools.cache
def package_folder(module: str) -> Path | None:
    """Where an installed package is, found without importing it; once per load (each task asks for its
    checkpoints: find_spec walks sys.path every time, ~0.1 ms)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


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
    source) the comparison metrics. The bound key gives the direction (build_rules/gates.py); relative bounds need
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
        g.check_keys(("overrides", "node_overrides", "weight_overrides"))
        own = {k: _override_table(g, k) for k in ("overrides", "node_overrides") if k in g.data}
        if "weight_overrides" in g.data:  # per-layer weight bits of this graph only (block_quant.py)
            own["weight_overrides"] = _block_settings(g, t.data.get("weights"), t.data.get("quantizer", "ort"))[
                "weight_overrides"]
        if any(own.values()):
            graph_overrides[graph_name] = own
    quantizer, techniques, technique_params = _quantizer(t)
    weights = t.get("weights", str, choices=WEIGHT_TYPES)
    method = calibration.get("method", str, "minmax", choices=CALIBRATION_METHODS)
    if quantizer == "aimet":
        if weights not in AIMET_WEIGHTS:
            raise t.error("weights", f"with quantizer = \"aimet\" expected one of {', '.join(map(repr, AIMET_WEIGHTS))} "
                                     f"(AIMET's HTP configs quantize weights symmetrically), got {weights!r}")
        if method not in AIMET_CALIBRATION:
            raise calibration.error("method", f"with quantizer = \"aimet\" expected one of "
                                              f"{', '.join(map(repr, AIMET_CALIBRATION))}, got {method!r}")
    return Variant(name=name, precision="quantized",
                   activations=t.get("activations", str, choices=ACTIVATION_TYPES), weights=weights,
                   per_channel=t.get("per_channel", bool, True), calibration_method=method,
                   calibration_samples=samples, overrides=_override_table(t, "overrides"),
                   node_overrides=_override_table(t, "node_overrides"), graph_overrides=graph_overrides,
                   quantizer=quantizer, techniques=techniques, technique_params=technique_params,
                   **_block_settings(t, weights, quantizer))


def _block_settings(t: _Table, weights: str, quantizer: str) -> dict:
    """block_size and weight_overrides of a quantized variant (LPBQ, per-layer weight bits: block_quant.py)."""
    from . import block_quant
    block_size = t.data.get("block_size")
    if block_size is not None:
        problem = block_quant.check_block_size(block_size)
        if problem:
            raise t.error("block_size", problem)
        if weights not in block_quant.BLOCK_WEIGHTS:
            raise t.error("block_size", f"blocks need weights = {' or '.join(map(repr, block_quant.BLOCK_WEIGHTS))} "
                                        f"(LPBQ is int4 weights decompressed to 8 bit), got weights = {weights!r}")
    table = t.table("weight_overrides", {})
    for node in table.data:
        table.get(node, str, choices=AIMET_WEIGHTS if quantizer == "aimet" else WEIGHT_TYPES)
    return {"block_size": block_size, "weight_overrides": dict(table.data)}


def _quantizer(t: _Table) -> tuple[str, tuple[str, ...], dict[str, dict[str, int]]]:
    """quantizer, techniques (checked: known, once each, cle first) and each technique's parameters."""
    quantizer = t.get("quantizer", str, "ort", choices=QUANTIZERS)
    techniques = t.get("techniques", list, [])
    if techniques and quantizer != "aimet":
        raise t.error("techniques", 'AIMET\'s techniques need quantizer = "aimet"')
    for i, name in enumerate(techniques):
        if name not in TECHNIQUES:
            raise t.error("techniques", f"unknown technique {name!r} (allowed: {', '.join(map(repr, TECHNIQUES))})")
        if name in techniques[:i]:
            raise t.error("techniques", f"{name!r} is listed twice")
    if "cle" in techniques and techniques[0] != "cle":
        raise t.error("techniques", "'cle' must come first: cross-layer equalization changes the float model's "
                                    "weights, which the other techniques then quantize")
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
        if name in TECHNIQUE_PARAMS:
            params.setdefault(name, dict(TECHNIQUE_PARAMS[name]))
    return quantizer, tuple(techniques), params


def load_model(folder: Path, chips: ChipTable, cache: TomlCache | None = None) -> Model:
    path = folder / "model.toml"
    root = _Table(path, "", read_toml(path, cache))
    root.check_keys(("model", "graphs", "variants", "evaluate", "tuning", "dist"))
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
                  dist=_dist(root, folder), share_weights=_share_weights(m, graphs), checkpoint_files=checkpoint_files)
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
    return [load_model(folder, chips, cache) for folder in sorted(models_dir.iterdir())
            if (folder / "model.toml").is_file()]


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
