"""build_model: a resolved spec in, an initialized nn.Module out (the family's backbone)."""

from __future__ import annotations

import torch
from torch import nn

from blockforge.spec.family import get_family
from blockforge.spec.model import ModelSpec, ResolvedSpec
from blockforge.spec.resolve import resolve


def build_model(spec: ResolvedSpec | ModelSpec, *, device: str | torch.device | None = None, seed: int | None = None) -> nn.Module:
    """Build and initialize the model `spec` describes (a ModelSpec is resolved first).

    `seed` fixes every initial weight (each parameter from its own stream: see nn.init); None draws one
    from torch's global generator. On the meta device nothing is allocated or initialized (memory plans).
    """
    if isinstance(spec, ModelSpec):
        spec = resolve(spec)
    with torch.device(device or "cpu"):
        model = get_family(spec.family).build(spec)
    if not any(p.is_meta for p in model.parameters()):
        model.init_weights(seed)
    return model


def layer_parameter_counts(model: nn.Module) -> list[int]:
    return [sum(p.numel() for p in block.parameters()) for block in model.layers]


def parameter_count(model: nn.Module) -> int:
    """Parameters counted once even when tied."""
    return sum(p.numel() for p in model.parameters())


def copy_weight(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst <- src (cast to dst's dtype), outside autograd: for converters."""
    with torch.no_grad():
        dst.copy_(src.detach().to(dst.dtype))
