"""Per-block torch.compile: blocks with one structure share compiled code (state-dict keys do not change)."""

from __future__ import annotations

import torch
from torch import nn


def block_signature(block: nn.Module) -> tuple:
    """What decides the compiled graph of a block: its module types and shapes, and its float constants."""
    parts = []
    for name, module in block.named_modules():
        shapes = tuple(tuple(p.shape) for p in module.parameters(recurse=False))
        parts.append((name, type(module).__name__, shapes))
    scales = tuple((r.residual_scale, r.input_scale) for r in (block.attn, block.mlp))
    return tuple(parts), scales


def compile_blocks(model: nn.Module) -> int:
    """Compile each block in place. Blocks with one structure share compiled code; the recompile limit
    is raised to the number of distinct structures so a heterogeneous stack never falls back to eager.
    Returns the number of distinct signatures."""
    signatures = {block_signature(block) for block in model.layers}
    limit = 2 * len(signatures) + 8
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, limit)
    torch._dynamo.config.accumulated_cache_size_limit = max(torch._dynamo.config.accumulated_cache_size_limit, 4 * limit)
    for block in model.layers:
        block.compile()
    return len(signatures)
