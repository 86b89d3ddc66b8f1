"""Autoregressive generation with a KV cache, for any causal backbone (every placement: norms act per position).

    out = model.generate(tokens, 50, temperature=0.8, top_k=40, seed=0)     # (B, T + 50) token ids

The prompt runs once through the model, filling each layer's cache; every next token then runs one
position. With `use_cache=False` the whole sequence runs again at every step (the reference the cache
is tested against). Greedy decoding: temperature 0.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from blockforge.errors import BlockforgeError
from blockforge.nn.attention import KVCache


def filter_logits(logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """Logits (B, vocab) with everything outside the top k, and outside the smallest set holding `top_p` of
    the probability, set to -inf (the most likely token always stays)."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        ordered, order = torch.sort(logits, descending=True, dim=-1)
        probs = torch.softmax(ordered, dim=-1)
        drop = probs.cumsum(-1) - probs >= top_p  # the mass of the tokens before it already reaches top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))
    return logits


SEED_LIMIT = 2**64  # a torch generator's seed is 64 bits: 0 to 2**64 - 1 (torch folds a negative one onto them)


def check_sampling(temperature: float, top_k: int | None, top_p: float | None, seed: int | None = None) -> None:
    """Sampling settings that are numbers in range, or one sentence naming the bad one."""
    if not (math.isfinite(temperature) and temperature >= 0):
        raise BlockforgeError(f"temperature must be a finite number >= 0 (0: greedy), not {temperature}")
    if top_k is not None and top_k < 1:
        raise BlockforgeError(f"top_k must be at least 1 (or left out), not {top_k}")
    if top_p is not None and not (math.isfinite(top_p) and 0 < top_p <= 1):
        raise BlockforgeError(f"top_p must lie in (0, 1] (or be left out), not {top_p}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT):
        raise BlockforgeError(f"seed must be a whole number from 0 to 2**64 - 1 ({SEED_LIMIT - 1}), not {seed!r}")


@torch.no_grad()
def generate(
    model: nn.Module, tokens: torch.Tensor, max_new_tokens: int, *, temperature: float = 1.0, top_k: int | None = None,
    top_p: float | None = None, seed: int | None = None, eos_id: int | list[int] | None = None, use_cache: bool = True,
    on_token: Callable[[torch.Tensor], None] | None = None, cache: KVCache | None = None,
) -> torch.Tensor:
    """`tokens` (B, T) followed by up to `max_new_tokens` sampled ids (B, T + n); stops early when every row
    produced `eos_id` (or one of them, given a list). `on_token` receives each new column (B,) as it is chosen (for streaming). `cache`: an empty
    KVCache to fill (to look at afterwards); by default a new one."""
    if tokens.dim() == 1:
        tokens = tokens[None]
    check_sampling(temperature, top_k, top_p, seed)
    context = model.spec.context
    if tokens.shape[1] + max_new_tokens - 1 > context:  # the last new token is chosen, never run through the model
        raise BlockforgeError(
            f"a prompt of {tokens.shape[1]} tokens plus {max_new_tokens} new ones passes the model's context of {context}; "
            f"ask for at most {max(0, context + 1 - tokens.shape[1])} new tokens or shorten the prompt"
        )
    generator = torch.Generator(device=tokens.device).manual_seed(seed) if seed is not None else None
    was_training = model.training
    model.eval()
    stops = None if eos_id is None else torch.tensor([eos_id] if isinstance(eos_id, int) else list(eos_id), device=tokens.device)
    if use_cache and cache is None:
        cache = KVCache(len(model.layers))
    elif not use_cache:
        cache = None
    out, finished = tokens, torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    step_input = tokens
    try:
        for _ in range(max_new_tokens):
            logits = (model(step_input, cache=cache) if use_cache else model(out))[:, -1].float()  # (B, vocab)
            if temperature == 0:
                chosen = logits.argmax(-1)
            else:
                probs = torch.softmax(filter_logits(logits / temperature, top_k, top_p), dim=-1)
                chosen = torch.multinomial(probs, 1, generator=generator)[:, 0]
            if stops is not None:
                chosen = torch.where(finished, torch.full_like(chosen, int(stops[0])), chosen)
                finished |= torch.isin(chosen, stops)
            out = torch.cat((out, chosen[:, None]), dim=1)
            step_input = chosen[:, None]
            if on_token is not None:
                on_token(chosen)
            if stops is not None and bool(finished.all()):
                break
    finally:
        model.train(was_training)
    return out
