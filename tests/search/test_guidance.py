"""Law-guided cells, racing that drops the clearly worse, and verdicts followed to longer training: driven the way Tune
drives a search (searcher and scheduler, no Ray, no training) along synthetic curves of known answer."""

import hashlib
import math
import random

import pytest

from blockforge.cli import main
from blockforge.search.config import load_search
from blockforge.search.evidence.evidence import Candidate, evidence_by_cell
from blockforge.search.records.ledger import Ledger
from blockforge.search.reports.report import write_reports
from blockforge.search.run.searcher import CellSearcher
from blockforge.search.stages.confirm import race_drops

from .conftest import drive_curves, write_search
from .test_golden import NoScheduler

ALPHA = "model.layers.mix_ln.alpha"
DEPTHS = [4, 6, 8, 12, 16]


def _unit(*parts) -> random.Random:
    return random.Random(int(hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:12], 16))


def law_curves(plan, best_k=lambda depth: round(0.2 * depth), shrink: float = 0.0):
    """A cell's loss is lowest at best_k(depth) Post-LN layers (quadratic around it), with a per-seed offset every model of
    that seed shares and a little noise of its own; trained longer, every model gets better and the gap between models
    is multiplied by (1 - shrink) per doubling of the steps."""
    def curve(config):
        recipe = plan.recipe([tuple(pair) for pair in config["overrides"]])
        depth, k, seed, steps = recipe.spec.depth, recipe.spec.post_ln_count(), recipe.train.seed, recipe.train.steps
        doublings = math.log2(steps / plan.settings[config["cell"]].steps)
        gap = (0.04 * (k - best_k(depth)) ** 2 - 0.04 * best_k(depth) ** 2 * (k > 0)) * (1 - shrink) ** doublings
        final = 5.9 - 0.1 * doublings + gap + _unit("seed", depth, seed).gauss(0, 0.03) + _unit("own", depth, k, seed, steps).gauss(0, 0.004)
        every = recipe.train.eval_every or steps
        return {step: final + 0.5 * (1 - step / steps) for step in range(every, steps + 1, every)}
    return curve


def grid(tmp_path, **changes):
    settings = dict(cells={"model.depth": DEPTHS}, space={ALPHA: {"uniform": [0.0, 0.5]}}, trials_per_cell=9,
                    baselines=[{ALPHA: 0.0}], confirm={"top": 2, "seeds": 2}, scheduler=None,
                    overrides={"train.steps": 40, "train.eval_every": 20})
    settings.update(changes)
    tmp_path.mkdir(parents=True, exist_ok=True)
    return load_search(write_search(tmp_path, **settings))


def explored(records, cell) -> list[int]:
    return sorted({r.post_ln_layers for r in records if r.cell == cell and r.stage == "explore" and r.status == "completed"})


def drive(plan, folder, curve, **kwargs):
    searcher = CellSearcher(plan, folder)
    handed = drive_curves(searcher, NoScheduler(), curve, limit=5000, **kwargs)
    return searcher, handed, Ledger(folder / "trials.jsonl").records()


def test_later_cells_explore_the_window_the_law_predicts_and_answer_with_their_own_seeds(tmp_path):
    unguided = grid(tmp_path / "u")
    guided = grid(tmp_path / "g", guide={"after": 3})
    assert guided.order == ["depth=4", "depth=6", "depth=8", "depth=12", "depth=16"]  # cheapest trial first
    _, handed_u, records_u = drive(unguided, tmp_path / "u" / "s", law_curves(unguided))
    searcher, handed_g, records_g = drive(guided, tmp_path / "g" / "s", law_curves(guided))
    # The first three explore every k; each later one the k the laws fitted to the cells before it predict (every law within
    # 2 AICc of the best), one more on each side, and Pre-LN.
    for cell in guided.guide_cells():
        assert explored(records_g, cell) == explored(records_u, cell)
    assert explored(records_g, "depth=12") == [0, 1, 2, 3] and explored(records_g, "depth=16") == [0, 1, 2, 3, 4]
    assert len(handed_g) < len(handed_u)
    evidence_u, evidence_g = evidence_by_cell(unguided, records_u), evidence_by_cell(guided, records_g)
    for cell in guided.cell_names():  # the same answers, from each cell's own seeds
        assert evidence_g[cell].winner.post_ln_layers == evidence_u[cell].winner.post_ln_layers
        assert evidence_g[cell].winner.n == 3
    summary = (write_reports(tmp_path / "g" / "s", guided, Ledger(tmp_path / "g" / "s" / "trials.jsonl")), (tmp_path / "g" / "s" / "summary.md").read_text())[1]
    line = next(line for line in summary.splitlines() if line.startswith("- depth=16: the law predicted"))
    assert "k 2-3 of 16" in line and "never trained: 5, 6, 7, 8" in line and "the window did not grow" in line
    assert "seed resamples of depth=4, depth=6, depth=8, depth=12" in line  # every cell before it


def test_a_cell_that_breaks_the_law_is_found_by_the_window_growing(tmp_path):
    plan = grid(tmp_path, guide={"after": 3})
    breaks = lambda depth: 7 if depth == 16 else round(0.2 * depth)  # noqa: E731
    searcher, _, records = drive(plan, tmp_path / "s", law_curves(plan, breaks))
    assert explored(records, "depth=16") == list(range(9))  # predicted 2-3: grew from the window's edge to 7, and one past it
    assert evidence_by_cell(plan, records)["depth=16"].winner.post_ln_layers == 7
    write_reports(tmp_path / "s", plan, Ledger(tmp_path / "s" / "trials.jsonl"))
    assert "the window grew to k 5, 6, 7, 8" in (tmp_path / "s" / "summary.md").read_text()


def test_a_guided_search_killed_and_rebuilt_from_its_ledger_keeps_every_decision(tmp_path):
    plan = grid(tmp_path, guide={"after": 3})
    curve = law_curves(plan, lambda depth: 7 if depth == 16 else round(0.2 * depth))
    _, whole, _ = drive(plan, tmp_path / "whole", curve)
    first = CellSearcher(plan, tmp_path / "cut")
    drive_curves(first, NoScheduler(), curve, limit=5000, stop_after=lambda handed: len(handed) >= len(whole) - 12)  # mid-growth
    in_flight = first.suggest("killed")  # handed out, and killed while it trains: a guided cell's exploration trial
    assert (in_flight["cell"], in_flight["stage"]) == ("depth=16", "explore")
    assert [r.trial for r in Ledger(tmp_path / "cut" / "trials.jsonl").mark_interrupted("stopped")] == [in_flight["number"]]
    again = CellSearcher(plan, tmp_path / "cut", from_ledger=True)
    handed = drive_curves(again, NoScheduler(), curve, limit=5000)
    assert handed[0]["identity"] == in_flight["identity"] and handed[0]["number"] == in_flight["number"]  # taken up first, as itself
    trained = lambda folder: sorted((r.cell, r.stage, r.status, r.post_ln_layers, r.seed) for r in Ledger(folder / "trials.jsonl").records())  # noqa: E731
    assert trained(tmp_path / "cut") == trained(tmp_path / "whole")  # the same models and seeds trained, the window grown alike


def test_the_plan_gives_the_guided_and_the_unguided_worst_case(tmp_path, capsys):
    path = write_search(tmp_path, cells={"model.depth": DEPTHS}, space={ALPHA: {"uniform": [0.0, 0.5]}}, trials_per_cell=9,
                        baselines=[{ALPHA: 0.0}], confirm={"top": 2, "seeds": 2}, scheduler=None, guide={"after": 3})
    assert main(["search", str(path), "--plan"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("depth=16"))
    assert row.split()[4] == "5"  # explore: Pre-LN, the baseline, and a window of one k with one on each side (it is Pre-LN too)
    assert "the first 3 at once, then each after the cells before it" in out and "if every window grew to its cell's whole range" in out


@pytest.mark.parametrize("change,needle", [
    ({"cells": {"model.depth": [4, 6, 8]}, "guide": {"after": 3}}, "guide.after: guides later cells by the first 3 answered ones, and this search has 3"),
    ({"guide": {"after": 1}}, "guide.after: must be a whole number of at least 2"),
    ({"guide": {"after": 3, "margin": -1}}, "guide.margin"),
    ({"guide": {"after": 3}, "space": {ALPHA: {"uniform": [0.0, 0.5]}, "train.lr": {"loguniform": [1e-3, 1e-2]}},
      "baselines": [{ALPHA: 0.0, "train.lr": 3e-3}]}, "train.lr is a range"),
    ({"guide": {"after": 3}, "confirm": None}, "guide: is fitted to answered cells"),
    ({"confirm": {"top": 1, "seeds": 2, "length": {"factors": [1]}}}, "confirm.length.factors[0]: must be a number above 1"),
    ({"confirm": {"top": 1, "seeds": 2, "length": {"factors": [1.5]}}, "overrides": {"train.steps": 25}}, "not a whole number of steps"),
    ({"confirm": {"top": 1, "seeds": 2, "length": {"factors": [2]}}, "space": {ALPHA: {"uniform": [0.0, 0.5]}, "train.steps": {"choice": [20, 40]}},
      "baselines": [{ALPHA: 0.0, "train.steps": 40}]},
     "confirm.length: continues finalists to multiples of the steps, and train.steps varies here already"),
    ({"confirm": {"top": 1, "seeds": 2, "length": {"factors": [2, 1e7]}}}, "continued to 1e+07x its steps trains"),
    ({"cells": {"model.depth": [2, 4], "train.steps": [30]}, "transfer": {"to": [{"model.depth": 4, "train.steps": 10 ** 14}]}},
     "transfer.to: transfer target depth=4,steps=100000000000000 trains 100,000,000,000,000 steps"),
])
def test_guidance_and_length_refuse_what_they_cannot_do_in_one_sentence(tmp_path, capsys, change, needle):
    settings = dict(cells={"model.depth": DEPTHS}, space={ALPHA: {"uniform": [0.0, 0.5]}}, baselines=[{ALPHA: 0.0}],
                    confirm={"top": 2, "seeds": 2}, scheduler=None)
    settings.update(change)
    assert main(["search", str(write_search(tmp_path, **settings)), "--plan"]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def candidate(model: str, values: dict, uniform_pre: bool = False) -> Candidate:
    return Candidate(model, {}, None, None, uniform_pre, values=dict(values))


def test_a_finalist_leaves_the_race_only_when_a_bonferroni_corrected_paired_interval_puts_it_behind(tmp_path):
    plan = grid(tmp_path, confirm={"top": 2, "seeds": 4})  # 3 looks: each at 1 - 0.05/3
    leader = candidate("leader", {0: 5.0, 1: 5.1, 2: 5.05})
    far = candidate("far", {0: 5.50, 1: 5.61, 2: 5.54})  # behind by ~0.5 with little spread: out
    near = candidate("near", {0: 5.07, 1: 5.20, 2: 5.18})  # behind by 0.1 (sd 0.03): at 95% its interval excludes zero; corrected, not
    pre = candidate("pre", {0: 6.0, 1: 6.1, 2: 6.05}, uniform_pre=True)  # far behind, but the reference stays
    drops = race_drops([leader, far, near, pre], [0, 1, 2], plan)
    assert set(drops) == {"far"} and drops["far"][0] is leader
    from blockforge.search.evidence.evidence import paired_difference

    assert paired_difference(near.values, leader.values).excludes_zero()  # what an uncorrected look would have dropped


def test_racing_drops_a_clearly_worse_finalist_before_its_last_seed_and_the_summary_names_the_test(tmp_path):
    plan = grid(tmp_path, cells={"model.depth": [8]}, confirm={"top": 3, "seeds": 4})
    _, _, records = drive(plan, tmp_path / "s", law_curves(plan))
    evidence = evidence_by_cell(plan, records)["depth=8"]
    counts = {c.post_ln_layers: c.n for c in evidence.candidates if c.n > 1}
    assert counts[0] == 5 and counts[evidence.winner.post_ln_layers] == 5  # the reference and the leader keep every seed
    left = min(counts.values())
    assert left < 5  # a finalist clearly behind left before the last seed (with 1 df at two seeds, only a huge gap would)
    write_reports(tmp_path / "s", plan, Ledger(tmp_path / "s" / "trials.jsonl"))
    summary = (tmp_path / "s" / "summary.md").read_text()
    assert "sequential paired t-test against the leader before each further seed, Bonferroni" in summary
    assert f"left the race after {left} seeds" in summary


def length_grid(tmp_path, until_stable=True, factors=(2, 4)):
    return grid(tmp_path, cells={"model.depth": [8]}, confirm={"top": 1, "seeds": 2, "length": {"factors": list(factors), "until_stable": until_stable}})


@pytest.mark.parametrize("shrink,outcomes", [
    (0.0, ["holds", "not trained"]),  # stable at twice the steps: four times is not trained
    (1.0, ["shrinks to a tie", "shrinks to a tie"]),  # the gap is gone at twice the steps, and stays gone (each against the proxy)
    (2.0, ["flips", "holds"]),  # the gap changes sign with each doubling: Pre-LN ahead at 2x, behind again at 4x
])
def test_verdicts_follow_the_training_length(tmp_path, shrink, outcomes):
    plan = length_grid(tmp_path)
    _, handed, records = drive(plan, tmp_path / "s", law_curves(plan, shrink=shrink))
    longer = [c for c in handed if c["stage"] == "length"]
    assert all(c["continues"].startswith("trials/depth=8/") for c in longer)  # each continues a run of the search
    assert {dict(c["overrides"])["train.steps"] for c in longer} == ({80} if outcomes[-1] == "not trained" else {80, 160})
    assert len(longer) == 2 * 3 * (1 if outcomes[-1] == "not trained" else 2)  # the pair, on the confirmation's three seeds
    write_reports(tmp_path / "s", plan, Ledger(tmp_path / "s" / "trials.jsonl"))
    from blockforge.search.reports.findings import Findings

    check = Findings.of(plan, Ledger(tmp_path / "s" / "trials.jsonl").records()).lengths["depth=8"]
    assert [s.outcome for s in check.steps] == outcomes
    summary = (tmp_path / "s" / "summary.md").read_text()
    assert "## Verdicts at longer training" in summary and f"80 steps: {check.steps[0].verdict}" in summary
    assert evidence_by_cell(plan, Ledger(tmp_path / "s" / "trials.jsonl").records())["depth=8"].winner.n == 3  # the main answer stays the proxy's


def test_a_length_check_cut_by_a_kill_is_taken_up_from_the_ledger(tmp_path):
    plan = length_grid(tmp_path / "whole", until_stable=False)
    curve = law_curves(plan, shrink=0.5)
    _, whole, _ = drive(plan, tmp_path / "whole" / "s", curve)
    cut = length_grid(tmp_path / "cut", until_stable=False)
    first = CellSearcher(cut, tmp_path / "cut" / "s")
    drive_curves(first, NoScheduler(), law_curves(cut, shrink=0.5), limit=5000, stop_after=lambda handed: handed[-1]["stage"] == "length")
    again = CellSearcher(cut, tmp_path / "cut" / "s", from_ledger=True)
    drive_curves(again, NoScheduler(), law_curves(cut, shrink=0.5), limit=5000)
    trained = lambda folder: sorted((r.stage, r.status, r.post_ln_layers, r.seed, r.steps) for r in Ledger(folder / "trials.jsonl").records())  # noqa: E731
    assert trained(tmp_path / "cut" / "s") == trained(tmp_path / "whole" / "s")


def test_the_plan_counts_the_length_check(tmp_path, capsys):
    path = write_search(tmp_path, cells={"model.depth": [8]}, space={ALPHA: {"uniform": [0.0, 0.5]}}, baselines=[{ALPHA: 0.0}],
                        scheduler=None, confirm={"top": 1, "seeds": 2, "length": {"factors": [2, 4]}})
    assert main(["search", str(path), "--plan"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("cell"))
    row = next(line for line in out.splitlines() if line.startswith("depth=8"))
    assert "length" in header.split() and row.split()[header.split().index("length")] == str(2 * 3 * 3)  # 3 new lengths' worth of steps
    assert "continuations counted in trials of the cell's own length" in out


@pytest.mark.slow
def test_a_trained_guided_search_continues_its_pair_to_longer_training_from_their_checkpoints(tmp_path, ray_session):
    import json

    from blockforge.search.run.driver import run_search

    path = write_search(tmp_path, cells={"model.depth": [2, 3, 4, 6]}, space={ALPHA: {"uniform": [0.0, 0.5]}}, trials_per_cell=4,
                        baselines=[{ALPHA: 0.0}], scheduler=None, max_concurrent=1, guide={"after": 3},
                        confirm={"top": 2, "seeds": 1, "length": {"factors": [2], "until_stable": False}},
                        overrides={"train.steps": 20, "train.eval_every": 10, "train.checkpoint_every": 10})
    outcome = run_search(path, out=tmp_path / "out", progress_every_s=100)
    records = outcome.records
    assert {r.status for r in records} <= {"completed", "duplicate"}
    longer = [r for r in records if r.stage == "length" and r.status == "completed"]
    assert {r.steps for r in longer} == {40} and len(longer) == 4 * 2 * 2  # every cell, the pair, two seeds
    for r in longer:  # each continued from the checkpoint its 20-step run ended at
        attempts = [json.loads(line) for line in (tmp_path / "out" / r.run_dir.split("/out/")[1] / "attempts.jsonl").read_text().splitlines()]
        assert attempts[0]["start_step"] == 20
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "## Law-guided cells" in summary and "- depth=6: the law predicted" in summary
    assert "## Verdicts at longer training" in summary and "40 steps:" in summary
