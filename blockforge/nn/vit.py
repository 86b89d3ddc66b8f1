"""The vit backbone: patch embedding, class token, learned positions, bidirectional attention, GELU MLP."""

from __future__ import annotations

import torch
from torch import nn

from blockforge.nn.attention import Attention
from blockforge.nn.block import Block, Residual
from blockforge.nn.mlp import GeluMLP
from blockforge.nn.norms import make_norm
from blockforge.nn.placements import get_placement
from blockforge.spec.model import LayerSpec, ResolvedSpec


def vit_block(spec: ResolvedSpec, layer: LayerSpec) -> Block:
    placement = get_placement(layer.placement)

    def norm() -> nn.Module:
        return make_norm(spec.norm, spec.width, spec.norm_eps)

    attn = Attention(spec.width, layer.heads, bias=True, causal=False, backend=spec.attention)
    return Block(
        Residual(attn, placement, norm, layer.index, spec.depth),
        Residual(GeluMLP(spec.width, layer.ffn), placement, norm, layer.index, spec.depth),
    )


class ViT(nn.Module):
    def __init__(self, spec: ResolvedSpec):
        super().__init__()
        self.spec = spec
        patches = (spec.image_size // spec.patch_size) ** 2
        self.patch_embed = nn.Conv2d(spec.channels, spec.width, kernel_size=spec.patch_size, stride=spec.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, spec.width))
        self.pos_embed = nn.Parameter(torch.zeros(1, patches + 1, spec.width))
        self.layers = nn.ModuleList(vit_block(spec, layer) for layer in spec.layers)
        self.final_norm = make_norm(spec.norm, spec.width, spec.norm_eps) if spec.final_norm else nn.Identity()
        self.head = nn.Linear(spec.width, spec.classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, channels, H, W) -> logits (B, classes)."""
        x = self.patch_embed(images).flatten(2).transpose(1, 2)  # (B, N, C)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1) + self.pos_embed  # (B, N+1, C)
        for block in self.layers:
            x = block(x)
        return self.head(self.final_norm(x)[:, 0])
