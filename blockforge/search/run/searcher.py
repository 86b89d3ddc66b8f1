"""The Ray Tune Searcher of a blockforge search: Tune's calls handed to the cells.

Each cell (search/stages/cell.py) runs its own pipeline of stages (search/stages/). The searcher hands out trials
round-robin across the cells that have one, so a cluster works on every cell at once, and routes each result
and each end to the cell the trial belongs to. Nothing here reads the ledger after the start: the cells hold
what they need. CellScheduler (search/run/scheduler.py) is the per-cell guarded ASHA beside it.
"""

from __future__ import annotations

from pathlib import Path

from ray.tune.search import Searcher

from blockforge.search.config import OBJECTIVE, SearchPlan
from blockforge.search.records.ledger import Ledger
from blockforge.search.records.store import SearchStore
from blockforge.search.stages.cell import Cell, SearchContext
from blockforge.search.stages.explore import FREE_ASKS_IN_A_ROW
from blockforge.search.stages.guidance import Guidance
from blockforge.search.stages.pipeline import build_stages
from blockforge.search.stages.predictions import Predictions


class CellSearcher(Searcher):
    """Per cell: exploration, then confirmation, promotion and racing as the plan has them; transfer targets after."""

    def __init__(self, plan: SearchPlan, search: SearchStore | str | Path, *, from_ledger: bool = False):
        """search: the search folder (a local path, or a SearchStore: where it is kept).
        from_ledger: continue the search the ledger records (when Ray Tune's own saved state is missing or
        damaged): its trials keep their numbers and outcomes, the samplers learn what they found, and the
        first points (baselines, enumerations) not yet tried come first, after the trials a stop interrupted."""
        super().__init__(metric=OBJECTIVE, mode=plan.mode)
        store = SearchStore.of(search)
        ledger = store.attach(Ledger(store.local / "trials.jsonl"))  # read once, here
        records = ledger.records() if from_ledger else []
        self.context = SearchContext(plan, store, ledger)
        self.context.predictions = Predictions(self.context)
        self.context.guidance = Guidance(self.context)
        for index, name in enumerate(plan.all_names()):
            self.context.cells[name] = Cell(self.context, name, build_stages(self.context, name, index, records), records)
        self.turn = 0
        if from_ledger:
            self._take_in(records)

    @property
    def plan(self) -> SearchPlan:
        return self.context.plan

    @property
    def search_dir(self) -> str:
        return self.context.search_dir

    @property
    def ledger(self) -> Ledger:
        return self.context.ledger

    @property
    def live(self) -> dict:
        """Tune trial id -> the Trial it runs."""
        return self.context.live

    @property
    def cells(self) -> dict[str, Cell]:
        return self.context.cells

    # ---- Tune's Searcher interface ------------------------------------------------------------

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True  # everything comes from the plan

    def suggest(self, trial_id: str) -> dict | None:
        cells = list(self.cells.values())
        for _ in range(len(cells) * (FREE_ASKS_IN_A_ROW + 2)):
            ready = [cell for cell in cells if cell.ready()]
            if not ready:
                return Searcher.FINISHED if all(cell.finished for cell in cells) else None
            cell = cells[self.turn % len(cells)]
            self.turn += 1
            if cell not in ready:
                continue
            config = cell.next(trial_id)
            if config is not None:
                return config
        return None  # only free proposals this time: Tune asks again

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        trial = self.live.get(trial_id)
        if trial is not None:
            cell = self.cells[trial.cell]
            stage = cell.stage_of(trial)
            stage.on_result(cell.given_to(stage), trial, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        trial = self.live.pop(trial_id, None)
        if trial is not None:
            self.cells[trial.cell].finish(trial_id, trial, result or {}, error)

    def save(self, checkpoint_path: str) -> None:
        import pickle

        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.__dict__, f)

    def restore(self, checkpoint_path: str) -> None:
        import pickle

        with open(checkpoint_path, "rb") as f:
            self.__dict__.update(pickle.load(f))
        self.context.store = store = self.context.store.rebound()  # saved elsewhere (a moved folder, another machine): here
        self.context.ledger = store.attach(Ledger(store.local / "trials.jsonl"))
        records = self.ledger.records()
        for cell in self.cells.values():
            cell.latest = {r.trial: r for r in records if r.cell == cell.name}
        self._take_in(records)

    def _take_in(self, records: list) -> None:
        """Take in what the ledger recorded after the state this searcher started from was saved (Tune saves it every
        few seconds, the ledger is written at once); see Cell.take_in."""
        for record in records:
            cell = self.cells.get(record.cell)
            if cell is not None:
                cell.take_in(record)
