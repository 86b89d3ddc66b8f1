"""The three per-layer measures: gradient norms, angular distance between layer inputs, layer-drop.

Each takes a built model (llama or vit; `model.layers` is its list of blocks) and an iterable of the
batches a dataset gives (token rows of context + 1 ids, or (images, labels)), and leaves the model as
it found it. Losses, evaluation and per-block gradient norms come from the training loop, so these
numbers are the ones a run logs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from blockforge.errors import BlockforgeError
from blockforge.spec.family import get_family
from blockforge.train.runtime import Runtime, to_device
from blockforge.train.task import evaluate, layer_grad_norms, loss_of


def drop_metrics(family: str) -> tuple[str, ...]:
    """The validation metrics layer-drop can report for a family."""
    return get_family(family).metrics


# ---- gradient norms ---------------------------------------------------------------------------


def grad_norms(model: nn.Module, batches: Iterable, *, pad_id: int | None = None, precision: str = "auto") -> np.ndarray:
    """The L2 norm of the loss gradient over each block's parameters, one row per batch: shape (batches, layers).

    Each batch gets its own backward pass (nothing is accumulated across batches), so the rows show the
    spread between batches; `.mean(0)` is the per-layer profile. The model's `.grad` are cleared.
    """
    runtime = Runtime.of(model, precision)
    rows = []
    for batch in batches:
        model.zero_grad(set_to_none=True)
        with runtime.autocast():
            loss = loss_of(model, to_device(batch, runtime.device), pad_id)[0]
        loss.backward()
        rows.append(layer_grad_norms(model))
    model.zero_grad(set_to_none=True)
    if not rows:
        raise BlockforgeError("no batches to measure gradient norms on; give more data or a larger sample")
    return np.asarray(rows, dtype=np.float64)


def logged_grad_norms(run_dir: str | Path) -> dict | None:
    """The per-layer gradient norms a run logged in metrics.jsonl: {'steps': [...], 'norms': [[...], ...]}, or None."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return None
    by_step = {}
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            if "layer_grad_norms" in record:
                by_step[record["step"]] = record["layer_grad_norms"]  # a resumed run may log a step again: last wins
    if not by_step:
        return None
    steps = sorted(by_step)
    return {"steps": steps, "norms": [by_step[s] for s in steps]}


# ---- angular distance -------------------------------------------------------------------------


class AngularDistance:
    """Streaming mean of d(x_l, x_{l+n}) = arccos(cos(x_l, x_{l+n})) / pi over tokens.

    The states x_0 .. x_L are the inputs of the L blocks and the output of the last one (before the
    final norm). Only the (L+1) x (L+1) table of float64 sums is kept between batches, so memory does
    not grow with the number of tokens, and adding batches one at a time gives what adding them all
    at once gives.
    """

    def __init__(self, depth: int):
        self.depth = depth
        self.sums = np.zeros((depth + 1, depth + 1))  # sums[a, b]: distance between states a and b, summed over tokens
        self.tokens = 0

    def update(self, states: Sequence[torch.Tensor]) -> None:
        """Add L+1 states, each (tokens, width), row t of every state being the same token."""
        if len(states) != self.depth + 1:
            raise ValueError(f"expected {self.depth + 1} states (the inputs of {self.depth} layers and the last output), got {len(states)}")
        units = F.normalize(torch.stack([s.to(torch.float64) for s in states], dim=1), dim=-1)  # (N, L+1, C)
        cos = (units @ units.transpose(1, 2)).clamp(-1.0, 1.0)  # (N, L+1, L+1); clamped: rounding can step past 1
        self.sums += (torch.arccos(cos).sum(0) / math.pi).cpu().numpy()
        self.tokens += units.shape[0]

    @property
    def distances(self) -> np.ndarray:
        """(L, L): row n-1, column l is the mean d(x_l, x_{l+n}); NaN where l + n > L."""
        mean = self.sums / max(self.tokens, 1)
        table = np.full((self.depth, self.depth), np.nan)
        for n in range(1, self.depth + 1):
            for l in range(self.depth - n + 1):
                table[n - 1, l] = mean[l, l + n]
        return table


def angular_distance(model: nn.Module, batches: Iterable, *, pad_id: int | None = None, precision: str = "auto") -> AngularDistance:
    """d(x_l, x_{l+n}) between the inputs of layers l and l+n, averaged over every token of `batches`.

    Text: every input position of every row (padding excluded); images: every token (class token and
    patches). Batches are processed one at a time, so only one batch's states are ever held.
    """
    runtime = Runtime.of(model, precision)
    result = AngularDistance(len(model.layers))
    model_inputs = get_family(model.spec.family).model_inputs
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), runtime.autocast():
            for batch in batches:
                inputs, keep = model_inputs(to_device(batch, runtime.device), pad_id)
                flat = [s.flatten(0, -2) for s in model.forward_intermediates(inputs)]  # (tokens, width)
                result.update(flat if keep is None else [s[keep] for s in flat])
    finally:
        model.train(was_training)
    return result


# ---- layer-drop -------------------------------------------------------------------------------


class SkippedLayer(nn.Module):
    """Stands in for a removed block: its output is its input (keyword arguments such as rope are ignored)."""

    def forward(self, x: torch.Tensor, **kwargs) -> torch.Tensor:
        return x


@contextmanager
def layer_skipped(model: nn.Module, index: int):
    """Within the block, model.layers[index] is a SkippedLayer; the block is put back afterwards."""
    block = model.layers[index]
    model.layers[index] = SkippedLayer()
    try:
        yield model
    finally:
        model.layers[index] = block


def layer_drop(model: nn.Module, batches: Iterable, metric: str = "val_loss", *, pad_id: int | None = None, precision: str = "auto") -> dict:
    """The validation metric with each layer skipped in turn, and its change from the full model.

    Returns {'metric', 'baseline', 'dropped': [per layer], 'change': [dropped - baseline], and every
    metric `evaluate` gives in 'baseline_metrics' and 'dropped_metrics'}.
    """
    allowed = drop_metrics(model.spec.family)
    if metric not in allowed:
        raise BlockforgeError(f"layer-drop metric '{metric}' does not apply to a {model.spec.family} model; choose one of: {', '.join(allowed)}")
    if not isinstance(batches, Sequence):
        batches = list(batches)  # evaluated once per layer and once more for the full model
    runtime = Runtime.of(model, precision)
    baseline = evaluate(model, batches, runtime, pad_id)
    dropped = []
    for index in range(len(model.layers)):
        with layer_skipped(model, index):
            dropped.append(evaluate(model, batches, runtime, pad_id))
    return {
        "metric": metric,
        "baseline": baseline[metric],
        "dropped": [d[metric] for d in dropped],
        "change": [d[metric] - baseline[metric] for d in dropped],
        "baseline_metrics": baseline,
        "dropped_metrics": dropped,
    }
