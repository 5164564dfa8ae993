"""Whisper tiny.en front and back ends in numpy and the standard library.

- ``log_mel(audio)``: 16 kHz mono float audio -> float32 (80, 3000) log-mel
  spectrogram as Whisper's encoder expects it (30 s window).
- ``Tokenizer``: GPT-2 byte-level BPE read from the model's vocabulary files
  (``vocabulary.txt``: one token per line, line number = id, special tokens
  included; ``tokenizer.json``: the BPE merges, used only for encoding).
- ``normalize`` and ``word_errors``: the text normalisation and edit distance
  behind the WER metric.

No torch here: the hooks use this module from ONNX Runtime / emulator code
paths too.
"""

from __future__ import annotations

import json
import re
import wave
from functools import lru_cache
from pathlib import Path

import numpy as np

# --------------------------------------------------------------------------
# Audio -> log-mel
# --------------------------------------------------------------------------

SAMPLE_RATE = 16000
N_FFT = 400          # 25 ms window
HOP = 160            # 10 ms hop
N_MELS = 80
CHUNK_SECONDS = 30
N_SAMPLES = SAMPLE_RATE * CHUNK_SECONDS   # 480000
N_FRAMES = N_SAMPLES // HOP               # 3000 mel frames -> 1500 encoder frames


def _hz_to_mel_slaney(hz: np.ndarray) -> np.ndarray:
    """Slaney's auditory-toolbox mel scale: linear below 1 kHz, logarithmic above."""
    hz = np.asarray(hz, dtype=np.float64)
    f_sp = 200.0 / 3.0                      # Hz per mel in the linear part
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp         # 15 mel
    logstep = np.log(6.4) / 27.0            # 27 mel per factor 6.4 in Hz
    mel = hz / f_sp
    above = hz >= min_log_hz
    mel = np.where(above, min_log_mel + np.log(np.maximum(hz, 1e-12) / min_log_hz) / logstep, mel)
    return mel


def _mel_to_hz_slaney(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    f_sp = 200.0 / 3.0
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = np.log(6.4) / 27.0
    hz = mel * f_sp
    return np.where(mel >= min_log_mel, min_log_hz * np.exp(logstep * (mel - min_log_mel)), hz)


@lru_cache(maxsize=None)
def mel_filterbank(sr: int = SAMPLE_RATE, n_fft: int = N_FFT, n_mels: int = N_MELS) -> np.ndarray:
    """(n_mels, 1 + n_fft // 2) triangular filters on the Slaney mel scale, Slaney area-normalised.

    Filter m rises from edge m to edge m+1 and falls to edge m+2, where the
    n_mels + 2 edges are equally spaced in mel between 0 Hz and sr / 2. Each
    filter is scaled by 2 / (bandwidth in Hz) so that all have equal area.
    """
    fft_hz = np.linspace(0.0, sr / 2.0, 1 + n_fft // 2)
    edges_hz = _mel_to_hz_slaney(np.linspace(_hz_to_mel_slaney(0.0), _hz_to_mel_slaney(sr / 2.0), n_mels + 2))
    widths = np.diff(edges_hz)                                  # (n_mels + 1,)
    offsets = edges_hz[:, None] - fft_hz[None, :]               # (n_mels + 2, n_bins)
    rising = -offsets[:-2] / widths[:-1, None]
    falling = offsets[2:] / widths[1:, None]
    filters = np.maximum(0.0, np.minimum(rising, falling))
    filters *= (2.0 / (edges_hz[2:] - edges_hz[:-2]))[:, None]
    filters = filters.astype(np.float32)
    filters.setflags(write=False)
    return filters


@lru_cache(maxsize=None)
def _hann(n: int) -> np.ndarray:
    """Periodic Hann window (the DFT-even variant used for spectral analysis)."""
    w = 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n) / n)
    w.setflags(write=False)
    return w


def pad_or_trim(audio: np.ndarray, length: int = N_SAMPLES) -> np.ndarray:
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    if audio.shape[0] >= length:
        return audio[:length]
    return np.concatenate([audio, np.zeros(length - audio.shape[0], dtype=np.float32)])


def log_mel(audio: np.ndarray) -> np.ndarray:
    """16 kHz float audio in [-1, 1] -> float32 (80, 3000) Whisper log-mel features.

    The audio is zero-padded (or cut) to 30 s; frames are centred (the signal
    is reflect-padded by n_fft / 2 on both sides), which gives 3001 frames of
    which the last is dropped. Power spectrum -> mel -> log10 (floor 1e-10),
    then clamped to at most 8 (i.e. 80 dB) below the maximum and mapped with
    (x + 4) / 4.
    """
    x = pad_or_trim(audio).astype(np.float64)
    half = N_FFT // 2
    x = np.pad(x, (half, half), mode="reflect")
    n_frames = 1 + (x.shape[0] - N_FFT) // HOP                   # 3001
    frames = np.lib.stride_tricks.sliding_window_view(x, N_FFT)[::HOP][:n_frames]
    spectrum = np.fft.rfft(frames * _hann(N_FFT), axis=-1)        # (3001, 201)
    power = (spectrum.real ** 2 + spectrum.imag ** 2)[:-1]         # (3000, 201)
    mel = mel_filterbank().astype(np.float64) @ power.T            # (80, 3000)
    logspec = np.log10(np.maximum(mel, 1e-10))
    logspec = np.maximum(logspec, logspec.max() - 8.0)
    return ((logspec + 4.0) / 4.0).astype(np.float32)


def read_wav(path: str | Path) -> np.ndarray:
    """16 kHz mono 16-bit PCM WAV -> float32 in [-1, 1)."""
    with wave.open(str(path), "rb") as w:
        if w.getnchannels() != 1 or w.getsampwidth() != 2 or w.getframerate() != SAMPLE_RATE:
            raise ValueError(f"{path}: expected 16 kHz mono 16-bit PCM, got {w.getframerate()} Hz, "
                             f"{w.getnchannels()} channel(s), {8 * w.getsampwidth()}-bit")
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return pcm.astype(np.float32) / 32768.0


# --------------------------------------------------------------------------
# Tokenizer (GPT-2 byte-level BPE)
# --------------------------------------------------------------------------

@lru_cache(maxsize=None)
def _byte_to_char() -> dict[int, str]:
    """The reversible byte -> printable character map of byte-level BPE.

    Bytes that are printable Latin-1 characters ('!'..'~', '\\xa1'..'\\xac',
    '\\xae'..'\\xff') stand for themselves; the other 68 bytes are mapped, in
    increasing order, to the code points 256, 257, ...
    """
    keep = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAC + 1)) | set(range(0xAE, 0xFF + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


# Pre-tokenisation: contractions, runs of letters, runs of digits, runs of
# other symbols (each optionally with one leading space), then whitespace.
# [^\W\d_] is "a letter" for Python's re (no \p{L}).
_PRETOKEN = re.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+(?!\S)|\s+""")


class Tokenizer:
    """Whisper tiny.en tokens from the model package's vocabulary files."""

    def __init__(self, vocabulary: str | Path, tokenizer_json: str | Path | None = None) -> None:
        with open(vocabulary, encoding="utf-8") as f:
            self.tokens = [line.rstrip("\n") for line in f]
        self.ids = {t: i for i, t in enumerate(self.tokens)}
        self.eot = self.ids["<|endoftext|>"]
        self.sot = self.ids["<|startoftranscript|>"]
        self.no_timestamps = self.ids["<|notimestamps|>"]
        # tiny.en is English-only: no language or task token in the prefix.
        self.sot_prefix = (self.sot, self.no_timestamps)
        # Every id >= eot is a special token (<|endoftext|>, <|startoftranscript|>, ..., timestamps).
        self.first_special = self.eot
        self._char_to_byte = {c: b for b, c in _byte_to_char().items()}
        self._ranks: dict[tuple[str, str], int] | None = None
        self._tokenizer_json = tokenizer_json
        self._cache: dict[str, list[int]] = {}

    def __len__(self) -> int:
        return len(self.tokens)

    # -- decoding ----------------------------------------------------------
    def decode(self, ids, *, skip_special: bool = True) -> str:
        out = bytearray()
        for i in ids:
            i = int(i)
            if i >= self.first_special:
                if not skip_special:
                    out += self.tokens[i].encode("utf-8")
                continue
            out += bytes(self._char_to_byte[c] for c in self.tokens[i])
        return out.decode("utf-8", errors="replace")

    # -- encoding ----------------------------------------------------------
    def _load_merges(self) -> dict[tuple[str, str], int]:
        if self._ranks is None:
            if self._tokenizer_json is None:
                raise RuntimeError("encoding needs tokenizer.json (the BPE merges)")
            with open(self._tokenizer_json, encoding="utf-8") as f:
                merges = json.load(f)["model"]["merges"]
            ranks = {}
            for rank, m in enumerate(merges):
                a, b = m.split(" ") if isinstance(m, str) else m
                ranks[(a, b)] = rank
            self._ranks = ranks
        return self._ranks

    def _bpe(self, word: str) -> list[int]:
        if word in self._cache:
            return self._cache[word]
        ranks = self._load_merges()
        parts = list(word)
        while len(parts) > 1:
            best, best_rank = -1, None
            for i in range(len(parts) - 1):
                r = ranks.get((parts[i], parts[i + 1]))
                if r is not None and (best_rank is None or r < best_rank):
                    best, best_rank = i, r
            if best < 0:
                break
            a, b = parts[best], parts[best + 1]
            merged, i = [], 0
            # Merge every occurrence of the best-ranked pair, left to right.
            while i < len(parts):
                if i < len(parts) - 1 and parts[i] == a and parts[i + 1] == b:
                    merged.append(a + b)
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        ids = [self.ids[p] for p in parts]
        self._cache[word] = ids
        return ids

    def encode(self, text: str) -> list[int]:
        """Plain text -> token ids (no special tokens)."""
        table = _byte_to_char()
        ids: list[int] = []
        for piece in _PRETOKEN.findall(text):
            ids += self._bpe("".join(table[b] for b in piece.encode("utf-8")))
        return ids


@lru_cache(maxsize=None)
def tokenizer_from_dir(model_dir: str) -> Tokenizer:
    d = Path(model_dir)
    tj = d / "tokenizer.json"
    return Tokenizer(d / "vocabulary.txt", tj if tj.is_file() else None)


# --------------------------------------------------------------------------
# WER
# --------------------------------------------------------------------------

def normalize(text: str) -> list[str]:
    """Lowercase, punctuation removed (apostrophes inside words kept), split on whitespace."""
    text = text.lower().replace("\u2019", "'")
    text = re.sub(r"[^\w\s']", " ", text)
    text = re.sub(r"(?<!\w)'|'(?!\w)", " ", text)
    return text.split()


def word_errors(reference: list[str], hypothesis: list[str]) -> int:
    """Levenshtein distance over words (substitutions + deletions + insertions)."""
    prev = list(range(len(hypothesis) + 1))
    for i, r in enumerate(reference, 1):
        cur = [i] + [0] * len(hypothesis)
        for j, h in enumerate(hypothesis, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h))
        prev = cur
    return prev[-1]


def wer(references: list[str], hypotheses: list[str]) -> float:
    """Corpus WER: total word errors / total reference words."""
    errors = words = 0
    for ref, hyp in zip(references, hypotheses, strict=True):
        r, h = normalize(ref), normalize(hyp)
        errors += word_errors(r, h)
        words += len(r)
    return errors / max(words, 1)
