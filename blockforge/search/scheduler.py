"""ASHA per cell over exploration trials, guarded against pruning what may still end ahead.

At each rung (grace, grace * rf, ... steps) a trial is compared with the cell's exploration trials that reached
the rung before it, as in ASHA: it is stopped only if it is outside the best 1/rf of them *and* behind their
cutoff by more than the rung's margin, the largest amount by which one of the cell's full-budget curves (same
seed) was behind another there and still ended ahead (at least `asha.margin`). Confirmation trials, and
exploration trials of cells that enumerate their distinct points (config `early_stop` false), always run the
full budget.

What a rung holds lives in the cell's RungTable: read once from the trials' run folders (so a resumed driver
decides as the first one would have), then kept up to date from the results Tune reports and the full-budget
curves the cell records. A decision costs the same at the ten-thousandth trial as at the tenth.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from blockforge.search.config import OBJECTIVE, SearchPlan
from blockforge.search.ledger import StageName
from blockforge.search.rungs import Curve, asha_rungs, curve_of, value_at
from blockforge.train.events import Status


class RungTable:
    """A cell's rungs: the value each exploration trial had on first reaching each rung, and the largest margin by which
    a full-budget curve of the cell's base seed was behind another there and still ended ahead."""

    def __init__(self, plan: SearchPlan, cell):
        self.sign = 1.0 if plan.mode == "min" else -1.0
        self.rungs = asha_rungs(plan.asha.grace_steps, plan.asha.reduction_factor, plan.steps[cell.name])
        self.base_seed = cell.base_seed
        self.values = {rung: [] for rung in self.rungs}  # rung -> sign * value of every trial there, sorted
        self.reached: dict[int, dict[int, float]] = {}  # trial number -> rung -> its sign * value there
        self.curves = 0  # full-budget curves of the base seed
        self.crossing = dict.fromkeys(self.rungs, 0.0)  # rung -> the largest margin overtaken there on the base seed
        self.orders: dict[int, dict[int, SeedOrder]] = {rung: {} for rung in self.rungs}  # rung -> seed -> its curves
        metric = plan.metric
        for record in cell.records():
            if record.stage == StageName.EXPLORE and record.run_dir and record.status not in (Status.DUPLICATE, Status.FAILED):
                for step, value in sorted(curve_of(record.run_dir, metric).items()):
                    self.observe(record.trial, step, value)
            if record.status == Status.COMPLETED and record.value is not None and record.run_dir:
                self.add_curve(Curve(record.model or record.identity, record.seed, curve_of(record.run_dir, metric), record.value))

    def observe(self, number: int, step: int, value: float) -> None:
        """Trial `number` reported `value` at `step`: the rungs it reaches here for the first time hold it."""
        held = self.reached.setdefault(number, {})
        for rung in self.rungs:
            if rung <= step and rung not in held:
                held[rung] = self.sign * value
                bisect.insort(self.values[rung], self.sign * value)

    def forget(self, number: int) -> None:
        """A trial that failed counts at no rung."""
        for rung, value in self.reached.pop(number, {}).items():
            self.values[rung].pop(bisect.bisect_left(self.values[rung], value))

    def add_curve(self, curve: Curve) -> None:
        """A full-budget curve: placed among the earlier ones of its seed at each rung (SeedOrder); the base seed's
        crossings set the rung's margin."""
        if curve.seed == self.base_seed:
            self.curves += 1
        final = self.sign * curve.final
        for rung in self.rungs:
            value = value_at(curve.values, rung)
            if value is None:
                continue
            largest = self.orders[rung].setdefault(curve.seed, SeedOrder()).add(final, self.sign * value)
            if curve.seed == self.base_seed:
                self.crossing[rung] = max(self.crossing[rung], largest)

    def agreement(self, rung: int) -> tuple[float | None, int, int, float]:
        """(Kendall tau averaged over the seeds two or more full-budget curves share, pairs, pairs that cross, the
        largest margin overtaken) at `rung`: rungs.rung_checks' figures, kept up to date instead of recomputed."""
        orders = [o for o in self.orders[rung].values() if o.pairs]
        if not orders:
            return None, 0, 0, 0.0
        tau = sum((o.concordant - o.discordant) / o.pairs for o in orders) / len(orders)
        return tau, sum(o.pairs for o in orders), sum(o.discordant for o in orders), max(o.largest for o in orders)

    def others(self, number: int, rung: int) -> list[float]:
        """sign * value at `rung` of every trial there but `number`, sorted."""
        values = self.values[rung]
        own = self.reached.get(number, {}).get(rung)
        if own is None:
            return values
        values = list(values)
        values.pop(bisect.bisect_left(values, own))
        return values


class SeedOrder:
    """One seed's full-budget curves at one rung: (sign * final, sign * value there) ordered by final, with the pairs
    ranked alike and oppositely at the rung and at the end (ties in either are neither) and the largest margin by which
    a curve behind at the rung ended ahead."""

    def __init__(self):
        self.finals, self.values = np.empty(0), np.empty(0)
        self.concordant = self.discordant = 0
        self.largest = 0.0

    @property
    def pairs(self) -> int:
        return len(self.finals) * (len(self.finals) - 1) // 2

    def add(self, final: float, value: float) -> float:
        """Place one curve (O(log n) to find, O(n) vectorised to count); returns the largest margin it crossed by."""
        better = bisect.bisect_left(self.finals, final)  # those ending ahead of it: before here
        worse = bisect.bisect_right(self.finals, final)  # those ending behind it: from here on
        ahead, behind = self.values[:better], self.values[worse:]
        self.concordant += int((ahead < value).sum() + (behind > value).sum())
        self.discordant += int((ahead > value).sum() + (behind < value).sum())
        largest = 0.0
        if len(ahead) and ahead.max() > value:  # it ends behind them yet was ahead of one at the rung
            largest = float(ahead.max()) - value
        if len(behind) and behind.min() < value:  # it ends ahead of them yet was behind one at the rung
            largest = max(largest, value - float(behind.min()))
        self.largest = max(self.largest, largest)
        self.finals, self.values = np.insert(self.finals, worse, final), np.insert(self.values, worse, value)
        return largest


def sorted_percentile(ordered: list[float], percent: float) -> float:
    """numpy.percentile(ordered, percent) (its default, linear method) of an already sorted list, in O(1): the same
    arithmetic, so the same bits."""
    n = len(ordered)
    virtual = (n - 1) * (percent / 100)
    if virtual >= n - 1:
        return ordered[-1]
    if virtual < 0:
        return ordered[0]
    below = math.floor(virtual)
    gamma = virtual - below
    a, b = ordered[below], ordered[below + 1]
    if gamma >= 0.5:
        return b - (b - a) * (1 - gamma)
    return a + (b - a) * gamma


class CellScheduler(FIFOScheduler):
    """Guarded ASHA per cell (see the module's docstring); the cells are the searcher's, found by the search folder."""

    def __init__(self, plan: SearchPlan, search_dir: str):
        super().__init__()
        self.plan = plan
        self.search_dir = str(search_dir)
        self.passed: dict[str, set[int]] = {}  # Tune trial id -> rungs it has been judged at (this driver)

    def set_search_properties(self, metric, mode, **spec) -> bool:
        return True

    def _cell(self, name: str):
        from blockforge.search.cell import SearchContext

        return SearchContext.of(self.search_dir, self.plan).cells[name]

    @staticmethod
    def _early_stoppable(trial) -> bool:
        return trial.config.get("stage", "explore") == "explore" and trial.config.get("early_stop", True)

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        if "step" not in result or trial.config.get("stage", "explore") != "explore":
            return TrialScheduler.CONTINUE
        cell, step = trial.config["cell"], int(result["step"])
        table = self._cell(cell).rung_table()
        decision = TrialScheduler.CONTINUE
        judged = self.passed.setdefault(trial.trial_id, set())
        due = [rung for rung in table.rungs if rung <= step and rung not in judged]
        if due and OBJECTIVE in result and self._early_stoppable(trial):
            rung = max(due)
            judged.update(due)
            if not result.get("diverged"):  # a diverged trial ends by itself
                stop = self.decide(cell, trial.config["number"], rung, float(result[OBJECTIVE])).stop
                decision = TrialScheduler.STOP if stop else TrialScheduler.CONTINUE
        value = result.get(self.plan.metric)
        if isinstance(value, (int, float)) and not result.get("diverged"):
            table.observe(trial.config["number"], step, float(value))
        return decision

    def decide(self, cell: str, number: int, rung: int, value: float) -> "RungDecision":
        """Whether exploration trial `number` of `cell`, at `value` on reaching `rung`, is stopped there."""
        table = self._cell(cell).rung_table()
        ordered = table.others(number, rung)  # best first
        if not ordered:
            return RungDecision(False, None, None)
        cutoff = sorted_percentile(ordered, 100.0 / self.plan.asha.reduction_factor) * table.sign  # ASHA's: keep the best 1/rf
        behind = table.sign * (value - cutoff)
        floor = self.plan.asha.margin
        if floor is None and table.curves < 2:
            return RungDecision(False, behind, None)  # nothing yet says how far the rung's ranking can be trusted
        margin = max(floor or 0.0, table.crossing[rung])
        return RungDecision(behind > margin, behind, margin)


@dataclass(frozen=True)
class RungDecision:
    stop: bool
    behind: float | None  # behind the rung's cutoff by this much (negative: inside the best 1/rf); None: first at the rung
    margin: float | None  # what it had to be behind by to be stopped (None: not stoppable yet, no full curves to judge by)
