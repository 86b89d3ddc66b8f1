"""Seeded weight initialization: every tensor is drawn from its own generator, seeded by (seed, its name).

Two models built with one seed therefore start from the same values in every parameter they share by
name and shape, whatever else differs between them (a placement, another layer's width): comparisons
between candidates of a search are paired by seed (common random numbers), not blurred by init noise.

What is drawn where belongs to the modules (`Attention.init_weights`, the MLPs', each backbone's
`init_outer_weights`); this file holds the seeded drawing they share. Linear weights of block l are
N(0, init_std * init_scale_l); the placement's branch gain (DeepNorm's (8L)^(-1/4)) further scales the
value rows, the attention output and the MLP; norms keep their construction values (weight 1, bias 0).
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn


def parameter_seed(seed: int, name: str) -> int:
    """A 63-bit seed for the parameter called `name` (e.g. 'layers.3.attn.branch.qkv.weight') under `seed`."""
    digest = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class SeededInit:
    """Draws the parameters of `model` in place, each from the generator of (seed, its name)."""

    def __init__(self, model: nn.Module, seed: int | None, *, truncated: bool = False):
        self.seed = int(torch.randint(0, 2**62, ())) if seed is None else seed
        self.truncated = truncated  # timm's ViT draws from a truncated normal
        self.names = {id(p): name for name, p in model.named_parameters()}  # a tied weight goes by its first name

    def generator(self, tensor: torch.Tensor) -> torch.Generator:
        return torch.Generator(device=tensor.device).manual_seed(parameter_seed(self.seed, self.names[id(tensor)]))

    @torch.no_grad()
    def normal(self, tensor: torch.Tensor, std: float, *, truncated: bool | None = None) -> None:
        if self.truncated if truncated is None else truncated:
            nn.init.trunc_normal_(tensor, std=std, generator=self.generator(tensor))
        else:
            tensor.normal_(0.0, std, generator=self.generator(tensor))

    @torch.no_grad()
    def linear(self, module: nn.Linear, std: float) -> None:
        self.normal(module.weight, std)
        if module.bias is not None:
            module.bias.zero_()

    @torch.no_grad()
    def torch_default(self, module: nn.Conv2d | nn.Linear) -> None:
        """PyTorch's own default for the layer (kaiming-uniform weight, uniform bias), drawn seeded."""
        nn.init.kaiming_uniform_(module.weight, a=5**0.5, generator=self.generator(module.weight))
        if module.bias is not None:
            bound = module.weight[0].numel() ** -0.5
            module.bias.uniform_(-bound, bound, generator=self.generator(module.bias))
