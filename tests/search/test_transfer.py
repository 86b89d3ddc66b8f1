"""The transfer stage: a small search's answer tested at a larger size with paired seeds (no Ray here except
the one end-to-end search), held or not, resumable, exportable."""

import json

from blockforge.search.checks.transfer import judge, predict
from blockforge.search.config import load_search
from blockforge.search.records.ledger import Ledger
from blockforge.search.reports.report import write_reports
from blockforge.search.run.searcher import CellSearcher

from .conftest import drive, write_search

ALPHA = "model.layers.mix_ln.alpha"


def transfer_search(tmp_path, **changes):
    settings = dict(cells={"model.depth": [2, 4]}, scheduler=None, confirm={"top": 1, "seeds": 1},
                    transfer={"to": [{"model.depth": 8}], "seeds": 2, "neighbours": 1})
    settings.update(changes)
    return load_search(write_search(tmp_path, **settings))


def k_of(config, depth_of=lambda config: {"depth=2": 2, "depth=4": 4, "depth=8": 8}[config["cell"]]):
    return round(dict(config["overrides"])[ALPHA] * depth_of(config))


def test_targets_train_the_predicted_k_its_neighbours_and_pre_ln_with_seeds_and_say_whether_it_held(tmp_path):
    plan = transfer_search(tmp_path)
    # Proxies: a quarter of the layers Post-LN is best (k=1 of 4). At depth 8 the truth is k=3, not the predicted 2.
    def value(config):
        k, seed = k_of(config), dict(config["overrides"])["train.seed"]
        best = {"depth=2": 0, "depth=4": 1, "depth=8": 3}[config["cell"]]
        return 5.0 + 0.2 * abs(k - best) + 0.01 * seed
    handed = drive(CellSearcher(plan, str(tmp_path / "s")), value)
    targets = [c for c in handed if c["cell"] == "depth=8"]
    assert all(c["stage"] == "transfer" for c in targets)
    assert sorted((k_of(c), dict(c["overrides"])["train.seed"]) for c in targets) == [(k, s) for k in (0, 1, 2, 3) for s in (0, 1)]
    assert handed.index(targets[0]) > max(i for i, c in enumerate(handed) if c["cell"] != "depth=8")  # after every proxy
    records = Ledger(tmp_path / "s" / "trials.jsonl").records()
    prediction = predict(plan, records, "depth=8")
    assert prediction.k == 2 and prediction.nearest == "depth=4" and "nearest proxy cell depth=4" in prediction.source
    outcome = judge(plan, records, prediction)
    assert outcome.outcome == "did not hold" and outcome.observed == 3 and outcome.versus_pre == "better"
    assert "edge of what was trained" in outcome.detail  # k=3 is the largest trained: a larger k may be better still
    summary = write_reports(tmp_path / "s", plan, Ledger(tmp_path / "s" / "trials.jsonl"))
    assert "depth=8: predicted k=2" in summary and "did not hold" in summary
    saved = json.loads((tmp_path / "s" / "transfer.json").read_text())
    assert saved[0]["predicted_k"] == 2 and saved[0]["observed_k"] == 3 and 0 < saved[0]["flops_spent"] < saved[0]["flops_full_search"]


def proxies_then(target_value):
    """Proxies where k=1 of 4 (a quarter) is best; at the target depth 8, `target_value(k, seed)`."""
    def value(config):
        k, seed = k_of(config), dict(config["overrides"])["train.seed"]
        if config["cell"] != "depth=8":
            return 5.0 + abs(k / {"depth=2": 2, "depth=4": 4}[config["cell"]] - 0.25) + 0.01 * seed
        return target_value(k, seed)
    return value


def test_a_prediction_inside_the_targets_tied_best_set_held(tmp_path):
    plan = transfer_search(tmp_path)
    # At depth 8, k=3 has the best mean (5.0 against the predicted k=2's 5.05), but k=2's seeds disagree (4.85 and
    # 5.25): its interval against k=3 includes zero, so it is in the tied-best set. Pre-LN is worse on both seeds.
    def target(k, seed):
        sign = 1 if seed % 2 else -1
        return {3: 5.0 + 0.01 * sign, 2: 5.05 + 0.2 * sign, 0: 6.0}.get(k, 5.0 + 0.05 * abs(k - 3))
    drive(CellSearcher(plan, str(tmp_path / "s")), proxies_then(target))
    records = Ledger(tmp_path / "s" / "trials.jsonl").records()
    outcome = judge(plan, records, predict(plan, records, "depth=8"))
    assert outcome.prediction.k == 2 and outcome.observed == 3 and outcome.outcome == "held", outcome
    assert "tied with the best k=3" in outcome.detail


def test_a_target_where_everything_ties_with_the_best_cannot_tell(tmp_path):
    plan = transfer_search(tmp_path)
    # k=3's seeds disagree (4.8 and 5.2), so every candidate, Pre-LN (5.15) included, is tied with it: no ranking.
    drive(CellSearcher(plan, str(tmp_path / "s")), proxies_then(lambda k, seed: 5.0 + 0.05 * abs(k - 3) + ((0.2 if seed % 2 else -0.2) if k == 3 else 0.0)))
    records = Ledger(tmp_path / "s" / "trials.jsonl").records()
    outcome = judge(plan, records, predict(plan, records, "depth=8"))
    assert outcome.observed == 3 and outcome.outcome == "cannot tell", outcome
    assert "Pre-LN included, is tied with the best" in outcome.detail


def test_a_search_killed_during_the_transfer_stage_repeats_nothing(tmp_path):
    plan = transfer_search(tmp_path)
    value = lambda config: 5.0 + 0.1 * k_of(config) + 0.01 * dict(config["overrides"])["train.seed"]  # noqa: E731
    whole = drive(CellSearcher(plan, str(tmp_path / "whole")), value)
    first = drive(CellSearcher(plan, str(tmp_path / "s")), value, limit=len(whole) - 3)  # stops with 3 target trials left
    assert sum(c["cell"] == "depth=8" for c in first) > 0
    again = drive(CellSearcher(plan, str(tmp_path / "s"), from_ledger=True), value, trial_prefix="r")
    done = [(c["cell"], c["identity"]) for c in first + again]
    assert len(done) == len(set(done)) and sorted(done) == sorted((c["cell"], c["identity"]) for c in whole)


def test_a_search_with_a_transfer_stage_trains_its_target_records_a_verdict_and_exports_it(tmp_path, ray_session, capsys):
    import blockforge
    from blockforge.cli import main
    from blockforge.search.run.driver import run_search

    path = write_search(tmp_path, cells={"model.depth": [2]}, scheduler=None, baselines=[{ALPHA: 0.0}], trials_per_cell=2,
                        confirm={"top": 1, "seeds": 1}, transfer={"to": [{"model.depth": 4}], "seeds": 2, "neighbours": 1})
    out = tmp_path / "out"
    outcome = run_search(path, out=out, progress_every_s=0)
    target = [r for r in outcome.records if r.cell == "depth=4"]
    assert target and all(r.stage == "transfer" and r.status == "completed" and r.steps == 30 for r in target)
    assert {r.seed for r in target} == {0, 1} and 0 in {r.post_ln_layers for r in target}
    saved = json.loads((out / "transfer.json").read_text())
    assert saved[0]["outcome"] in ("held", "did not hold", "cannot tell") and saved[0]["target"] == "depth=4"
    assert "## Transfer" in (out / "summary.md").read_text() and "depth=4: predicted k=" in outcome.summary
    trained = len(target)
    again = run_search(path, out=out, resume=True, progress_every_s=0)  # nothing is left to do: nothing is trained again
    assert len([r for r in again.records if r.cell == "depth=4"]) == trained
    capsys.readouterr()
    assert main(["export", str(out), "--cell", "depth=4", "--out", str(tmp_path / "target")]) == 0
    assert blockforge.load(tmp_path / "target").spec.depth == 4


def test_the_plan_counts_no_more_transfer_trials_than_the_k_that_exist(tmp_path):
    from blockforge.search.reports.plan import search_plan

    # neighbours 100 at depth 8 with alpha up to 0.75: k = 0..6 exist (7), each with 2 seeds, not (2 * 100 + 2) * 2
    plan = transfer_search(tmp_path, transfer={"to": [{"model.depth": 8}], "seeds": 2, "neighbours": 100})
    target = next(c for c in search_plan(plan) if c.target)
    assert target.trials == {"transfer": 7 * 2}
