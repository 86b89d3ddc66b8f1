"""Feed-forward branches: SwiGLU (llama) and GELU (vit). `init_weights(draw, std, gain)`: every weight N(0, std * gain)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SwiGLU(nn.Module):
    def __init__(self, width: int, hidden: int, *, bias: bool = False):
        super().__init__()
        self.gate_up = nn.Linear(width, 2 * hidden, bias=bias)  # rows: gate, then up
        self.down = nn.Linear(hidden, width, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)

    def init_weights(self, draw, std: float, gain: float) -> None:
        draw.linear(self.gate_up, std * gain)
        draw.linear(self.down, std * gain)


class GeluMLP(nn.Module):
    def __init__(self, width: int, hidden: int, *, bias: bool = True):
        super().__init__()
        self.fc1 = nn.Linear(width, hidden, bias=bias)
        self.fc2 = nn.Linear(hidden, width, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))

    def init_weights(self, draw, std: float, gain: float) -> None:
        draw.linear(self.fc1, std * gain)
        draw.linear(self.fc2, std * gain)
