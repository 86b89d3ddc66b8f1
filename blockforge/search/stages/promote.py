"""Promotion: a pruned exploration trial that the full-budget curves say could have ended ahead is brought back.

When the cell is idle after confirmation, every pruned exploration trial that was behind the best full-budget
curve of its seed, where it was stopped, by no more than those curves were overtaken by there continues from its
checkpoint to the full budget and becomes a finalist with the confirmation's seeds. Why it was promoted is a field
of its records (`promoted`), so a search rebuilt from its ledger keeps the decision.
"""

from __future__ import annotations

from blockforge.search.config import SearchPlan
from blockforge.search.records.ledger import StageName
from blockforge.search.stages.base import CellLike, Finalist, Stage, promoted_before

PROMOTION_RULE = """Confirmation trains several models of each cell to the full budget with the same seeds; their curves
show how far the ranking at an early step agrees with the final one (Kendall tau, mean over seeds) and
which pairs cross (behind there, ahead at the end). A pruned trial that was behind by no more than such
a crossing may have ended ahead: it is promoted to a full-budget run before the cell's answer."""


class Promote(Stage):
    name = StageName.PROMOTION

    def __init__(self, plan: SearchPlan):
        self.plan = plan
        self.resumed = False

    def open(self, cell: CellLike) -> bool:
        if self.plan.confirm is None and not self.resumed:  # no confirmation took them back in: models promoted before this driver
            self.resumed = True
            queued = False
            for f in promoted_before(cell):
                queued |= self.queue(cell, f.searched, [cell.base_seed], note=f.note, promoted=f.promoted)
            if queued:
                return True
        from blockforge.search.evidence.rungs import pruned_checks

        records = cell.records()
        checks = [c for c in pruned_checks(records, cell.name, self.plan.metric, self.plan.mode) if c.inside]
        finalists, queued = cell.finalists, False
        for check in checks:
            if check.model in finalists.promoted:
                continue
            record = cell.latest[check.trial]
            why = (f"promoted: pruned at step {check.step} {check.margin:.3g} behind the best full-budget curve of its seed, "
                   f"inside the {check.crossing:.3g} by which full-budget curves were overtaken there")
            finalists.promote(Finalist(dict(record.overrides), check.model, record.uniform_pre, note=why, promoted=why))
            queued |= self.queue(cell, dict(record.overrides), finalists.seeds(cell.base_seed), note=why, promoted=why)  # as many as the finalists have
        return queued

    @classmethod
    def worst_case(cls, plan: SearchPlan, name: str, explored: int) -> int:
        return explored * (1 + (plan.confirm.seeds if plan.confirm else 0))
