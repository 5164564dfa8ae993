"""The typed config: what chips.toml and models/<name>/model.toml become (config.py reads and validates them into
these records; every other module takes them from there). Only the standard library: doit loads it every run."""
from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from ..quantization.quant_spec import QuantSpec
from ..plumbing.records import factory, record

BOUND_KEYS = ("min", "max", "max_decrease", "max_increase", "max_change")


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
    """A metric with a bound (build_rules/measuring/gates.py): `min` / `max` absolute; `max_decrease` / `max_increase` the
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
    quant: QuantSpec | None = None  # a quantized variant's precision (quant_spec.py); None for fp16

    @property
    def is_aimet(self) -> bool:
        return self.quant is not None and self.quant.is_aimet

    @property
    def is_fp16(self) -> bool:
        return self.precision == "fp16"

    def settings_for(self, graph: str) -> dict:
        """What changes one graph's quantized model (the quantize task's key): the variant-wide overrides
        with the graph's own on top, so tuning one graph re-quantizes only that graph."""
        return self.settings() if self.quant is None else self.quant.settings(graph)

    def settings(self) -> dict:
        """What changes the quantized model: goes into task keys and manifests."""
        return {"precision": "fp16"} if self.quant is None else self.quant.settings()


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
class CheckPolicy:
    """[check] of model.toml: which chips' binaries the emulator checks in full (docs/models.md, "Checks on several
    chips")."""
    every_chip: bool = False  # true: a full emulator check on every chip, no equality proof
    reference_chip: str | None = None  # the chip checked in full; default SM8750 when the model targets it, else its first
    proof_samples: int = 3  # evaluation samples on which another chip's outputs must equal the reference's, bit for bit


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
    check: CheckPolicy = CheckPolicy()  # [check]: full checks on one reference chip, equality proofs on the others

    def checkpoint_paths(self, graph: Graph) -> list[Path]:
        return list(self.checkpoint_files[graph.name])
