"""Weight initialization, applied after construction by walking model.layers[i] beside spec.layers[i].

Linear weights are N(0, init_std * layer.init_scale); the placement's branch gain (DeepNorm's
(8L)^(-1/4)) further scales the value rows of qkv, the attention output and the MLP weights, and
leaves queries and keys alone. Norms keep their construction values (weight 1, bias 0).
"""

from __future__ import annotations

import torch
from torch import nn

from blockforge.nn.placements import get_placement
from blockforge.spec.model import ResolvedSpec


@torch.no_grad()
def init_weights(model: nn.Module, spec: ResolvedSpec) -> None:
    normal = nn.init.trunc_normal_ if spec.family == "vit" else nn.init.normal_

    def linear(module: nn.Linear, std: float) -> None:
        normal(module.weight, mean=0.0, std=std)
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
        normal(model.embed.weight, mean=0.0, std=spec.embed_init_std)
        if not spec.tie_embeddings:
            normal(model.head.weight, mean=0.0, std=spec.init_std)
    else:
        normal(model.pos_embed, mean=0.0, std=spec.embed_init_std)
        nn.init.normal_(model.cls_token, std=1e-6)
        linear(model.head, spec.init_std)
