"""Exploration: the cell's sampler (Optuna through Ray's OptunaSearch) proposes points until the trial budget is spent.

The baselines come first, then (when every point fits the budget) each distinct point once, trained to the full
budget; otherwise the sampler samples and the scheduler may stop trials early. A proposal is resolved before it
runs: an invalid one is recorded failed, one outside a constraint infeasible, and one whose identity already ran
in the cell is a free duplicate (one that runs now waits for its twin). Free proposals do not use the budget; a
sampler that keeps making only those has exhausted the space.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from blockforge.errors import SpecError
from blockforge.search.config import OBJECTIVE, SearchPlan
from blockforge.search.records.ledger import StageName, TrialRecord
from blockforge.search.stages.base import Outcome, Stage, Trial
from blockforge.train.events import Status

if TYPE_CHECKING:
    from blockforge.search.stages.cell import Cell

# Duplicates and invalid combinations cost nothing and do not use a cell's trial budget; a cell whose
# sampler keeps proposing only those has exhausted its space and closes after this many in a row.
FREE_ASKS_IN_A_ROW = 10


def make_sampler(plan: SearchPlan, cell_index: int, name: str):
    import optuna

    sampler = plan.sampler
    if sampler.kind == "grid":
        return optuna.samplers.GridSampler({d.name: d.values() for d in plan.dimensions_in(name)}, seed=cell_index)
    settings = sampler.tpe or sampler.random
    seed = settings.seed + 1000 * cell_index  # cells draw independent sequences, reproducibly
    if sampler.kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=settings.startup_trials, constant_liar=True)


class Explore(Stage):
    name = StageName.EXPLORE
    on_demand = True

    def __init__(self, plan: SearchPlan, name: str, index: int, records: list[TrialRecord]):
        import optuna
        from ray.tune.search.optuna import OptunaSearch

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.plan = plan
        first = self._first_points(name, records)
        # With a cost axis the study has several objectives: the quality, then the costs (TPE handles them)
        metrics = [OBJECTIVE, *(cost for cost, _ in plan.costs)] if plan.costs else OBJECTIVE
        modes = [plan.mode, *(mode for _, mode in plan.costs)] if plan.costs else plan.mode
        self.distributions = {d.name: d.optuna() for d in plan.dimensions_in(name)}
        self.storage, self.study_name = optuna.storages.InMemoryStorage(), f"cell-{index}"  # the sampler's study, open to optuna's API
        self.sampler = OptunaSearch(space=self.distributions, metric=metrics, mode=modes, storage=self.storage, study_name=self.study_name,
                                    sampler=make_sampler(plan, index, name), points_to_evaluate=first or None)
        # A cell whose distinct points fit its budget enumerates them (first points) and asks no more.
        self.enumerated = len(first) if plan.enumeration(name) is not None else None
        self.asks = 0  # proposals asked for
        self.runs = 0  # proposals sent to train: the budget
        self.free_streak = 0  # proposals in a row that needed no training
        self._teach(name, records)

    def _first_points(self, name: str, records: list[TrialRecord]) -> list[dict]:
        """The points the cell tries before it samples: the plan's, less those the ledger has tried, after the
        exploration trials it records as stopped while running (so they continue)."""
        explored = [r for r in records if r.cell == name and r.stage == StageName.EXPLORE]
        params = lambda r: self.plan.sampler_params(name, r.overrides)  # noqa: E731
        stopped = [params(r) for r in explored if r.status in (Status.RUNNING, Status.INTERRUPTED)]
        tried = [params(r) for r in explored]
        points = [p for i, p in enumerate(stopped) if p not in stopped[:i]]
        return points + [p for p in self.plan.first_points(name) if p not in tried]

    def _teach(self, name: str, records: list[TrialRecord]) -> None:
        """Give the sampler the exploration outcomes the ledger records (a search rebuilt from it)."""
        for r in records:
            if r.cell != name or r.stage != StageName.EXPLORE or r.status not in (Status.COMPLETED, Status.DIVERGED, Status.PRUNED, Status.FAILED):
                continue
            value = self.plan.penalty if r.status == Status.DIVERGED else r.value
            if r.status == Status.COMPLETED and value is None:
                continue
            params = self.plan.sampler_params(name, r.overrides)
            if self.plan.costs and value is not None and r.status in (Status.COMPLETED, Status.DIVERGED):
                self._teach_front_point(params, [value, *(r.costs.get(c) for c, _ in self.plan.costs)])
                continue
            self.sampler.add_evaluated_point(params, value, error=r.status == Status.FAILED, pruned=r.status == Status.PRUNED)

    def _teach_front_point(self, params: dict, values: list) -> None:
        """A finished point of a search with a cost axis: Ray's add_evaluated_point passes one value to Optuna, which
        a study with several objectives refuses, so the trial (values: quality, then each cost) is added directly."""
        import optuna

        trial = optuna.trial.create_trial(state=optuna.trial.TrialState.COMPLETE, values=values, params=params, distributions=self.distributions)
        optuna.load_study(study_name=self.study_name, storage=self.storage).add_trial(trial)

    def active(self, cell: "Cell") -> bool:
        if self.enumerated is not None and self.asks >= self.enumerated:
            return False  # every distinct point has been proposed
        return self.runs < self.plan.trials_per_cell and self.free_streak < FREE_ASKS_IN_A_ROW

    def propose(self, cell: "Cell", trial_id: str) -> dict | None:
        self.asks += 1
        config = self._ask(cell, trial_id)
        if config is None:
            self.free_streak += 1
            return None
        self.free_streak = 0
        self.runs += 1
        return config

    def _ask(self, cell: "Cell", trial_id: str) -> dict | None:
        """Ask the sampler for a trial; a Tune config, or None when it needs no run."""
        cell.context.serial += 1
        optuna_id = f"{trial_id}-{cell.context.serial}"
        params = self.sampler.suggest(optuna_id) or {}
        return self._run_point(cell, trial_id, params, optuna_id)

    def _run_point(self, cell: "Cell", trial_id: str, params: dict, optuna_id: str | None = None) -> dict | None:
        """The point `params` (sampler parameters) as a trial: a Tune config, or None when it needs no run (invalid, outside a
        constraint, a duplicate of a trained one, or the twin of a running one)."""
        trial = cell.new_trial(self.plan.searched_values(cell.name, params), cell.base_seed, StageName.EXPLORE, owner=self, optuna_id=optuna_id)
        try:
            trial = cell.identify(trial)
        except SpecError as err:
            self.tell(cell, trial, Status.FAILED, None)
            cell.append(cell.record(trial, Status.FAILED, note=f"invalid: {err}"))
            return None
        broken = cell.broken_constraint(trial)
        if broken:  # never trained; the sampler learns it as a failure
            self.tell(cell, trial, Status.FAILED, None)
            cell.append(cell.record(trial, Status.INFEASIBLE, note=broken))
            return None
        trial = cell.adopt_orphan(trial)
        if trial.identity in cell.done:
            cell.settle_duplicate(trial, cell.done[trial.identity])
            return None
        if cell.is_running(trial.identity):
            cell.hold_twin(trial)
            return None
        return cell.launch(trial, trial_id)

    def tell(self, cell: "Cell", trial: Trial, status: str, value: float | None, costs: dict | None = None) -> None:
        if trial.optuna_id is None:
            return  # a point proposed without the sampler (guided exploration)
        if status in (Status.COMPLETED, Status.DIVERGED):
            result = {OBJECTIVE: value, **{c: (costs or {})[c] for c, _ in self.plan.costs}}
            self.sampler.on_trial_complete(trial.optuna_id, result=result)
        else:  # pruned: Optuna must not take a partial value as a finished one; failed: FAIL
            self.sampler.on_trial_complete(trial.optuna_id, result=None, error=status == Status.FAILED)

    def on_result(self, cell: "Cell", trial: Trial, result: dict) -> None:
        if OBJECTIVE in result and "step" in result and not self.plan.costs and trial.optuna_id is not None:
            self.sampler.on_trial_result(trial.optuna_id, {OBJECTIVE: result[OBJECTIVE], "training_iteration": result.get("step", 0)})

    def on_complete(self, cell: "Cell", trial: Trial, outcome: Outcome) -> None:
        self.tell(cell, trial, outcome.status, outcome.value, trial.costs)

    def on_duplicate(self, cell: "Cell", trial: Trial, outcome: Outcome) -> None:
        self.tell(cell, trial, outcome.status, outcome.value, outcome.record.costs)  # the sampler learns the point it proposed

    def taken_in(self, cell: "Cell", trial: Trial, record: TrialRecord) -> None:
        self.runs += 1

    @classmethod
    def worst_case(cls, plan: SearchPlan, name: str, explored: int) -> int:
        return explored

    @staticmethod
    def budget(plan: SearchPlan, name: str) -> int:
        """Exploration's worst case: the trial budget, or the distinct points of a cell that enumerates them."""
        return min(plan.trials_per_cell, len(plan.first_points(name))) if plan.enumeration(name) is not None else plan.trials_per_cell
