"""Hooks of the LPBQ Conv test block: 1x1 Convs (blocked), a 3x3 Conv (kept per-channel) and a Linear head."""
import numpy as np


def module_class():
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.expand = torch.nn.Conv2d(32, 64, 1)
            self.mix = torch.nn.Conv2d(64, 64, 3, padding=1)
            self.project = torch.nn.Conv2d(64, 32, 1)
            self.head = torch.nn.Linear(32, 16)
            with torch.no_grad():  # outlier input channels: one quarter of each layer's weights 8x larger
                for layer in (self.expand, self.mix, self.project, self.head):
                    layer.weight[:, : layer.weight.shape[1] // 4] *= 8

        def forward(self, x):
            h = torch.relu(self.mix(torch.relu(self.expand(x))))
            x = x + self.project(h)
            return self.head(x.mean(dim=(2, 3)))

    return Block


def build(graph, checkpoints):
    import torch
    module = module_class()()
    module.load_state_dict(torch.load(checkpoints[0], weights_only=True))
    return module.eval()


def _samples(count, seed):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, 32, 8, 8)).astype(np.float32)} for _ in range(count)]


def calibration_inputs(graph, count):
    return _samples(count, 0)


def evaluation_inputs(graph):
    return _samples(8, 1)
