"""ASHA per cell over exploration trials, guarded against pruning what may still end ahead.

At each rung (grace, grace * rf, ... steps) a trial is compared with the cell's exploration trials that reached
the rung before it, as in ASHA: it is stopped only if it is outside the best 1/rf of them *and* behind their
cutoff by more than the rung's margin, the largest amount by which one of the cell's full-budget curves (same
seed) was behind another there and still ended ahead (at least `asha.margin`). Only trials whose config says
`early_stop` (SearchPlan.stops_early) are judged; the others run the full budget.

What a rung holds lives in the cell's RungTable (search/evidence/rungs.py): read once from the trials' run folders (so a resumed driver
decides as the first one would have), then kept up to date from the results Tune reports and the full-budget
curves the cell records. A decision costs the same at the ten-thousandth trial as at the tenth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from blockforge.search.config import OBJECTIVE, SEED_KEY, SearchPlan, trial_dir
from blockforge.search.evidence.rungs import Curve, RungTable, curve_of
from blockforge.search.records.ledger import APART, StageName
from blockforge.search.stages.base import ended_status
from blockforge.train.events import Status


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
    """Guarded ASHA per cell (see the module's docstring). The scheduler owns its cells' rung tables: read from the
    ledger and the run folders when first asked (so a resumed driver decides as the first one would have), then
    kept up to date from what Tune tells it: each result, each end."""

    def __init__(self, plan: SearchPlan, search):
        """search: the search folder (a local path, or a search/store.SearchStore)."""
        super().__init__()
        from blockforge.search.records.store import SearchStore

        self.plan = plan
        self.store = SearchStore.of(search)
        self.passed: dict[str, set[int]] = {}  # Tune trial id -> rungs it has been judged at (this driver)
        self.tables: dict[str, RungTable] | None = None  # cell -> its rungs, read when first asked

    def __getstate__(self) -> dict:  # Tune pickles the scheduler with its settings: the tables are read again
        return {**self.__dict__, "tables": None}

    def set_search_properties(self, metric, mode, **spec) -> bool:
        return True

    def table(self, cell: str) -> RungTable:
        """Cell `cell`'s rungs: every cell's are read from the ledger the first time any is asked for."""
        if self.tables is None:
            from blockforge.search.records.ledger import Ledger

            store = self.store.rebound()  # the driver's (a scheduler restored from Tune's state was saved elsewhere)
            records = Ledger(store.local / "trials.jsonl").records()
            self.tables = {name: RungTable(self.plan, name, self.plan.settings[name].base_seed, [r for r in records if r.cell == name])
                           for name in self.plan.cell_names()}
        return self.tables[cell]

    def on_trial_complete(self, tune_controller, trial, result: dict) -> None:
        """A trial ended: a full-budget curve (not the learning-rate or length checks') joins its cell's rungs."""
        config = trial.config
        if self.tables is None or config["cell"] not in self.tables or StageName.of_config(config) in APART:
            return  # not read yet: the ledger will hold it when they are
        if ended_status(result or {}, False, config["steps"]) != Status.COMPLETED or self.plan.metric not in (result or {}):
            return
        store = self.store.rebound()
        run_dir = trial_dir(store.local, config["cell"], config["identity"])
        store.pull_run(str(run_dir))  # its curve, as the trial put it up (a remote search's)
        curve = Curve(config["model"] or config["identity"], dict(config["overrides"])[SEED_KEY], curve_of(run_dir, self.plan.metric),
                      result[self.plan.metric])
        self.tables[config["cell"]].add_curve(curve, config["number"])

    def on_trial_error(self, tune_controller, trial) -> None:
        """A trial that failed counts at no rung."""
        if self.tables is not None and trial.config.get("cell") in self.tables:
            self.tables[trial.config["cell"]].forget(trial.config["number"])

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        if "step" not in result or StageName.of_config(trial.config) is not StageName.EXPLORE:  # rungs compare exploration trials
            return TrialScheduler.CONTINUE
        cell, step = trial.config["cell"], int(result["step"])
        table = self.table(cell)
        decision = TrialScheduler.CONTINUE
        judged = self.passed.setdefault(trial.trial_id, set())
        due = [rung for rung in table.rungs if rung <= step and rung not in judged]
        if due and OBJECTIVE in result and trial.config.get("early_stop"):  # SearchPlan.stops_early, as the trial carries it
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
        table = self.table(cell)
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
