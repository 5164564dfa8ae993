"""Hooks of the recurrent test model: an LSTMCell whose state goes in and out of the graph."""
import numpy as np

HIDDEN = 32
# True: the next state leaves the graph as one stacked tensor that nothing else reads (the cookbook's advice).
# False: h and c leave as they are, and h also feeds a Relu (the quantizer then clamps h_out to [0, ...]).
STACK_STATES = True


def module_class():
    import torch

    class Cell(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.RMSNorm(16)
            self.cell = torch.nn.LSTMCell(16, HIDDEN)
            self.head = torch.nn.Linear(HIDDEN, 8)

        def forward(self, frame, h, c):
            h2, c2 = self.cell(self.norm(frame), (h, c))
            logits = self.head(torch.relu(h2))
            if STACK_STATES:
                return logits, torch.stack([h2, c2])
            return logits, h2, c2

    return Cell


def build(graph, checkpoints):
    import torch
    module = module_class()()
    module.load_state_dict(torch.load(checkpoints[0], weights_only=True))  # the graph's only checkpoint
    return module


def _samples(count, seed):
    """Frames with the states a running cell carries (h in (-1, 1), c of a few units)."""
    rng = np.random.default_rng(seed)
    return [{"frame": rng.standard_normal((1, 16)).astype(np.float32),
             "h": np.tanh(rng.standard_normal((1, HIDDEN))).astype(np.float32),
             "c": (1.5 * rng.standard_normal((1, HIDDEN))).astype(np.float32)} for _ in range(count)]


def calibration_inputs(graph, count):
    return _samples(count, seed=1)


def evaluation_inputs(graph):
    return _samples(6, seed=2)


def score(graph, inputs, outputs):
    """state_cosine: how much of the incoming h the cell keeps (mean cosine of h_in and h_out)."""
    cosines = []
    for sample, out in zip(inputs, outputs):
        h_in = sample["h"].ravel()
        h_out = (out["state"][0] if "state" in out else out["h_out"]).ravel()
        cosines.append(float(h_in @ h_out / (np.linalg.norm(h_in) * np.linalg.norm(h_out) + 1e-12)))
    return {"state_cosine": float(np.mean(cosines))}
