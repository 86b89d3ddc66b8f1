"""The stability check (`confirm: {stability: {lr_max: ..., resolution, steps, warmup}}`): once a cell has its answer, each
of its finalists, baselines and the Pre-LN reference gets its largest stable learning rate by bisection, per seed of the
confirmation and per warm-up fraction (search/checks/stability_check.py says how). Every time the cell is idle, each chain's
next probe is queued: a round per bisection step, all chains at once. Its trials are recorded with stage `stability` and
stay out of the cell's main evidence; what a chain has found is read back from its probes' identities, so a resumed
driver goes on where the chains were.
"""

from __future__ import annotations

import math

from blockforge.search.config import SearchPlan
from blockforge.search.records.ledger import StageName
from blockforge.search.stages.base import CellLike, Stage
from blockforge.search.stages.confirm import Confirm, Front


class Stability(Stage):
    name = StageName.STABILITY
    answers = False

    def __init__(self, plan: SearchPlan):
        self.plan = plan
        self.probes = None  # stability_check.Probes of the cell, made when first opened (its identities computed once)

    def __getstate__(self) -> dict:  # Tune pickles the searcher: the identities are recomputed on restore
        return {**self.__dict__, "probes": None}

    def open(self, cell: CellLike) -> bool:
        from blockforge.search.checks.stability_check import Probes, probed, warmups
        from blockforge.search.evidence.evidence import min_seeds

        if self.probes is None:
            self.probes = Probes(self.plan, cell.name, lambda identity: getattr(cell.done.get(identity), "record", None))
        evidence = cell.evidence(min_seeds(self.plan))
        seeds = [cell.base_seed + i for i in range(self.plan.confirm.seeds + 1)]
        queued = False
        for candidate in probed(self.plan, evidence):
            for warmup in warmups(self.plan):
                for seed in seeds:
                    following, _ = self.probes.chain(candidate.overrides, seed, warmup)
                    for index in following:
                        queued |= self.queue(cell, self.probes.searched(candidate.overrides, index, warmup), [seed], stage=StageName.STABILITY)
        return queued

    @classmethod
    def worst_case(cls, plan: SearchPlan, name: str, explored: int) -> int:
        """In trials of the cell's own length: every chain's probes (2 + the grid's levels), for every finalist, baseline and the
        Pre-LN reference, seed of the confirmation and warm-up."""
        from blockforge.search.checks.stability_check import grid, probe_steps, warmups

        top = (Front if plan.costs else Confirm).top(plan)
        candidates = min(top + len(plan.baselines) + 1, explored + len(plan.baselines))
        probes = candidates * (plan.confirm.seeds + 1) * len(warmups(plan)) * (2 + grid(plan, name).levels)
        return math.ceil(probes * probe_steps(plan, name) / plan.settings[name].steps)

    @classmethod
    def rounds(cls, plan: SearchPlan) -> int:
        from blockforge.search.checks.stability_check import grid

        return 1 + max(grid(plan, name).levels for name in plan.cell_names())
