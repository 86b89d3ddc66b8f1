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


def by_hand(searcher, value_of):
    """Trials handed out and ended one by one, as Tune would with several slots: `take(id)` asks the searcher for a trial
    (its config, None while it has nothing to hand out); `finish(id)` ends that trial at its full budget with
    `value_of(config)`."""
    from blockforge.search.config import OBJECTIVE

    running = {}

    def take(trial_id):
        config = searcher.suggest(trial_id)
        if config is not None and config != searcher.FINISHED:
            running[trial_id] = config
        return config

    def finish(trial_id):
        config = running.pop(trial_id)
        searcher.on_trial_complete(trial_id, {OBJECTIVE: value_of(config), "val_loss": value_of(config), "step": 30})

    return take, finish


def test_a_free_slot_at_explorations_end_starts_the_baselines_confirmation_seeds_and_every_answer_stays(tmp_path):
    """Exploration's last trial still trains and a slot is free: the baselines' first further seed (which confirmation
    trains whatever the ranking) starts there, as the same trial (identity, seed) confirmation would queue later; the
    search trains the same replicates and gives the same answer as one that waited at the barrier."""
    from blockforge.search.config import OBJECTIVE
    from blockforge.search.reports.findings import Findings

    alpha = "model.layers.mix_ln.alpha"
    settings = dict(cells={"model.depth": [4]}, scheduler=None, trials_per_cell=3, sampler={"grid": {}}, space={alpha: {"grid": [0.0, 0.25, 0.5]}},
                    baselines=[{alpha: 0.0}, {alpha: 0.25}], confirm={"top": 1, "seeds": 2})
    value = lambda config: 5.0 + abs(dict(config["overrides"])[alpha] - 0.25) + 0.01 * dict(config["overrides"])["train.seed"]  # noqa: E731

    def finish(searcher, trial_id, config):
        searcher.on_trial_complete(trial_id, {OBJECTIVE: value(config), "val_loss": value(config), "step": 30})

    (tmp_path / "early").mkdir()
    plan = load_search(write_search(tmp_path / "early", **settings))
    searcher = CellSearcher(plan, str(tmp_path / "early" / "s"))
    explored = {i: searcher.suggest(i) for i in ("a", "b", "c")}  # two slots' worth and one more: every point of the grid
    assert all(c["stage"] == "explore" for c in explored.values())
    finish(searcher, "a", explored["a"])
    finish(searcher, "b", explored["b"])
    early = searcher.suggest("d")  # "c" still trains: the free slot takes the first baseline's further seed
    assert early is not None and early["stage"] == "confirm" and dict(early["overrides"])["train.seed"] == 1
    assert dict(early["overrides"])[alpha] in (0.0, 0.25)
    finish(searcher, "c", explored["c"])
    finish(searcher, "d", early)
    drive(searcher, value, trial_prefix="e")
    records = Ledger(tmp_path / "early" / "s" / "trials.jsonl").records()

    (tmp_path / "waited").mkdir()
    waited_plan = load_search(write_search(tmp_path / "waited", **settings))
    drive(CellSearcher(waited_plan, str(tmp_path / "waited" / "s")), value)  # one trial at a time: never a free slot
    waited = Ledger(tmp_path / "waited" / "s" / "trials.jsonl").records()

    trained = lambda rs: sorted((r.alpha, r.seed, str(r.stage)) for r in rs if r.status == "completed")  # noqa: E731 (each search its folder)
    assert trained(records) == trained(waited)
    assert Findings.of(plan, records).evidence["depth=4"].claim() == Findings.of(waited_plan, waited).evidence["depth=4"].claim()


def test_a_baselines_early_seed_still_training_holds_back_no_finalist_and_the_next_round_waits_for_every_seed(tmp_path):
    """Exploration has ended and only a baseline's early seed still trains: the ranking is known, so the finalists' seeds
    of round one start in the free slots rather than after it; who races on in round two is decided only once every
    seed of round one has ended; and the search trains the same replicates, with the same answer, as one run a trial at
    a time."""
    from blockforge.search.reports.findings import Findings

    alpha = "model.layers.mix_ln.alpha"
    settings = dict(cells={"model.depth": [4]}, scheduler=None, trials_per_cell=4, sampler={"grid": {}},
                    space={alpha: {"grid": [0.0, 0.25, 0.5, 0.75]}}, baselines=[{alpha: 0.0}], confirm={"top": 2, "seeds": 2})
    best = {0.0: 5.3, 0.25: 5.0, 0.5: 5.1, 0.75: 5.4}  # the finalists: 0.25 and 0.5, and the baseline Pre-LN (0.0)
    value = lambda config: best[dict(config["overrides"])[alpha]] + 0.01 * dict(config["overrides"])["train.seed"]  # noqa: E731
    (tmp_path / "slots").mkdir()
    plan = load_search(write_search(tmp_path / "slots", **settings))
    searcher = CellSearcher(plan, str(tmp_path / "slots" / "s"))
    take, finish = by_hand(searcher, value)
    seeded = lambda config: (dict(config["overrides"])[alpha], dict(config["overrides"])["train.seed"])  # noqa: E731
    for i in range(3):
        take(f"x{i}")
    finish("x0")
    finish("x1")
    take("x3")
    finish("x2")
    assert seeded(take("early")) == (0.0, 1)  # the baseline's first further seed, while exploration's last trial trains
    finish("x3")  # exploration has ended; the baseline's seed trains on
    round_one = [take("f0"), take("f1")]
    assert sorted(seeded(c) for c in round_one) == [(0.25, 1), (0.5, 1)]
    assert seeded(take("ahead")) == (0.0, 2)  # Pre-LN's seed of round two: it never leaves the race
    assert take("wait") is None  # the others of round two wait for round one's seeds, all of them
    for trial_id in ("f0", "early", "f1"):
        finish(trial_id)
        if trial_id != "f1":
            assert take("wait") is None
    assert seeded(take("s0")) == (0.25, 2)  # the leader's seed two: 0.5, clearly behind it on round one's seeds, left the race
    assert take("s1") is None
    finish("ahead")
    finish("s0")
    drive(searcher, value, trial_prefix="rest")
    records = Ledger(tmp_path / "slots" / "s" / "trials.jsonl").records()

    (tmp_path / "waited").mkdir()
    waited_plan = load_search(write_search(tmp_path / "waited", **settings))
    drive(CellSearcher(waited_plan, str(tmp_path / "waited" / "s")), value)  # one trial at a time: never a free slot
    waited = Ledger(tmp_path / "waited" / "s" / "trials.jsonl").records()

    trained = lambda rs: sorted((r.alpha, r.seed, str(r.stage)) for r in rs if r.status == "completed")  # noqa: E731
    assert trained(records) == trained(waited)
    assert Findings.of(plan, records).evidence["depth=4"].claim() == Findings.of(waited_plan, waited).evidence["depth=4"].claim()


def test_while_a_confirmation_rounds_last_trial_trains_pre_ln_starts_its_next_seed(tmp_path):
    """Pre-LN never leaves the race, so its seed of the next round is known while the round's last trial still trains: a
    free slot starts it, and the round after queues only what is left."""

    alpha = "model.layers.mix_ln.alpha"
    plan = load_search(write_search(tmp_path, cells={"model.depth": [4]}, scheduler=None, trials_per_cell=4, sampler={"grid": {}},
                                    space={alpha: {"grid": [0.0, 0.25, 0.5, 0.75]}}, baselines=[], confirm={"top": 2, "seeds": 2}))
    searcher = CellSearcher(plan, str(tmp_path / "s"))
    best = {0.0: 5.3, 0.25: 5.0, 0.5: 5.1, 0.75: 5.4}  # the two best are 0.25 and 0.5; Pre-LN (0.0) joins them as the reference
    value = lambda config: best[dict(config["overrides"])[alpha]] + 0.01 * dict(config["overrides"])["train.seed"]  # noqa: E731
    take, finish = by_hand(searcher, value)

    for i in range(4):  # exploration, one at a time
        take(f"x{i}")
        finish(f"x{i}")
    round_one = [take(f"r{i}") for i in range(3)]  # the two best and Pre-LN, seed 1
    assert all(c["stage"] == "confirm" and dict(c["overrides"])["train.seed"] == 1 for c in round_one)
    finish("r0")
    finish("r1")  # r2 still trains
    ahead = take("ahead")
    assert ahead is not None and dict(ahead["overrides"])[alpha] == 0.0 and dict(ahead["overrides"])["train.seed"] == 2
    finish("r2")
    finish("ahead")
    rest = [take(f"s{i}") for i in range(3)]
    handed = [dict(c["overrides"])[alpha] for c in rest if c not in (None, searcher.FINISHED)]
    assert 0.25 in handed and 0.0 not in handed  # the leader's seed 2 (0.5, clearly behind, left the race); Pre-LN's ran already
