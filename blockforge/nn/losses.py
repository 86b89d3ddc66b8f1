"""Training losses, one per kind of head: next-token prediction and image classification.

Each returns (mean loss, samples counted, correctly classified or None), which `evaluate` weights
and turns into the family's metrics. Nothing here reads a value back from the device (a count of
unpadded targets stays a tensor): a training step calls them and must not wait for the device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def lm_loss(model: nn.Module, tokens: torch.Tensor, pad_id: int | None = None) -> tuple[torch.Tensor, int | torch.Tensor, None]:
    """Mean next-token cross-entropy of (B, T+1) tokens, and the number of predicted tokens (a tensor on the device when
    padding is left out of the count: its reader decides when to wait for it)."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    logits = model(inputs)  # (B, T, vocab)
    ignore = pad_id if pad_id is not None else -100
    loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=ignore)
    count = (targets != ignore).sum() if pad_id is not None else targets.numel()
    return loss, count, None


def image_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], pad_id: int | None = None) -> tuple[torch.Tensor, int, torch.Tensor]:
    """Mean cross-entropy of a batch of (images, labels), the number of images and how many are classified correctly."""
    images, labels = batch
    logits = model(images)  # (B, classes)
    return F.cross_entropy(logits.float(), labels), labels.shape[0], (logits.argmax(-1) == labels).sum()
