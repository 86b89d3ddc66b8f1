"""Multi-head self-attention with rotary embeddings and interchangeable kernels (sdpa | eager | xformers)."""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from blockforge.errors import BlockforgeError

Rope = dict[int, tuple[torch.Tensor, torch.Tensor]]  # head_dim -> (cos, sin), each (T, head_dim)


def rope_tables(head_dims: set[int], length: int, theta: float, device: torch.device, dtype: torch.dtype) -> Rope:
    """cos/sin tables for positions 0..length-1, computed in float32 (the half-split RoPE of LLaMA)."""
    positions = torch.arange(length, device=device, dtype=torch.float32)
    tables = {}
    for dim in head_dims:
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, device=device, dtype=torch.int64).float() / dim))
        angles = torch.outer(positions, inv_freq)  # (T, dim/2)
        angles = torch.cat((angles, angles), dim=-1)  # (T, dim)
        tables[dim] = (angles.cos().to(dtype), angles.sin().to(dtype))
    return tables


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + _rotate_half(x) * sin


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


ATTENTION_BACKENDS: dict[str, Callable[..., torch.Tensor]] = {"sdpa": _sdpa, "eager": _eager, "xformers": _xformers}


class Attention(nn.Module):
    def __init__(self, width: int, heads: int, *, bias: bool, causal: bool, backend: str):
        super().__init__()
        self.heads = heads
        self.head_dim = width // heads
        self.causal = causal
        self.backend = backend
        self.qkv = nn.Linear(width, 3 * width, bias=bias)  # rows: q, then k, then v
        self.proj = nn.Linear(width, width, bias=bias)

    def forward(self, x: torch.Tensor, rope: Rope | None = None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)  # each (B, nh, T, hs)
        if rope is not None:
            cos, sin = rope[self.head_dim]
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = ATTENTION_BACKENDS[self.backend](q, k, v, self.causal)  # (B, nh, T, hs)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))
