"""The vit backbone: patch embedding, class token, learned positions, bidirectional attention, GELU MLP."""

from __future__ import annotations

import torch
from torch import nn

from blockforge.nn.block import Backbone, build_block
from blockforge.nn.init import SeededInit
from blockforge.nn.mlp import GeluMLP
from blockforge.nn.norms import make_norm
from blockforge.spec.model import ResolvedSpec


class ViT(Backbone):
    truncated_init = True  # as timm draws its ViT weights

    def __init__(self, spec: ResolvedSpec):
        super().__init__()
        self.spec = spec
        patches = (spec.image_size // spec.patch_size) ** 2
        self.patch_embed = nn.Conv2d(spec.channels, spec.width, kernel_size=spec.patch_size, stride=spec.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, spec.width))
        self.pos_embed = nn.Parameter(torch.zeros(1, patches + 1, spec.width))
        self.layers = nn.ModuleList(build_block(spec, layer, mlp=GeluMLP, causal=False) for layer in spec.layers)
        self.final_norm = make_norm(spec.norm, spec.width, spec.norm_eps, spec.dyt_alpha, spec.norm_weight_offset) if spec.final_norm else nn.Identity()
        self.head = nn.Linear(spec.width, spec.classes)

    def embed_inputs(self, images: torch.Tensor, start: int = 0) -> tuple[torch.Tensor, dict]:
        """images (B, channels, H, W) -> the first block's input (B, N+1, C): class token, then patches."""
        expected = (self.spec.channels, self.spec.image_size, self.spec.image_size)
        if tuple(images.shape[1:]) != expected:
            raise ValueError(f"this vit takes images of shape (B, {', '.join(map(str, expected))}), not {tuple(images.shape)}; "
                             "resize them to the image_size it was built for")
        x = self.patch_embed(images).flatten(2).transpose(1, 2)  # (B, N, C)
        return torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1) + self.pos_embed, {}  # (B, N+1, C)

    def head_outputs(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N+1, C) -> logits (B, classes), from the class token; under muP times the readout multiplier 1/m."""
        logits = self.head(self.final_norm(x)[:, 0])
        return logits * self.spec.readout_multiplier if self.spec.readout_multiplier != 1.0 else logits

    def init_outer_weights(self, draw: SeededInit) -> None:
        draw.torch_default(self.patch_embed)  # the patch projection keeps PyTorch's Conv2d default, as timm's does
        draw.normal(self.pos_embed, self.spec.embed_init_std)
        draw.normal(self.cls_token, 1e-6, truncated=False)
        draw.linear(self.head, self.spec.init_std)
