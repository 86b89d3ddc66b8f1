"""Searches over a vision transformer: every search feature either works for a vit or is refused by name before anything
trains. End to end (Ray, training): the plan, the search, its answer as open_search reads it, and the winner exported to
timm where timm can hold it (all Pre-LN), refused by name where it cannot; the cell's Pre-LN reference always loads back
in timm with the same logits. The features' logic on a vit's plan: confirmation, racing, early stopping, the curve against
a uniform guess, the law, a cost axis and transfer targets."""

import json
import math

import pytest
import torch

from blockforge.errors import SpecError
from blockforge.search.config import load_search
from blockforge.search.records.ledger import Ledger
from blockforge.search.reports.findings import Findings
from blockforge.search.reports.plan import format_plan, search_plan
from blockforge.search.run.searcher import CellSearcher

from .conftest import drive, write_search

ALPHA = "model.layers.mix_ln.alpha"


def test_a_vit_alpha_search_runs_from_its_plan_to_a_winner_timm_loads(tmp_path, ray_session, capsys):
    import timm

    import blockforge
    from blockforge.cli import main
    from blockforge.export import export_run

    path = write_search(tmp_path, family="vit", cells={"model.depth": [2]}, scheduler=None, space={ALPHA: {"grid": [0.0, 1.0]}},
                        sampler={"grid": {}}, trials_per_cell=2, baselines=[{ALPHA: 0.0}], confirm={"top": 1, "seeds": 1},
                        overrides={"train.steps": 40, "train.batch_size": 32})
    assert main(["search", str(path), "--plan"]) == 0
    assert "Compute plan of tiny" in capsys.readouterr().out
    out = tmp_path / "out"
    search = blockforge.run_search(path, out=out)
    cell = search.cell()
    assert cell.winner is not None and cell.progress.final and cell.verdict in ("better", "tied", "worse", "Pre-LN")
    records = [r for r in search.records if r.status == "completed"]
    assert records and all(r.metrics["val_baseline"] == pytest.approx(math.log(10)) for r in records)  # the uniform guess
    text = (out / "summary.md").read_text()
    assert "measured at 40 steps (1,280 samples)" in text and "tokens" not in text.split("## Candidates")[0]

    images = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(0))

    def loads_in_timm(folder, source) -> None:
        config = json.loads((folder / "config.json").read_text())
        model = timm.create_model(config["architecture"], pretrained=True,
                                  pretrained_cfg_overlay=dict(file=str(folder / "model.safetensors"), num_classes=10), **config["model_args"])
        with torch.no_grad():
            assert (model.eval()(images) - blockforge.load(source)(images)).abs().max().item() <= 1e-4

    winner = cell.winner
    code = main(["export", str(out), "--out", str(tmp_path / "winner"), "--format", "timm"])
    said = capsys.readouterr()
    if winner.uniform_pre:
        assert code == 0
        loads_in_timm(tmp_path / "winner", out / winner.run_dirs[min(winner.run_dirs)])
    else:  # all Post-LN won: timm's VisionTransformer has Pre-LN blocks only
        assert code == 2 and "timm's VisionTransformer cannot hold this vit" in said.err and "Traceback" not in said.err
    reference = cell.evidence.reference
    run = out / reference.run_dirs[min(reference.run_dirs)]
    loads_in_timm(export_run(run, tmp_path / "pre-ln", format="timm"), run)


def vit_search(tmp_path, **changes):
    settings = dict(family="vit", cells={"model.depth": [4, 8]}, scheduler=None, trials_per_cell=3, baselines=[],
                    confirm={"top": 1, "seeds": 2}, space={ALPHA: {"grid": [0.0, 0.25, 0.5]}}, sampler={"grid": {}})
    settings.update(changes)
    tmp_path.mkdir(parents=True, exist_ok=True)
    return load_search(write_search(tmp_path, **settings))


GUESS = math.log(10)  # a uniform guess over the digits' 10 classes: the vit's count baseline and its initial loss


def stand_in(config) -> dict:
    """A vit's final loss: U-shaped in the learning rate around 0.004, alpha 0.25 best by 0.05, back at the uniform guess
    above an edge that each Post-LN layer lowers."""
    overrides = dict(config["overrides"])
    depth = overrides["model.depth"]
    k = math.floor(overrides[ALPHA] * depth + 1e-9)
    lr, seed = overrides.get("train.lr", 3e-3), overrides["train.seed"]
    if lr > 0.04 / (1 + k):
        loss = GUESS - 0.01
    else:
        loss = 0.4 - 0.05 * (4 * k == depth) + 0.02 * math.log(lr / 0.004) ** 2 + 0.01 * seed
    return {"val_loss": loss, "val_baseline": GUESS, "unstable": ""}


def test_a_vit_cell_gets_its_learning_rate_curve_against_the_uniform_guess(tmp_path):
    plan = vit_search(tmp_path, confirm={"top": 1, "seeds": 2, "lr_curve": {"lr_max": 0.1}})
    drive(CellSearcher(plan, str(tmp_path / "s")), lambda c: stand_in(c)["val_loss"], extra=stand_in, limit=3000)
    found = Findings.of(plan, Ledger(tmp_path / "s" / "trials.jsonl").records())
    for cell, depth in (("depth=4", 4), ("depth=8", 8)):
        curves = found.curves[cell]
        assert curves.finished and curves.initial == pytest.approx(GUESS)
        for c in curves.candidates:
            for chain in c.chains:
                assert chain.state == "found" and chain.stable <= 0.04 / (1 + c.post_ln_layers) < chain.unstable
                assert any(p.state == "unstable" and "collapsed" in p.why for p in chain.points.values())
        winner = curves.of(found.evidence[cell].winner.model)
        assert winner.edge_verdict == "less stable"
    assert found.stability_law is not None


@pytest.mark.parametrize("family", ["llama", "vit"])
@pytest.mark.parametrize("feature, changes, stage", [
    ("confirmation and racing", {"confirm": {"top": 2, "seeds": 1, "max_seeds": 3}}, "racing"),
    ("early stopping", {"scheduler": {"asha": {"grace_steps": 10, "reduction_factor": 2}}, "space": {ALPHA: {"uniform": [0.0, 0.75]}},
                        "sampler": {"tpe": {"seed": 0, "startup_trials": 2}}}, "explore"),
    ("the learning-rate curve", {"confirm": {"top": 1, "seeds": 1, "lr_curve": {"lr_max": 0.03, "predict": [{"model.depth": 12}]}}}, "lr curve"),
    ("a longer training", {"confirm": {"top": 1, "seeds": 1, "length": {"factors": [2]}}}, "length"),
    ("transfer targets", {"cells": {"model.depth": [2, 4, 6]}, "confirm": {"top": 1, "seeds": 1},
                          "transfer": {"to": [{"model.depth": 8}], "seeds": 2}}, "transfer"),
    ("a cost axis", {"objective": None, "objectives": [{"metric": "val_loss"}, {"cost": "parameters"}], "constraints": {"parameters": {"max": 10 ** 7}},
                     "confirm": {"top": 2, "seeds": 1}}, "confirm"),
    ("law-guided cells", {"cells": {"model.depth": [2, 4, 6]}, "guide": {"after": 2}, "confirm": {"top": 1, "seeds": 1}}, "explore"),
])
def test_each_search_feature_plans_for_both_backbones(tmp_path, family, feature, changes, stage):
    settings = {"cells": {"model.depth": [2, 4]}, "scheduler": None, "space": {ALPHA: {"grid": [0.0, 0.25, 0.5]}}, "sampler": {"grid": {}},
                "trials_per_cell": 3, "baselines": []}
    settings.update(changes)
    plan = load_search(write_search(tmp_path, family=family, **settings))
    cells = search_plan(plan)
    assert all(c.trial_flops > 0 for c in cells) and any(c.trials.get(stage) for c in cells), (feature, [c.trials for c in cells])
    assert "Compute plan of tiny" in format_plan(plan, cells)


@pytest.mark.parametrize("cost", ["kv_cache_bytes", "inference_flops_per_token", "generate_tokens_per_s", "train_tokens_per_s"])
def test_a_language_models_cost_is_refused_by_name_for_a_vit(tmp_path, cost):
    with pytest.raises(SpecError) as caught:
        vit_search(tmp_path, objective=None, objectives=[{"metric": "val_loss"}, {"cost": cost}], confirm={"top": 2, "seeds": 1})
    assert caught.value.path == "objectives[1].cost" and "a language model's cost" in caught.value.message
    if cost in ("kv_cache_bytes", "inference_flops_per_token"):  # a constraint on one is refused the same way
        with pytest.raises(SpecError) as caught:
            vit_search(tmp_path / "c", objective=None, objectives=[{"metric": "val_loss"}, {"cost": "parameters"}], constraints={cost: {"max": 1e9}},
                       confirm={"top": 2, "seeds": 1})
        assert caught.value.path == f"constraints.{cost}" and "vit has none" in caught.value.message
