"""The two proxies a verdict rests on beyond its cell's size: training length (a transfer target that only trains
longer) and the learning rate (the finalists over a grid, confirm.lr): each gets its verdict, said plainly."""

import json
import math
from pathlib import Path

from blockforge.search.checks.lr_check import lr_check
from blockforge.search.config import load_search
from blockforge.search.evidence.evidence import cell_evidence
from blockforge.search.records.ledger import Ledger, TrialRecord
from blockforge.search.reports.findings import Findings
from blockforge.search.reports.plan import search_plan
from blockforge.search.reports.report import write_reports
from blockforge.search.run.searcher import CellSearcher

from .conftest import drive, write_search

ALPHA = "model.layers.mix_ln.alpha"
GRID = [0.0015, 0.003, 0.006]


def lr_search(tmp_path, **changes):
    settings = dict(cells={"model.depth": [4]}, scheduler=None, confirm={"top": 1, "seeds": 2, "lr": {"grid": GRID}},
                    space={ALPHA: {"grid": [0.0, 0.25, 0.5]}}, sampler={"grid": {}}, trials_per_cell=3, baselines=[])
    settings.update(changes)
    tmp_path.mkdir(parents=True, exist_ok=True)
    return load_search(write_search(tmp_path, **settings))


def value(config, best_lr_of=lambda k: 0.003):
    """k=1 of 4 is best at the shared lr; every model is best at `best_lr_of(k)`."""
    overrides = dict(config["overrides"])
    k, lr, seed = round(overrides[ALPHA] * 4), overrides.get("train.lr", 0.003), overrides["train.seed"]
    return 5.0 + 0.1 * abs(k - 1) + 0.3 * math.log(lr / best_lr_of(k)) ** 2 + 0.01 * seed + 0.002 * ((seed * 7 + k) % 3)


def test_the_lr_grid_trains_every_finalist_over_it_with_the_confirmations_seeds_and_the_plan_counts_it(tmp_path):
    plan = lr_search(tmp_path)
    (cell,) = search_plan(plan)
    finalists = min(1 + 0 + 1, 3 + 0)  # top 1, no baselines, Pre-LN
    assert cell.trials["lr"] == finalists * 2 * 3  # two learning rates besides the shared one, three seeds each
    drive(CellSearcher(plan, str(tmp_path / "s")), value)
    records = Ledger(tmp_path / "s" / "trials.jsonl").records()
    swept = [r for r in records if r.stage == "lr"]
    assert {(r.post_ln_layers, r.overrides["train.lr"], r.seed) for r in swept} == {(k, lr, s) for k in (0, 1) for lr in (0.0015, 0.006) for s in (0, 1, 2)}
    evidence = Findings.of(plan, records).evidence["depth=4"]
    assert evidence.winner.post_ln_layers == 1 and "train.lr" not in evidence.winner.overrides  # the grid stays out of the answer
    summary = write_reports(tmp_path / "s", plan, Ledger(tmp_path / "s" / "trials.jsonl"))
    assert "depth=4: lr-robust: better at the shared lr 0.003" in summary
    assert "measured at 30 steps" in (tmp_path / "s" / "summary.md").read_text()
    assert (tmp_path / "s" / "lr_check.png").stat().st_size > 0 and "`lr_check.png`" in (tmp_path / "s" / "summary.md").read_text()


def records_of(plan, value_of) -> list[TrialRecord]:
    """Full-budget records of k=0 and k=1 at every learning rate of the grid, seeds 0..2, valued by `value_of(k, lr, seed)`."""
    out, number = [], 0
    for k in (0, 1):
        for lr in GRID:
            for seed in range(3):
                searched = {ALPHA: k / 4} if lr == 0.003 else {ALPHA: k / 4, "train.lr": lr}
                out.append(TrialRecord(cell="depth=4", trial=number, status="completed", stage="confirm" if lr == 0.003 else "lr", seed=seed,
                                       model=f"k{k}", uniform_pre=k == 0, identity=f"k{k}-{lr}-{seed}", overrides=searched, alpha=k / 4,
                                       post_ln_layers=k, steps=30, value=value_of(k, lr, seed)))
                number += 1
    return out


def test_a_verdict_that_changes_with_the_learning_rate_is_not_lr_robust_and_names_it(tmp_path):
    plan = lr_search(tmp_path)
    # At the shared 0.003, k=1 beats Pre-LN clearly; Pre-LN at its own best (0.006) is as good as k=1 at its best.
    table = {(1, 0.0015): 5.30, (1, 0.003): 5.00, (1, 0.006): 5.20, (0, 0.0015): 5.60, (0, 0.003): 5.40, (0, 0.006): 5.00}
    records = records_of(plan, lambda k, lr, seed: table[(k, lr)] + 0.01 * ((seed * 5 + k) % 3))
    check = lr_check(plan, records, cell_evidence(records, "depth=4", mode="min", penalty=plan.penalty, min_seeds=3))
    assert (check.shared_verdict, check.best_verdict, check.robust) == ("better", "tied", False)
    assert (check.candidate.best, check.reference.best) == (0.003, 0.006)
    text = check.text()
    assert text.startswith("depth=4: not lr-robust: the verdict depends on the learning rate (0.003 shared; 0.003 and 0.006 their own)")
    assert "better at the shared lr 0.003" in text and "tied at each one's best lr, 1 Post-LN layer at 0.003 against Pre-LN at 0.006" in text


def test_a_target_that_only_trains_longer_gets_a_verdict_and_the_summary_names_its_length(tmp_path):
    plan = load_search(write_search(tmp_path, cells={"model.depth": [2, 4], "train.steps": [30]}, scheduler=None, confirm={"top": 1, "seeds": 1},
                                    transfer={"to": [{"model.depth": 4, "train.steps": 60}], "seeds": 2, "neighbours": 1}))
    target = plan.target_names()[0]
    assert plan.settings[target].steps == 60

    def longer(config):
        overrides = dict(config["overrides"])
        k = round(overrides[ALPHA] * {"depth=2,steps=30": 2}.get(config["cell"], 4))
        return 5.0 + 0.1 * abs(k - 1) + 0.01 * overrides["train.seed"]

    handed = drive(CellSearcher(plan, str(tmp_path / "s")), longer)
    assert any(c["cell"] == target and c["stage"] == "transfer" for c in handed)
    summary = write_reports(tmp_path / "s", plan, Ledger(tmp_path / "s" / "trials.jsonl"))
    text = (tmp_path / "s" / "summary.md").read_text()
    assert f"{target}: predicted k=1" in summary
    assert "depth=4,steps=30: measured at 30 steps" in text and f"length check: {target} at 60 steps: held" in text
    assert "depth=2,steps=30: measured at 30 steps" in text and "length check: none" in text


def test_a_longer_target_reports_its_gap_to_pre_ln_along_training_from_the_run_folders_curves(tmp_path):
    plan = load_search(write_search(tmp_path, cells={"model.depth": [4], "train.steps": [30]}, scheduler=None, confirm={"top": 1, "seeds": 1},
                                    transfer={"to": [{"model.depth": 4, "train.steps": 60}], "seeds": 2, "neighbours": 0}))
    target = plan.target_names()[0]
    drive(CellSearcher(plan, str(tmp_path / "s")), lambda config: 5.0 + 0.1 * abs(round(dict(config["overrides"])[ALPHA] * 4) - 1))
    trained = [r for r in Ledger(tmp_path / "s" / "trials.jsonl").records() if r.cell == target and r.status == "completed"]
    assert {(r.post_ln_layers, r.seed) for r in trained} == {(k, s) for k in (0, 1) for s in (0, 1)}
    for r in trained:  # k=1 starts level with Pre-LN and pulls ahead: its gap grows with training (seed 1 twice as fast)
        Path(r.run_dir).mkdir(parents=True, exist_ok=True)
        gap = lambda step: -0.001 * step * (r.seed + 1) * (r.post_ln_layers or 0)  # noqa: E731
        (Path(r.run_dir) / "metrics.jsonl").write_text("".join(json.dumps({"step": t, "event": "eval", "val_loss": 6.0 - 0.01 * t + gap(t)}) + "\n"
                                                               for t in (20, 40, 60)))
    write_reports(tmp_path / "s", plan, Ledger(tmp_path / "s" / "trials.jsonl"))
    text = (tmp_path / "s" / "summary.md").read_text()
    assert "Against Pre-LN along training" in text
    assert "1 Post-LN layer: -0.03 at step 20, -0.06 at step 40, -0.09 at step 60." in text  # mean of -0.02 and -0.04 at step 20
    assert (tmp_path / "s" / "transfer_curves.png").stat().st_size > 0 and "`transfer_curves.png`" in text


def test_when_pre_ln_wins_the_lr_stage_still_reports_what_it_trained(tmp_path):
    pre_ln_best = lambda config: value(config) - 0.3 * (round(dict(config["overrides"])[ALPHA] * 4) == 0)  # noqa: E731
    # Only Pre-LN is a finalist (top 1, the Pre-LN model is the best explored): the grid trains it alone.
    plan = lr_search(tmp_path / "alone")
    drive(CellSearcher(plan, str(tmp_path / "alone" / "s")), pre_ln_best)
    records = Ledger(tmp_path / "alone" / "s" / "trials.jsonl").records()
    assert {r.post_ln_layers for r in records if r.stage == "lr"} == {0}
    summary = write_reports(tmp_path / "alone" / "s", plan, Ledger(tmp_path / "alone" / "s" / "trials.jsonl"))
    assert "Pre-LN won at the shared lr 0.003 and no other finalist was trained over the grid" in summary and "best lr 0.003" in summary
    assert "lr check: Pre-LN won and no other finalist was trained over the grid" in (tmp_path / "alone" / "s" / "summary.md").read_text()
    # With a second finalist that left the race (clearly behind Pre-LN), the grid spends nothing on it either.
    plan = lr_search(tmp_path / "two", confirm={"top": 2, "seeds": 2, "lr": {"grid": GRID}})
    drive(CellSearcher(plan, str(tmp_path / "two" / "s")), pre_ln_best)
    records = Ledger(tmp_path / "two" / "s" / "trials.jsonl").records()
    assert {r.post_ln_layers for r in records if r.stage == "lr"} == {0} and any(r.post_ln_layers == 1 and r.stage == "confirm" for r in records)
