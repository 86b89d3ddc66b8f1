"""A run's metric log: metrics.jsonl (one JSON object per line) and, optionally, TensorBoard."""

from __future__ import annotations

import json
from pathlib import Path

from blockforge.errors import BlockforgeError
from blockforge.io import atomic_write_text, writes_into


class RunLog:
    def __init__(self, run_dir: Path, *, tensorboard: bool = False, enabled: bool = True):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.run_dir = Path(run_dir)
        self.enabled = enabled  # only the main process of a data-parallel run writes
        self._tensorboard = self._open_tensorboard(run_dir) if tensorboard and enabled else None

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

    def close(self) -> None:
        if self._tensorboard is not None:
            self._tensorboard.close()


def _step(line: str) -> float:
    """The step of a metrics.jsonl line; a damaged line (a run killed mid-write) sorts after every step, so trim drops it."""
    try:
        step = json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return float("inf")
    return step if isinstance(step, (int, float)) else float("inf")
