"""Hooks of the feed-forward test block: pseudo-random token features (this model tests what the quantizers write)."""
import numpy as np


def module_class():
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(32)
            self.up, self.down = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)

        def forward(self, x):
            h = self.up(self.norm(x))
            # exact GELU in the form Whisper's code (models/whisper_tiny_en/whisper.py) writes it: exported as Erf,
            # Mul and Add, which qnn_preprocess_model fuses into one Gelu (F.gelu exports as Gelu itself at opset 20)
            return x + self.down(h * ((torch.erf(h / 2 ** 0.5) + 1.0) * 0.5))

    return Block


def build(graph, checkpoints):
    import torch
    module = module_class()()
    module.load_state_dict(torch.load(checkpoints[0], weights_only=True))
    return module.eval()


def _samples(count, seed):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, 8, 32)).astype(np.float32)} for _ in range(count)]


def calibration_inputs(graph, count):
    return _samples(count, 0)


def evaluation_inputs(graph):
    return _samples(8, 1)
