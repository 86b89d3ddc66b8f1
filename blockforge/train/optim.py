"""Optimizer with per-layer parameter groups (the resolved spec's lr_mult) and the learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

from blockforge.spec.family import get_family
from blockforge.spec.model import ResolvedSpec
from blockforge.spec.train import TrainConfig


def parameter_groups(model: nn.Module, spec: ResolvedSpec, weight_decay: float, eps: float = 1e-8) -> list[dict]:
    """One group per distinct (lr multiplier, weight decay, eps), found by walking model.layers[i] beside spec.layers[i].

    A block's parameters take its layer's lr_mult, times CompleteP's block learning-rate scale, and Adam's
    epsilon times CompleteP's block epsilon scale (both 1 under the standard parametrization). Under muP the
    blocks' matrices (hidden weights) further take the width rules: learning rate and epsilon times 1/m,
    weight decay times m (ResolvedSpec.hidden_*_scale). Parameters outside the blocks (embeddings, final
    norm, head) keep lr_mult 1 and `eps`. Weight decay applies to matrices only, and not to the family's
    `no_decay` parameters (e.g. vit's positions and class token).
    """
    no_decay = get_family(spec.family).no_decay
    in_block: dict[int, tuple[float, float, float]] = {}
    for block, layer in zip(model.layers, spec.layers, strict=True):
        for p in block.parameters():
            hidden = p.ndim >= 2
            in_block[id(p)] = (layer.lr_mult * spec.block_lr_scale * (spec.hidden_lr_scale if hidden else 1.0),
                               eps * spec.block_eps_scale * (spec.hidden_eps_scale if hidden else 1.0),
                               spec.hidden_wd_scale if hidden else 1.0)
    groups: dict[tuple[float, float, float], list[nn.Parameter]] = {}
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if id(p) in seen or not p.requires_grad:
            continue
        seen.add(id(p))
        mult, group_eps, decay_scale = in_block.get(id(p), (1.0, eps, 1.0))
        decay = weight_decay * decay_scale if p.ndim >= 2 and name.rsplit(".", 1)[-1] not in no_decay else 0.0
        groups.setdefault((mult, decay, group_eps), []).append(p)
    return [{"params": params, "lr_mult": mult, "weight_decay": decay, "eps": group_eps}
            for (mult, decay, group_eps), params in sorted(groups.items())]


def make_optimizer(model: nn.Module, spec: ResolvedSpec, cfg: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    groups = parameter_groups(model, spec, cfg.weight_decay if cfg.optimizer == "adamw" else 0.0, cfg.eps)
    kind = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    fused = device.type == "cuda"
    return kind(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, fused=fused)


def learning_rate(step: int, cfg: TrainConfig) -> float:
    """Peak-lr schedule at 0-based `step`: linear warmup, then cosine/linear decay to lr * min_lr_ratio."""
    warmup = cfg.warmup_steps
    if step < warmup:
        return cfg.lr * (step + 1) / warmup
    if cfg.schedule == "constant":
        return cfg.lr
    progress = (step - warmup) / max(1, cfg.steps - warmup)
    progress = min(1.0, progress)
    shape = 0.5 * (1.0 + math.cos(math.pi * progress)) if cfg.schedule == "cosine" else 1.0 - progress
    return cfg.lr * (cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape)


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr * group["lr_mult"]
