"""Confirmation: the cell's finalists trained to the full budget with further seeds, and racing among them.

`Confirm` takes the `top` best distinct explored models (completed ones by value, then the pruned ones that got
furthest), the baselines and the best Pre-LN model seen, and queues each with the confirmation's seeds; `Front`,
for a search with a cost axis, takes up to 2 * top points of the explored front instead. Models an earlier driver
promoted stay finalists. `Race` then gives the two leaders and the Pre-LN reference one more seed at a time while
their paired interval includes zero, up to max_seeds. Their trials are recorded as the confirmation's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from blockforge.errors import SpecError
from blockforge.search.config import SearchPlan
from blockforge.search.ledger import StageName
from blockforge.search.stages.base import Finalist, Outcome, Stage
from blockforge.train.events import Status

if TYPE_CHECKING:
    from blockforge.search.cell import Cell


class Confirm(Stage):
    name = StageName.CONFIRM

    def __init__(self, plan: SearchPlan):
        self.plan = plan
        self.opened = False

    def open(self, cell: "Cell") -> bool:
        if self.opened:
            return False
        self.opened = True
        confirm = self.plan.confirm
        finalists = self.finalists(cell, self.ranked(cell))
        unique: dict[str, Finalist] = {}
        for f in finalists:
            unique.setdefault(f.model, Finalist(f.searched, f.model, f.uniform_pre))
        for model, why in cell.promoted.items():  # models an earlier driver promoted stay finalists (a search rebuilt from its ledger)
            if model not in unique:
                record = next(r for r in cell.records() if r.model == model and r.promoted)
                unique[model] = Finalist(dict(record.overrides), model, record.uniform_pre, note=why, promoted=why)
        cell.finalists = list(unique.values())
        seeds = [cell.base_seed + i for i in range(confirm.seeds + 1)]
        cell.extra_seeds = confirm.seeds
        for finalist in cell.finalists:
            for seed in seeds:
                cell.enqueue(finalist.searched, seed, note=finalist.note, promoted=finalist.promoted)
        return bool(cell.queue)

    def ranked(self, cell: "Cell") -> list[Outcome]:
        """The cell's explored models: completed ones best first, then pruned ones, furthest and best first."""
        sign = 1.0 if self.plan.mode == "min" else -1.0
        explored = [o for o in cell.done.values() if o.trial.stage == StageName.EXPLORE]
        ranked = sorted((o for o in explored if o.status == Status.COMPLETED and o.value is not None), key=lambda o: sign * o.value)
        return ranked + sorted((o for o in explored if o.status == Status.PRUNED), key=lambda o: (-o.record.steps, sign * (o.record.value or 0.0)))

    def finalists(self, cell: "Cell", ranked: list[Outcome]) -> list[Finalist]:
        """The best `top` explored models, the baselines and (when none of them is) the best Pre-LN model seen."""
        chosen = [self._finalist(o) for o in self.choose(ranked)]
        for baseline in self.plan.baselines:
            searched = self.plan.searched_values(cell.name, self.plan.sampler_params(cell.name, baseline))
            trial = cell.new_trial(searched, cell.base_seed, StageName.CONFIRM)
            try:
                cell.identify(trial)
            except SpecError:
                continue  # an invalid baseline was recorded as failed when it was proposed
            chosen.append(Finalist(trial.searched, trial.model, trial.uniform_pre))
        if not any(f.uniform_pre for f in chosen):  # the best Pre-LN model seen is the reference
            chosen += [self._finalist(o) for o in ranked if o.trial.uniform_pre][:1]
        return chosen

    def choose(self, ranked: list[Outcome]) -> list[Outcome]:
        return ranked[: self.plan.confirm.top]

    @staticmethod
    def _finalist(outcome: Outcome) -> Finalist:
        trial = outcome.trial
        return Finalist(trial.searched, trial.model, trial.uniform_pre)

    @classmethod
    def worst_case(cls, plan: SearchPlan, name: str, explored: int) -> int:
        pruning = plan.asha is not None and plan.enumeration(name) is None
        finalists = min(cls.top(plan) + len(plan.baselines) + 1, explored + len(plan.baselines))
        return finalists * plan.confirm.seeds + (finalists if pruning else 0)  # those stopped early finish their run too

    @staticmethod
    def top(plan: SearchPlan) -> int:
        return plan.confirm.top


class Front(Confirm):
    """Confirmation with a cost axis: the explored models no other beats on quality and every cost at once (one
    seed each), best quality first, at most 2 * top of them; the pruned best ones when nothing completed."""

    def choose(self, ranked: list[Outcome]) -> list[Outcome]:
        from blockforge.search.evidence import dominates

        plan = self.plan
        done = [o for o in ranked if o.status == Status.COMPLETED]
        signs = [1.0 if plan.mode == "min" else -1.0, *(1.0 if m == "min" else -1.0 for _, m in plan.costs)]
        point = lambda o: [s * v for s, v in zip(signs, [o.value, *(o.record.costs.get(c, 0.0) for c, _ in plan.costs)])]  # noqa: E731
        front = [o for o in done if not any(dominates(point(other), point(o)) for other in done if other is not o)]
        return (front or ranked)[: 2 * plan.confirm.top]

    @staticmethod
    def top(plan: SearchPlan) -> int:
        return 2 * plan.confirm.top


class Race(Stage):
    """One more seed for the two leaders (and the Pre-LN reference) while their paired interval includes zero."""

    name = StageName.RACING

    def __init__(self, plan: SearchPlan):
        self.plan = plan

    def open(self, cell: "Cell") -> bool:
        confirm = self.plan.confirm
        if cell.extra_seeds >= confirm.max_seeds:
            return False
        evidence = cell.evidence(confirm.seeds + 1)
        if evidence.runner_up is None or evidence.vs_runner_up is None or evidence.vs_runner_up.excludes_zero():
            return False
        cell.extra_seeds += 1
        seed = cell.base_seed + cell.extra_seeds
        racing = {c.model: c for c in (evidence.winner, evidence.runner_up, evidence.reference) if c is not None}
        for candidate in racing.values():
            cell.enqueue(candidate.overrides, seed)
        return bool(cell.queue)

    @classmethod
    def worst_case(cls, plan: SearchPlan, name: str, explored: int) -> int:
        return 3 * cls.rounds(plan)

    @classmethod
    def rounds(cls, plan: SearchPlan) -> int:
        return plan.confirm.max_seeds - plan.confirm.seeds
