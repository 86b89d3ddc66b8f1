"""What every converter shares: account for every tensor it is given, and check the result before handing it over.

A converter reads the source model's parameters and buffers through a `TensorSource`: each is either
taken (mapped into the other model) or left, and anything left at the end is refused by name — a
converter never drops a bias, a norm or a token it does not model. Then `check_same_outputs` runs
both models on one small random input and refuses unless their outputs agree within 1e-4.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch
from torch import nn

from blockforge.errors import BlockforgeError

TOLERANCE = 1e-4


class ConversionError(BlockforgeError):
    """A model that cannot be converted exactly; the message names what is in the way."""


class TensorSource:
    """The tensors (parameters and buffers, by name) of the model being converted."""

    def __init__(self, model: nn.Module, what: str, *, ignore: Callable[[str], bool] = lambda name: False, into: str = "blockforge's model"):
        self.what = what
        self.into = into  # the model the tensors go into, for messages
        self.tensors = dict(model.named_parameters(remove_duplicate=False))
        self.tensors.update(model.named_buffers(remove_duplicate=False))
        self.left = {name for name in self.tensors if not ignore(name)}

    def has(self, name: str) -> bool:
        return name in self.tensors

    def take(self, name: str) -> torch.Tensor:
        if name not in self.tensors:
            raise ConversionError(f"{self.what} has no tensor '{name}', which {self.into} needs; it is built differently")
        self.left.discard(name)
        return self.tensors[name]

    def copy_into(self, target: torch.Tensor, name: str) -> None:
        """target <- tensor `name`, which must have target's shape."""
        tensor = self.take(name)
        if tensor.shape != target.shape:
            raise ConversionError(
                f"{self.what}'s tensor '{name}' has shape {tuple(tensor.shape)} where {self.into} has {tuple(target.shape)}; "
                "it is built differently (extra tokens, another layout)"
            )
        with torch.no_grad():
            target.copy_(tensor.detach().to(target.dtype))

    def finish(self) -> None:
        """Refuse when any tensor was not mapped."""
        if self.left:
            names = sorted(self.left)
            more = f" and {len(names) - 3} more" if len(names) > 3 else ""
            raise ConversionError(
                f"{self.what} has tensors {self.into} does not hold ({', '.join(names[:3])}{more}); refusing rather than dropping them"
            )


@torch.no_grad()
def check_same_outputs(
    ours: torch.Tensor, theirs: torch.Tensor, what: str, tolerance: float = TOLERANCE, *,
    cause: str = "so it uses something blockforge does not model",
) -> float:
    """The largest |difference| between two models' outputs on the same input; refused above `tolerance`."""
    if ours.shape != theirs.shape:
        raise ConversionError(f"{what}: the converted model's output has shape {tuple(ours.shape)}, the original's {tuple(theirs.shape)}")
    difference = (ours.float() - theirs.float()).abs().max().item()
    if not difference <= tolerance:
        raise ConversionError(
            f"{what}: the converted model's outputs differ from the original's by {difference:.3g} (more than {tolerance:g}) on a "
            f"random input, {cause}; refused"
        )
    return difference


@contextmanager
def evaluating(model: nn.Module) -> Iterator[nn.Module]:
    """`model` in eval mode for the check, back in its own mode afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


PROBE_LENGTH = 16  # tokens a check runs at least
WINDOW_MARGIN = 16  # ...and past the longest sliding window by this many, so a window in the wrong layer shows


def probe_tokens(spec) -> torch.Tensor:
    """The fixed random token ids a converted language model is checked on against its source: 16 tokens, or
    more than its longest sliding window (up to its context), where a window's place and size change the logits."""
    windows = [layer.window for layer in spec.layers if layer.window is not None]
    length = min(spec.context, max(PROBE_LENGTH, max(windows, default=0) + WINDOW_MARGIN))
    rows = 2 if length <= 256 else 1  # long probes of large models: one row is enough to see a window
    return torch.randint(0, spec.vocab, (rows, length), generator=torch.Generator().manual_seed(0))
