"""The learning-rate curve (confirm.lr_curve; confirm.lr and confirm.stability ask for the same): every finalist, baseline
and Pre-LN over one grid per cell against a stand-in trainer whose curves and edges are known; the best learning rates,
verdicts at each one's best, edges and LR sensitivities it reads off them, as summary.md, open_search, the trackers'
table, stability.json and the plot say them; the law of the edge across cells; and every bad setting refused by name."""

import json
import math
from pathlib import Path

import pytest

from blockforge.errors import SpecError
from blockforge.search.checks.lr_curve import FAILED, ProbeRun, replay
from blockforge.search.checks.stability_law import StabilityPoint, fit_cells, stability_law
from blockforge.search.config import load_search
from blockforge.search.records.ledger import Ledger
from blockforge.search.reports.findings import CellAnswer, Findings
from blockforge.search.reports.plan import search_plan, format_plan
from blockforge.search.reports.report import write_reports
from blockforge.search.run.searcher import CellSearcher
from blockforge.search.stages.lr_curve import chain_probes
from blockforge.spec.search import LrCurve
from blockforge.train.stability import Stability

from .conftest import drive, run_search_stopped_by_sigterm, write_search

ALPHA = "model.layers.mix_ln.alpha"
BASELINE = 4.6  # the count model's loss on the scored tokens (the tiny model's vocabulary is 300: ln 300 = 5.7 is l0)


def edge(depth: int, k: int, seed: int, warmup: float) -> float:
    """The stand-in's edge: Pre-LN's falls as depth^-0.5, each Post-LN layer lowers it (more at depth 8), warm-up raises it
    by half, seeds move it by a few percent."""
    return 0.04 * (depth / 4) ** -0.5 * (1.0 + k * depth / 4) ** -1.0 * (1.5 if warmup > 0 else 1.0) * (1.0 + 0.04 * seed)


def stand_in(config, best=lambda k: 0.006, slow=lambda k: False) -> dict:
    """A U-shaped final loss around each model's best learning rate (alpha 0.25 best by 0.05), collapsed to just above the
    count model above its edge; a `slow` model learns nothing below 0.006 and learns above it."""
    overrides = dict(config["overrides"])
    depth = overrides["model.depth"]
    k = math.floor(overrides[ALPHA] * depth + 1e-9)
    lr, seed, warmup = overrides.get("train.lr", 3e-3), overrides["train.seed"], overrides.get("train.warmup", 0.1)
    if lr > edge(depth, k, seed, warmup):
        loss = BASELINE + 0.03
    elif slow(k) and lr < 0.006:
        loss = BASELINE - 0.02
    else:
        loss = 3.9 - 0.05 * (4 * k == depth) + 0.03 * math.log(lr / best(k)) ** 2 + 0.01 * seed + 0.002 * ((seed * 7 + k) % 3)
    return {"val_loss": loss, "val_baseline": BASELINE, "unstable": ""}


def curve_search(tmp_path, key="lr_curve", cells=(4, 8), **settings):
    settings = {"lr_max": 0.1, **settings}
    tmp_path.mkdir(parents=True, exist_ok=True)
    return load_search(write_search(tmp_path, cells={"model.depth": list(cells)}, scheduler=None, trials_per_cell=3, baselines=[],
                                    confirm={"top": 1, "seeds": 2, key: settings}, space={ALPHA: {"grid": [0.0, 0.25, 0.5]}},
                                    sampler={"grid": {}}))


def run_stand_in(plan, folder: Path, **kwargs) -> Findings:
    drive(CellSearcher(plan, str(folder)), lambda c: stand_in(c, **kwargs)["val_loss"], extra=lambda c: stand_in(c, **kwargs), limit=5000)
    return Findings.of(plan, Ledger(folder / "trials.jsonl").records())


def probe(loss: float | None, unstable: str = "") -> ProbeRun:
    return ProbeRun(Stability(unstable, learnt=None if loss is None else BASELINE - loss), loss, "lr")


@pytest.mark.parametrize("true", [0.0021, 0.0049, 0.0123, 0.0456, 0.0999])
def test_a_chain_finds_a_known_edge_within_the_resolution_with_at_most_its_probes(true):
    grid = LrCurve(lr_max=0.1).grid(3e-3)
    assert grid.step <= 1.25 and grid.lr(grid.top) == 0.1 and grid.lr(grid.bottom) < 3e-3

    def state(i):
        lr = grid.lr(i)
        return probe(BASELINE + 0.03) if lr > true else probe(3.9 + 0.03 * math.log(lr / 0.006) ** 2)

    trained: dict[int, ProbeRun] = {}
    while True:
        following, ended = replay(lambda i: trained.get(i), grid, grid.bottom)
        if ended is not None:
            break
        assert following and not set(following) & set(trained)
        trained.update({i: state(i) for i in following})
    low, high, how = ended["edge"]
    if true >= 0.1:
        assert how == "up to lr_max" and low == grid.top
    else:
        assert how == "found" and grid.lr(low) <= true < grid.lr(high) and high - low == 1
    assert len(trained) <= chain_probes(grid)


def test_a_chain_below_its_range_or_with_a_failed_probe_ends_there():
    grid = LrCurve(lr_max=0.1).grid(3e-3)
    assert replay(lambda i: probe(None, "diverged at step 3"), grid, grid.bottom)[1]["edge"] == (None, grid.bottom, "below the range")
    assert replay(lambda i: FAILED if i == 0 else probe(3.9), grid, grid.bottom)[1]["edge"] == (None, None, FAILED)
    assert replay(lambda i: None, grid, grid.bottom)[0] == list(range(grid.bottom, 1, grid.every))  # the points up to the shared lr at once


def test_the_stage_reads_every_candidates_curve_edge_and_sensitivity_and_weighs_them(tmp_path):
    plan = curve_search(tmp_path, warmup=[0.1, 0.0], predict=[{"model.depth": 16}])
    grid = LrCurve(lr_max=0.1).grid(3e-3)
    assert [c.trials["lr curve"] for c in search_plan(plan)] == [2 * 3 * 2 * chain_probes(grid)] * 2  # 2 candidates, 3 seeds, 2 warm-ups
    found = run_stand_in(plan, tmp_path / "s")
    records = found.records
    probes = [r for r in records if r.stage == "lr"]
    assert probes and all("train.lr" in r.overrides for r in probes)
    assert found.evidence["depth=4"].winner.post_ln_layers == 1 and "train.lr" not in found.evidence["depth=4"].winner.overrides
    for cell, depth in (("depth=4", 4), ("depth=8", 8)):
        curves = found.curves[cell]
        assert curves.finished and len(curves.candidates) == 4
        for c in curves.candidates:
            for chain in c.chains:  # every seed's bracket holds its true edge, one grid step wide
                true = edge(depth, c.post_ln_layers, chain.seed, c.warmup)
                assert chain.state == "found" and chain.stable <= true < chain.unstable and chain.unstable / chain.stable <= 1.25 + 1e-6
            assert c.best == pytest.approx(0.006, rel=0.3)  # the stand-in's best, to the coarse grid
    curves = found.curves["depth=4"]
    winner = curves.of(found.evidence["depth=4"].winner.model)
    assert winner.edge_verdict == "less stable" and winner.edge_vs_pre.mean < 0.7
    assert winner.sensitivity_vs_pre.mean > 0.1  # its curve fails sooner: more of the range sits at l0
    assert curves.of(winner.model, 0.0).sensitivity_verdict == "more sensitive"  # (without warm-up every seed fails at one point)
    assert curves.best_verdict == "better" and curves.shared_verdict == "better"  # 0.05 better at either rate
    assert curves.answer.startswith("at the shared lr 0.003: better") and "edge less stable (x0." in curves.answer
    # Each chain's probe at the search's lr with the recipe's own warm-up is the confirmation's own run: not trained again.
    trained = [(r.identity, r.seed) for r in records if r.status in ("completed", "diverged")]
    assert len(trained) == len(set(trained))
    assert not any(r.overrides.get("train.lr") == 3e-3 and "train.warmup" not in r.overrides for r in probes)
    law = found.stability_law
    pre = next(f for f in law.fits if f.kind == "Pre-LN" and f.warmup == 0.1)
    assert pre.terms == ["1", "log depth"] and pre.fit.low is None  # two cells: a line through them, no interval
    assert all("cannot tell" in line for line in law.verdicts()) and {p.verdict for p in law.predictions} == {"cannot tell"}

    summary = write_reports(tmp_path / "s", plan, Ledger(tmp_path / "s" / "trials.jsonl"), found=found)
    text = (tmp_path / "s" / "summary.md").read_text()
    assert "lr curve vs Pre-LN" in summary and f"depth=4: lr curve: {curves.answer}" in summary
    assert "## Learning-rate curves: best learning rate, edge and LR sensitivity" in text and f"**{curves.answer}.**" in text
    for name in ("lr_curves", "stability_vs_depth"):
        assert (tmp_path / "s" / f"{name}.png").stat().st_size > 0 and f"`{name}.png`" in text
    data = json.loads((tmp_path / "s" / "stability.json").read_text())
    for cell in ("depth=4", "depth=8"):
        assert data["cells"][cell]["probes"] == sum(r.cell == cell and r.stage == "lr" and r.status in ("completed", "diverged") for r in records)
    assert CellAnswer.of(found, "depth=4").curves is curves


def test_a_curve_grows_down_while_its_lowest_point_is_the_best(tmp_path):
    found = run_stand_in(curve_search(tmp_path, cells=(4,)), tmp_path / "s", best=lambda k: 0.0008)
    grid = LrCurve(lr_max=0.1).grid(3e-3)
    for c in found.curves["depth=4"].candidates:
        assert min(c.curve) < grid.lr(grid.bottom)  # grew below lr_min
        assert min(c.curve) >= grid.lr(grid.floor) * (1 - 1e-9)  # at most `below` coarse steps
        assert c.best == pytest.approx(0.0008, rel=0.5)


def test_a_collapse_is_told_from_a_model_that_does_not_train_at_this_length(tmp_path):
    # Every Mix-LN model collapses from 0.002 on (the search's lr 0.003 included) where a lower lr learnt: unstable, its edge
    # below the shared lr. A slow Post-LN model learns nothing below 0.006: "did not train" there, never unstable.
    plan = load_search(write_search(tmp_path, cells={"model.depth": [4]}, scheduler=None, trials_per_cell=3, baselines=[{ALPHA: 0.25}, {ALPHA: 1.0}],
                                    confirm={"top": 1, "seeds": 1, "lr_curve": {"lr_max": 0.05}}, space={ALPHA: {"grid": [0.0, 0.25, 1.0]}},
                                    sampler={"grid": {}}))

    def trainer(config):
        overrides = dict(config["overrides"])
        k, lr = round(overrides[ALPHA] * 4), overrides.get("train.lr", 3e-3)
        if k == 1 and lr >= 0.002:
            return {"val_loss": BASELINE + 0.04, "val_baseline": BASELINE, "unstable": ""}
        if k == 4 and lr < 0.006:
            return {"val_loss": BASELINE - 0.02, "val_baseline": BASELINE, "unstable": ""}
        return {"val_loss": 3.9 + 0.03 * math.log(lr / 0.006) ** 2 + 0.01 * overrides["train.seed"], "val_baseline": BASELINE, "unstable": ""}

    drive(CellSearcher(plan, str(tmp_path / "s")), lambda c: trainer(c)["val_loss"], extra=trainer, limit=3000)
    curves = Findings.of(plan, Ledger(tmp_path / "s" / "trials.jsonl").records()).curves["depth=4"]
    mix = next(c for c in curves.candidates if c.post_ln_layers == 1)
    assert all(ch.state == "found" and ch.unstable <= 0.003 and ch.stable < 0.002 for ch in mix.chains)
    at_shared = next(p for ch in mix.chains for p in ch.points.values() if p.lr == 3e-3)
    assert at_shared.state == "unstable" and "collapsed" in at_shared.why
    post = next(c for c in curves.candidates if c.post_ln_layers == 4)
    states = {p.lr: p.state for ch in post.chains for p in ch.points.values()}
    assert {s for lr, s in states.items() if lr < 0.006} == {"did not train"} and "unstable" not in states.values()
    assert {s for lr, s in states.items() if lr >= 0.006} == {"stable"} and post.outcome == "trained"


def test_confirm_lr_and_confirm_stability_ask_for_the_same_curve_and_the_plan_says_so(tmp_path):
    plans = {key: curve_search(tmp_path / key, key=key, cells=(4,)) for key in ("lr_curve", "stability")}
    (tmp_path / "lr").mkdir()
    plans["lr"] = load_search(write_search(tmp_path / "lr", cells={"model.depth": [4]}, scheduler=None, trials_per_cell=3, baselines=[],
                                           confirm={"top": 1, "seeds": 2, "lr": {"grid": [0.002, 0.003, 0.1]}},
                                           space={ALPHA: {"grid": [0.0, 0.25, 0.5]}}, sampler={"grid": {}}))
    counts = {key: search_plan(plan)[0].trials["lr curve"] for key, plan in plans.items()}
    assert len(set(counts.values())) == 1, counts
    text = format_plan(plans["lr"], search_plan(plans["lr"]))
    assert "lr curve: confirm.lr asks for the learning-rate curve (confirm.lr_curve)" in text
    assert "confirm.stability asks for" in format_plan(plans["stability"], search_plan(plans["stability"]))
    trained = {}
    for key, plan in plans.items():
        found = run_stand_in(plan, tmp_path / key / "s")
        trained[key] = sorted((r.post_ln_layers, r.seed, r.overrides["train.lr"]) for r in found.records if r.stage == "lr")
        assert found.curves["depth=4"].answer
    assert trained["lr"] == trained["stability"] == trained["lr_curve"]


def test_without_a_curve_nothing_changes(tmp_path):
    plan = load_search(write_search(tmp_path, cells={"model.depth": [4]}, scheduler=None, trials_per_cell=3, baselines=[],
                                    confirm={"top": 1, "seeds": 2}, space={ALPHA: {"grid": [0.0, 0.25, 0.5]}}, sampler={"grid": {}}))
    assert "lr curve" not in search_plan(plan)[0].trials
    drive(CellSearcher(plan, str(tmp_path / "s")), lambda c: stand_in(c)["val_loss"])
    summary = write_reports(tmp_path / "s", plan, Ledger(tmp_path / "s" / "trials.jsonl"))
    assert "lr curve" not in summary and not (tmp_path / "s" / "stability.json").exists()
    assert "Learning-rate curves" not in (tmp_path / "s" / "summary.md").read_text()


@pytest.mark.parametrize("key, settings, where, says", [
    ("lr_curve", {"lr_max": 0.002}, "confirm.lr_curve.lr_max", "is not above the search's learning rate 0.003"),
    ("lr_curve", {"lr_max": 0.1, "lr_min": 0.2}, "confirm.lr_curve.lr_min", "must lie below lr_max"),
    ("lr_curve", {"lr_max": 0.1, "lr_min": 0.005}, "confirm.lr_curve.lr_min", "is not below the search's learning rate 0.003"),
    ("lr_curve", {"lr_max": 1e308}, "confirm.lr_curve.lr_max", "must lie in (0, 1000]"),
    ("lr_curve", {"lr_max": 0.1, "resolution": 1.000001}, "confirm.lr_curve.resolution", "more than 256"),
    ("lr_curve", {"lr_max": 0.1, "lr_min": 1e-300}, "confirm.lr_curve.lr_min", "give a higher lr_min"),
    ("stability", {"lr_max": 0.1, "resolution": 1.000001}, "confirm.stability.resolution", "more than 256"),
    ("stability", {"lr_max": 1e308}, "confirm.stability.lr_max", "at most 1000"),
    ("lr_curve", {"lr_max": 0.1, "resolution": 3.0}, "confirm.lr_curve.resolution", "at most step"),
    ("lr_curve", {"lr_max": 0.1, "step": 1.0}, "confirm.lr_curve.step", "must lie in (1, 10]"),
    ("lr_curve", {"lr_max": 0.1, "below": 9}, "confirm.lr_curve.below", "must lie in [0, 8]"),
    ("lr_curve", {"lr_max": 0.1, "steps": 0}, "confirm.lr_curve.steps", "must be at least 1"),
    ("lr_curve", {"lr_max": 0.1, "steps": 31}, "confirm.lr_curve.steps", "is above the 30 steps of a trial"),
    ("lr_curve", {"lr_max": 0.1, "warmup": []}, "confirm.lr_curve.warmup", "lists no warm-up fraction"),
    ("lr_curve", {"lr_max": 0.1, "warmup": [0.1, -0.1]}, "confirm.lr_curve.warmup[1]", "in [0, 1)"),
    ("lr_curve", {"lr_max": 0.1, "bisect": True}, "confirm.lr_curve.bisect", "unknown key"),
    ("lr_curve", {}, "confirm.lr_curve.lr_max", ""),
    ("lr_curve", {"lr_max": 0.1, "predict": [{"model.depht": 16}]}, "confirm.lr_curve.predict[0].model.depht", ""),
    ("lr_curve", {"lr_max": 0.1, "predict": [{"model.depth": 0}]}, "confirm.lr_curve.predict[0]", "builds no model"),
    ("stability", {"lr_max": 0.002}, "confirm.stability.lr_max", "is not above"),
])
def test_a_bad_curve_setting_is_one_sentence_naming_the_key(tmp_path, key, settings, where, says):
    with pytest.raises(SpecError) as caught:
        load_search(write_search(tmp_path, cells={"model.depth": [4]}, scheduler=None, confirm={"top": 1, "seeds": 1, key: settings}))
    assert caught.value.path == where and says in caught.value.message and "\n" not in str(caught.value)


def test_a_curve_with_confirm_lr_or_a_searched_learning_rate_is_refused(tmp_path):
    with pytest.raises(SpecError) as caught:
        load_search(write_search(tmp_path, cells={"model.depth": [4]}, scheduler=None,
                                 confirm={"top": 1, "seeds": 1, "lr_curve": {"lr_max": 0.1}, "lr": {"grid": [0.001, 0.01]}}))
    assert caught.value.path == "confirm.lr_curve" and "give one of them" in caught.value.message
    with pytest.raises(SpecError) as caught:
        load_search(write_search(tmp_path, cells={"model.depth": [4], "train.lr": [1e-3, 3e-3]}, scheduler=None,
                                 confirm={"top": 1, "seeds": 1, "lr_curve": {"lr_max": 0.1}}))
    assert caught.value.path == "confirm.lr_curve" and "varies here already" in caught.value.message


def points(edges: dict[int, float], capped=()) -> list[StabilityPoint]:
    return [StabilityPoint(f"depth={d}", d, 64, e, None, None, {0: e}) for d, e in edges.items()]


def test_the_law_counts_its_cells_not_its_seeds_and_says_cannot_tell_when_they_cannot_show_it():
    # Three cells whose seeds agree (each cell known exactly) but which scatter around any line: one degree of freedom.
    cells = points({4: 0.04, 8: 0.02, 16: 0.03})
    fit = fit_cells(cells, ["1", "log depth"], [math.log(p.largest) for p in cells], grid_step=1.25)
    assert fit.dof == 1 and fit.low[1] < 0 < fit.high[1]  # the scatter between cells, not the seeds', sets the interval
    two = points({4: 0.04, 8: 0.02})
    fit = fit_cells(two, ["1", "log depth"], [math.log(p.largest) for p in two], grid_step=1.25)
    assert fit.low is None and "cannot tell" in fit.interval_text(1)
    # On a perfect line the interval is still as wide as one grid step at one end of the depth range.
    line = points({4: 0.04, 8: 0.04 / 2 ** 0.5, 16: 0.02, 32: 0.04 / 8 ** 0.5})
    fit = fit_cells(line, ["1", "log depth"], [math.log(p.largest) for p in line], grid_step=1.25)
    assert fit.params[1] == pytest.approx(-0.5) and fit.high[1] - fit.low[1] == pytest.approx(2 * math.log(1.25) / math.log(8))


def test_a_capped_edge_never_narrows_an_interval_and_kinds_are_compared_over_common_cells(tmp_path):
    plan = curve_search(tmp_path, cells=(4, 8, 16))
    found = run_stand_in(plan, tmp_path / "s")
    law = found.stability_law
    winner = next(f for f in law.fits if f.kind == "winner" or f.kind == "Mix-LN alpha 0.25")
    if winner.versus_pre is not None:
        assert set(winner.versus_cells) <= {p.cell for p in next(f for f in law.fits if f.kind == "Pre-LN").points}
    # The same cells, one of them stable up to lr_max (a lower bound): left out, the law is fitted on fewer cells only.
    curves = dict(found.curves)
    from dataclasses import replace

    capped = curves["depth=16"]
    capped = replace(capped, candidates=[replace(c, chains=[replace(ch, state="up to lr_max", stable=0.1, unstable=None) for ch in c.chains])
                                         for c in capped.candidates])
    curves["depth=16"] = capped
    again = stability_law(plan, curves, found.evidence)
    for f in again.fits:
        assert "depth=16" not in {p.cell for p in f.points}
        assert f.left_out == ["depth=16"] or not any(c.uniform_pre == (f.kind == "Pre-LN") for c in capped.candidates)
        before = next((g for g in law.fits if g.kind == f.kind and g.warmup == f.warmup), None)
        if before is not None and before.fit.low is not None and f.fit.low is not None:
            i = f.terms.index("log depth")
            assert f.fit.high[i] - f.fit.low[i] >= before.fit.high[i] - before.fit.low[i] - 1e-9


def test_a_trained_search_stopped_mid_probe_resumes_and_answers_as_one_never_stopped(tmp_path, ray_session):
    """A real search (Ray, training) with the curve, SIGTERM while a probe trains, then resume: the probe continues from its
    checkpoint (no step trained twice), every chain ends, the stopped probe is judged as the same run trained without a
    stop is, and stability.json counts the probes the ledger holds."""
    import yaml

    import blockforge
    from blockforge.train.loop import Trainer

    # Each chain: its probe at the search's lr is the confirmation's run; one below it (0.00075) and lr_max (0.012) train 60 steps
    # (a probe's first checkpoint is at step 5: the stop has 55 steps to reach it, however busy the machine).
    path = write_search(tmp_path, scheduler=None, cells={"model.depth": [2]}, trials_per_cell=2, baselines=[], space={ALPHA: {"grid": [0.0, 0.5]}},
                        sampler={"grid": {}}, max_concurrent=1, overrides={"train.steps": 60, "train.checkpoint_every": 5, "train.eval_every": 10,
                                                                             "train.log_every": 10},
                        confirm={"top": 2, "seeds": 1, "lr_curve": {"lr_max": 0.012, "step": 4.0, "resolution": 4.0, "below": 0}})
    out = tmp_path / "out"
    plan_text = format_plan(load_search(path), search_plan(load_search(path)))
    assert "at most 3 probes a chain" in plan_text

    def probe_folders():
        return [run for run in out.glob("trials/*/*") if (run / "recipe.yaml").exists()
                and yaml.safe_load((run / "recipe.yaml").read_text())["train"]["lr"] != 0.003]

    run_search_stopped_by_sigterm(path, out, lambda: any((run / "checkpoints" / "latest.json").exists() for run in probe_folders()))
    stopped = [run for run in probe_folders() if not (run / "result.json").exists() or
               json.loads((run / "result.json").read_text())["status"] == "interrupted"]
    assert stopped
    search = blockforge.run_search(path, out=out, resume=True)
    records = search.records
    probes = [r for r in records if r.stage == "lr"]
    assert probes and all(r.status in ("completed", "diverged") for r in probes)
    trained = [(r.identity, r.seed) for r in records if r.status in ("completed", "diverged")]
    assert len(trained) == len(set(trained))  # no model trained twice on one seed
    for run in stopped:  # continued from its checkpoint: each step trained once
        attempts = [json.loads(x) for x in (run / "attempts.jsonl").read_text().splitlines()]
        assert len(attempts) == 2 and attempts[1]["start_step"] > 0, attempts
        steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines() if json.loads(x)["event"] == "train"]
        assert steps == sorted(set(steps)) and steps[-1] == 60
        recipe = blockforge.load_recipe(run / "recipe.yaml")
        alone = Trainer(recipe, tmp_path / "alone" / run.name, progress=False).run()  # the same probe, never stopped
        assert json.loads((run / "result.json").read_text())["stability"] == alone.stability.record()
    curves = search.cell().curves
    assert curves is not None and curves.finished and {c.name for c in curves.candidates} == {"Pre-LN", "1 Post-LN layer"}
    data = json.loads((out / "stability.json").read_text())
    assert data["cells"]["depth=2"]["probes"] == len(probes) == curves.probes
    assert curves.answer and f"**{curves.answer}.**" in (out / "summary.md").read_text()


def test_summary_the_python_view_the_trackers_table_and_the_plot_say_the_same(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    import blockforge
    from blockforge.io import atomic_write_json
    from blockforge.search.config import MARKER, folder_marker
    from blockforge.search.records.store import SearchStore
    from blockforge.search.reports.tracked import ANSWER_COLUMNS, CURVE_COLUMNS, SearchTracking
    from blockforge.storage import Storage

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file://{tmp_path}/mlruns")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    plan = curve_search(tmp_path)
    plan.tracking.report_to = ["mlflow"]
    folder = tmp_path / "s"
    found = run_stand_in(plan, folder)
    atomic_write_json(folder / MARKER, folder_marker(plan, None))
    records = Ledger(folder / "trials.jsonl").records()
    write_reports(folder, plan, Ledger(folder / "trials.jsonl"), found=found)
    tracking = SearchTracking(plan, SearchStore(Storage.open(folder)))
    tracking.finish(records, found)

    view = blockforge.open_search(folder)
    summary = (folder / "summary.md").read_text()
    data = json.loads((folder / "stability.json").read_text())
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    parent = next(r for r in client.search_runs([client.get_experiment_by_name(tracking.group).experiment_id]) if r.info.run_name == tracking.group)
    table = json.loads(Path(client.download_artifacts(parent.info.run_id, "answers.json", str(tmp_path / "dl"))).read_text())
    assert table["columns"] == ANSWER_COLUMNS + CURVE_COLUMNS
    for row in table["data"]:
        cell = row[0]
        curves = view.cell(cell).curves
        assert curves.answer == found.curves[cell].answer == row[table["columns"].index("curve_answer")] == data["cells"][cell]["answer"]
        assert f"### {cell}\n\n**{curves.answer}.**" in summary
        winner = curves.of(view.cell(cell).winner.model)
        assert row[table["columns"].index("edge")] == pytest.approx(winner.edge)
        assert row[table["columns"].index("best_lr")] == pytest.approx(winner.best)
        saved = next(c for c in data["cells"][cell]["candidates"] if c["model"] == winner.model and c["warmup"] == winner.warmup)
        assert saved["edge"] == pytest.approx(winner.edge) and saved["best_lr"] == pytest.approx(winner.best)
    figure = view.plot("lr_curves")
    assert len(figure.axes) == 2 and {ax.get_title() for ax in figure.axes} == {"depth=4, warm-up 0.1", "depth=8, warm-up 0.1"}
    law = view.law().stability
    assert law is not None and {f.kind for f in law.fits} >= {"Pre-LN"}


def test_two_slots_train_the_same_probes_and_answer_alike_as_one(tmp_path):
    """Trials handed out two at a time (a chain goes on in a free slot while another's probe trains; confirmation's known
    seeds start early) give the same replicates and probes and the same answers as one at a time."""
    from ray.tune.search import Searcher

    from blockforge.search.config import OBJECTIVE

    def two_at_a_time(searcher, limit=5000):
        running, i, idle = [], 0, 0
        while i < limit:
            config = searcher.suggest(f"t{i}")
            if config == Searcher.FINISHED and not running:
                break
            if config is not None and config != Searcher.FINISHED:
                running.append((f"t{i}", config))
                i += 1
                if len(running) < 2:
                    continue
            if not running:
                idle += 1
                assert idle < 20000
                continue
            trial_id, done = running.pop(0)
            result = stand_in(done)
            searcher.on_trial_complete(trial_id, {OBJECTIVE: result["val_loss"], "step": searcher.live[trial_id].steps, **result})

    answers = {}
    for name, drive_it in (("one", lambda s: drive(s, lambda c: stand_in(c)["val_loss"], extra=stand_in, limit=5000)), ("two", two_at_a_time)):
        plan = curve_search(tmp_path / name, cells=(4,))
        drive_it(CellSearcher(plan, str(tmp_path / name / "s")))
        records = Ledger(tmp_path / name / "s" / "trials.jsonl").records()
        found = Findings.of(plan, records)
        trained = sorted((r.alpha, r.seed, r.overrides.get("train.lr", 3e-3), str(r.stage)) for r in records if r.status == "completed")
        answers[name] = (trained, found.evidence["depth=4"].claim(), found.curves["depth=4"].answer)
    assert answers["one"] == answers["two"]
