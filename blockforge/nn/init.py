"""Weight initialization, applied after construction by walking model.layers[i] beside spec.layers[i].

Linear weights are N(0, init_std * layer.init_scale); the placement's branch gain (DeepNorm's
(8L)^(-1/4)) further scales the value rows of qkv, the attention output and the MLP weights, and
leaves queries and keys alone. Norms keep their construction values (weight 1, bias 0).

Every tensor is drawn from its own generator, seeded by (seed, the parameter's name). Two models
built with one seed therefore start from the same values in every parameter they share by name and
shape, whatever else differs between them (a placement, another layer's width): comparisons between
candidates of a search are paired by seed (common random numbers), not blurred by init noise.
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn

from blockforge.nn.placements import get_placement
from blockforge.spec.model import ResolvedSpec


def parameter_seed(seed: int, name: str) -> int:
    """A 63-bit seed for the parameter called `name` (e.g. 'layers.3.attn.branch.qkv.weight') under `seed`."""
    digest = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@torch.no_grad()
def init_weights(model: nn.Module, spec: ResolvedSpec, seed: int | None = None) -> None:
    """Initialize `model` in place; `seed` None draws one from torch's global generator."""
    if seed is None:
        seed = int(torch.randint(0, 2**62, ()))
    vit = spec.family == "vit"  # timm draws ViT weights from a truncated normal
    names = {id(p): name for name, p in model.named_parameters()}  # a tied weight goes by its first name

    def generator(tensor: torch.Tensor) -> torch.Generator:
        return torch.Generator(device=tensor.device).manual_seed(parameter_seed(seed, names[id(tensor)]))

    def normal(tensor: torch.Tensor, std: float, truncated: bool = vit) -> None:
        if truncated:
            nn.init.trunc_normal_(tensor, std=std, generator=generator(tensor))
        else:
            tensor.normal_(0.0, std, generator=generator(tensor))

    def linear(module: nn.Linear, std: float) -> None:
        normal(module.weight, std)
        if module.bias is not None:
            module.bias.zero_()

    for block, layer in zip(model.layers, spec.layers, strict=True):
        std = spec.init_std * layer.init_scale
        gain = get_placement(layer.placement).branch_init_gain(layer.index, spec.depth)
        attn, mlp = block.attn.branch, block.mlp.branch
        linear(attn.qkv, std)
        attn.qkv.weight[2 * spec.width :].mul_(gain)  # value rows
        linear(attn.proj, std * gain)
        for module in mlp.modules():
            if isinstance(module, nn.Linear):
                linear(module, std * gain)

    if spec.family == "llama":
        normal(model.embed.weight, spec.embed_init_std)
        if not spec.tie_embeddings:
            normal(model.head.weight, spec.init_std)
    else:
        # The patch projection keeps PyTorch's default Conv2d distribution (as timm does), drawn seeded.
        conv = model.patch_embed
        nn.init.kaiming_uniform_(conv.weight, a=5**0.5, generator=generator(conv.weight))
        bound = conv.weight[0].numel() ** -0.5
        conv.bias.uniform_(-bound, bound, generator=generator(conv.bias))
        normal(model.pos_embed, spec.embed_init_std)
        normal(model.cls_token, 1e-6, truncated=False)
        linear(model.head, spec.init_std)
