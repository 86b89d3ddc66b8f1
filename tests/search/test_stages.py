"""Stages as objects: a new stage is one class and one line where pipelines are built. Here a trivial one,
defined in this test, retrains each cell's winner with one more seed after everything else: the searcher runs
it without knowing it, its trials are recorded and trained, and the compute plan counts them."""

import pytest

from blockforge.search.config import load_search
from blockforge.search.records.ledger import Ledger, StageName
from blockforge.search.reports.plan import search_plan
from blockforge.search.run.searcher import CellSearcher
from blockforge.search.stages import pipeline
from blockforge.search.stages.base import Stage

from .conftest import drive, write_search


class Recheck(Stage):
    """Once the cell is idle at the end: its best model so far, once more, with a seed no stage used."""

    name = StageName.CONFIRM  # its trials are replicates of a finalist
    label = "recheck"

    def __init__(self, plan):
        self.plan, self.done, self.heard = plan, False, []

    def open(self, cell):
        self.given = cell
        if self.done:
            return False
        self.done = True
        winner = cell.evidence(1).winner
        return winner is not None and self.queue(cell, winner.overrides, [cell.base_seed + 99], note="recheck")

    def on_complete(self, cell, trial, outcome):
        self.heard.append((trial.number, outcome.status))

    @classmethod
    def worst_case(cls, plan, name, explored):
        return 1


@pytest.fixture
def with_recheck(monkeypatch):
    monkeypatch.setattr(pipeline, "PROXY_STAGES", [*pipeline.PROXY_STAGES, (Recheck, lambda plan, name: True)])  # the one line


def test_a_stage_is_one_class_and_one_line_in_the_pipeline(tmp_path, with_recheck):
    plan = load_search(write_search(tmp_path, scheduler=None, confirm={"top": 1, "seeds": 1}))
    searcher = CellSearcher(plan, str(tmp_path / "s"))
    handed = drive(searcher, lambda c: 5.0 + dict(c["overrides"])["model.layers.mix_ln.alpha"])
    rechecked = [r for r in Ledger(tmp_path / "s" / "trials.jsonl").records() if r.note == "recheck"]
    assert {r.cell for r in rechecked} == set(plan.cell_names()) and all(r.seed == 99 and r.status == "completed" for r in rechecked)
    # Its trials are recorded as the confirmation's, and their outcomes come back to it, not to Confirm: it heard its own, only.
    assert all(r.stage == "confirm" for r in rechecked)
    for name, cell in searcher.cells.items():
        (recheck,) = [s for s in cell.stages if isinstance(s, Recheck)]
        # what it received of the cell: its finalists, a way to queue and what it reads; not the cell's bookkeeping
        assert recheck.given is cell.view and recheck.given.finalists is cell.finalists
        assert not any(hasattr(recheck.given, name) for name in ("queue", "waiting", "running", "asked", "context", "stages"))
        assert recheck.heard == [(r.trial, "completed") for r in rechecked if r.cell == name], name
    numbers = [(c["cell"], c["number"]) for c in handed]
    assert handed[-1]["cell"] in plan.cell_names() and len(set(numbers)) == len(numbers)  # each cell numbers its trials once
    for cell in search_plan(plan):
        assert cell.trials["recheck"] == 1 and list(cell.trials)[-1] == "recheck"


def test_every_stage_counts_its_own_worst_case():
    from blockforge.search.stages.base import Stage as Base

    for stage, _ in pipeline.PROXY_STAGES + pipeline.TARGET_STAGES:
        assert issubclass(stage, Base) and stage.worst_case is not Base.worst_case, stage
