"""Multi-head self-attention with rotary embeddings and interchangeable kernels (sdpa | eager | xformers)."""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from blockforge.errors import BlockforgeError

Rope = dict[int, torch.Tensor]  # head_dim -> (cos, sin) of every rotation angle, (T, head_dim / 2, 2) float32


def rope_tables(head_dims: set[int], length: int, theta: float, device: torch.device) -> Rope:
    """cos and sin of t w_j for positions t = 0..length-1 and frequencies w_j = theta^(-2j/dim), in float32."""
    positions = torch.arange(length, device=device, dtype=torch.float32)
    tables = {}
    for dim in head_dims:
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, device=device, dtype=torch.int64).float() / dim))
        angles = torch.outer(positions, inv_freq)  # (T, dim/2)
        tables[dim] = torch.stack((angles.cos(), angles.sin()), dim=-1)
    return tables


def apply_rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x[2j], x[2j+1]) of x (B, T, ..., hs) by its angle t w_j.

    Pairs are adjacent (interleaved RoPE, as in the original LLaMA code). Hugging Face's LLaMA pairs
    x[j] with x[j + hs/2] instead; convert.py permutes query/key rows so both give the same logits.
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


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, nh, T, T)
    if causal:
        length = q.shape[-2]
        mask = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores.to(torch.promote_types(scores.dtype, torch.float32)), dim=-1).to(q.dtype) @ v


def _xformers(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    if q.device.type != "cuda":
        raise BlockforgeError("attention 'xformers' runs on CUDA only; set model.attention: sdpa (the default) for CPU")
    try:
        import xformers.ops as xops
    except ImportError:
        raise BlockforgeError("attention 'xformers' needs the xformers package; pip install -e '.[gpu]', or set model.attention: sdpa") from None
    bias = xops.LowerTriangularMask() if causal else None
    out = xops.memory_efficient_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_bias=bias)
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


def _footprint(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    return _FusedFootprint.apply(q, k, v)


ATTENTION_BACKENDS: dict[str, Callable[..., torch.Tensor]] = {"sdpa": _sdpa, "eager": _eager, "xformers": _xformers, "footprint": _footprint}


class Attention(nn.Module):
    def __init__(self, width: int, heads: int, *, bias: bool, causal: bool, backend: str):
        super().__init__()
        self.width = width
        self.heads = heads
        self.head_dim = width // heads
        self.causal = causal
        self.backend = backend
        self.kernel = ATTENTION_BACKENDS[backend]  # chosen once, at build
        self.qkv = nn.Linear(width, 3 * width, bias=bias)  # rows: q, then k, then v
        self.proj = nn.Linear(width, width, bias=bias)

    def init_weights(self, draw, std: float, gain: float) -> None:
        """q, k, v and the output projection N(0, std); the value rows and the output further scaled by `gain`."""
        draw.linear(self.qkv, std)
        with torch.no_grad():
            self.qkv.weight[2 * self.width :].mul_(gain)  # value rows
        draw.linear(self.proj, std * gain)

    def forward(self, x: torch.Tensor, rope: Rope | None = None, cache: LayerCache | None = None) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C). With `cache`, x holds the positions after the cached ones (generation)."""
        B, T, C = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.heads, self.head_dim)
        if rope is not None:  # q and k rotated together: one multiply forward and one backward
            q, k = apply_rope(qkv[:, :, :2], rope[self.head_dim]).unbind(2)  # each (B, T, nh, hs)
            v = qkv[:, :, 2]
        else:
            q, k, v = qkv.unbind(2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, nh, T, hs)
        if cache is None or cache.keys is None:
            if cache is not None:
                cache.keys, cache.values = k, v
            y = self.kernel(q, k, v, self.causal)  # (B, nh, T, hs)
        else:
            past = cache.keys.shape[2]
            k = cache.keys = torch.cat((cache.keys, k), dim=2)  # (B, nh, past + T, hs)
            v = cache.values = torch.cat((cache.values, v), dim=2)
            # New position i (absolute past + i) sees every key up to itself.
            mask = torch.arange(past + T, device=x.device) <= past + torch.arange(T, device=x.device)[:, None]
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask if self.causal and T > 1 else None)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class LayerCache:
    """One layer's keys and values of the positions seen so far, (B, nh, positions, hs) each."""

    def __init__(self):
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None


class KVCache:
    """Every layer's keys and values during generation, and how many positions they hold."""

    def __init__(self, depth: int):
        self.layers = [LayerCache() for _ in range(depth)]
        self.length = 0
