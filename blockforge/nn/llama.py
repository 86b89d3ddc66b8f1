"""The llama backbone: token embedding, RoPE, causal attention, SwiGLU, RMSNorm, optional final norm, LM head."""

from __future__ import annotations

import torch
from torch import nn

from blockforge.nn.attention import Attention, rope_tables
from blockforge.nn.block import Block, Residual
from blockforge.nn.mlp import SwiGLU
from blockforge.nn.norms import make_norm
from blockforge.nn.placements import get_placement
from blockforge.spec.model import LayerSpec, ResolvedSpec


def llama_block(spec: ResolvedSpec, layer: LayerSpec) -> Block:
    placement = get_placement(layer.placement)

    def norm() -> nn.Module:
        return make_norm(spec.norm, spec.width, spec.norm_eps)

    attn = Attention(spec.width, layer.heads, bias=False, causal=True, backend=spec.attention)
    return Block(
        Residual(attn, placement, norm, layer.index, spec.depth),
        Residual(SwiGLU(spec.width, layer.ffn), placement, norm, layer.index, spec.depth),
    )


class Llama(nn.Module):
    def __init__(self, spec: ResolvedSpec):
        super().__init__()
        self.spec = spec
        self.embed = nn.Embedding(spec.vocab, spec.width)
        self.layers = nn.ModuleList(llama_block(spec, layer) for layer in spec.layers)
        self.final_norm = make_norm(spec.norm, spec.width, spec.norm_eps) if spec.final_norm else nn.Identity()
        self.head = nn.Linear(spec.width, spec.vocab, bias=False)
        if spec.tie_embeddings:
            self.head.weight = self.embed.weight
        self._head_dims = {spec.width // layer.heads for layer in spec.layers}

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (B, T) -> logits (B, T, vocab)."""
        x = self.embed(tokens)  # (B, T, C)
        rope = rope_tables(self._head_dims, tokens.shape[1], self.spec.rope_theta, x.device)
        for block in self.layers:
            x = block(x, rope=rope)
        return self.head(self.final_norm(x))
