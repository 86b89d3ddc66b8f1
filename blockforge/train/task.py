"""What a model is trained and judged on: its family's loss, evaluation metrics and per-layer gradient norms."""

from __future__ import annotations

import math

import torch
from torch import nn

from blockforge.errors import BlockforgeError
from blockforge.spec.family import get_family
from blockforge.train.distributed import World
from blockforge.train.runtime import Runtime, to_device


def loss_of(model: nn.Module, batch, pad_id: int | None = None):
    """(mean loss, samples counted, correct or None) of one batch, by the model's family."""
    return get_family(model.spec.family).loss(model, batch, pad_id)


@torch.no_grad()
def evaluate(model: nn.Module, batches: list, runtime: Runtime, pad_id: int | None = None) -> dict:
    """The family's validation metrics over `batches` (val_loss, and val_ppl or val_acc), weighted per token/image."""
    family = get_family(model.spec.family)
    was_training = model.training
    model.eval()
    total_loss, total_count, correct = 0.0, 0, 0
    with runtime.autocast():
        for batch in batches:
            loss, count, right = family.loss(model, to_device(batch, runtime.device), pad_id)
            count = int(count)  # evaluation reads every batch's figures
            total_loss += float(loss) * count
            total_count += count
            correct += int(right) if right is not None else 0
    model.train(was_training)
    if total_count == 0:
        raise BlockforgeError("the validation set is empty; give the data source more text or images")
    mean = total_loss / total_count
    metrics = {"val_loss": mean}
    if "val_ppl" in family.metrics:
        metrics["val_ppl"] = math.exp(min(mean, 700.0))
    if "val_acc" in family.metrics:
        metrics["val_acc"] = correct / total_count
    return metrics


def layer_grad_norms(model: nn.Module, sharded_over: World | None = None) -> list[float]:
    """The L2 norm of the gradient over each block's parameters (FSDP: shards summed over `sharded_over`)."""
    squares = []
    for block in model.layers:
        grads = [p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad for p in block.parameters() if p.grad is not None]
        squares.append(torch.stack(torch._foreach_norm(grads)).square().sum() if grads else torch.zeros(()))
    total = torch.stack(squares).float()
    if sharded_over is not None and sharded_over.size > 1:
        import torch.distributed as dist

        dist.all_reduce(total)
    return total.sqrt().tolist()
