"""Feed-forward branches: a gated MLP (llama: SwiGLU, or GeGLU with a GELU gate) and a plain one (vit: GELU).
`init_weights(draw, std, gain)`: every weight N(0, std * gain)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def activation(name: str | None, default: str):
    """silu | gelu (exact, erf) | gelu_tanh (the tanh approximation: Gemma's gelu_pytorch_tanh)."""
    name = name or default
    if name == "silu":
        return F.silu
    if name == "gelu":
        return F.gelu
    return lambda x: F.gelu(x, approximate="tanh")


class SwiGLU(nn.Module):
    """down(act(gate(x)) * up(x)); act is SiLU unless `mlp_act` says otherwise (gelu_tanh: GeGLU)."""

    def __init__(self, width: int, hidden: int, *, bias: bool = False, mlp_act: str | None = None):
        super().__init__()
        self.gate_up = nn.Linear(width, 2 * hidden, bias=bias)  # rows: gate, then up
        self.down = nn.Linear(hidden, width, bias=bias)
        self.mlp_act = mlp_act or "silu"
        self.act = activation(mlp_act, "silu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(self.act(gate) * up)

    def init_weights(self, draw, std: float, gain: float) -> None:
        draw.linear(self.gate_up, std * gain)
        draw.linear(self.down, std * gain)


class GeluMLP(nn.Module):
    """fc2(act(fc1(x))); act is the exact GELU unless `mlp_act` says otherwise."""

    def __init__(self, width: int, hidden: int, *, bias: bool = True, mlp_act: str | None = None):
        super().__init__()
        self.fc1 = nn.Linear(width, hidden, bias=bias)
        self.fc2 = nn.Linear(hidden, width, bias=bias)
        self.mlp_act = mlp_act or "gelu"
        self.act = activation(mlp_act, "gelu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))

    def init_weights(self, draw, std: float, gain: float) -> None:
        draw.linear(self.fc1, std * gain)
        draw.linear(self.fc2, std * gain)
