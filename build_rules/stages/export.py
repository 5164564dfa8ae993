"""Stage 1, export: checkpoint(s) + the model's build hook -> <graph>.onnx (static shapes, batch 1).

torch is imported here, in the stage process, never when the build file loads.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import BuildError
from .common import guard_checkpoint_loading, load_hooks

VERSION = 1
OPSET = 17


def run(params: dict) -> dict:
    import numpy as np
    import torch

    guard_checkpoint_loading(params)
    hooks = load_hooks(params["hooks"], params.get("data_dir"), params.get("checkpoints"))
    if not hasattr(hooks, "build"):
        raise BuildError(f"{params['hooks']}: no build(graph, checkpoints) hook")
    checkpoints = {Path(p).name: Path(p) for p in params["checkpoints"]}
    try:
        module = hooks.build(params["graph"], checkpoints)
    except Exception as e:  # a corrupt checkpoint surfaces here: name it
        raise BuildError(f"{params['hooks']}: build({params['graph']!r}) failed with checkpoints "
                         f"{', '.join(map(str, checkpoints.values()))}: {type(e).__name__}: {e}") from e
    module.eval()
    inputs = params["inputs"]
    # Zeros are enough to trace a static graph; real data is used by verify.
    example = tuple(torch.from_numpy(np.zeros(s["shape"], dtype=s["dtype"])) for s in inputs.values())
    target = Path(params["outputs"]["onnx"])  # in the private staging folder: the runner publishes it
    target.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(module, example, str(target), input_names=list(inputs),
                          output_names=params["output_names"], opset_version=OPSET, dynamo=False)
    return {}
