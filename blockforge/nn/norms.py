"""Normalization layers, looked up by the spec's `norm` string: RMSNorm, LayerNorm and DyT."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """x / rms(x) * (offset + weight), computed in at least float32 whatever the input dtype (as LLaMA does).

    With offset 1 (Gemma) the weight is stored as w in (1 + w); it starts at 1 - offset, so the gain starts at 1.
    """

    def __init__(self, dim: int, eps: float = 1e-6, offset: float = 0.0):
        super().__init__()
        self.eps = eps
        self.offset = offset
        self.weight = nn.Parameter(torch.full((dim,), 1.0 - offset))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.to(torch.promote_types(x.dtype, torch.float32))  # bf16/fp16 -> fp32, fp64 stays
        gain = self.weight.to(wide.dtype)
        if self.offset != 0.0:
            gain = gain + self.offset
        return F.rms_norm(wide, (x.shape[-1],), weight=gain, eps=self.eps).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}" + (f", offset={self.offset:g}" if self.offset else "")


class LayerNorm(nn.LayerNorm):
    """LayerNorm with a bias, as ViT uses it."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__(dim, eps=eps)


class DyT(nn.Module):
    """Dynamic Tanh ("Transformers without Normalization", 2025): weight * tanh(alpha * x) + bias, alpha a learned scalar."""

    def __init__(self, dim: int, eps: float = 0.0, alpha: float = 0.5):
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), float(alpha)))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.alpha * x) * self.weight + self.bias

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}"


# The class of each norm name spec.fields.NORMS declares (tests/nn/test_models.py checks that every name has one).
NORMS: dict[str, type[nn.Module]] = {"rmsnorm": RMSNorm, "layernorm": LayerNorm, "dyt": DyT}


def make_norm(name: str, dim: int, eps: float, dyt_alpha: float = 0.5, offset: float = 0.0) -> nn.Module:
    if name == "dyt":
        return DyT(dim, alpha=dyt_alpha)
    return RMSNorm(dim, eps, offset) if name == "rmsnorm" else NORMS[name](dim, eps)
