"""Deterministic, resumable order of training samples.

Training reads an endless stream of epochs; each epoch visits every sample once in an order drawn from
a seed derived from (seed, epoch). Sample *positions* count through that stream (position p is the
(p mod n)-th sample of epoch p // n), so batch k is positions k*B .. k*B+B-1 whatever happened before:
a run killed after k batches resumes with `start=k` and sees exactly the batches it would have seen.
"""

from __future__ import annotations

import itertools
from typing import Iterator

import numpy as np


def derived_seed(seed: int, *keys: int) -> int:
    """A 32-bit seed for one use of `seed` (an epoch's shuffle: keys (epoch,)); distinct keys give independent streams."""
    return int(np.random.SeedSequence([seed, *keys]).generate_state(1)[0])


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng(derived_seed(seed, epoch)).permutation(n)


def shuffled_batches(n: int, batch_size: int, seed: int, start: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Endless (positions, sample indices) per batch, from batch `start` on; a batch may span two epochs."""
    if n <= 0:
        raise ValueError("cannot draw batches from an empty set")
    orders: dict[int, np.ndarray] = {}
    for k in itertools.count(start):
        positions = np.arange(k * batch_size, (k + 1) * batch_size, dtype=np.int64)
        epochs = positions // n
        indices = np.empty_like(positions)
        for epoch in range(int(epochs[0]), int(epochs[-1]) + 1):
            if epoch not in orders:
                orders[epoch] = epoch_order(n, seed, epoch)
            here = epochs == epoch
            indices[here] = orders[epoch][positions[here] % n]
        for done in [e for e in orders if e < epochs[-1]]:  # only the last epoch is needed again
            del orders[done]
        yield positions, indices
