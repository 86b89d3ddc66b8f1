"""The one Block class: two residual sub-layers whose norm slots a placement fills.

    h = out_norm( a * x  +  branch_norm( branch( s * in_norm(x) ) ) )

Empty slots are nn.Identity and a, s are plain floats, so every placement runs the same code.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from blockforge.nn.placements import Placement


class Residual(nn.Module):
    def __init__(self, branch: nn.Module, placement: Placement, make_norm: Callable[[], nn.Module], index: int, depth: int):
        super().__init__()
        self.in_norm = make_norm() if placement.in_norm else nn.Identity()
        self.branch = branch
        self.branch_norm = make_norm() if placement.branch_norm else nn.Identity()
        self.out_norm = make_norm() if placement.out_norm else nn.Identity()
        self.residual_scale = placement.residual_scale(index, depth)  # a
        self.input_scale = placement.input_scale(index, depth)  # s

    def forward(self, x: torch.Tensor, **branch_kwargs) -> torch.Tensor:
        h = self.in_norm(x)
        if self.input_scale != 1.0:
            h = h * self.input_scale
        if self.residual_scale != 1.0:
            x = x * self.residual_scale
        return self.out_norm(x + self.branch_norm(self.branch(h, **branch_kwargs)))

    def extra_repr(self) -> str:
        return f"residual_scale={self.residual_scale:.4g}, input_scale={self.input_scale:.4g}"


class Block(nn.Module):
    def __init__(self, attn: Residual, mlp: Residual):
        super().__init__()
        self.attn = attn
        self.mlp = mlp

    def forward(self, x: torch.Tensor, rope=None) -> torch.Tensor:
        x = self.attn(x, rope=rope)
        return self.mlp(x)
