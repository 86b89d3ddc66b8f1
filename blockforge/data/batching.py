"""Deterministic, resumable order of training samples.

Training reads an endless stream of epochs; each epoch visits every sample once in an order drawn from
a seed derived from (seed, epoch). Sample *positions* count through that stream (position p is the
(p mod n)-th sample of epoch p // n), so batch k is positions k*B .. k*B+B-1 whatever happened before:
a run killed after k batches resumes with `start=k` and sees exactly the batches it would have seen. Finding the
samples of a position is arithmetic on its epoch's permutation, so resuming costs the same at any position.
"""

from __future__ import annotations

import itertools
from typing import Callable, Iterator

import numpy as np


def derived_seed(seed: int, *keys: int) -> int:
    """A 32-bit seed for one use of `seed` (an epoch's shuffle: keys (epoch,)); distinct keys give independent streams."""
    return int(np.random.SeedSequence([seed, *keys]).generate_state(1)[0])


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng(derived_seed(seed, epoch)).permutation(n)


def part_of(batch_size: int, part: tuple[int, int] | None) -> slice:
    """The share of a batch of `batch_size` samples that rank `part[0]` of `part[1]` trains on (all of it for None)."""
    if part is None:
        return slice(0, batch_size)
    rank, ranks = part
    if not 0 <= rank < ranks or batch_size % ranks:
        raise ValueError(f"a batch of {batch_size} cannot be shared by rank {rank} of {ranks}")
    share = batch_size // ranks
    return slice(rank * share, (rank + 1) * share)


def shuffled_batches(n: int, batch_size: int, seed: int, start: int = 0, *, part: tuple[int, int] | None = None,
                     order: Callable[[int], np.ndarray] | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Endless (positions, sample indices) per batch, from batch `start` on; a batch may span two epochs.

    `part` = (rank, ranks): only that rank's share of every batch (the batch stays the one a single process sees).
    `order(epoch)`: the epoch's permutation, when it comes from elsewhere than epoch_order (a saved copy of it)."""
    if n <= 0:
        raise ValueError("cannot draw batches from an empty set")
    order = order or (lambda epoch: epoch_order(n, seed, epoch))
    share = part_of(batch_size, part)
    orders: dict[int, np.ndarray] = {}
    for k in itertools.count(start):
        positions = np.arange(k * batch_size + share.start, k * batch_size + share.stop, dtype=np.int64)
        epochs = positions // n
        indices = np.empty_like(positions)
        for epoch in range(int(epochs[0]), int(epochs[-1]) + 1):
            if epoch not in orders:
                orders[epoch] = order(epoch)
            here = epochs == epoch
            indices[here] = orders[epoch][positions[here] % n]
        for done in [e for e in orders if e < epochs[-1]]:  # only the last epoch is needed again
            del orders[done]
        yield positions, indices
