"""A quantized variant's precision as one typed record: what config validates from model.toml, what tune's ladder
derives its candidates from (QuantSpec.replace, then the same validation), and what a quantizing stage receives
whole (QuantSpec.from_settings of its params). Its settings dict is the form task keys and manifests hold; that
dict's shape is frozen (changing it re-keys every user's quantize tasks), so it is made here and only here.

Light: a leaf module (doit loads it every run). The type names are dtypes.py's, the techniques aimet_techniques.py's.
"""
from __future__ import annotations

from . import aimet_techniques, block_quant
from .dtypes import ACTIVATION_TYPES, AIMET_WEIGHT_TYPES, WEIGHT_TYPES
from ..plumbing.records import factory, record

CALIBRATION_METHODS = ("minmax", "entropy", "percentile")
AIMET_CALIBRATION = ("minmax", "percentile")  # AIMET's QuantScheme has no entropy
QUANTIZERS = ("ort", "aimet")
# What the per-graph table [variants.<v>.graphs.<g>] may set: that graph's overrides on top of the variant's.
GRAPH_OVERRIDE_KEYS = ("overrides", "node_overrides", "weight_overrides")


@record
class QuantSpec:
    """model.toml's quantized variant: weight and activation types, calibration, the quantizer and its techniques,
    LPBQ blocks and per-tensor / per-node / per-layer overrides (docs/model-toml.md)."""
    activations: str  # dtypes.ACTIVATION_TYPES
    weights: str  # dtypes.WEIGHT_TYPES
    per_channel: bool = True
    calibration_method: str = "minmax"
    calibration_samples: int = 0
    overrides: dict[str, str] = factory(dict)  # tensor -> activation type
    node_overrides: dict[str, str] = factory(dict)  # node -> activation type of its outputs
    weight_overrides: dict[str, str] = factory(dict)  # node -> type of its weight (per-layer weight bits)
    # graph -> {"overrides": {...}, "node_overrides": {...}, "weight_overrides": {...}}: only that graph sees them
    graph_overrides: dict[str, dict[str, dict[str, str]]] = factory(dict)
    quantizer: str = "ort"  # "aimet": the aimet stage makes the QDQ model and an encodings JSON
    techniques: tuple[str, ...] = ()  # aimet techniques, in the order they are applied
    technique_params: dict[str, dict[str, int]] = factory(dict)  # e.g. {"seq_mse": {"candidates": 20}}
    block_size: int | None = None  # LPBQ: int4 weights in blocks of this many input channels (block_quant.py)

    @property
    def is_aimet(self) -> bool:
        return self.quantizer == "aimet"

    def problems(self) -> list[tuple[tuple[str, ...], str]]:
        """What is wrong with this combination, as (model.toml key path within the variant's table, message):
        config raises the first at its key; tune's ladder skips a candidate that has one. TOML types are checked
        when the file is read."""
        found = []
        if self.activations not in ACTIVATION_TYPES:
            found.append((("activations",), f"expected one of {_listed(ACTIVATION_TYPES)}, got {self.activations!r}"))
        if self.weights not in WEIGHT_TYPES:
            found.append((("weights",), f"expected one of {_listed(WEIGHT_TYPES)}, got {self.weights!r}"))
        if self.quantizer not in QUANTIZERS:
            found.append((("quantizer",), f"expected one of {_listed(QUANTIZERS)}, got {self.quantizer!r}"))
        if self.techniques and not self.is_aimet:
            found.append((("techniques",), 'AIMET\'s techniques need quantizer = "aimet"'))
        for i, name in enumerate(self.techniques):
            if name not in aimet_techniques.NAMES:
                found.append((("techniques",), f"unknown technique {name!r} (allowed: {_listed(aimet_techniques.NAMES)})"))
            elif name in self.techniques[:i]:
                found.append((("techniques",), f"{name!r} is listed twice"))
        if "cle" in self.techniques and self.techniques[0] != "cle":
            found.append((("techniques",), "'cle' must come first: cross-layer equalization changes the float model's "
                                        "weights, which the other techniques then quantize"))
        if self.is_aimet:
            if self.weights not in AIMET_WEIGHT_TYPES:
                found.append((("weights",), f"with quantizer = \"aimet\" expected one of {_listed(AIMET_WEIGHT_TYPES)} "
                                         f"(AIMET's HTP configs quantize weights symmetrically), got {self.weights!r}"))
            if self.calibration_method not in AIMET_CALIBRATION:
                found.append((("calibration", "method"), f"with quantizer = \"aimet\" expected one of "
                                                    f"{_listed(AIMET_CALIBRATION)}, got {self.calibration_method!r}"))
        if self.block_size is not None:
            problem = block_quant.check_block_size(self.block_size)
            if problem:
                found.append((("block_size",), problem))
            elif self.weights not in block_quant.BLOCK_WEIGHTS:
                found.append((("block_size",), f"blocks need weights = {' or '.join(map(repr, block_quant.BLOCK_WEIGHTS))} "
                                            f"(LPBQ is int4 weights decompressed to 8 bit), got weights = "
                                            f"{self.weights!r}"))
        weight_types = AIMET_WEIGHT_TYPES if self.is_aimet else WEIGHT_TYPES
        for where, table in [((), self.weight_overrides)] + [
                (("graphs", g), o.get("weight_overrides", {})) for g, o in self.graph_overrides.items()]:
            for node, wtype in table.items():
                if wtype not in weight_types:
                    found.append(((*where, "weight_overrides", node),
                                  f"expected one of {_listed(weight_types)}, got {wtype!r}"))
        return found

    def replace(self, **changes) -> "QuantSpec":
        """This spec with some fields changed (tune's ladder derives its candidates so); validate with problems()."""
        fields = {name: getattr(self, name) for name in _FIELDS}
        fields.update(changes)
        return QuantSpec(**fields)

    def for_graph(self, graph: str) -> "QuantSpec":
        """The spec one graph's quantize sees: the variant's overrides with the graph's own on top."""
        own = self.graph_overrides.get(graph, {})
        return self.replace(graph_overrides={},
                            **{k: {**getattr(self, k), **own.get(k, {})} for k in GRAPH_OVERRIDE_KEYS})

    def settings(self, graph: str | None = None) -> dict:
        """The task-key form (the variant's, or with `graph` the one graph's quantize task takes). Keys only appear
        when set, so that variants made before a field existed keep their keys."""
        spec = self.for_graph(graph) if graph is not None else self
        out = {"precision": "quantized", "activations": spec.activations, "weights": spec.weights,
               "per_channel": spec.per_channel, "calibration_method": spec.calibration_method,
               "calibration_samples": spec.calibration_samples, "overrides": dict(sorted(spec.overrides.items()))}
        if spec.node_overrides or graph is not None:  # a graph's settings always held node_overrides
            out["node_overrides"] = dict(sorted(spec.node_overrides.items()))
        if spec.graph_overrides:
            out["graphs"] = spec.graph_overrides
        if spec.is_aimet:  # only for aimet variants: an ort variant's settings (and so its task keys) stay as they were
            out.update(quantizer="aimet", techniques=list(spec.techniques),
                       technique_params={t: spec.technique_params[t] for t in spec.techniques
                                         if t in spec.technique_params})
        if spec.block_size:
            out["block_size"] = spec.block_size
        if spec.weight_overrides:
            out["weight_overrides"] = dict(sorted(spec.weight_overrides.items()))
        return out

    @classmethod
    def from_settings(cls, settings: dict) -> "QuantSpec":
        """The spec back from its settings dict (a stage's params["variant"]); extra keys (a report's "name") are
        ignored, a missing required one is a KeyError naming it."""
        if settings.get("precision") == "fp16":
            raise ValueError("an fp16 variant has no quantization spec")
        return cls(activations=settings["activations"], weights=settings["weights"],
                   per_channel=settings.get("per_channel", True),
                   calibration_method=settings.get("calibration_method", "minmax"),
                   calibration_samples=settings.get("calibration_samples", 0),
                   overrides=dict(settings.get("overrides") or {}),
                   node_overrides=dict(settings.get("node_overrides") or {}),
                   weight_overrides=dict(settings.get("weight_overrides") or {}),
                   graph_overrides=dict(settings.get("graphs") or {}),
                   quantizer=settings.get("quantizer", "ort"), techniques=tuple(settings.get("techniques") or ()),
                   technique_params={k: dict(v) for k, v in (settings.get("technique_params") or {}).items()},
                   block_size=settings.get("block_size"))

    def toml_lines(self, base: "QuantSpec") -> list[str]:
        """The model.toml lines that make this spec in a variant that inherits one with spec `base` (tune writes
        them). A base's block_size cannot be unset by inheriting: such a spec is not written this way (the ladder
        says so)."""
        lines = [f"weights = {_toml(self.weights)}", f"activations = {_toml(self.activations)}"]
        if self.block_size:
            lines.append(f"block_size = {self.block_size}")
        if self.is_aimet:
            lines += ['quantizer = "aimet"', f"techniques = {_toml(list(self.techniques))}",
                      f'calibration = {{ method = {_toml(self.calibration_method)}, samples = {self.calibration_samples} }}']
        elif base.is_aimet:  # an onnxruntime candidate of an AIMET variant: undo what it would inherit
            lines += ['quantizer = "ort"', "techniques = []"]
        return lines

    def inherits_from(self, base: "QuantSpec") -> bool:
        """toml_lines can express this spec on top of `base`."""
        return not (base.block_size and not self.block_size)


_FIELDS = tuple(QuantSpec.__annotations__)


def _listed(names) -> str:
    return ", ".join(map(repr, names))


def _toml(value) -> str:
    import json
    return json.dumps(value)
