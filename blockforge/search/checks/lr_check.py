"""Verdicts at each candidate's own learning rate (`confirm: {lr: {grid: [...]}}`).

A verdict at one shared learning rate is confounded with how far each candidate sits from its own optimum. With
the learning-rate check, the cell's winner and the Pre-LN reference have replicates at every learning rate of the
grid (the confirmation's seeds). For each, its best learning rate is the one with the best mean over the seeds
every learning rate shares, with how often seed resamples choose it and the range they choose within; the
winner at its best against Pre-LN at its best gives a second verdict (paired by seed, 95% t). The cell's answer is
`lr-robust` when the two verdicts agree, else the report names the learning rates where they differ. Choosing
each one's best on the same seeds favours both alike; it is a check of the shared-lr verdict, not a new answer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from blockforge.search.config import SearchPlan
from blockforge.search.evidence.evidence import CellEvidence, Difference, describe, paired_difference, verdict
from blockforge.search.records.ledger import StageName, TrialRecord
from blockforge.spec.search import LR_KEY, mode_sign
from blockforge.train.events import Status

RESAMPLES = 1000


@dataclass
class LrCurve:
    """One candidate over the learning rates: lr -> seed -> its value."""

    name: str
    by_lr: dict[float, dict[int, float]]
    best: float
    share: float  # the fraction of seed resamples that choose `best`
    low: float  # the lowest and highest learning rate chosen in 95% of the resamples
    high: float

    @property
    def seeds(self) -> list[int]:
        """The seeds every learning rate of the grid has: what means and choices are taken over."""
        return shared_seeds(self.by_lr)

    def mean_at(self, lr: float, seeds: list[int]) -> float:
        return sum(self.by_lr[lr][s] for s in seeds) / len(seeds)

    def text(self) -> str:
        span = f"{self.low:g}" if self.low == self.high else f"{self.low:g}-{self.high:g}"
        return f"{self.name}: best lr {self.best:g} (chosen in {self.share:.0%} of seed resamples; 95% of them within {span})"


@dataclass
class LrCheck:
    cell: str
    shared: float
    candidate: LrCurve | None  # None: Pre-LN won and no other finalist was trained over the grid
    reference: LrCurve
    at_shared: Difference | None
    at_best: Difference | None
    shared_verdict: str
    best_verdict: str

    @property
    def robust(self) -> bool | None:
        """Whether the verdict is the same at the shared and at each one's best learning rate (None: nothing to compare)."""
        return None if self.candidate is None else self.shared_verdict == self.best_verdict

    def text(self) -> str:
        if self.candidate is None:
            return (f"{self.cell}: Pre-LN won at the shared lr {self.shared:g} and no other finalist was trained over the grid, so "
                    f"there is no verdict to check; Pre-LN's own curve over it: {self.reference.text()}.")
        at_best = f"{self.candidate.name} at {self.candidate.best:g} against Pre-LN at {self.reference.best:g}"
        shared = f"{self.shared_verdict} at the shared lr {self.shared:g} ({self.at_shared.text() if self.at_shared else 'no common seed'})"
        best = f"{self.best_verdict} at each one's best lr, {at_best} ({self.at_best.text() if self.at_best else 'no common seed'})"
        head = "lr-robust" if self.robust else f"not lr-robust: the verdict depends on the learning rate ({self.shared:g} shared; " \
                                                f"{self.candidate.best:g} and {self.reference.best:g} their own)"
        return f"{self.cell}: {head}: {shared}; {best}. {self.candidate.text()}; {self.reference.text()}."


def shared_seeds(by_lr: dict[float, dict[int, float]]) -> list[int]:
    return sorted(set.intersection(*(set(v) for v in by_lr.values())))


def _curve(name: str, by_lr: dict[float, dict[int, float]], mode: str) -> LrCurve:
    seeds = shared_seeds(by_lr)
    sign = mode_sign(mode)

    def best_of(chosen: list[int]) -> float:
        return min(by_lr, key=lambda lr: (sign * sum(by_lr[lr][s] for s in chosen) / len(chosen), lr))

    best = best_of(seeds)
    rng = random.Random(0)
    picks = sorted(best_of([rng.choice(seeds) for _ in seeds]) for _ in range(RESAMPLES)) if seeds else [best]
    cut = int(0.025 * len(picks))
    return LrCurve(name, by_lr, best, picks.count(best) / len(picks), picks[cut], picks[len(picks) - 1 - cut])


def lr_check(plan: SearchPlan, records: list[TrialRecord], evidence: CellEvidence) -> LrCheck | None:
    """The learning-rate check of one cell (None without confirm.lr, or before the winner and Pre-LN have their grid)."""
    if plan.confirm is None or plan.confirm.lr is None or evidence.winner is None or evidence.reference is None:
        return None
    shared = plan.shared_lr(evidence.cell)
    swept = {_model_key(r.overrides) for r in records if r.cell == evidence.cell and r.stage == StageName.LR}
    if evidence.winner is not evidence.reference:
        candidate = evidence.winner
    else:  # Pre-LN won: the best other finalist trained over the grid (every finalist is), if any
        candidate = next((c for c in evidence.candidates if c is not evidence.reference and _model_key(c.overrides) in swept), None)
    curves = []
    for c in (candidate, evidence.reference):
        if c is None:
            curves.append(None)
            continue
        by_lr: dict[float, dict[int, float]] = {shared: dict(c.values)}
        for r in records:
            if r.cell != evidence.cell or r.stage != StageName.LR or r.status not in (Status.COMPLETED, Status.DIVERGED):
                continue
            if _model_key(r.overrides) != _model_key(c.overrides):
                continue
            value = plan.penalty if r.status == Status.DIVERGED else r.value
            if value is not None:
                by_lr.setdefault(float(r.overrides[LR_KEY]), {})[r.seed] = value
        if len(by_lr) < 2:
            return None  # the grid has not been trained yet
        curves.append(_curve("Pre-LN" if c is evidence.reference else describe(c), by_lr, plan.mode))
    mine, pre = curves
    if mine is None:
        return LrCheck(evidence.cell, shared, None, pre, None, None, "n/a", "n/a")
    seeds = set.intersection(*(set(v) for curve in curves for v in curve.by_lr.values()))
    on = lambda values: {s: v for s, v in values.items() if s in seeds}  # noqa: E731  (the seeds every learning rate shares)
    at_shared = paired_difference(on(mine.by_lr[shared]), on(pre.by_lr[shared]))
    at_best = paired_difference(on(mine.by_lr[mine.best]), on(pre.by_lr[pre.best]))
    return LrCheck(evidence.cell, shared, mine, pre, at_shared, at_best, verdict(at_shared, plan.mode), verdict(at_best, plan.mode))


def _model_key(overrides: dict) -> str:
    """A model's searched values less its learning rate (what is the same model over the grid)."""
    import json

    return json.dumps({k: v for k, v in overrides.items() if k != LR_KEY}, sort_keys=True, default=str)
