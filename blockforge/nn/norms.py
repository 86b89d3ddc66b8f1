"""Normalization layers, looked up by the spec's `norm` string."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in at least float32 whatever the input dtype (as LLaMA does)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.to(torch.promote_types(x.dtype, torch.float32))  # bf16/fp16 -> fp32, fp64 stays
        return F.rms_norm(wide, (x.shape[-1],), weight=self.weight.to(wide.dtype), eps=self.eps).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class LayerNorm(nn.LayerNorm):
    """LayerNorm with a bias, as ViT uses it."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__(dim, eps=eps)


NORMS: dict[str, type[nn.Module]] = {"rmsnorm": RMSNorm, "layernorm": LayerNorm}


def make_norm(name: str, dim: int, eps: float) -> nn.Module:
    return NORMS[name](dim, eps)
