"""The quantized types a variant names (model.toml's `activations`, `weights`, overrides), in one table that config
validation, onnxruntime's quantizer, AIMET, the qairt tools, the size estimate and tune's ladder all read.
Light: a leaf module (doit loads it on every run)."""
from __future__ import annotations

from ..plumbing.records import record


@record
class QuantType:
    name: str  # as model.toml spells it
    bits: int
    signed: bool
    ort: str  # onnxruntime.quantization.QuantType member
    aimet: str  # AIMET's type of these bits (its activation quantizers are asymmetric: exported unsigned)
    nbytes: float  # a weight's bytes in a context binary (the size estimate)
    activation: bool  # allowed for activations
    weight: bool  # allowed for weights
    aimet_weight: str  # the weight type an AIMET variant uses in its place (AIMET's HTP configs: signed, <= 8 bit)
    qairt_symmetric: bool  # qairt quantizes these weights symmetrically (signed, and 16 bit: see qairt.py)


# In the order error messages list them.
TYPES: tuple[QuantType, ...] = (
    QuantType("uint8", 8, False, "QUInt8", "int8", 1.0, True, True, "int8", False),
    QuantType("int8", 8, True, "QInt8", "int8", 1.0, False, True, "int8", True),
    QuantType("uint16", 16, False, "QUInt16", "int16", 2.0, True, True, "int8", True),
    QuantType("int4", 4, True, "QInt4", "int4", 0.5, False, True, "int4", True),
)
BY_NAME = {t.name: t for t in TYPES}

ACTIVATION_TYPES = tuple(t.name for t in TYPES if t.activation)  # ("uint8", "uint16")
WEIGHT_TYPES = tuple(t.name for t in TYPES if t.weight)  # ("uint8", "int8", "uint16", "int4")
AIMET_WEIGHT_TYPES = tuple(t.name for t in TYPES if t.weight and t.signed)  # ("int8", "int4"): what AIMET takes
