"""The search's own record of trials: one JSON line per event, the last line per trial wins.

Ray Tune keeps its experiment state for resuming; this ledger is what results.csv, the summary, the
plots and `blockforge export` read. It is append-only, so a killed driver loses nothing it wrote.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from blockforge.train.events import Status

COLUMNS = ["cell", "trial", "stage", "status", "seed", "alpha", "post_ln_layers", "steps", "metric", "value", "wall_s", "overrides",
           "model", "identity", "duplicate_of", "note"]


@dataclass
class TrialRecord:
    cell: str
    trial: int  # the trial's number within its cell (exploration: the Optuna trial number)
    status: str  # a blockforge.train.events.Status value
    stage: str = "explore"  # explore (sampled, maybe stopped early) | confirm (a finalist's replicate, full budget)
    seed: int = 0  # train.seed
    model: str = ""  # the model's identity, the seed aside: replicates of one model share it
    uniform_pre: bool = False  # every layer Pre-LN: the reference the verdicts compare with
    identity: str = ""
    overrides: dict[str, Any] = field(default_factory=dict)  # the cell's searched values (and baselines')
    alpha: float | None = None
    post_ln_layers: int | None = None
    steps: int = 0
    metric: str = ""
    value: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    costs: dict[str, float] = field(default_factory=dict)  # a search with a cost axis: the candidate's costs (search/costs.py)
    wall_s: float = 0.0
    duplicate_of: int | None = None
    run_dir: str = ""
    note: str = ""


class Ledger:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    def append(self, record: TrialRecord) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = (json.dumps(asdict(record)) + "\n").encode()
        with open(self.path, "ab+") as f:
            end = f.seek(0, os.SEEK_END)
            if end:
                f.seek(end - 1)
                if f.read(1) != b"\n":
                    line = b"\n" + line  # a line cut short by a kill stays on its own, not glued to this one
            f.write(line)

    def records(self) -> list[TrialRecord]:
        """The latest record of every trial, in cell then trial order."""
        if not self.path.exists():
            return []
        latest: dict[tuple[str, int], TrialRecord] = {}
        for line in self.path.read_text().splitlines():
            try:
                record = TrialRecord(**json.loads(line))
            except (ValueError, TypeError):  # blank, or cut short by a kill: the trial's previous record stands
                continue
            latest[(record.cell, record.trial)] = record
        return sorted(latest.values(), key=lambda r: (r.cell, r.trial))

    def latest(self, cell: str, trial: int) -> TrialRecord | None:
        """The latest record of trial `trial` of `cell`, if any."""
        return next((r for r in self.records() if r.cell == cell and r.trial == trial), None)

    def mark_interrupted(self, note: str) -> list[TrialRecord]:
        """Every trial still recorded as running ends as interrupted (a resumed search takes it up again)."""
        stopped = [replace(r, status=Status.INTERRUPTED, note=note) for r in self.records() if r.status == Status.RUNNING]
        for record in stopped:
            self.append(record)
        return stopped
