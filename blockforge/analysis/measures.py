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
from blockforge.train.loop import autocast, evaluate, image_loss, layer_grad_norms, lm_loss, to_device


def data_kind(model: nn.Module) -> str:
    """'text' for a llama, 'image' for a vit: what `evaluate` calls the data."""
    return "text" if model.spec.family == "llama" else "image"


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


# ---- gradient norms ---------------------------------------------------------------------------


def grad_norms(model: nn.Module, batches: Iterable, *, pad_id: int | None = None, precision: str = "auto") -> np.ndarray:
    """The L2 norm of the loss gradient over each block's parameters, one row per batch: shape (batches, layers).

    Each batch gets its own backward pass (nothing is accumulated across batches), so the rows show the
    spread between batches; `.mean(0)` is the per-layer profile. The model's `.grad` are cleared.
    """
    device = model_device(model)
    rows = []
    for batch in batches:
        model.zero_grad(set_to_none=True)
        batch = to_device(batch, device)
        with autocast(device, precision):
            loss = lm_loss(model, batch, pad_id)[0] if data_kind(model) == "text" else image_loss(model, batch)[0]
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


class _StatesCaptured(Exception):
    """Raised by the last block's hook: every state is in hand, so the head (B x T x vocab logits) never runs."""


@contextmanager
def captured_states(model: nn.Module):
    """Within the block, a forward pass fills the yielded list with x_0 .. x_L and stops with _StatesCaptured."""
    states: list[torch.Tensor] = []

    def grab_input(block, args):
        states.append(args[0].detach())

    def grab_output_and_stop(block, args, output):
        states.append(output.detach())
        raise _StatesCaptured

    handles = [block.register_forward_pre_hook(grab_input) for block in model.layers]
    handles.append(model.layers[-1].register_forward_hook(grab_output_and_stop))
    try:
        yield states
    finally:
        for handle in handles:
            handle.remove()


def angular_distance(model: nn.Module, batches: Iterable, *, pad_id: int | None = None, precision: str = "auto") -> AngularDistance:
    """d(x_l, x_{l+n}) between the inputs of layers l and l+n, averaged over every token of `batches`.

    Text: every input position of every row (padding excluded); images: every token (class token and
    patches). Batches are processed one at a time, so only one batch's states are ever held.
    """
    device = model_device(model)
    result = AngularDistance(len(model.layers))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), autocast(device, precision), captured_states(model) as states:
            for batch in batches:
                batch = to_device(batch, device)
                if data_kind(model) == "text":
                    inputs = batch[:, :-1]  # what lm_loss feeds the model
                    keep = (inputs != pad_id).flatten() if pad_id is not None else None
                else:
                    inputs, keep = batch[0], None
                states.clear()
                try:
                    model(inputs)
                except _StatesCaptured:
                    pass
                flat = [s.flatten(0, -2) for s in states]  # (tokens, width)
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


LAYER_DROP_METRICS = {"text": ("val_loss", "val_ppl"), "image": ("val_loss", "val_acc")}


def layer_drop(model: nn.Module, batches: Iterable, metric: str = "val_loss", *, pad_id: int | None = None, precision: str = "auto") -> dict:
    """The validation metric with each layer skipped in turn, and its change from the full model.

    Returns {'metric', 'baseline', 'dropped': [per layer], 'change': [dropped - baseline], and every
    metric `evaluate` gives in 'baseline_metrics' and 'dropped_metrics'}.
    """
    kind = data_kind(model)
    if metric not in LAYER_DROP_METRICS[kind]:
        raise BlockforgeError(f"layer-drop metric '{metric}' does not apply to a {model.spec.family} model; choose one of: {', '.join(LAYER_DROP_METRICS[kind])}")
    if not isinstance(batches, Sequence):
        batches = list(batches)  # evaluated once per layer and once more for the full model
    device = model_device(model)
    baseline = evaluate(model, batches, kind, device, precision, pad_id)
    dropped = []
    for index in range(len(model.layers)):
        with layer_skipped(model, index):
            dropped.append(evaluate(model, batches, kind, device, precision, pad_id))
    return {
        "metric": metric,
        "baseline": baseline[metric],
        "dropped": [d[metric] for d in dropped],
        "change": [d[metric] - baseline[metric] for d in dropped],
        "baseline_metrics": baseline,
        "dropped_metrics": dropped,
    }
