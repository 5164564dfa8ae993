"""A small PyTorch Whisper (tiny.en sizes) for static-shape export to QNN HTP.

Two separate graphs, as an NPU runtime wants them:

    WhisperEncoder: mel float32 (1, 80, 3000) -> encoder_out float32 (1, 1500, 384)
    WhisperDecoder: tokens int32 (1, N), encoder_out (1, 1500, 384) -> logits (1, N, 51864)

The decoder has no KV cache: every call recomputes all N positions, and the
caller reads the logits at the last real (non-padding) position. A causal mask
keeps position i from seeing positions > i, so right padding never changes the
logits of real positions. The mask is a finite constant (-1e4): finfo.min
would blow up the range of 16-bit activation quantisation.

Weights come from the CTranslate2 model.bin (see ct2_reader.py) and are kept
in the CTranslate2 layout: fused q/k/v projection for self-attention, fused
k/v for cross-attention. Names used below:

    encoder/conv{1,2}/{weight,bias}
    encoder/position_encodings/encodings                     (1500, 384) sinusoidal
    {encoder,decoder}/layer_<i>/self_attention/layer_norm/{gamma,beta}
    {encoder,decoder}/layer_<i>/self_attention/linear_0      q|k|v (1152, 384)
    {encoder,decoder}/layer_<i>/self_attention/linear_1      out projection
    decoder/layer_<i>/attention/layer_norm/{gamma,beta}      cross-attention
    decoder/layer_<i>/attention/linear_0                     q (384, 384)
    decoder/layer_<i>/attention/linear_1                     k|v (768, 384) of encoder_out
    decoder/layer_<i>/attention/linear_2                     out projection
    {encoder,decoder}/layer_<i>/ffn/layer_norm/{gamma,beta}
    {encoder,decoder}/layer_<i>/ffn/linear_{0,1}             384 -> 1536 -> 384, exact GELU
    {encoder,decoder}/layer_norm/{gamma,beta}                final pre-norm output norm
    decoder/embeddings/weight                                (51864, 384), tied output projection
    decoder/position_encodings/encodings                     (448, 384) learned

This module imports torch at the top: export.py loads it only inside hooks.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

D_MODEL = 384
N_HEADS = 6
N_LAYERS = 4
D_FFN = 1536
N_MELS = 80
N_AUDIO_CTX = 1500
N_TEXT_CTX = 448
VOCAB = 51864
LN_EPS = 1e-5
MASK_VALUE = -1e4
_SQRT2 = math.sqrt(2.0)


def gelu(x: torch.Tensor) -> torch.Tensor:
    """Exact (erf) GELU, written as x * ((erf(x / sqrt 2) + 1) * 0.5).

    Same function as F.gelu, but F.gelu exports as (x * (1 + erf)) * 0.5 and
    onnxsim folds that trailing "* 0.5" into the weights of a following Conv
    (conv1 -> conv2 here), which breaks onnxruntime's Erf -> Gelu fusion: the
    lone Erf then falls back to the CPU and splits the QNN graph in two. With
    the 0.5 inside, the last op multiplies two activations and nothing folds.
    """
    return x * ((torch.erf(x / _SQRT2) + 1.0) * 0.5)


class Attention(nn.Module):
    """Multi-head attention on pre-projected q, k, v (batch 1, static shapes)."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.scale = 1.0 / math.sqrt(self.d_head)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.reshape(b, t, self.n_heads, self.d_head).transpose(1, 2)   # (b, h, t, d)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        b, t, c = q.shape
        q, k, v = self.split(q * self.scale), self.split(k), self.split(v)
        scores = q @ k.transpose(-1, -2)                                     # (b, h, tq, tk)
        if mask is not None:
            scores = scores + mask
        out = torch.softmax(scores, dim=-1) @ v                              # (b, h, tq, d)
        return out.transpose(1, 2).reshape(b, t, c)


class SelfAttentionBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(D_MODEL, eps=LN_EPS)
        self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL)
        self.out = nn.Linear(D_MODEL, D_MODEL)
        self.attn = Attention(D_MODEL, N_HEADS)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        q, k, v = self.qkv(self.norm(x)).split(D_MODEL, dim=-1)
        return x + self.out(self.attn(q, k, v, mask))


class CrossAttentionBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(D_MODEL, eps=LN_EPS)
        self.q = nn.Linear(D_MODEL, D_MODEL)
        self.kv = nn.Linear(D_MODEL, 2 * D_MODEL)
        self.out = nn.Linear(D_MODEL, D_MODEL)
        self.attn = Attention(D_MODEL, N_HEADS)

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        q = self.q(self.norm(x))
        k, v = self.kv(memory).split(D_MODEL, dim=-1)
        return x + self.out(self.attn(q, k, v))


class FeedForwardBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(D_MODEL, eps=LN_EPS)
        self.up = nn.Linear(D_MODEL, D_FFN)
        self.down = nn.Linear(D_FFN, D_MODEL)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(gelu(self.up(self.norm(x))))


class EncoderLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn = SelfAttentionBlock()
        self.ffn = FeedForwardBlock()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ffn(self.self_attn(x))


class DecoderLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn = SelfAttentionBlock()
        self.cross_attn = CrossAttentionBlock()
        self.ffn = FeedForwardBlock()

    def forward(self, x: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.ffn(self.cross_attn(self.self_attn(x, mask), memory))


class WhisperEncoder(nn.Module):
    """mel (1, 80, 3000) -> encoder_out (1, 1500, 384)."""

    input_names = ("mel",)
    output_names = ("encoder_out",)

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(N_MELS, D_MODEL, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(D_MODEL, D_MODEL, kernel_size=3, stride=2, padding=1)
        self.register_buffer("positions", torch.zeros(N_AUDIO_CTX, D_MODEL))
        self.layers = nn.ModuleList(EncoderLayer() for _ in range(N_LAYERS))
        self.norm = nn.LayerNorm(D_MODEL, eps=LN_EPS)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        x = gelu(self.conv1(mel))
        x = gelu(self.conv2(x))                  # (1, 384, 1500)
        x = x.transpose(1, 2) + self.positions     # (1, 1500, 384)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class WhisperDecoder(nn.Module):
    """tokens int32 (1, N), encoder_out (1, 1500, 384) -> logits (1, N, 51864), no KV cache."""

    input_names = ("tokens", "encoder_out")
    output_names = ("logits",)

    def __init__(self, n_tokens: int) -> None:
        super().__init__()
        if not 1 <= n_tokens <= N_TEXT_CTX:
            raise ValueError(f"n_tokens must be in 1..{N_TEXT_CTX}, got {n_tokens}")
        self.n_tokens = n_tokens
        # Token embedding and tied output projection as ONE (384, 51864) matrix
        # (the transpose of the checkpoint's embedding table): the projection is
        # a plain MatMul with it, the lookup a Gather along axis 1. Stored the
        # other way round, the exporter constant-folds a transposed copy for the
        # projection and the ONNX file carries the 20M-entry table twice.
        self.token_matrix = nn.Parameter(torch.zeros(D_MODEL, VOCAB))
        self.register_buffer("positions", torch.zeros(n_tokens, D_MODEL))
        causal = torch.triu(torch.full((n_tokens, n_tokens), MASK_VALUE), diagonal=1)
        self.register_buffer("causal_mask", causal)
        self.layers = nn.ModuleList(DecoderLayer() for _ in range(N_LAYERS))
        self.norm = nn.LayerNorm(D_MODEL, eps=LN_EPS)

    def forward(self, tokens: torch.Tensor, encoder_out: torch.Tensor) -> torch.Tensor:
        # Graph input is int32 (QNN HTP has no int64); Gather takes int32 indices directly.
        ids = tokens.to(torch.int32).reshape(-1)
        x = torch.index_select(self.token_matrix, 1, ids).transpose(0, 1).unsqueeze(0)   # (1, N, 384)
        x = x + self.positions
        for layer in self.layers:
            x = layer(x, encoder_out, self.causal_mask)
        return self.norm(x) @ self.token_matrix                                          # (1, N, 51864)


# --------------------------------------------------------------------------
# Loading from CTranslate2 variables
# --------------------------------------------------------------------------

def _set(param: torch.Tensor, value: np.ndarray, name: str) -> None:
    value = np.asarray(value, dtype=np.float32)
    if tuple(param.shape) != value.shape:
        raise ValueError(f"{name}: checkpoint shape {value.shape}, model expects {tuple(param.shape)}")
    with torch.no_grad():
        param.copy_(torch.from_numpy(value))


class _Weights:
    """Tracks which checkpoint variables were used, so none is silently ignored."""

    def __init__(self, variables: dict[str, np.ndarray]) -> None:
        self.variables = variables
        self.used: set[str] = set()

    def __call__(self, name: str) -> np.ndarray:
        if name not in self.variables:
            raise KeyError(f"checkpoint has no variable {name!r}")
        self.used.add(name)
        return self.variables[name]

    def scalar(self, name: str) -> int:
        return int(np.asarray(self(name)).reshape(()))

    def linear(self, module: nn.Linear, prefix: str) -> None:
        _set(module.weight, self(f"{prefix}/weight"), f"{prefix}/weight")
        _set(module.bias, self(f"{prefix}/bias"), f"{prefix}/bias")

    def norm(self, module: nn.LayerNorm, prefix: str) -> None:
        _set(module.weight, self(f"{prefix}/gamma"), f"{prefix}/gamma")
        _set(module.bias, self(f"{prefix}/beta"), f"{prefix}/beta")

    def self_attention(self, block: SelfAttentionBlock, prefix: str) -> None:
        self.norm(block.norm, f"{prefix}/layer_norm")
        self.linear(block.qkv, f"{prefix}/linear_0")
        self.linear(block.out, f"{prefix}/linear_1")

    def ffn(self, block: FeedForwardBlock, prefix: str) -> None:
        self.norm(block.norm, f"{prefix}/layer_norm")
        self.linear(block.up, f"{prefix}/linear_0")
        self.linear(block.down, f"{prefix}/linear_1")


# Constants of the checkpoint this model implements; anything else is refused.
_EXPECTED = {
    "encoder/num_heads": N_HEADS,
    "decoder/num_heads": N_HEADS,
    "decoder/pre_norm": 1,
    "decoder/activation": 3,          # CTranslate2 activation id 3 = exact (erf) GELU
    "decoder/scale_embeddings": 0,
    "decoder/alibi": 0,
    "decoder/start_from_zero_embedding": 0,
}
# Used only by CTranslate2's runtime (alignment heads for word timestamps).
_IGNORED = {"decoder/alignment_heads", "decoder/alignment_layer", "decoder/projection/weight"}


def _check_constants(w: _Weights) -> None:
    for name, expected in _EXPECTED.items():
        if name in w.variables:
            got = w.scalar(name)
            if got != expected:
                raise ValueError(f"checkpoint {name} = {got}, this model implements {expected}")


def load_encoder(variables: dict[str, np.ndarray]) -> WhisperEncoder:
    w = _Weights(variables)
    _check_constants(w)
    enc = WhisperEncoder()
    for i, conv in ((1, enc.conv1), (2, enc.conv2)):
        _set(conv.weight, w(f"encoder/conv{i}/weight"), f"encoder/conv{i}/weight")
        _set(conv.bias, w(f"encoder/conv{i}/bias"), f"encoder/conv{i}/bias")
    _set(enc.positions, w("encoder/position_encodings/encodings"), "encoder/position_encodings/encodings")
    for i, layer in enumerate(enc.layers):
        p = f"encoder/layer_{i}"
        w.self_attention(layer.self_attn, f"{p}/self_attention")
        w.ffn(layer.ffn, f"{p}/ffn")
    w.norm(enc.norm, "encoder/layer_norm")
    unused = sorted(k for k in variables if k.startswith("encoder/") and k not in w.used and k not in _IGNORED)
    if unused:
        raise ValueError(f"encoder variables not used by the model: {unused}")
    return _frozen(enc)


def load_decoder(variables: dict[str, np.ndarray], n_tokens: int) -> WhisperDecoder:
    w = _Weights(variables)
    _check_constants(w)
    dec = WhisperDecoder(n_tokens)
    _set(dec.token_matrix, np.asarray(w("decoder/embeddings/weight")).T, "decoder/embeddings/weight (transposed)")
    if "decoder/projection/weight" in variables and \
            variables["decoder/projection/weight"] is not variables["decoder/embeddings/weight"] and \
            not np.array_equal(variables["decoder/projection/weight"], variables["decoder/embeddings/weight"]):
        raise ValueError("decoder/projection/weight differs from the embeddings: this model ties them")
    positions = w("decoder/position_encodings/encodings")
    _set(dec.positions, positions[:n_tokens], "decoder/position_encodings/encodings[:N]")
    for i, layer in enumerate(dec.layers):
        p = f"decoder/layer_{i}"
        w.self_attention(layer.self_attn, f"{p}/self_attention")
        w.norm(layer.cross_attn.norm, f"{p}/attention/layer_norm")
        w.linear(layer.cross_attn.q, f"{p}/attention/linear_0")
        w.linear(layer.cross_attn.kv, f"{p}/attention/linear_1")
        w.linear(layer.cross_attn.out, f"{p}/attention/linear_2")
        w.ffn(layer.ffn, f"{p}/ffn")
    w.norm(dec.norm, "decoder/layer_norm")
    unused = sorted(k for k in variables if k.startswith("decoder/") and k not in w.used
                    and k not in _IGNORED and k not in _EXPECTED and k != "decoder/num_heads")
    if unused:
        raise ValueError(f"decoder variables not used by the model: {unused}")
    return _frozen(dec)


def _frozen(module: nn.Module) -> nn.Module:
    module.eval()
    for p in module.parameters():
        p.requires_grad_(False)
    return module
