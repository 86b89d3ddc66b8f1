"""A run's metric log: metrics.jsonl (one JSON object per line) and, optionally, TensorBoard and the experiment trackers
its recipe's tracking: names (blockforge/tracking.py)."""

from __future__ import annotations

import json
import queue
import threading
from pathlib import Path

from blockforge.errors import BlockforgeError
from blockforge.io import atomic_write_text, writes_into


class RunLog:
    def __init__(self, run_dir: Path, *, tensorboard: bool = False, enabled: bool = True, tracking=None, config: dict | None = None):
        """tracking: a recipe's tracking: section (its W&B and MLflow runs are named after the run folder; `config` is
        what they record of the recipe)."""
        self.path = Path(run_dir) / "metrics.jsonl"
        self.run_dir = Path(run_dir)
        self.enabled = enabled  # only the main process of a data-parallel run writes
        wanted = enabled and tracking is not None and any(t != "tensorboard" for t in tracking.report_to)
        tensorboard = tensorboard or (tracking is not None and "tensorboard" in tracking.report_to)
        self._tensorboard = self._open_tensorboard(run_dir) if tensorboard and enabled else None
        self._trackers = None
        self._config = config or {}
        if wanted:
            from blockforge.tracking import Trackers

            self._trackers = Trackers(tracking, name="blockforge", state_dir=self.run_dir, what="the run")  # the default project
            self._track([], start=True)  # the trackers' runs start before the first step, not inside it
            # Lines go to the trackers from a thread of their own: a step never waits on a tracker's files or server.
            self._pending: queue.SimpleQueue = queue.SimpleQueue()
            self._sender = threading.Thread(target=self._send, name="blockforge-trackers", daemon=True)
            self._sender.start()

    @staticmethod
    def _open_tensorboard(run_dir: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise BlockforgeError("train.tensorboard: true needs the tensorboard package; pip install tensorboard") from None
        return SummaryWriter(str(Path(run_dir) / "tensorboard"))

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        with writes_into(self.path.parent, self.path.name), open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        self._scalars(record)
        if self._trackers is not None:
            self._pending.put(record)

    def _send(self) -> None:
        while (record := self._pending.get()) is not None:
            lines = [record]
            while True:  # what queued up meanwhile goes in one call
                try:
                    more = self._pending.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._track(lines)
                    return
                lines.append(more)
            self._track(lines)

    def _track(self, lines: list[dict], ended: dict | None = None, failed: bool = False, start: bool = False) -> None:
        if self._trackers:
            self._trackers.log("run", lines, name=self.run_dir.name, kind="train", config=self._config, ended=ended, failed=failed,
                               start=start)
            self._trackers.save()

    def _scalars(self, record: dict) -> None:
        if self._tensorboard is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self._tensorboard.add_scalar(key, value, record["step"])

    def trim(self, step: int) -> None:
        """Drop lines past `step` (the checkpoint being resumed), so the log reads as one clean run; TensorBoard's event
        files, which cannot be cut, are written again from what is kept (one scalar a step, however often it resumed)."""
        if not self.enabled or not self.path.exists():
            return
        kept = [line for line in self.path.read_text().splitlines() if _step(line) <= step]
        atomic_write_text(self.path, "".join(line + "\n" for line in kept))
        if self._tensorboard is not None:
            self._tensorboard.close()
            for old in (self.run_dir / "tensorboard").glob("events.out.tfevents.*"):
                old.unlink()
            self._tensorboard = self._open_tensorboard(self.run_dir)
            for line in kept:
                self._scalars(json.loads(line))
            self._tensorboard.flush()

    def close(self, summary: dict | None = None, failed: bool = False) -> None:
        """The run ended (`summary`: its outcome, for the trackers) or stopped."""
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._trackers is not None:
            self._pending.put(None)
            self._sender.join()
            self._track([], ended=summary or {}, failed=failed)
            self._trackers.close(finished=not failed)
            self._trackers = None


def _step(line: str) -> float:
    """The step of a metrics.jsonl line; a damaged line (a run killed mid-write) sorts after every step, so trim drops it."""
    try:
        step = json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return float("inf")
    return step if isinstance(step, (int, float)) else float("inf")
