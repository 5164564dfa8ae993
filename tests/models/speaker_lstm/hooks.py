"""Hooks of the LSTM speaker classifier: frames of four synthetic "speakers" (harmonic stacks at their own pitch,
with noise), evaluation samples labelled with the speaker, so score() gets (inputs, label) pairs' labels.

The weights are encoder.npz, made once by train() (60 seeded, single-threaded Adam steps on 32 synthetic samples).
They are shipped, not trained at build time: such a run still gives other weights on another CPU (torch's kernels
differ between AVX2 and AVX-512, as the dense-map detector's did), and the tests need the float model's accuracy
to be exactly 1. `python hooks.py` writes encoder.npz again."""
import numpy as np

SPEAKERS, FRAMES, BINS, HIDDEN = 4, 8, 20, 32


def module_class():
    import torch

    class Speaker(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(BINS, HIDDEN, num_layers=3, batch_first=True)
            self.head = torch.nn.Linear(HIDDEN, SPEAKERS)

        def forward(self, frames):
            sequence, _ = self.lstm(frames)
            return self.head(sequence[:, -1])

    return Speaker


def build(graph, checkpoints):
    """The classifier with encoder.npz's weights (model.toml's checkpoint)."""
    import torch
    module = module_class()()
    with np.load(checkpoints[0]) as weights:
        module.load_state_dict({name: torch.from_numpy(weights[name]) for name in weights.files})
    return module.eval()


def frames(speaker: int, rng) -> np.ndarray:
    """Log-spectrum-like frames: the speaker's harmonics (pitch bin 2 + speaker) drifting a little, plus noise."""
    bins = np.arange(BINS)
    pitch = 2.0 + speaker + 0.3 * rng.standard_normal()
    rows = []
    for t in range(FRAMES):
        f0 = pitch * (1 + 0.02 * np.sin(t / 3))
        rows.append(sum(np.exp(-0.5 * ((bins - k * f0) / 0.7) ** 2) / k for k in range(1, 6)))
    x = np.log(np.array(rows) + 0.05) + 0.2 * rng.standard_normal((FRAMES, BINS))
    return x[None].astype(np.float32)


def labelled(count: int, seed: int) -> list[tuple[dict, int]]:
    rng = np.random.default_rng(seed)
    return [({"frames": frames(i % SPEAKERS, rng)}, i % SPEAKERS) for i in range(count)]


def calibration_inputs(graph, count):
    return [inputs for inputs, _ in labelled(count, seed=1)]


def evaluation_inputs(graph):
    return labelled(8, seed=2)


def score(graph, inputs, outputs, *, float_outputs, labels):
    """accuracy against the speaker labels; agreement: share of samples where the float model picks the same."""
    picked = [int(np.argmax(o["logits"])) for o in outputs]
    float_picked = [int(np.argmax(o["logits"])) for o in float_outputs]
    return {"accuracy": float(np.mean([p == y for p, y in zip(picked, labels)])),
            "agreement": float(np.mean([p == q for p, q in zip(picked, float_picked)]))}


def train(steps: int = 60, seed: int = 0):
    """A classifier that does the job (60 Adam steps on 32 synthetic samples: accuracy 1.0 on the evaluation set)."""
    import torch
    torch.set_num_threads(1)  # small tensors: more threads only contend (and on a busy machine, badly)
    torch.manual_seed(seed)
    module = module_class()()
    optimizer = torch.optim.Adam(module.parameters(), lr=0.01)
    data = labelled(32, seed=3)
    x = torch.from_numpy(np.concatenate([i["frames"] for i, _ in data]))
    y = torch.tensor([label for _, label in data])
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(module(x), y)
        loss.backward()
        optimizer.step()
    return module


def write_weights(path) -> None:
    """encoder.npz: train()'s weights, one array per state_dict entry."""
    np.savez(path, **{name: value.detach().numpy() for name, value in train().state_dict().items()})


if __name__ == "__main__":
    from pathlib import Path
    write_weights(Path(__file__).with_name("encoder.npz"))
