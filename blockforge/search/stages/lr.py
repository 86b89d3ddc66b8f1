"""The learning-rate check (`confirm: {lr: {grid: [...]}}`): every finalist, the Pre-LN reference among them, is also
trained at each learning rate of the grid with the confirmation's seeds, so that findings.LrCheck can give the
verdict at each candidate's own best learning rate beside the verdict at the shared one. Its trials are recorded
with stage `lr` and stay out of the cell's main evidence (which compares models at the shared learning rate).
"""

from __future__ import annotations

from blockforge.search.config import SearchPlan
from blockforge.search.records.ledger import StageName
from blockforge.search.stages.base import CellLike, Stage
from blockforge.search.stages.confirm import Confirm, Front
from blockforge.spec.search import LR_KEY


class LrSweep(Stage):
    name = StageName.LR
    answers = False

    def __init__(self, plan: SearchPlan):
        self.plan = plan
        self.opened = False

    def open(self, cell: CellLike) -> bool:
        if self.opened:
            return False
        self.opened = True
        shared = self.plan.shared_lr(cell.name)
        seeds = [cell.base_seed + i for i in range(self.plan.confirm.seeds + 1)]
        queued = False
        for finalist in cell.finalists.racing():  # a finalist that left confirmation's race is not checked further
            for lr in self.plan.confirm.lr.grid:
                if lr != shared:  # the confirmation trained it there
                    queued |= self.queue(cell, {**finalist.searched, LR_KEY: lr}, seeds, stage=StageName.LR)
        return queued

    @classmethod
    def worst_case(cls, plan: SearchPlan, name: str, explored: int) -> int:
        top = (Front if plan.costs else Confirm).top(plan)
        finalists = min(top + len(plan.baselines) + 1, explored + len(plan.baselines))
        other = sum(lr != plan.shared_lr(name) for lr in plan.confirm.lr.grid)
        return finalists * other * (plan.confirm.seeds + 1)
