"""Hooks of the labelled classifier: pseudo-random features, each labelled with the class the float model gives it
(computed here in numpy from the same weights), so the float model's accuracy is 1 and a quantized one's says how
many classes it kept. score() takes the labels."""
from pathlib import Path

import numpy as np

WEIGHTS = Path(__file__).parent / "classifier.npz"


def write_weights(path=WEIGHTS, seed=0):
    rng = np.random.default_rng(seed)
    np.savez(path, w1=rng.standard_normal((64, 32)).astype(np.float32) / 4, b1=np.zeros(64, np.float32),
             w2=rng.standard_normal((10, 64)).astype(np.float32) / 4, b2=np.zeros(10, np.float32))


def _logits(weights, x):
    return np.maximum(x @ weights["w1"].T + weights["b1"], 0) @ weights["w2"].T + weights["b2"]


def build(graph, checkpoints):
    import torch
    weights = np.load(checkpoints[0])
    module = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    with torch.no_grad():
        for layer, name in ((module[0], "1"), (module[2], "2")):
            layer.weight.copy_(torch.from_numpy(weights[f"w{name}"]))
            layer.bias.copy_(torch.from_numpy(weights[f"b{name}"]))
    return module.eval()


def _samples(count, seed):
    # one feature 40x the others: 8-bit activations resolve the rest coarsely, 16-bit ones do not (tune has to act)
    rng = np.random.default_rng(seed)
    scale = np.ones((1, 32), np.float32)
    scale[0, 0] = 40
    return [{"x": rng.standard_normal((1, 32)).astype(np.float32) * scale} for _ in range(count)]


def calibration_inputs(graph, count):
    return _samples(count, 0)


def evaluation_inputs(graph):
    weights = np.load(WEIGHTS)
    return [(sample, int(np.argmax(_logits(weights, sample["x"])))) for sample in _samples(16, 1)]


def score(graph, inputs, outputs, labels):
    return {"accuracy": float(np.mean([int(np.argmax(o["logits"])) == label for o, label in zip(outputs, labels)]))}
