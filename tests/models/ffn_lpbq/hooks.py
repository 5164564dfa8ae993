"""Hooks of the LPBQ test block: a transformer feed-forward block wide enough for blocks of 64 input channels, with
an input projection of 96 input channels (not a multiple of 64: it cannot be blocked) and an output head."""
import numpy as np


def module_class():
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(96, 128)  # 96 input channels: one and a half blocks of 64
            self.norm = torch.nn.LayerNorm(128)
            self.up, self.down = torch.nn.Linear(128, 384), torch.nn.Linear(384, 128)
            self.head = torch.nn.Linear(128, 64)

        def forward(self, x):
            x = self.proj(x)
            h = self.up(self.norm(x))
            # exact GELU written as Whisper writes it (fused back into one Gelu by qnn_preprocess_model)
            x = x + self.down(h * ((torch.erf(h / 2 ** 0.5) + 1.0) * 0.5))
            return self.head(x)

    return Block


def build(graph, checkpoints):
    import torch
    module = module_class()()
    module.load_state_dict(torch.load(checkpoints[0], weights_only=True))
    return module.eval()


def _samples(count, seed):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, 8, 96)).astype(np.float32)} for _ in range(count)]


def calibration_inputs(graph, count):
    return _samples(count, 0)


def evaluation_inputs(graph):
    return _samples(8, 1)
