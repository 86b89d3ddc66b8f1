"""The learning-rate curves (`confirm: {lr_curve: {...}}`, or `confirm.lr` / `confirm.stability`): once a cell has its
answer, each of its finalists, baselines and the Pre-LN reference is trained over the cell's learning-rate grid, per seed
of the confirmation and per warm-up fraction (search/checks/lr_curve.py says how). Every time the cell is idle, each
chain's next probes are queued: the points up to the search's learning rate at once, then a step up the grid or a
bisection step at a time; once the curves have begun, a chain goes on in a free slot as soon as its own probes have ended. Its trials are recorded with stage `lr` and stay out of the cell's main
evidence; what a chain has found is read back from its probes' identities, so a resumed driver goes on where the chains
were.
"""

from __future__ import annotations

import math

from blockforge.search.config import SearchPlan
from blockforge.search.records.ledger import StageName
from blockforge.search.stages.base import CellLike, Stage
from blockforge.search.stages.confirm import Confirm, Front


class LrCurve(Stage):
    name = StageName.LR
    label = "lr curve"
    answers = False

    def __init__(self, plan: SearchPlan):
        self.plan = plan
        self.probes = None  # lr_curve.Probes of the cell, made when first opened (its identities computed once)

    def __getstate__(self) -> dict:  # Tune pickles the searcher: the identities are recomputed on restore
        return {**self.__dict__, "probes": None}

    def early(self, cell: CellLike) -> bool:
        """Once the curves have begun, a chain whose probes so far have ended goes on in a free slot while others still
        train: each chain's next probe depends on its own probes only."""
        return getattr(self, "opened", False) and self.open(cell)

    def open(self, cell: CellLike) -> bool:
        from blockforge.search.checks.lr_curve import Probes, probed, warmups
        from blockforge.search.evidence.evidence import min_seeds

        self.opened = True
        if self.probes is None:
            self.probes = Probes(self.plan, cell.name, lambda identity: getattr(cell.done.get(identity), "record", None))
        queued = False
        for candidate in probed(self.plan, cell.evidence(min_seeds(self.plan))):
            for warmup in warmups(self.plan):
                floor = self.probes.floor(candidate.overrides, warmup)
                for seed in self.probes.seeds:
                    following, _ = self.probes.chain(candidate.overrides, seed, warmup, floor)
                    for index in following:
                        queued |= self.queue(cell, self.probes.searched(candidate.overrides, index, warmup), [seed], stage=StageName.LR)
        return queued

    @classmethod
    def worst_case(cls, plan: SearchPlan, name: str, explored: int) -> int:
        """In trials of the cell's own length: every chain's probes (each coarse point from as far down as the curve may grow
        to lr_max, and the bisection between two of them), for every finalist, baseline and the Pre-LN reference, seed of
        the confirmation and warm-up."""
        from blockforge.search.checks.lr_curve import grid, probe_steps, warmups

        top = (Front if plan.costs else Confirm).top(plan)
        candidates = min(top + len(plan.baselines) + 1, explored + len(plan.baselines))
        return math.ceil(candidates * (plan.confirm.seeds + 1) * len(warmups(plan)) * chain_probes(grid(plan, name))
                         * probe_steps(plan, name) / plan.settings[name].steps)

    @classmethod
    def rounds(cls, plan: SearchPlan) -> int:
        from blockforge.search.checks.lr_curve import grid

        return max(chain_rounds(grid(plan, name)) for name in plan.cell_names())


def chain_probes(grid) -> int:
    """The most probes one chain trains: every coarse point from its lowest possible to lr_max, and a bisection."""
    return (grid.top - grid.floor) // grid.every + 1 + math.ceil(math.log2(grid.every))


def chain_rounds(grid) -> int:
    """The most rounds one chain waits through: the points up to the search's learning rate, each coarse step up and each
    step down the curve may grow, and the bisection."""
    return 1 + grid.top // grid.every + grid.below + math.ceil(math.log2(grid.every))
