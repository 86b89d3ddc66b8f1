"""The llama backbone: token embedding, RoPE, causal attention, SwiGLU, RMSNorm, optional final norm, LM head."""

from __future__ import annotations

import torch
from torch import nn

from blockforge.nn.attention import rope_tables
from blockforge.nn.block import Backbone, build_block
from blockforge.nn.init import SeededInit
from blockforge.nn.mlp import SwiGLU
from blockforge.nn.norms import make_norm
from blockforge.spec.model import ResolvedSpec


class Llama(Backbone):
    def __init__(self, spec: ResolvedSpec):
        super().__init__()
        self.spec = spec
        self.embed = nn.Embedding(spec.vocab, spec.width)
        self.layers = nn.ModuleList(build_block(spec, layer, mlp=SwiGLU, causal=True) for layer in spec.layers)
        self.final_norm = make_norm(spec.norm, spec.width, spec.norm_eps, spec.dyt_alpha, spec.norm_weight_offset) if spec.final_norm else nn.Identity()
        self.head = nn.Linear(spec.width, spec.vocab, bias=False)
        if spec.tie_embeddings:
            self.head.weight = self.embed.weight
        self._rope_keys = {block.attn.branch.rope_key for block in self.layers} - {None}  # (head_dim, theta) of the layers with RoPE
        self._logit_multiplier = spec.readout_multiplier * spec.logit_multiplier

    @property
    def logit_scale(self) -> float:
        """What head_outputs multiplies the logits by before any soft cap: muP's readout multiplier 1/m times logit_multiplier."""
        return self._logit_multiplier

    def embed_inputs(self, tokens: torch.Tensor, start: int = 0) -> tuple[torch.Tensor, dict]:
        """tokens (B, T) at positions start.. -> the first block's input (B, T, C) and the RoPE tables every block uses."""
        x = self.embed(tokens)  # (B, T, C)
        if self.spec.embed_scale != 1.0:
            x = x * self.spec.embed_scale
        tables = rope_tables(self._rope_keys, start + tokens.shape[1], x.device, self.spec.rope_scaling)
        return x, {"rope": {key: table[start:] for key, table in tables.items()} if start else tables}

    def generate(self, tokens: torch.Tensor, max_new_tokens: int, **sampling) -> torch.Tensor:
        """Continue `tokens` (B, T); see blockforge.nn.generate.generate for the sampling options."""
        from blockforge.nn.generate import generate

        return generate(self, tokens, max_new_tokens, **sampling)

    def head_outputs(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, C) -> logits (B, T, vocab); times muP's readout multiplier 1/m and logit_multiplier, then soft-capped
        (c * tanh(logits / c)) with logit_softcap."""
        logits = self.head(self.final_norm(x))
        if self._logit_multiplier != 1.0:
            logits = logits * self._logit_multiplier
        cap = self.spec.logit_softcap
        return torch.tanh(logits / cap) * cap if cap is not None else logits

    def init_outer_weights(self, draw: SeededInit) -> None:
        draw.normal(self.embed.weight, self.spec.embed_init_std)
        if not self.spec.tie_embeddings:
            draw.normal(self.head.weight, self.spec.init_std)
