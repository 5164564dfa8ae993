"""Hooks of the tiny test net. Inputs are fixed pseudo-random arrays: this model only tests the build graph."""

import numpy as np


def modules():
    import torch

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.conv2 = torch.nn.Conv2d(8, 4, 3, stride=2, padding=1)

        def forward(self, image):
            return torch.relu(self.conv2(torch.relu(self.conv1(image)))).flatten(1)[:, :64]

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(64, 10)

        def forward(self, features):
            return self.fc(features)

    return {"encoder": Encoder, "head": Head}


def build(graph, checkpoints):
    import torch
    module = modules()[graph]()
    module.load_state_dict(torch.load(checkpoints[f"{graph}.pt"], weights_only=True))
    return module.eval()


def _samples(graph, count, seed):
    rng = np.random.default_rng(seed)
    shape = (1, 3, 16, 16) if graph == "encoder" else (1, 64)
    name = "image" if graph == "encoder" else "features"
    return [{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(count)]


def calibration_inputs(graph, count):
    return _samples(graph, count, seed=1)


def evaluation_inputs(graph):
    return _samples(graph, 4, seed=2)
