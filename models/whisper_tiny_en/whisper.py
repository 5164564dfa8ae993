"""A small PyTorch Whisper (tiny.en sizes) for static-shape export to QNN HTP, in sherpa-onnx's QNN form.

Two graphs, as sherpa-onnx's scripts/whisper/qnn/export_onnx.py splits them (adapted, not copied):

    WhisperEncoderCrossKV (graph "encoder"): mel float32 (1, 80, 3000)
        -> cross_k_<i>, cross_v_<i> float32 (1, 1500, 384) for each decoder layer i: the cross-attention keys and
           values, computed once per utterance
    WhisperDecoderStep (graph "decoder"): one token per call
        tokens int32 (1, 1), self_k_<i> / self_v_<i> float32 (1, 448, 384) (the self-attention caches),
        cross_k_<i> / cross_v_<i>, offset int32 (1,) (the token's position), mask int32 (448,)
        (1 = cache position not written yet, 0 = written)
        -> logits float32 (1, 1, 51864), this_self_k_<i> / this_self_v_<i> float32 (1, 1, 384): this token's keys
           and values, which the caller writes into the caches at `offset` before the next step

The step attends to the cache positions the mask leaves open plus its own key/value (concatenated as a 449th
position), so its output does not depend on when the caller writes the cache, only that positions < offset
hold the earlier tokens' keys and values. Masked scores get a finite constant (MASK_VALUE): -inf or
finfo.min would blow up the range of 16-bit activation quantisation (docs/models.md).

WhisperDecoder is the same decoder without a cache (tokens (1, N) + encoder output -> logits (1, N, 51864)):
not a graph of the build, but the reference the step graph is tested against, and what makes realistic caches
(its per-layer keys and values of a whole transcript) for calibration in one pass.

Weights come from the CTranslate2 model.bin (see ct2_reader.py). CTranslate2 fuses q|k|v of self-attention
and k|v of cross-attention into one matrix each; they are split here into separate projections, so each key
and value the graphs return is the output of its own projection. Names used below:

    encoder/conv{1,2}/{weight,bias}
    encoder/position_encodings/encodings                     (1500, 384) sinusoidal
    {encoder,decoder}/layer_<i>/self_attention/layer_norm/{gamma,beta}
    {encoder,decoder}/layer_<i>/self_attention/linear_0      q|k|v (1152, 384)
    {encoder,decoder}/layer_<i>/self_attention/linear_1      out projection
    decoder/layer_<i>/attention/layer_norm/{gamma,beta}      cross-attention
    decoder/layer_<i>/attention/linear_0                     q (384, 384)
    decoder/layer_<i>/attention/linear_1                     k|v (768, 384) of the encoder output
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
# Added to the scores of masked positions: finite, and small enough that a 16-bit quantisation step of the
# masked scores stays ~2e-3 (with -1e4 it would be 0.15); exp(-100) is 0 in float32 all the same.
MASK_VALUE = -100.0
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


def head_selector() -> torch.Tensor:
    """(N_HEADS, D_MODEL) of 0/1: row h selects head h's D_MODEL / N_HEADS dims."""
    d_head = D_MODEL // N_HEADS
    return torch.kron(torch.eye(N_HEADS), torch.ones(1, d_head))


def one_query_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, heads: torch.Tensor,
                        mask: torch.Tensor | None = None) -> torch.Tensor:
    """Multi-head attention of one position q (1, 1, D) over keys and values (1, T, D) that are read as they are:
    no reshape or transpose of the (1, T, D) tensors, which on the HTP would move 1500 x 384 values per layer and
    step (and a graph input whose first op is a layout op stays float32 at the binary's boundary). Each head's query
    is a row of `heads`-masked q (H, D); keys @ those rows give every head's scores (1, T, H); the weights of head h
    mix all D value dims and `heads` keeps head h's own. mask: (T,), added to the scores."""
    d_head = D_MODEL // N_HEADS
    per_head = (q * (1.0 / math.sqrt(d_head))).reshape(1, D_MODEL) * heads          # (H, D)
    scores = keys @ per_head.transpose(0, 1)                                          # (1, T, H)
    if mask is not None:
        scores = scores + mask.reshape(-1, 1)
    weights = torch.softmax(scores.transpose(1, 2), dim=-1)                           # (1, H, T)
    return ((weights @ values) * heads).sum(dim=1, keepdim=True)                      # (1, 1, D)


class SelfAttentionBlock(nn.Module):
    """Pre-norm self-attention; returns the keys and values of its input positions too (a decoder's cache)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(D_MODEL, eps=LN_EPS)
        self.q = nn.Linear(D_MODEL, D_MODEL)
        self.k = nn.Linear(D_MODEL, D_MODEL)
        self.v = nn.Linear(D_MODEL, D_MODEL)
        self.out = nn.Linear(D_MODEL, D_MODEL)
        self.attn = Attention(D_MODEL, N_HEADS)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None):
        h = self.norm(x)
        q, k, v = self.q(h), self.k(h), self.v(h)
        return x + self.out(self.attn(q, k, v, mask)), k, v

    def step(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, mask: torch.Tensor,
             heads: torch.Tensor):
        """One position x (1, 1, D) against the cache (1, L, D) plus itself; mask (L + 1,), 0 = attend."""
        h = self.norm(x)
        q, k, v = self.q(h), self.k(h), self.v(h)
        keys, values = torch.cat([k_cache, k], dim=1), torch.cat([v_cache, v], dim=1)   # (1, L + 1, D)
        return x + self.out(one_query_attention(q, keys, values, heads, mask)), k, v


class CrossAttentionBlock(nn.Module):
    """Pre-norm cross-attention on keys and values computed beforehand from the encoder output (CrossKV)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(D_MODEL, eps=LN_EPS)
        self.q = nn.Linear(D_MODEL, D_MODEL)
        self.out = nn.Linear(D_MODEL, D_MODEL)
        self.attn = Attention(D_MODEL, N_HEADS)

    def forward(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return x + self.out(self.attn(self.q(self.norm(x)), k, v))

    def step(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
        """One position x (1, 1, D) against the cross K/V (1, 1500, D) as the encoder returned them."""
        return x + self.out(one_query_attention(self.q(self.norm(x)), k, v, heads))


class CrossKV(nn.Module):
    """One decoder layer's cross-attention key and value projections of the encoder output."""

    def __init__(self) -> None:
        super().__init__()
        self.k = nn.Linear(D_MODEL, D_MODEL)
        self.v = nn.Linear(D_MODEL, D_MODEL)

    def forward(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k(memory), self.v(memory)


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
        return self.ffn(self.self_attn(x)[0])


class DecoderLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn = SelfAttentionBlock()
        self.cross_attn = CrossAttentionBlock()
        self.cross_kv = CrossKV()   # run by the encoder graph, once per utterance
        self.ffn = FeedForwardBlock()

    def forward(self, x, cross_k, cross_v, mask):
        x, k, v = self.self_attn(x, mask)
        return self.ffn(self.cross_attn(x, cross_k, cross_v)), k, v

    def step(self, x, k_cache, v_cache, cross_k, cross_v, mask, heads):
        x, k, v = self.self_attn.step(x, k_cache, v_cache, mask, heads)
        return self.ffn(self.cross_attn.step(x, cross_k, cross_v, heads)), k, v


class WhisperEncoder(nn.Module):
    """mel (1, 80, 3000) -> encoder output (1, 1500, 384)."""

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


class TextDecoder(nn.Module):
    """The decoder's weights, shared by its two forms (WhisperDecoderStep, WhisperDecoder)."""

    def __init__(self) -> None:
        super().__init__()
        # Token embedding and tied output projection as ONE (384, 51864) matrix
        # (the transpose of the checkpoint's embedding table): the projection is
        # a plain MatMul with it, the lookup a Gather along axis 1. Stored the
        # other way round, the exporter constant-folds a transposed copy for the
        # projection and the ONNX file carries the 20M-entry table twice.
        self.token_matrix = nn.Parameter(torch.zeros(D_MODEL, VOCAB))
        self.register_buffer("positions", torch.zeros(N_TEXT_CTX, D_MODEL))
        self.layers = nn.ModuleList(DecoderLayer() for _ in range(N_LAYERS))
        self.norm = nn.LayerNorm(D_MODEL, eps=LN_EPS)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        # int32 ids (QNN HTP has no int64); Gather takes int32 indices directly.
        ids = tokens.to(torch.int32).reshape(-1)
        return torch.index_select(self.token_matrix, 1, ids).transpose(0, 1).unsqueeze(0)   # (1, N, 384)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x) @ self.token_matrix                                          # (1, N, 51864)


class WhisperEncoderCrossKV(nn.Module):
    """Graph "encoder": mel (1, 80, 3000) -> cross_k_0, cross_v_0, ..., cross_v_3, each (1, 1500, 384)."""

    def __init__(self, encoder: WhisperEncoder, decoder: TextDecoder) -> None:
        super().__init__()
        self.encoder = encoder
        self.cross_kv = nn.ModuleList(layer.cross_kv for layer in decoder.layers)

    def forward(self, mel: torch.Tensor) -> tuple[torch.Tensor, ...]:
        memory = self.encoder(mel)
        return tuple(t for kv in self.cross_kv for t in kv(memory))


def cross_kv_names() -> list[str]:
    return [f"cross_{kind}_{i}" for i in range(N_LAYERS) for kind in ("k", "v")]


def self_kv_names(prefix: str = "") -> list[str]:
    return [f"{prefix}self_{kind}_{i}" for i in range(N_LAYERS) for kind in ("k", "v")]


class WhisperDecoderStep(nn.Module):
    """Graph "decoder", one token per call (sherpa-onnx's QNN decoder, with an int32 offset):

        tokens int32 (1, 1), self_k_0, self_v_0, ..., self_v_3 (1, 448, 384), cross_k_0, ..., cross_v_3
        (1, 1500, 384), offset int32 (1,), mask int32 (448,)
        -> logits (1, 1, 51864), this_self_k_0, this_self_v_0, ..., this_self_v_3 (1, 1, 384)
    """

    input_names = ("tokens", *self_kv_names(), *cross_kv_names(), "offset", "mask")
    output_names = ("logits", *self_kv_names("this_"))

    def __init__(self, decoder: TextDecoder) -> None:
        super().__init__()
        self.decoder = decoder
        self.register_buffer("own_position", torch.zeros(1))   # the step's own key: never masked
        self.register_buffer("heads", head_selector())

    def forward(self, tokens: torch.Tensor, *states: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n = N_LAYERS
        self_kv, cross_kv, (offset, mask) = states[:2 * n], states[2 * n:4 * n], states[4 * n:]
        position = torch.index_select(self.decoder.positions, 0, offset.to(torch.int32)).unsqueeze(0)
        x = self.decoder.embed(tokens) + position                                       # (1, 1, 384)
        scores_mask = torch.cat([mask.to(torch.float32) * MASK_VALUE, self.own_position])  # (449,)
        new_kv = []
        for i, layer in enumerate(self.decoder.layers):
            x, k, v = layer.step(x, self_kv[2 * i], self_kv[2 * i + 1], cross_kv[2 * i], cross_kv[2 * i + 1],
                                 scores_mask, self.heads)
            new_kv += [k, v]
        return (self.decoder.logits(x), *new_kv)


class WhisperDecoder(nn.Module):
    """The decoder without a cache: tokens int32 (1, N) + encoder output (1, 1500, 384) -> logits (1, N, 51864).

    A causal mask keeps position i from seeing positions > i, so right padding never changes the logits of real
    positions. The reference for WhisperDecoderStep, and (self_kv) the source of realistic caches."""

    def __init__(self, decoder: TextDecoder, n_tokens: int) -> None:
        super().__init__()
        if not 1 <= n_tokens <= N_TEXT_CTX:
            raise ValueError(f"n_tokens must be in 1..{N_TEXT_CTX}, got {n_tokens}")
        self.decoder = decoder
        self.n_tokens = n_tokens
        self.register_buffer("causal_mask", torch.triu(torch.full((n_tokens, n_tokens), MASK_VALUE), diagonal=1))

    def self_kv(self, tokens: torch.Tensor, encoder_out: torch.Tensor):
        """(logits (1, N, V), [k_0, v_0, ..., v_3] each (1, N, 384)): the keys and values a step decoder's caches
        hold after stepping through these tokens."""
        x = self.decoder.embed(tokens) + self.decoder.positions[:self.n_tokens]
        kv = []
        for layer in self.decoder.layers:
            cross_k, cross_v = layer.cross_kv(encoder_out)
            x, k, v = layer(x, cross_k, cross_v, self.causal_mask)
            kv += [k, v]
        return self.decoder.logits(x), kv

    def forward(self, tokens: torch.Tensor, encoder_out: torch.Tensor) -> torch.Tensor:
        return self.self_kv(tokens, encoder_out)[0]


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

    def fused_linear(self, modules: list[nn.Linear], prefix: str) -> None:
        """A CTranslate2 projection fused along the output rows (q|k|v, k|v), split into `modules` in order."""
        weight, bias = np.asarray(self(f"{prefix}/weight")), np.asarray(self(f"{prefix}/bias"))
        rows = D_MODEL * len(modules)
        if weight.shape[0] != rows or bias.shape[0] != rows:
            raise ValueError(f"{prefix}: checkpoint shape {weight.shape}, expected {len(modules)} fused "
                             f"({rows}, {D_MODEL}) projections")
        for i, module in enumerate(modules):
            part = slice(i * D_MODEL, (i + 1) * D_MODEL)
            _set(module.weight, weight[part], f"{prefix}/weight[{part.start}:{part.stop}]")
            _set(module.bias, bias[part], f"{prefix}/bias[{part.start}:{part.stop}]")

    def norm(self, module: nn.LayerNorm, prefix: str) -> None:
        _set(module.weight, self(f"{prefix}/gamma"), f"{prefix}/gamma")
        _set(module.bias, self(f"{prefix}/beta"), f"{prefix}/beta")

    def self_attention(self, block: SelfAttentionBlock, prefix: str) -> None:
        self.norm(block.norm, f"{prefix}/layer_norm")
        self.fused_linear([block.q, block.k, block.v], f"{prefix}/linear_0")
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


def load_text_decoder(variables: dict[str, np.ndarray]) -> TextDecoder:
    """The decoder's weights; wrap them in WhisperDecoderStep (the graph) or WhisperDecoder (no cache)."""
    w = _Weights(variables)
    _check_constants(w)
    dec = TextDecoder()
    _set(dec.token_matrix, np.asarray(w("decoder/embeddings/weight")).T, "decoder/embeddings/weight (transposed)")
    if "decoder/projection/weight" in variables and \
            variables["decoder/projection/weight"] is not variables["decoder/embeddings/weight"] and \
            not np.array_equal(variables["decoder/projection/weight"], variables["decoder/embeddings/weight"]):
        raise ValueError("decoder/projection/weight differs from the embeddings: this model ties them")
    _set(dec.positions, w("decoder/position_encodings/encodings"), "decoder/position_encodings/encodings")
    for i, layer in enumerate(dec.layers):
        p = f"decoder/layer_{i}"
        w.self_attention(layer.self_attn, f"{p}/self_attention")
        w.norm(layer.cross_attn.norm, f"{p}/attention/layer_norm")
        w.linear(layer.cross_attn.q, f"{p}/attention/linear_0")
        w.fused_linear([layer.cross_kv.k, layer.cross_kv.v], f"{p}/attention/linear_1")
        w.linear(layer.cross_attn.out, f"{p}/attention/linear_2")
        w.ffn(layer.ffn, f"{p}/ffn")
    w.norm(dec.norm, "decoder/layer_norm")
    unused = sorted(k for k in variables if k.startswith("decoder/") and k not in w.used
                    and k not in _IGNORED and k not in _EXPECTED and k != "decoder/num_heads")
    if unused:
        raise ValueError(f"decoder variables not used by the model: {unused}")
    return _frozen(dec)


def load_encoder_cross_kv(variables: dict[str, np.ndarray]) -> WhisperEncoderCrossKV:
    return _frozen(WhisperEncoderCrossKV(load_encoder(variables), load_text_decoder(variables)))


def load_decoder_step(variables: dict[str, np.ndarray]) -> WhisperDecoderStep:
    return _frozen(WhisperDecoderStep(load_text_decoder(variables)))


def load_decoder(variables: dict[str, np.ndarray], n_tokens: int) -> WhisperDecoder:
    return _frozen(WhisperDecoder(load_text_decoder(variables), n_tokens))


def _frozen(module: nn.Module) -> nn.Module:
    module.eval()
    for p in module.parameters():
        p.requires_grad_(False)
    return module
