"""Recurrent layers and quantization (docs/models.md, "Recurrent layers as cells"): an ONNX GRU runs in float in a
quantized binary, and the build warns that the variant is mostly float, naming the ops and the fix; the fix for an
ONNX-only model, one nn.GRUCell per layer rebuilt from the ONNX file's weights (tests/models/gru_steps), computes
what the ONNX file computes and quantizes fully."""
from __future__ import annotations

import json
import re
import runpy
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import TEST_MODELS, make_repo, run_doit


def write_gru_onnx(path: Path) -> None:
    """A 2-layer GRU(16 -> 32) + Linear(32 -> 8) + sigmoid mask head with fixed random weights, exported as its
    authors export (TorchScript exporter: ONNX GRU nodes with linear_before_reset = 1), 24 frames."""
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gru = torch.nn.GRU(16, 32, num_layers=2, batch_first=True)
            self.head = torch.nn.Linear(32, 8)

        def forward(self, x):
            y, _ = self.gru(x)
            return torch.sigmoid(self.head(y))

    torch.manual_seed(0)
    torch.onnx.export(Net().eval(), (torch.zeros(1, 24, 16),), str(path), dynamo=False, input_names=["x"],
                      output_names=["mask"], opset_version=17)


@pytest.fixture(scope="module")
def gru_repo(tmp_path_factory) -> Path:
    """The step model (gru_steps) and the ONNX file as it is (gru_sequence: onnx = ..., its GRUs in float)."""
    repo = make_repo(tmp_path_factory.mktemp("gru"), {"gru_steps": TEST_MODELS / "gru_steps"})
    write_gru_onnx(repo / "models/gru_steps/gru_mask.onnx")
    sequence = repo / "models/gru_sequence"
    sequence.mkdir()
    shutil.copy(repo / "models/gru_steps/gru_mask.onnx", sequence / "gru_mask.onnx")
    (sequence / "hooks.py").write_text(
        "import runpy, pathlib\n"
        "steps = runpy.run_path(str(pathlib.Path(__file__).parent.parent / 'gru_steps' / 'hooks.py'))\n"
        "def calibration_inputs(graph, count):\n"
        "    return [{'x': steps['sequence'](seed)[None]} for seed in range(count)]\n"
        "def evaluation_inputs(graph):\n"
        "    return [{'x': steps['sequence'](100 + seed)[None]} for seed in range(4)]\n")
    (sequence / "model.toml").write_text(
        '[model]\nonnx = "gru_mask.onnx"\nhooks = "hooks.py"\nchips = ["SM8750"]\n\n'
        '[graphs.mask]\ninputs = { x = { shape = [1, 24, 16], dtype = "float32" } }\noutputs = ["mask"]\n'
        'calibration_samples = 8\ngate = { metric = "cosine", min = 0.9 }\n\n'
        '[variants.w8a16]\nactivations = "uint16"\nweights = "uint8"\n')
    return repo


def test_the_cells_rebuilt_from_the_onnx_weights_compute_what_the_onnx_file_computes(gru_repo):
    import onnxruntime as ort
    import torch

    folder = gru_repo / "models/gru_steps"
    hooks = runpy.run_path(str(folder / "hooks.py"), init_globals={"CHECKPOINTS": [folder / "gru_mask.onnx"]})
    step = hooks["build"]("step", [folder / "gru_mask.onnx"])
    frames = hooks["sequence"](7)
    expected = ort.InferenceSession(str(folder / "gru_mask.onnx")).run(None, {"x": frames[None]})[0][0]
    h0, h1, masks = torch.zeros(1, 32), torch.zeros(1, 32), []
    with torch.no_grad():
        for frame in frames:
            mask, h0, h1 = step(torch.from_numpy(frame[None]), h0, h1)
            masks.append(mask[0].numpy())
    assert np.max(np.abs(np.stack(masks) - expected)) < 1e-5


@pytest.mark.slow
def test_an_onnx_gru_stays_float_and_the_step_graph_quantizes_fully(gru_repo):
    result = run_doit(gru_repo)
    assert result.code == 0, result.output
    # The ONNX file as it is: its GRUs run in float in the w8a16 binary, and the build says so, with the fix
    sequence = json.loads((gru_repo / "out/gru_sequence/w8a16/SM8750/mask.check.json").read_text())["float_ops"]
    assert sequence["op_types"] == {"GRU": 2} and sequence["weights_share"] > 0.9
    warning = re.search(r"^  warning: package:gru_sequence/w8a16@SM8750: mask: 2 GRU ran in float \((\d+\.\d) % of "
                        r"the weights\): more than 25% of its weights are not quantized; QNN HTP has no quantized "
                        r"LSTM, GRU or RNN: export the recurrence as cells", result.output, re.M)
    assert warning and float(warning.group(1)) == pytest.approx(100 * sequence["weights_share"], abs=0.05), result.output
    manifest = json.loads((gru_repo / "out/gru_sequence/w8a16/SM8750/manifest.json").read_text())
    assert any("2 GRU ran in float" in w for w in manifest["warnings"])
    # The step graph: nothing in float, no warning, the gate met
    step = json.loads((gru_repo / "out/gru_steps/w8a16/SM8750/step.check.json").read_text())
    assert step["float_ops"]["count"] == 0 and step["summary"]["cosine"] >= 0.99
    assert "package:gru_steps/w8a16@SM8750" not in result.output.split("warning:", 1)[-1]
