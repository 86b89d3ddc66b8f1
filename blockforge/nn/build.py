"""build_model: a resolved spec in, an initialized nn.Module out (the family's backbone)."""

from __future__ import annotations

import contextlib

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
    meta = torch.device(device or "cpu").type == "meta"
    with torch.device(device or "cpu"), _no_default_init() if meta else contextlib.nullcontext():
        model = get_family(spec.family).build(spec)
    if not any(p.is_meta for p in model.parameters()):
        model.init_weights(seed)
    return model


_INITS = ("normal_", "uniform_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_", "xavier_normal_", "trunc_normal_",
          "ones_", "zeros_", "constant_", "orthogonal_")


@contextlib.contextmanager
def _no_default_init():
    """torch.nn.init's functions as no-ops while modules are built on the meta device, where there are no values to fill
    (torch would otherwise route meta tensors through its reference kernels, importing the compiler stack: seconds and
    a hundred-odd MB for a memory plan)."""
    saved = {name: getattr(nn.init, name) for name in _INITS}
    try:
        for name in _INITS:
            setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for name, function in saved.items():
            setattr(nn.init, name, function)


def layer_parameter_counts(model: nn.Module) -> list[int]:
    return [sum(p.numel() for p in block.parameters()) for block in model.layers]


def parameter_count(model: nn.Module) -> int:
    """Parameters counted once even when tied."""
    return sum(p.numel() for p in model.parameters())


def copy_weight(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst <- src (cast to dst's dtype), outside autograd: for converters."""
    with torch.no_grad():
        dst.copy_(src.detach().to(dst.dtype))
