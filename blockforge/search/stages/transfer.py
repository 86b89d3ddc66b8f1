"""Transfer: a target cell waits for every proxy cell, then trains the predicted k, its neighbours and Pre-LN.

The prediction (search/checks/transfer.py: the decided law, else the nearest proxy's winner) is made once for every target,
in the background, when the last proxy cell is done (stages/predictions.py); each candidate k is then trained with
the transfer's paired seeds at the full budget.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from blockforge.search.config import MIX_LN_ALPHA, SearchPlan
from blockforge.search.records.ledger import StageName
from blockforge.search.stages.base import CellLike, Stage

if TYPE_CHECKING:
    from blockforge.search.stages.predictions import Predictions


def highest_k(plan: SearchPlan, depth: int) -> int:
    """The most Post-LN layers the searched alpha range reaches at `depth`."""
    from blockforge.spec.resolve import mix_ln_count

    alpha = next(d for d in plan.dimensions if d.key == MIX_LN_ALPHA)
    return mix_ln_count(max(v for v in alpha.args if isinstance(v, (int, float))), depth)


class Transfer(Stage):
    name = StageName.TRANSFER
    answers = False

    def __init__(self, plan: SearchPlan, predictions: "Predictions"):
        self.plan = plan
        self.predictions = predictions  # made once for every target
        self.started = False

    def open(self, cell: CellLike) -> bool | None:
        if self.started:
            return False
        if not cell.proxies_done() or not self.predictions.ready():
            return None  # waits
        self.started = True
        prediction = self.predictions.of(cell.name)
        if prediction is None:
            return False  # no proxy cell has a winner: nothing to test
        note = f"transfer: predicted {prediction.text()}"
        seeds = [cell.base_seed + i for i in range(self.plan.transfer.seeds)]
        queued = False
        for k in prediction.candidates(self.plan.transfer.neighbours, highest_k(self.plan, prediction.depth)):
            queued |= self.queue(cell, {MIX_LN_ALPHA: k / prediction.depth, **prediction.searched}, seeds, note=note, stage=StageName.TRANSFER)
        return queued

    @classmethod
    def worst_case(cls, plan: SearchPlan, name: str, explored: int) -> int:
        """The predicted k, `neighbours` on each side and Pre-LN: no more than the k that exist at the target's depth."""
        depth = plan.settings[name].depth
        return min(2 * plan.transfer.neighbours + 2, highest_k(plan, depth) + 1) * plan.transfer.seeds
