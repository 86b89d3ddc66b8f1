"""Batches made ahead of the step: a background thread reads the next micro-batches while the model computes.

The thread takes batches from the dataset's iterator in order (one producer, so the order is the dataset's) into
a queue a few batches deep; on CUDA it pins each batch's memory, so the loop's copy to the device is asynchronous
(`non_blocking`) and overlaps the step before it. An error of the reader (a file that cannot be read) is raised
in the loop, where the batch is taken. Batches made ahead and never taken are simply dropped: a run's position in
its data counts the batches the loop took, so a resume starts at the first one it never trained on.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Iterator

import torch

from blockforge.train.runtime import to_device

DEPTH = 4  # micro-batches made ahead


class _Ended:
    def __init__(self, error: BaseException | None = None):
        self.error = error


def pinned(batch: Any) -> Any:
    if isinstance(batch, (tuple, list)):
        return type(batch)(pinned(t) for t in batch)
    return batch.pin_memory() if isinstance(batch, torch.Tensor) else batch


class Feed:
    """An iterator over `batches`, on `device`, read `depth` micro-batches ahead in a thread; `close()` stops it."""

    def __init__(self, batches: Iterator, device: torch.device, depth: int = DEPTH):
        self.batches, self.device = batches, device
        self.pin = device.type == "cuda"
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._fill, name="blockforge-feed", daemon=True)
        self.thread.start()

    def _put(self, item: Any) -> bool:
        while not self.stopping.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _fill(self) -> None:
        try:
            for batch in self.batches:
                if self.pin:
                    batch = pinned(batch)
                if not self._put(batch):
                    return
            self._put(_Ended())
        except BaseException as err:  # handed to the loop, which raises it where it takes the batch
            self._put(_Ended(err))

    def __iter__(self) -> "Feed":
        return self

    def __next__(self) -> Any:
        item = self.queue.get()
        if isinstance(item, _Ended):
            self.queue.put(item)  # asked again, it ends again
            if item.error is not None:
                raise item.error
            raise StopIteration
        return to_device(item, self.device)

    def close(self) -> None:
        self.stopping.set()
        while True:  # make room, so a thread waiting to put sees the stop
            try:
                self.queue.get_nowait()
            except queue.Empty:
                break
        self.thread.join(timeout=10)
        close = getattr(self.batches, "close", None)
        if close is not None and not self.thread.is_alive():
            close()  # a generator's own clean-up (files it holds open)
