"""confirm.stability: each finalist's, baseline's and Pre-LN's largest stable learning rate by bisection, against a
stand-in trainer whose thresholds are known; the verdicts that weigh it, the law across cells and its predictions, as
summary.md, open_search and the trackers' table say them; and every bad setting refused by name."""

import json
import math
from pathlib import Path

import pytest

from blockforge.errors import SpecError
from blockforge.search.checks.stability_check import FAILED, STABLE, UNSTABLE, Grid, replay
from blockforge.search.config import load_search
from blockforge.search.records.ledger import Ledger
from blockforge.search.reports.findings import CellAnswer, Findings
from blockforge.search.reports.plan import search_plan
from blockforge.search.reports.report import write_reports
from blockforge.search.run.searcher import CellSearcher

from .conftest import drive, run_search_stopped_by_sigterm, write_search

ALPHA = "model.layers.mix_ln.alpha"


def threshold(depth: int, k: int, seed: int, warmup: float) -> float:
    """The stand-in's largest stable learning rate: Pre-LN's falls as depth^-0.5, each Post-LN layer halves it at depth 4 and
    more at depth 8 (Mix-LN's margin shrinks faster with depth), warm-up raises it by half, seeds move it by a few percent."""
    return 0.04 * (depth / 4) ** -0.5 * (1.0 + k * depth / 4) ** -1.0 * (1.5 if warmup > 0 else 1.0) * (1.0 + 0.04 * seed)


def stand_in(config) -> dict:
    overrides = dict(config["overrides"])
    depth = overrides["model.depth"]
    k = math.floor(overrides[ALPHA] * depth + 1e-9)
    lr, seed, warmup = overrides.get("train.lr", 3e-3), overrides["train.seed"], overrides.get("train.warmup", 0.1)
    return {"unstable": "" if lr <= threshold(depth, k, seed, warmup) else "its loss rose"}


def value(config) -> float:
    """alpha 0.25 is best in every cell, clearly (its paired interval against Pre-LN excludes zero)."""
    overrides = dict(config["overrides"])
    alpha, seed = overrides[ALPHA], overrides["train.seed"]
    return 5.0 + 0.4 * abs(alpha - 0.25) + 0.01 * seed + 0.003 * ((seed * 7 + round(alpha * 4)) % 3)


def stability_search(tmp_path, **stability):
    settings = {"lr_max": 0.1, "resolution": 1.25, **stability}
    return load_search(write_search(tmp_path, cells={"model.depth": [4, 8]}, scheduler=None, trials_per_cell=3, baselines=[],
                                    confirm={"top": 1, "seeds": 2, "stability": settings}, space={ALPHA: {"grid": [0.0, 0.25, 0.5]}},
                                    sampler={"grid": {}}))


@pytest.mark.parametrize("true", [0.0031, 0.0049, 0.0123, 0.0456, 0.0999])
def test_bisection_finds_a_known_threshold_to_the_resolution_with_the_stated_probes(true):
    grid = Grid(3e-3, 0.1, 4)  # 1 + 16 points, each x1.245 above the one before
    probes = []

    def state(i):
        return STABLE if grid.lr(i) <= true else UNSTABLE

    trained: dict[int, str] = {}
    while True:
        following, end = replay(lambda i: trained.get(i), grid.top)
        if end is not None:
            break
        for i in following:
            trained[i] = state(i)
            probes.append(i)
    low, high, how = end
    assert how == "found" and grid.lr(low) <= true < grid.lr(high) and high - low == 1
    assert grid.lr(high) / grid.lr(low) <= 1.25 + 1e-9
    assert len(probes) == 2 + grid.levels == len(set(probes))  # the two ends, then one probe per halving


def test_a_chain_stops_at_once_unstable_at_the_search_lr_or_stable_at_lr_max_or_failed():
    assert replay(lambda i: UNSTABLE if i == 0 else None, 16) == ([], (None, 0, "unstable at the search's lr"))
    assert replay(lambda i: STABLE, 16) == ([], (16, None, "up to lr_max"))
    assert replay(lambda i: None, 16) == ([0, 16], None)  # the two ends first, together
    assert replay(lambda i: {0: STABLE, 16: UNSTABLE, 8: FAILED}.get(i), 16) == ([], (None, None, "failed"))


def test_the_stage_finds_every_candidates_threshold_and_weighs_it_in_the_answer(tmp_path):
    plan = stability_search(tmp_path, warmup=[0.1, 0.0], predict=[{"model.depth": 16}])
    cells = search_plan(plan)
    assert [c.trials["stability"] for c in cells] == [2 * 3 * 2 * 6] * 2  # Pre-LN and the winner, 3 seeds, 2 warm-ups, 2 + 4 probes
    drive(CellSearcher(plan, str(tmp_path / "s")), value, extra=stand_in, limit=3000)
    records = Ledger(tmp_path / "s" / "trials.jsonl").records()
    probes = [r for r in records if r.stage == "stability"]
    assert probes and all("train.lr" in r.overrides for r in probes)
    found = Findings.of(plan, records)
    assert found.evidence["depth=4"].winner.post_ln_layers == 1 and "train.lr" not in found.evidence["depth=4"].winner.overrides
    for cell, depth in (("depth=4", 4), ("depth=8", 8)):
        check = found.stability[cell]
        assert check.finished and len(check.candidates) == 4
        for c in check.candidates:
            for b in c.brackets:  # every seed's bracket holds its true threshold, one grid step wide
                true = threshold(depth, c.post_ln_layers, b.seed, c.warmup)
                assert b.state == "found" and b.stable <= true < b.unstable and b.unstable / b.stable < 1.25 + 1e-6
        winner = check.of(found.evidence[cell].winner.model)
        assert winner.verdict == "less stable" and winner.vs_pre_ln.mean < 0.6 and winner.used == pytest.approx(3e-3 / winner.largest)
        assert check.answer.startswith("better but less stable (x0.")
    # Each chain's first probe at the search's lr with the recipe's own warm-up is the confirmation's own run: not trained again.
    trained = [(r.identity, r.seed) for r in records if r.status in ("completed", "diverged")]
    assert len(trained) == len(set(trained))
    assert not any(r.overrides.get("train.lr") == 3e-3 and "train.warmup" not in r.overrides for r in probes)
    law = found.stability_law
    pre = next(f for f in law.fits if f.kind == "Pre-LN" and f.warmup == 0.1)
    mix = next(f for f in law.fits if f.kind == "winner" and f.warmup == 0.1)
    assert pre.terms == ["1", "log depth"] and pre.low[1] <= -0.5 <= pre.high[1] + 0.15  # the stand-in's exponent, to the grid
    assert mix.versus_pre[2] < 0  # the winner's margin shrinks with depth faster than Pre-LN's, and the interval says so
    assert {p.size for p in law.predictions} == {"depth=16"}

    summary = write_reports(tmp_path / "s", plan, Ledger(tmp_path / "s" / "trials.jsonl"))
    text = (tmp_path / "s" / "summary.md").read_text()
    assert "stability vs Pre-LN" in summary and "depth=4: stability: better but less stable" in summary
    assert "## Stability: each candidate's largest stable learning rate" in text and "falls faster with depth than Pre-LN's" in text
    assert (tmp_path / "s" / "stability_vs_depth.png").stat().st_size > 0 and "`stability_vs_depth.png`" in text
    data = json.loads((tmp_path / "s" / "stability.json").read_text())
    assert data["cells"]["depth=4"]["answer"] == found.stability["depth=4"].answer
    answer = CellAnswer.of(found, "depth=4")
    assert answer.stability is found.stability["depth=4"]


def test_a_candidate_unstable_at_the_search_lr_is_said_so_not_bisected(tmp_path):
    plan = stability_search(tmp_path)

    def fragile(config):  # every Mix-LN model is unstable even at the search's lr; Pre-LN is stable up to 0.02
        overrides = dict(config["overrides"])
        unstable = overrides[ALPHA] > 0 or overrides.get("train.lr", 3e-3) > 0.02
        return {"unstable": "its loss rose" if unstable else ""}

    drive(CellSearcher(plan, str(tmp_path / "s")), value, extra=fragile, limit=3000)
    records = Ledger(tmp_path / "s" / "trials.jsonl").records()
    check = Findings.of(plan, records).stability["depth=4"]
    mix = next(c for c in check.candidates if not c.uniform_pre)
    assert mix.verdict == "unstable at the search's lr" and mix.largest is None
    assert all(b.state == "unstable at the search's lr" and b.why == "its loss rose" for b in mix.brackets)
    assert len([r for r in records if r.cell == "depth=4" and r.stage == "stability" and r.post_ln_layers == 1]) <= 3  # lr_max at most
    assert check.answer == "better; stability: unstable at the search's lr"


def test_without_the_stage_nothing_changes(tmp_path):
    plan = load_search(write_search(tmp_path, cells={"model.depth": [4]}, scheduler=None, trials_per_cell=3, baselines=[],
                                    confirm={"top": 1, "seeds": 2}, space={ALPHA: {"grid": [0.0, 0.25, 0.5]}}, sampler={"grid": {}}))
    assert "stability" not in search_plan(plan)[0].trials
    drive(CellSearcher(plan, str(tmp_path / "s")), value)
    summary = write_reports(tmp_path / "s", plan, Ledger(tmp_path / "s" / "trials.jsonl"))
    assert "stability" not in summary.lower() and not (tmp_path / "s" / "stability.json").exists()
    assert "Stability" not in (tmp_path / "s" / "summary.md").read_text()


@pytest.mark.parametrize("stability, where, says", [
    ({"lr_max": 0.002}, "confirm.stability.lr_max", "is not above the search's learning rate 0.003"),
    ({"lr_max": 0.003}, "confirm.stability.lr_max", "is not above"),
    ({"lr_max": 0.1, "steps": 0}, "confirm.stability.steps", "must be at least 1"),
    ({"lr_max": 0.1, "steps": 31}, "confirm.stability.steps", "is above the 30 steps of a trial"),
    ({"lr_max": 0.1, "warmup": []}, "confirm.stability.warmup", "lists no warm-up fraction"),
    ({"lr_max": 0.1, "warmup": [0.1, -0.1]}, "confirm.stability.warmup[1]", "in [0, 1)"),
    ({"lr_max": 0.1, "warmup": [0.1, 0.1]}, "confirm.stability.warmup", "twice"),
    ({"lr_max": 0.1, "resolution": 1.0}, "confirm.stability.resolution", "above 1"),
    ({"lr_max": 0.1, "bisect": True}, "confirm.stability.bisect", "unknown key"),
    ({}, "confirm.stability.lr_max", ""),
    ({"lr_max": 0.1, "predict": [{"model.depht": 16}]}, "confirm.stability.predict[0].model.depht", ""),
    ({"lr_max": 0.1, "predict": [{"model.depth": 0}]}, "confirm.stability.predict[0]", "builds no model"),
])
def test_a_bad_stability_setting_is_one_sentence_naming_the_key(tmp_path, stability, where, says):
    with pytest.raises(SpecError) as caught:
        load_search(write_search(tmp_path, cells={"model.depth": [4]}, scheduler=None, confirm={"top": 1, "seeds": 1, "stability": stability}))
    assert caught.value.path == where and says in caught.value.message and "\n" not in str(caught.value)


@pytest.mark.parametrize("where", ["space", "cells"])
def test_stability_in_a_search_that_searches_the_learning_rate_is_refused(tmp_path, where):
    changes = {"space": {ALPHA: {"uniform": [0.0, 0.75]}, "train.lr": {"loguniform": [1e-3, 1e-2]}}} if where == "space" else \
        {"cells": {"model.depth": [4], "train.lr": [1e-3, 3e-3]}}
    with pytest.raises(SpecError) as caught:
        load_search(write_search(tmp_path, **changes, scheduler=None, confirm={"top": 1, "seeds": 1, "stability": {"lr_max": 0.1}}))
    assert caught.value.path == "confirm.stability" and "probes each finalist's learning rate" in caught.value.message


def test_a_trained_search_stopped_mid_probe_resumes_and_answers_as_one_never_stopped(tmp_path, ray_session):
    """A real search (Ray, training) with the stage, SIGTERM while a probe trains, then resume: the probe continues from its
    checkpoint (no step trained twice), every chain ends, and the stopped probe is judged as the same run trained without a
    stop is."""
    import yaml

    import blockforge
    from blockforge.train.loop import Trainer

    # Each chain's probe at the search's lr is the confirmation's run; the one at lr_max (4x, one grid step) trains 100 steps.
    path = write_search(tmp_path, scheduler=None, cells={"model.depth": [2]}, trials_per_cell=2, baselines=[], space={ALPHA: {"grid": [0.0, 0.5]}},
                        sampler={"grid": {}}, max_concurrent=1, overrides={"train.steps": 100, "train.checkpoint_every": 5, "train.eval_every": 10,
                                                                             "train.log_every": 10},
                        confirm={"top": 2, "seeds": 1, "stability": {"lr_max": 0.012, "resolution": 4.0}})
    out = tmp_path / "out"

    def probe_folders():
        return [run for run in out.glob("trials/*/*") if (run / "recipe.yaml").exists()
                and yaml.safe_load((run / "recipe.yaml").read_text())["train"]["lr"] == 0.012]

    run_search_stopped_by_sigterm(path, out, lambda: any((run / "checkpoints" / "latest.json").exists() for run in probe_folders()))
    stopped = [run for run in probe_folders() if not (run / "result.json").exists() or
               json.loads((run / "result.json").read_text())["status"] == "interrupted"]
    assert stopped
    search = blockforge.run_search(path, out=out, resume=True)
    records = search.records
    probes = [r for r in records if r.stage == "stability"]
    assert probes and all(r.status in ("completed", "diverged") for r in probes)
    trained = [(r.identity, r.seed) for r in records if r.status in ("completed", "diverged")]
    assert len(trained) == len(set(trained))  # no model trained twice on one seed
    for run in stopped:  # continued from its checkpoint: each step trained once
        attempts = [json.loads(x) for x in (run / "attempts.jsonl").read_text().splitlines()]
        assert len(attempts) == 2 and attempts[1]["start_step"] > 0, attempts
        steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines() if json.loads(x)["event"] == "train"]
        assert steps == sorted(set(steps)) and steps[-1] == 100
        recipe = blockforge.load_recipe(run / "recipe.yaml")
        alone = Trainer(recipe, tmp_path / "alone" / run.name, progress=False).run()  # the same probe, never stopped
        assert json.loads((run / "result.json").read_text())["stability"] == alone.stability.record()
    check = search.cell().stability
    assert check is not None and check.finished and {c.name for c in check.candidates} == {"Pre-LN", "1 Post-LN layer"}
    assert check.answer and "stability" in (out / "summary.md").read_text().lower()


def test_summary_the_python_view_and_the_trackers_table_say_the_same(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    import blockforge
    from blockforge.io import atomic_write_json
    from blockforge.search.config import MARKER, folder_marker
    from blockforge.search.records.store import SearchStore
    from blockforge.search.reports.tracked import ANSWER_COLUMNS, STABILITY_COLUMNS, SearchTracking
    from blockforge.storage import Storage

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file://{tmp_path}/mlruns")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    plan = stability_search(tmp_path, warmup=[0.1, 0.0])
    plan.tracking.report_to = ["mlflow"]
    folder = tmp_path / "s"
    drive(CellSearcher(plan, str(folder)), value, extra=stand_in, limit=3000)
    atomic_write_json(folder / MARKER, folder_marker(plan, None))
    records = Ledger(folder / "trials.jsonl").records()
    found = Findings.of(plan, records)
    write_reports(folder, plan, Ledger(folder / "trials.jsonl"), found=found)
    tracking = SearchTracking(plan, SearchStore(Storage.open(folder)))
    tracking.finish(records, found)

    view = blockforge.open_search(folder)
    summary = (folder / "summary.md").read_text()
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    parent = next(r for r in client.search_runs([client.get_experiment_by_name(tracking.group).experiment_id]) if r.info.run_name == tracking.group)
    table = json.loads(Path(client.download_artifacts(parent.info.run_id, "answers.json", str(tmp_path / "dl"))).read_text())
    assert table["columns"] == ANSWER_COLUMNS + STABILITY_COLUMNS
    for row in table["data"]:
        cell = row[0]
        answer = view.cell(cell).stability
        assert answer.answer == found.stability[cell].answer == row[table["columns"].index("answer")]
        assert f"### {cell}\n\n**{answer.answer}.**" in summary
        winner = answer.of(view.cell(cell).winner.model)
        assert row[table["columns"].index("stability")] == winner.verdict
        assert row[table["columns"].index("largest_stable_lr")] == pytest.approx(winner.largest)
    law = view.law().stability
    assert law is not None and {f.kind for f in law.fits} == {"Pre-LN", "Mix-LN alpha 0.25", "winner"}
