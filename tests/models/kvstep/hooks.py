"""Hooks of the KV-cache step test model: one attention layer over a cache of LENGTH positions plus the step's own
key and value. Calibration and evaluation samples are steps of greedy roll-outs of the float model itself, so the
caches hold what decoding writes there (zeros beyond the offset), not noise."""
import numpy as np

LENGTH, WIDTH, VOCAB, HEADS = 8, 16, 32, 2
MASK_VALUE = -100.0


def module_class():
    import torch

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = torch.nn.Parameter(torch.randn(VOCAB, WIDTH))
            self.positions = torch.nn.Parameter(0.1 * torch.randn(LENGTH, WIDTH))
            self.norm = torch.nn.LayerNorm(WIDTH)
            self.q, self.k, self.v = (torch.nn.Linear(WIDTH, WIDTH) for _ in range(3))
            self.head = torch.nn.Linear(WIDTH, VOCAB)

        def heads(self, x):
            return x.reshape(1, x.shape[1], HEADS, WIDTH // HEADS).transpose(1, 2)

        def forward(self, token, k_cache, v_cache, offset, mask):
            x = torch.index_select(self.embedding, 0, token.reshape(-1)) + torch.index_select(self.positions, 0, offset)
            h = self.norm(x.unsqueeze(0))                                               # (1, 1, WIDTH)
            q, k, v = self.q(h), self.k(h), self.v(h)
            keys, values = torch.cat([k_cache, k], 1), torch.cat([v_cache, v], 1)      # (1, LENGTH + 1, WIDTH)
            scores = self.heads(q) @ self.heads(keys).transpose(-1, -2) / (WIDTH // HEADS) ** 0.5
            scores = scores + torch.cat([mask.to(torch.float32) * MASK_VALUE, torch.zeros(1)])
            out = (torch.softmax(scores, -1) @ self.heads(values)).transpose(1, 2).reshape(1, 1, WIDTH)
            return self.head(h + out), k, v

    return Step


def build(graph, checkpoints):
    import torch
    module = module_class()()
    module.load_state_dict(torch.load(checkpoints[0], weights_only=True))
    return module


CHECKPOINTS = None  # set by build_rules (calibrate, verify): the samples come from running the model


def rollout(first_token, steps=LENGTH):
    """The inputs of each step of a greedy decode from `first_token` with the float model."""
    import torch
    module = build("step", CHECKPOINTS).eval()
    k_cache, v_cache = np.zeros((1, LENGTH, WIDTH), np.float32), np.zeros((1, LENGTH, WIDTH), np.float32)
    mask, token, samples = np.ones(LENGTH, np.int32), first_token, []
    for offset in range(steps):
        sample = {"token": np.array([[token]], np.int32), "k_cache": k_cache.copy(), "v_cache": v_cache.copy(),
                  "offset": np.array([offset], np.int32), "mask": mask.copy()}
        samples.append(sample)
        with torch.no_grad():
            logits, k, v = module(*(torch.from_numpy(a) for a in sample.values()))
        k_cache[:, offset], v_cache[:, offset], mask[offset] = k[:, 0].numpy(), v[:, 0].numpy(), 0
        token = int(logits.reshape(-1).argmax())
    return samples


def calibration_inputs(graph, count):
    samples = [s for first in (1, 5, 9) for s in rollout(first)]
    return samples[:count]


def evaluation_inputs(graph):
    return [s for first in (2, 7) for s in rollout(first)][::2]
