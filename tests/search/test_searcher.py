"""The searcher alone (no Ray, no training): budgets per cell and trial identities across versions."""

import dataclasses

from blockforge.search.config import load_search
from blockforge.search.records.ledger import Ledger
from blockforge.search.run.searcher import CellSearcher

from .conftest import drive, write_search


def test_cells_with_different_step_budgets_record_their_finished_trials_as_completed(tmp_path):
    plan = load_search(write_search(tmp_path, cells={"train.steps": [20, 30]}, trials_per_cell=3))
    assert {name: s.steps for name, s in plan.settings.items()} == {"steps=20": 20, "steps=30": 30}
    drive(CellSearcher(plan, str(tmp_path / "search")))
    records = Ledger(tmp_path / "search" / "trials.jsonl").records()
    trained = [r for r in records if r.status not in ("duplicate", "failed")]
    assert {r.cell for r in trained} == {"steps=20", "steps=30"}
    assert all(r.status == "completed" for r in trained), [(r.cell, r.status, r.steps) for r in trained]
    assert {r.steps for r in trained if r.cell == "steps=20"} == {20}


def test_a_search_resumed_after_a_spec_format_bump_still_deduplicates(tmp_path, monkeypatch):
    import blockforge.spec.recipe as recipe_module
    from blockforge.spec.model import SPEC_FORMAT

    # Two learning rates, both explored; then confirmation trains the better one with one more seed.
    search = write_search(tmp_path, cells={"model.depth": [4]}, space={"train.lr": {"choice": [1e-3, 2e-3]}}, baselines=[],
                          trials_per_cell=2, confirm={"top": 1, "seeds": 1})
    plan = load_search(search)
    first = CellSearcher(plan, str(tmp_path / "search"))
    assert len(drive(first, lambda config: 5.0 if "0.001" in str(config) else 6.0, limit=2)) == 2
    state = tmp_path / "searcher.pkl"
    first.save(str(state))  # the driver stops here, exploration done, confirmation not yet started

    # A newer blockforge writes its resolved specs in another format: the same models must keep their names, so
    # confirmation reuses the winner's explored run as its first seed instead of training it again.
    real = recipe_module.resolve
    monkeypatch.setattr(recipe_module, "resolve", lambda model: dataclasses.replace(real(model), format=SPEC_FORMAT + 1))
    resumed = CellSearcher(load_search(search), str(tmp_path / "search"))
    resumed.restore(str(state))
    handed = drive(resumed, trial_prefix="r")
    assert [(c["stage"], dict(c["overrides"])["train.seed"]) for c in handed] == [("confirm", 1)]
    records = Ledger(tmp_path / "search" / "trials.jsonl").records()
    assert sorted((r.overrides["train.lr"], r.seed) for r in records if r.status == "completed") == [(1e-3, 0), (1e-3, 1), (2e-3, 0)]


def test_a_search_whose_tune_state_is_lost_continues_from_its_ledger(tmp_path):
    """Without Ray Tune's saved state (damaged by a full disk, say), a searcher rebuilt from the ledger keeps every
    trial's number and outcome, trains nothing twice, continues a trial a stop interrupted, and ends as an
    undisturbed search would."""
    ALPHA = "model.layers.mix_ln.alpha"
    search = write_search(tmp_path, cells={"model.depth": [4]}, space={ALPHA: {"choice": [0.0, 0.25, 0.5, 0.75]}}, baselines=[],
                          trials_per_cell=4, scheduler=None, confirm={"top": 1, "seeds": 1})
    value = lambda config: 5.0 - dict(config["overrides"])[ALPHA]  # noqa: E731
    undisturbed = drive(CellSearcher(load_search(search), str(tmp_path / "whole")), value)

    first = CellSearcher(load_search(search), str(tmp_path / "search"))
    handed = drive(first, value, limit=2)
    assert len(handed) == 2
    assert first.suggest("running") is not None  # a third trial starts, and the driver stops while it runs
    Ledger(tmp_path / "search" / "trials.jsonl").mark_interrupted("stopped")

    rebuilt = CellSearcher(load_search(search), str(tmp_path / "search"), from_ledger=True)
    again = drive(rebuilt, value, trial_prefix="r")
    records = Ledger(tmp_path / "search" / "trials.jsonl").records()
    trained = [(r.stage, r.overrides[ALPHA], r.seed) for r in records if r.status == "completed"]
    assert len(trained) == len(set(trained)), trained  # nothing trained twice
    assert sorted(trained) == sorted((c["stage"], dict(c["overrides"])[ALPHA], dict(c["overrides"])["train.seed"]) for c in undisturbed)
    assert again[0]["number"] == 2  # the interrupted trial first, under its own number
    assert {r.trial for r in records} == set(range(len(records)))  # numbers neither repeated nor skipped
    assert rebuilt.suggest("after") == rebuilt.FINISHED


def test_tune_state_cut_short_is_found_before_tune_reads_it(tmp_path):
    import pickle

    from blockforge.search.run.driver import damaged_tune_state

    tune = tmp_path / "tune"
    tune.mkdir()
    assert damaged_tune_state(tune) is None  # nothing saved yet: nothing damaged
    (tune / "experiment_state-2026-01-01_00-00-00.json").write_text('{"trials": []}')
    (tune / "searcher-state-2026-01-01_00-00-00.pkl").write_bytes(pickle.dumps({"asked": {"depth=4": 3}}))
    (tune / "tuner.pkl").write_bytes(pickle.dumps({"a": 1}))
    (tune / "search_gen_state-2026-01-01_00-00-00.json").write_bytes(pickle.dumps({"counter": 3}))  # Tune's: a pickle named .json
    assert damaged_tune_state(tune) is None
    newer = tune / "experiment_state-2026-01-02_00-00-00.json"  # the newest state is the one Tune restores
    newer.write_text('{"trials": [{"id": "ab')
    assert damaged_tune_state(tune)[0] == newer
    newer.write_text('{"trials": []}')
    searcher = tune / "searcher-state-2026-01-02_00-00-00.pkl"
    searcher.write_bytes(pickle.dumps({"asked": {"depth=4": 3}})[:-5])
    assert damaged_tune_state(tune)[0] == searcher
