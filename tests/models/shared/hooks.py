"""Hooks of the weight-sharing test net: one two-layer MLP over token vectors, as a prompt graph (8 positions) and a
step graph (1 position). Inputs are fixed pseudo-random arrays."""

import numpy as np

POSITIONS = {"prompt": 8, "step": 1}


def module():
    import torch

    class Mlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(64, 256)
            self.fc2 = torch.nn.Linear(256, 64)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))

    return Mlp


def build(graph, checkpoints):
    import torch
    net = module()()
    net.load_state_dict(torch.load(checkpoints["mlp.pt"], weights_only=True))
    return net.eval()


def _samples(graph, count, seed):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, POSITIONS[graph], 64)).astype(np.float32)} for _ in range(count)]


def calibration_inputs(graph, count):
    return _samples(graph, count, seed=1)


def evaluation_inputs(graph):
    return _samples(graph, 4, seed=2)
