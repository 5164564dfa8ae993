"""AIMET's techniques a variant with quantizer = "aimet" can list (`techniques = [...]`), in one table: config
validates names and parameters from it, stages/aimet.py calls each from it. Adding a technique is a row here (and
a test). Light: a leaf module (config reads it on every doit load)."""
from __future__ import annotations

from ..plumbing.records import record


@record
class Technique:
    name: str
    before_quantsim: bool  # True: it edits the float model before QuantSim is made; False: it works on QuantSim
    function: str  # "<aimet_onnx module>:<function>": before QuantSim f(model); after, f(sim, samples, **arguments)
    defaults: dict  # the model.toml table [variants.<v>.<name>]: key -> aimet-onnx's default
    arguments: dict  # model.toml key -> the function's keyword


# In the order error messages list them; a variant applies them in its own order (cle first: config checks it).
TECHNIQUES: tuple[Technique, ...] = (
    Technique("seq_mse", False, "aimet_onnx:apply_seq_mse", {"candidates": 20}, {"candidates": "num_candidates"}),
    Technique("adaround", False, "aimet_onnx:apply_adaround", {"iterations": 10000}, {"iterations": "num_iterations"}),
    # cross-layer equalization; it folds batch norms into the convolutions before it scales them
    Technique("cle", True, "aimet_onnx.cross_layer_equalization:equalize_model", {}, {}),
)
BY_NAME = {t.name: t for t in TECHNIQUES}
NAMES = tuple(t.name for t in TECHNIQUES)
PARAMS = {t.name: dict(t.defaults) for t in TECHNIQUES if t.defaults}  # {"seq_mse": {"candidates": 20}, ...}
