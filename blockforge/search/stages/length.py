"""The length check (`confirm: {length: {factors: [2, 4], until_stable: true}}`): once a cell has its answer, its best
Mix-LN candidate and the Pre-LN reference continue from their checkpoints to each factor times the steps, with the
seeds their verdict was measured on, one length after the other (each continuing from the one before); with
`until_stable` the check stops once the verdicts at two consecutive lengths agree. Its trials are recorded with stage
`length` and stay out of the cell's main evidence; search/checks/length_check.py reads them (how a checkpoint is extended is
said there).
"""

from __future__ import annotations

from blockforge.search.config import SearchPlan, trial_rel
from blockforge.search.records.ledger import StageName
from blockforge.search.stages.base import CellLike, Stage


class Length(Stage):
    name = StageName.LENGTH
    answers = False

    def __init__(self, plan: SearchPlan):
        self.plan = plan

    def open(self, cell: CellLike) -> bool:
        from blockforge.search.checks.length_check import continuation, length_check, proxy_searched
        from blockforge.search.evidence.evidence import min_seeds

        evidence = cell.evidence(min_seeds(self.plan))
        check = length_check(self.plan, cell.records(), evidence, trained_only=True)
        if check is None:
            return False
        done = [s for s in check.steps if s.outcome != "not trained"]
        if len(done) < len(check.steps) or len(done) == len(self.plan.length_steps(cell.name)):
            return False  # stable before the last length (until_stable), or every length trained
        steps = self.plan.length_steps(cell.name)[len(done)]
        before = done[-1].steps if done else None
        seeds = sorted(set(check.candidate.values) & set(check.reference.values))
        queued = False
        for candidate in (check.candidate, check.reference):
            searched = proxy_searched(candidate.overrides)
            source = continuation(self.plan, cell.name, searched, before) if before else searched
            for seed in seeds:
                queued |= self.queue(cell, continuation(self.plan, cell.name, searched, steps), [seed], stage=StageName.LENGTH,
                                     continues=self._run_of(cell, source, seed))
        return queued

    def _run_of(self, cell: CellLike, searched: dict, seed: int) -> str:
        """The run folder (relative to the search) of model `searched` trained with `seed` in this cell."""
        from blockforge.search.config import trial_identity

        recipe = self.plan.recipe(self.plan.seed_overrides(cell.name, searched, seed))
        return trial_rel(cell.name, trial_identity(recipe))

    @classmethod
    def worst_case(cls, plan: SearchPlan, name: str, explored: int) -> int:
        """In trials of the cell's own length: each length's new steps, for two models with the confirmation's seeds."""
        import math

        factors = [1.0, *plan.confirm.length.factors]
        return 2 * (plan.confirm.seeds + 1) * math.ceil(factors[-1] - factors[0])

    @classmethod
    def rounds(cls, plan: SearchPlan) -> int:
        return len(plan.confirm.length.factors)
