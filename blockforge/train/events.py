"""What a run reports: one status vocabulary for runs, trials and reports, and the typed events a run emits."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from blockforge.train.stability import Stability


class Status(str, Enum):
    """How a run or a search trial stands or ended (a str: it is written to JSON as its value)."""

    RUNNING = "running"
    COMPLETED = "completed"
    DIVERGED = "diverged"
    PRUNED = "pruned"  # a search stopped it early
    FAILED = "failed"
    DUPLICATE = "duplicate"  # a search proposal that needed no training
    INTERRUPTED = "interrupted"
    INFEASIBLE = "infeasible"  # a search proposal that breaks a cost constraint: never trained

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Step:
    """After every optimizer step (what per-step callbacks receive)."""

    step: int  # 1-based: steps done
    loss: float
    lr: float
    grad_norm: float
    samples: int  # in this step, over all processes
    layer_grad_norms: list[float] | None = None  # every train.grad_norm_every steps


@dataclass(frozen=True)
class Evaluation:
    """After every evaluation (what `Trainer.iterate` yields), and once more if the run diverges."""

    step: int
    metrics: dict
    checkpoint: Path | None = None
    done: bool = False
    diverged: bool = False


@dataclass
class TrainResult:
    status: Status
    step: int
    metrics: dict = field(default_factory=dict)
    message: str = ""
    run_dir: Path | None = None
    signal: int | None = None  # the signal that interrupted the run (status interrupted)
    stability: "Stability | None" = None  # a run that completed or diverged: how stable it was (train/stability.py)
