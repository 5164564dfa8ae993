"""Hooks of the log-power test model: real speech (espeak-ng, at 16 kHz) cut into 8 frames of 64 samples."""
import functools

import numpy as np

SENTENCES = ("Build rules keep every binary up to date.", "Silence between words is where the trouble starts.")


def module_class():
    import torch

    class LogPower(torch.nn.Module):
        def __init__(self):
            super().__init__()
            n = torch.arange(64, dtype=torch.float64)
            k = torch.arange(33, dtype=torch.float64)[:, None]
            window = torch.hann_window(64, periodic=True, dtype=torch.float64)
            self.register_buffer("cos", (torch.cos(2 * torch.pi * k * n / 64) * window).float().T.contiguous())
            self.register_buffer("sin", (torch.sin(2 * torch.pi * k * n / 64) * window).float().T.contiguous())
            self.proj = torch.nn.Linear(33, 16)

        def forward(self, frames):
            real, imaginary = frames @ self.cos, frames @ self.sin
            power = real * real + imaginary * imaginary
            return self.proj(torch.log10(torch.maximum(power, torch.tensor(1e-12))))

    return LogPower


def build(graph, checkpoints):
    import torch
    module = module_class()()
    module.proj.load_state_dict(torch.load(checkpoints[0], weights_only=True))
    return module


@functools.cache
def _speech() -> np.ndarray:
    """The sentences spoken by espeak-ng, resampled by sox to 16 kHz mono, with 50 ms of silence around each."""
    import subprocess
    import tempfile
    import wave
    from pathlib import Path
    clips = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, sentence in enumerate(SENTENCES):
            raw, wav = Path(tmp, f"{i}.raw.wav"), Path(tmp, f"{i}.wav")
            subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(raw), sentence], check=True)
            subprocess.run(["sox", str(raw), "-r", "16000", "-c", "1", "-b", "16", str(wav), "pad", "0.05", "0.05"],
                           check=True)
            with wave.open(str(wav)) as w:
                clips.append(np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16))
    return np.concatenate(clips).astype(np.float32) / 32768


def _windows(start: int, count: int, step: int) -> list[dict]:
    speech = _speech()
    frames = speech[: len(speech) // 64 * 64].reshape(-1, 64)
    return [{"frames": np.ascontiguousarray(frames[i:i + 8][None])} for i in range(start, len(frames) - 8, step)][:count]


def calibration_inputs(graph, count):
    return _windows(0, count, 37)


def evaluation_inputs(graph):
    return _windows(11, 12, 113)
