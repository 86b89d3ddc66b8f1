"""Self-attention (multi-head or grouped-query) with rotary embeddings, sliding windows, per-head norms,
a KV cache for generation and interchangeable kernels (sdpa | eager | xformers)."""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from blockforge.errors import BlockforgeError

Rope = dict[tuple[int, float, float], torch.Tensor]  # (head_dim, theta, linear factor) -> (cos, sin) of every angle, (T, head_dim / 2, 2) float32


def rope_frequencies(dim: int, theta: float, scaling: dict | None = None, device=None) -> torch.Tensor:
    """w_j = theta^(-2j/dim), j < dim/2; with Llama-3 scaling, wavelengths longer than original_context /
    low_freq_factor are stretched by `factor`, shorter than original_context / high_freq_factor kept, and
    those between blended linearly in original_context / wavelength."""
    freq = 1.0 / (theta ** (torch.arange(0, dim, 2, device=device, dtype=torch.int64).float() / dim))
    if scaling is None:
        return freq
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    keep = ((scaling["original_context"] * freq / (2 * math.pi) - low) / (high - low)).clamp(0.0, 1.0)  # 0: stretch, 1: keep
    return freq / scaling["factor"] * (1.0 - keep) + freq * keep


def rope_tables(keys: set[tuple[int, float, float]], length: int, device: torch.device, scaling: dict | None = None) -> Rope:
    """For each (head_dim, theta, linear factor): cos and sin of t w_j / factor for positions t = 0..length-1 and
    the frequencies w_j of rope_frequencies, in float32 (linear RoPE scaling divides the positions by the factor)."""
    positions = torch.arange(length, device=device, dtype=torch.float32)
    tables = {}
    for dim, theta, factor in keys:
        angles = torch.outer(positions, rope_frequencies(dim, theta, scaling, device) / factor)  # (T, dim/2)
        tables[(dim, theta, factor)] = torch.stack((angles.cos(), angles.sin()), dim=-1)
    return tables


def apply_rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x[2j], x[2j+1]) of x (B, T, ..., hs) by its angle t w_j.

    Pairs are adjacent (interleaved RoPE, as in the original LLaMA code). Hugging Face's LLaMA pairs
    x[j] with x[j + hs/2] instead; families/llama_hf.py permutes query/key rows so both give the same logits.
    Eager mode does it as one complex multiply; under torch.compile, whose code generator has no complex
    kernels, as the same rotation in real arithmetic, which it fuses.
    """
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    pairs = wide.reshape(*x.shape[:-1], -1, 2)  # (B, T, ..., hs/2, 2)
    table = table.view(table.shape[0], *[1] * (pairs.dim() - 4), *table.shape[1:])  # broadcast over batch and heads
    rotate = rotate_pairs_real if torch.compiler.is_compiling() else rotate_pairs_complex
    return rotate(pairs, table).flatten(-2).type_as(x)


def rotate_pairs_complex(pairs: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(torch.view_as_complex(pairs) * torch.view_as_complex(table))


def rotate_pairs_real(pairs: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    a, b = pairs.unbind(-1)
    cos, sin = table.unbind(-1)
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1)


def causal_mask(queries: int, keys: int, past: int, window: int | None, device, first: int = 0) -> torch.Tensor:
    """(queries, keys) booleans: query i (absolute position past + i) sees key j (absolute position first + j) when
    that is not after it, and with a sliding window only the last `window` positions (itself included). `first` is
    nonzero when a windowed cache dropped the keys no later query can see."""
    i = torch.arange(queries, device=device)[:, None] + past
    j = torch.arange(keys, device=device)[None, :] + first
    allowed = j <= i
    return allowed & (j > i - window) if window is not None else allowed


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, window: int | None = None, past: int = 0,
          scale: float | None = None, first: int = 0) -> torch.Tensor:
    options = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}  # k, v not repeated for grouped-query attention
    if scale is not None:  # None: SDPA's own 1/sqrt(head_dim)
        options["scale"] = scale
    if not causal or (window is None and past == 0):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, **options)
    if q.shape[2] == 1 and (window is None or k.shape[2] <= window):  # one new position sees every cached one
        return F.scaled_dot_product_attention(q, k, v, **options)
    mask = causal_mask(q.shape[2], k.shape[2], past, window, q.device, first)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **options)


def _eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, window: int | None = None, past: int = 0,
           scale: float | None = None, first: int = 0) -> torch.Tensor:
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = q @ k.transpose(-2, -1)  # (B, nh, T, S)
    scores = scores / math.sqrt(q.shape[-1]) if scale is None else scores * scale
    if causal:
        scores = scores.masked_fill(~causal_mask(q.shape[2], k.shape[2], past, window, q.device, first), float("-inf"))
    return torch.softmax(scores.to(torch.promote_types(scores.dtype, torch.float32)), dim=-1).to(q.dtype) @ v


def _softcapped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, window: int | None, past: int, scale: float | None,
                cap: float, first: int = 0) -> torch.Tensor:
    """Attention with scores c * tanh(scores / c) before the mask and softmax (Gemma 2): no fused kernel does that."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = (q @ k.transpose(-2, -1)) * (scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
    scores = torch.tanh(scores / cap) * cap
    if causal:
        scores = scores.masked_fill(~causal_mask(q.shape[2], k.shape[2], past, window, q.device, first), float("-inf"))
    return torch.softmax(scores.to(torch.promote_types(scores.dtype, torch.float32)), dim=-1).to(q.dtype) @ v


def _xformers(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, window: int | None = None, past: int = 0,
              scale: float | None = None) -> torch.Tensor:
    if q.device.type != "cuda":
        raise BlockforgeError("attention 'xformers' runs on CUDA only; set model.attention: sdpa (the default) for CPU")
    if window is not None or past or q.shape[1] != k.shape[1]:
        raise BlockforgeError("attention 'xformers' here takes neither windows, grouped-query attention nor a KV cache; set model.attention: sdpa")
    try:
        import xformers.ops as xops
    except ImportError:
        raise BlockforgeError("attention 'xformers' needs the xformers package; pip install -e '.[gpu]', or set model.attention: sdpa") from None
    bias = xops.LowerTriangularMask() if causal else None
    out = xops.memory_efficient_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_bias=bias, scale=scale)
    return out.transpose(1, 2)


class _FusedFootprint(torch.autograd.Function):
    """Shapes only, as flash/efficient attention keeps them: q, k, v, the output and the log-sum-exp saved.

    The `footprint` backend, for memory plans on the meta device (where SDPA falls back to its unfused
    math and would save a T x T matrix no GPU kernel keeps).
    """

    @staticmethod
    def forward(ctx, q, k, v):
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, _, _ = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _footprint(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, window: int | None = None, past: int = 0,
               scale: float | None = None) -> torch.Tensor:
    return _FusedFootprint.apply(q, k, v)


ATTENTION_BACKENDS: dict[str, Callable[..., torch.Tensor]] = {"sdpa": _sdpa, "eager": _eager, "xformers": _xformers, "footprint": _footprint}


class Attention(nn.Module):
    """Multi-head (or grouped-query) self-attention: one fused q/k/v projection, RoPE, an optional sliding
    window and per-head q/k (and v) norms.

    qkv rows: heads * head_dim query rows, then kv_heads * head_dim key rows, then as many value rows.
    """

    def __init__(self, width: int, heads: int, *, bias: bool, causal: bool, backend: str, kv_heads: int | None = None,
                 head_dim: int | None = None, proj_bias: bool | None = None, window: int | None = None,
                 head_norm: Callable[[int], nn.Module] | None = None, qk_norm: bool = False, v_norm: bool = False,
                 score_multiplier: float = 1.0, rope_theta: float | None = None, query_scale: float | None = None,
                 qk_norm_over: str = "head", attn_logit_softcap: float | None = None, rope_linear_factor: float | None = None):
        super().__init__()
        self.width = width
        self.heads = heads
        self.kv_heads = kv_heads or heads
        self.head_dim = head_dim or width // heads
        self.causal = causal
        self.window = window
        self.kernel = ATTENTION_BACKENDS[backend]  # chosen once, at build
        # scores are q.k * query_scale (default 1/sqrt(head_dim)), times score_multiplier (muP's 1/head_dim); None keeps
        # each kernel's own 1/sqrt(head_dim)
        base = query_scale if query_scale is not None else 1.0 / math.sqrt(self.head_dim)
        self.scale = None if score_multiplier == 1.0 and query_scale is None else score_multiplier * base
        self.rope_linear_factor = rope_linear_factor  # positions divided by it before rotating (linear RoPE scaling)
        # None: no RoPE in this layer (NoPE)
        self.rope_key = (self.head_dim, rope_theta, rope_linear_factor or 1.0) if rope_theta is not None else None
        self.attn_logit_softcap = attn_logit_softcap
        self.qkv = nn.Linear(width, (heads + 2 * self.kv_heads) * self.head_dim, bias=bias)
        self.proj = nn.Linear(heads * self.head_dim, width, bias=bias if proj_bias is None else proj_bias)
        # per head, or (OLMo 2) over the whole query and key projections
        self.qk_norm_over = qk_norm_over
        q_dim, k_dim = (self.head_dim, self.head_dim) if qk_norm_over == "head" else (heads * self.head_dim, self.kv_heads * self.head_dim)
        self.q_norm = head_norm(q_dim) if qk_norm else None
        self.k_norm = head_norm(k_dim) if qk_norm else None
        self.v_norm = head_norm(self.head_dim) if v_norm else None

    def init_weights(self, draw, std: float, gain: float) -> None:
        """q, k, v and the output projection N(0, std); the value rows and the output further scaled by `gain`."""
        draw.linear(self.qkv, std)
        with torch.no_grad():
            self.qkv.weight[(self.heads + self.kv_heads) * self.head_dim :].mul_(gain)  # value rows
        draw.linear(self.proj, std * gain)

    def forward(self, x: torch.Tensor, rope: Rope | None = None, cache: LayerCache | None = None) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C). With `cache`, x holds the positions after the cached ones (generation)."""
        B, T, _ = x.shape
        hd = self.head_dim
        table = rope[self.rope_key] if rope is not None and self.rope_key is not None else None
        if self.kv_heads == self.heads and self.q_norm is None and self.v_norm is None:
            qkv = self.qkv(x).view(B, T, 3, self.heads, hd)
            if table is not None:  # q and k rotated together: one multiply forward and one backward
                q, k = apply_rope(qkv[:, :, :2], table).unbind(2)  # each (B, T, nh, hs)
                v = qkv[:, :, 2]
            else:
                q, k, v = qkv.unbind(2)
        else:
            q, k, v = self.qkv(x).split([self.heads * hd, self.kv_heads * hd, self.kv_heads * hd], dim=-1)
            if self.q_norm is not None and self.qk_norm_over == "projection":
                q, k = self.q_norm(q), self.k_norm(k)
            q, k, v = q.view(B, T, self.heads, hd), k.view(B, T, self.kv_heads, hd), v.view(B, T, self.kv_heads, hd)
            if self.q_norm is not None and self.qk_norm_over == "head":
                q, k = self.q_norm(q), self.k_norm(k)
            if self.v_norm is not None:
                v = self.v_norm(v)
            if table is not None:
                q, k = apply_rope(q, table), apply_rope(k, table)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, T, hs)
        past = first = 0  # the absolute positions of the first query and of the first key
        if cache is not None:
            past = cache.seen
            k, v, first = cache.extend(k, v, keep=self.window - 1 if self.window is not None else None)
        if self.attn_logit_softcap is not None:
            y = _softcapped(q, k, v, self.causal, self.window, past, self.scale, self.attn_logit_softcap, first)
        elif past:
            y = _sdpa(q, k, v, self.causal, self.window, past, scale=self.scale, first=first)  # cached steps always take SDPA
        else:
            y = self.kernel(q, k, v, self.causal, self.window, scale=self.scale)  # (B, heads, T, hs)
        return self.proj(y.transpose(1, 2).reshape(B, T, self.heads * hd))


class LayerCache:
    """One layer's keys and values, (B, kv_heads, positions, hs) each: of every position seen so far, or, for a layer
    with a sliding window of w, of the last w - 1 only (all that the next position can see besides itself), so a
    windowed layer holds what search/costs.py counts as its KV cache."""

    def __init__(self):
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.seen = 0  # positions seen so far (held or dropped)

    def extend(self, keys: torch.Tensor, values: torch.Tensor, keep: int | None = None) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Append the new positions; the keys and values the new positions attend over (those held before, then
        theirs) and the absolute position of the first of them. Afterwards only the last `keep` are held (None: all)."""
        held = 0 if self.keys is None else self.keys.shape[2]
        first = self.seen - held
        self.seen += keys.shape[2]
        if held:
            keys, values = torch.cat((self.keys, keys), dim=2), torch.cat((self.values, values), dim=2)
        drop = keys.shape[2] - keep if keep is not None and keys.shape[2] > keep else 0
        # a copy when dropping, so the storage of the dropped positions is freed, not kept alive by a view
        self.keys, self.values = (keys[:, :, drop:].clone(), values[:, :, drop:].clone()) if drop else (keys, values)
        return keys, values, first

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes


class KVCache:
    """Every layer's keys and values during generation, and how many positions they hold."""

    def __init__(self, depth: int):
        self.layers = [LayerCache() for _ in range(depth)]
        self.length = 0

    @property
    def nbytes(self) -> int:
        """The bytes of keys and values held now, over every layer."""
        return sum(layer.nbytes for layer in self.layers)
