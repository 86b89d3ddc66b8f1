"""The one Block class: two residual sub-layers whose norm slots a placement fills.

    h = out_norm( a * x  +  branch_norm( branch( s * in_norm(x) ) ) )

Empty slots are nn.Identity and a, s are plain floats, so every placement runs the same code.
`Backbone` is what llama and vit share: a stack of blocks built from the resolved spec, seeded
initialization, per-layer activation checkpointing and the inputs of every block for analysis.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from blockforge.nn.attention import Attention, KVCache, LayerCache
from blockforge.nn.init import SeededInit
from blockforge.nn.norms import make_norm
from blockforge.spec.fields import module_fields
from blockforge.spec.model import LayerSpec, ResolvedSpec
from blockforge.spec.placements import Placement, get_placement


class Residual(nn.Module):
    """out_norm(a * x + m * g * branch_norm(F(s * in_norm(x)))): g a per-channel layer scale when `layer_scale` is set,
    m a constant branch multiplier (CompleteP)."""

    def __init__(self, branch: nn.Module, placement: Placement, make_norm: Callable[[], nn.Module], index: int, depth: int,
                 layer_scale: float | None = None, width: int | None = None, branch_multiplier: float = 1.0):
        super().__init__()
        self.in_norm = make_norm() if placement.in_norm else nn.Identity()
        self.branch = branch
        self.branch_norm = make_norm() if placement.branch_norm else nn.Identity()
        self.out_norm = make_norm() if placement.out_norm else nn.Identity()
        self.residual_scale = placement.residual_scale(index, depth)  # a
        self.input_scale = placement.input_scale(index, depth)  # s
        self.layer_scale = nn.Parameter(torch.full((width,), float(layer_scale))) if layer_scale is not None else None  # g
        self.branch_multiplier = branch_multiplier  # m: a constant (CompleteP's depth scaling), 1 otherwise

    def forward(self, x: torch.Tensor, **branch_kwargs) -> torch.Tensor:
        h = self.in_norm(x)
        if self.input_scale != 1.0:
            h = h * self.input_scale
        if self.residual_scale != 1.0:
            x = x * self.residual_scale
        out = self.branch_norm(self.branch(h, **branch_kwargs))
        if self.layer_scale is not None:
            out = out * self.layer_scale
        if self.branch_multiplier != 1.0:
            out = out * self.branch_multiplier
        return self.out_norm(x + out)

    def extra_repr(self) -> str:
        return f"residual_scale={self.residual_scale:.4g}, input_scale={self.input_scale:.4g}, branch_multiplier={self.branch_multiplier:.4g}"


class Block(nn.Module):
    def __init__(self, attn: Residual, mlp: Residual):
        super().__init__()
        self.attn = attn
        self.mlp = mlp
        self.checkpointed = False  # recompute activations in the backward pass (Backbone.set_grad_checkpointing)

    def forward(self, x: torch.Tensor, rope=None, cache: LayerCache | None = None) -> torch.Tensor:
        if self.checkpointed and torch.is_grad_enabled():
            return checkpoint(self._forward, x, rope, cache, use_reentrant=False)
        return self._forward(x, rope, cache)

    def _forward(self, x: torch.Tensor, rope=None, cache: LayerCache | None = None) -> torch.Tensor:
        x = self.attn(x, rope=rope, cache=cache)
        return self.mlp(x)


def build_block(spec: ResolvedSpec, layer: LayerSpec, *, mlp: type[nn.Module], causal: bool) -> Block:
    """Block `layer.index` of `spec`: attention and `mlp` branches, each in its sub-layer's placement."""
    attn_placement, mlp_placement = (get_placement(name) for name in layer.placements)

    def norm(dim: int = spec.width) -> nn.Module:
        return make_norm(layer.norm, dim, spec.norm_eps, spec.dyt_alpha, spec.norm_weight_offset)

    def declared(module: str) -> dict:  # the per-layer fields spec/fields.py gives this module, by name
        return {f.name: getattr(layer, f.name) for f in module_fields(module)}

    rope_theta = spec.value(layer, "rope_theta") if layer.rope and causal else None  # vit: learned positions, no RoPE
    attn = Attention(spec.width, layer.heads, kv_heads=layer.kv_heads, head_dim=layer.head_dim, bias=spec.qkv_bias,
                     proj_bias=spec.proj_bias, causal=causal, backend=spec.attention, head_norm=norm, qk_norm=layer.qk_norm,
                     v_norm=layer.v_norm, score_multiplier=spec.attention_multiplier(layer), rope_theta=rope_theta,
                     query_scale=layer.query_scale, **declared("attn"))
    scale = dict(layer_scale=layer.layer_scale, width=spec.width, branch_multiplier=spec.branch_multiplier)
    return Block(
        Residual(attn, attn_placement, norm, layer.index, spec.depth, **scale),
        Residual(mlp(spec.width, layer.ffn, bias=spec.mlp_bias, **declared("mlp")), mlp_placement, norm, layer.index, spec.depth, **scale),
    )


class Backbone(nn.Module):
    """A stack of blocks (`self.layers`, one per `spec.layers[i]`) between a family's embedding and head."""

    spec: ResolvedSpec
    layers: nn.ModuleList

    def init_weights(self, seed: int | None = None) -> None:
        """Initialize every weight from `seed` (None: a seed drawn from torch's global generator); see nn.init."""
        draw = SeededInit(self, seed, truncated=self.truncated_init)
        for block, layer in zip(self.layers, self.spec.layers, strict=True):
            std = self.spec.init_std * layer.init_scale * self.spec.hidden_init_scale  # muP: hidden weights shrink with width
            attn, mlp = (get_placement(name).branch_init_gain(layer.index, self.spec.depth) for name in layer.placements)
            block.attn.branch.init_weights(draw, std, attn)
            block.mlp.branch.init_weights(draw, std, mlp)
        self.init_outer_weights(draw)

    truncated_init = False  # draw from a truncated normal (timm's ViT) instead of a plain one

    def init_outer_weights(self, draw: SeededInit) -> None:
        """Embeddings and head: each family's own."""
        raise NotImplementedError

    def set_grad_checkpointing(self, layers: list[int] | bool = True) -> None:
        """Recompute the chosen blocks' activations in the backward pass instead of keeping them (True: all)."""
        chosen = set(range(len(self.layers))) if layers is True else set(layers or [])
        for index, block in enumerate(self.layers):
            block.checkpointed = index in chosen

    def forward_intermediates(self, inputs: torch.Tensor) -> list[torch.Tensor]:
        """x_0 .. x_L: the input of every block and the output of the last one (before the final norm).

        The head never runs, so a (B, T, vocab) tensor is never made.
        """
        x, kwargs = self.embed_inputs(inputs)
        states = [x]
        for block in self.layers:
            x = block(x, **kwargs)
            states.append(x)
        return states

    def embed_inputs(self, inputs: torch.Tensor, start: int = 0) -> tuple[torch.Tensor, dict]:
        """The first block's input and the keyword arguments every block takes (e.g. rope); `start` is the
        position of the first input (nonzero when a KV cache holds the earlier ones)."""
        raise NotImplementedError

    def forward(self, inputs: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        if cache is None:
            x, kwargs = self.embed_inputs(inputs)
            for block in self.layers:
                x = block(x, **kwargs)
            return self.head_outputs(x)
        x, kwargs = self.embed_inputs(inputs, start=cache.length)
        for block, layer_cache in zip(self.layers, cache.layers, strict=True):
            x = block(x, cache=layer_cache, **kwargs)
        cache.length += inputs.shape[1]
        return self.head_outputs(x)

    def head_outputs(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError
