"""Preemption: SIGTERM (what Slurm and Kubernetes send) and a first Ctrl-C ask a run to stop cleanly.

While `StopRequest` is installed, the first SIGTERM or SIGINT only records itself; the training loop
finishes its optimizer step, writes a checkpoint and result.json (status interrupted) and returns. A
second signal stops at once: SIGINT raises KeyboardInterrupt, SIGTERM SystemExit(143), so `finally`
blocks still run and no temporary file is left behind. The previous handlers come back on exit.
Handlers can only be installed from the main thread; elsewhere (a Ray Tune trial) this does nothing.
"""

from __future__ import annotations

import signal
import threading

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
    """A context manager; `signum` is the first signal received (None while none came)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
            # A file size limit (ulimit -f) then fails the write with an OSError, reported as one sentence, instead of killing us.
            self._previous[signal.SIGXFSZ] = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        if self.signum is None:
            self.signum = signum
            return
        self.__exit__()
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""
