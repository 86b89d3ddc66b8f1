"""Searches with a cost axis: costs by hand, measured speed cached, the front with evidence, constraints that skip
training, export by pick and by budget, resume keeping the front."""

import json

import pytest

import blockforge
from blockforge.search.config import load_search
from blockforge.search.costs import computed_costs, measured_costs
from blockforge.search.evidence.evidence import Candidate
from blockforge.search.evidence.pareto import front_evidence, hypervolume
from blockforge.search.records.ledger import Ledger
from blockforge.search.run.searcher import CellSearcher
from blockforge.spec.recipe import recipe_from_data

from .conftest import drive, write_search

ALPHA = "model.layers.mix_ln.alpha"


def recipe(model: dict, train: dict | None = None):
    data = {"source": "digits"} if model["family"] == "vit" else {"source": "builtin"}
    return recipe_from_data({"model": model, "train": train or {"batch_size": 4}, "data": data})


def test_llama_costs_match_a_hand_computation_with_gqa_windows_and_a_ramp():
    # width 64, 3 layers of 4 heads of 16 (kv heads by layer 1, 2, 2 from the ramp... here set per layer), context 32
    r = recipe({"family": "llama", "width": 64, "depth": 3, "heads": 4, "ffn": 96, "vocab": 100, "context": 32,
                "layers": {"overrides": [{"at": 0, "kv_heads": 1, "window": 8}, {"at": 1, "kv_heads": 2}, {"at": 2, "ffn": 128}]}})
    costs = computed_costs(r)
    kv = [1, 2, 4]
    ffn = [96, 96, 128]
    blocks = sum((4 + 2 * k) * 16 * 64 + 64 * 64 + 3 * f * 64 for k, f in zip(kv, ffn))  # q/k/v, output, gate/up and down
    # a window of 8 holds the 7 positions before the next one (which sees those and itself)
    assert costs["kv_cache_bytes"] == 2 * 16 * 2 * (1 * 7 + 2 * 32 + 4 * 32)
    assert costs["inference_flops_per_token"] == 2 * (blocks + 64 * 100) + 4 * 4 * 16 * (8 + 32 + 32)
    assert costs["train_flops_per_token"] == 3 * (2 * blocks + 4 * 32 * 4 * 16 * 3 + 2 * 64 * 100)
    norms = 3 * 2 * 64 + 64
    assert costs["parameters"] == blocks + 2 * 100 * 64 + norms and costs["non_embedding_parameters"] == blocks + 100 * 64 + norms
    assert costs["peak_train_memory_bytes"] > 16 * costs["parameters"]  # weights, gradients and Adam moments at least


def test_vit_costs_match_a_hand_computation():
    r = recipe({"family": "vit", "width": 48, "depth": 2, "heads": 3, "ffn": 96, "image_size": 16, "patch_size": 4, "classes": 7})
    costs = computed_costs(r, ("parameters", "non_embedding_parameters", "train_flops_per_token"))
    patches, S = 16, 17
    blocks = 2 * (3 * 48 * 48 + 48 * 48 + 2 * 48 * 96)
    forward = 2 * S * blocks + 4 * S * S * 48 * 2 + 2 * 48 * 7 + 2 * patches * 3 * 16 * 48
    assert costs["train_flops_per_token"] == 3 * forward / S
    biases = 2 * (3 * 48 + 48 + 96 + 48)
    norms = 2 * 2 * 2 * 48 + 2 * 48
    params = blocks + biases + norms + 3 * 16 * 48 + 48 + (patches + 1) * 48 + 48 + 48 * 7 + 7
    assert costs["parameters"] == params and costs["non_embedding_parameters"] == params - (patches + 1) * 48 - 48


def test_measured_speed_is_measured_once_per_model(tmp_path, monkeypatch):
    r = recipe({"family": "llama", "width": 32, "depth": 1, "heads": 2, "ffn": 64, "vocab": 50, "context": 16})
    first = measured_costs(r, tmp_path, steps=1)
    assert first["train_tokens_per_s"] > 0 and first["generate_tokens_per_s"] > 0
    import blockforge.nn.build

    monkeypatch.setattr(blockforge.nn.build, "build_model", lambda *a, **k: (_ for _ in ()).throw(AssertionError("measured again")))
    assert measured_costs(r, tmp_path, steps=1) == first  # from costs/<hash>-mb<micro batch>-cpu.json
    other = recipe({"family": "llama", "width": 32, "depth": 2, "heads": 2, "ffn": 64, "vocab": 50, "context": 16})
    with pytest.raises(AssertionError, match="measured again"):
        measured_costs(other, tmp_path, steps=1)  # another model is measured


def candidate(name, cost, values):
    c = Candidate(name, {}, None, None, False, values=dict(enumerate(values)))
    c.costs = {"kv_cache_bytes": cost}
    return c


def test_the_front_keeps_what_no_cheaper_model_beats_by_an_interval():
    cheap = candidate("cheap", 1.0, [5.0, 5.1, 4.9])
    better = candidate("better", 2.0, [4.5, 4.55, 4.45])  # costlier, but clearly better: on the front
    worse = candidate("worse", 2.0, [5.5, 5.6, 5.4])  # same cost as `better`, beaten by an interval excluding zero
    noisy = candidate("noisy", 3.0, [4.0, 5.0, 4.4])  # costlier than `better` and not separated from it: tied, on the front
    front = front_evidence([cheap, better, worse, noisy], [("kv_cache_bytes", "min")], "min")
    on = {p.candidate.model for p in front.front()}
    assert on == {"cheap", "better", "noisy"}
    worse_point = next(p for p in front.points if p.candidate.model == "worse")
    assert {q.model for q, _ in worse_point.dominated_by} == {"cheap", "better"}  # each no more costly, better by an interval
    assert all(d.excludes_zero() for _, d in worse_point.dominated_by)
    noisy_point = next(p for p in front.points if p.candidate.model == "noisy")
    assert {q.model for q, _ in noisy_point.tied_with} == {"cheap", "better", "worse"}  # no more costly, not separated by an interval
    assert [p.candidate.model for p in front.points] == ["cheap", "better", "noisy", "worse"]  # the front first, by cost
    assert front.low <= front.hypervolume <= front.high
    # hypervolume by hand: unit square, points (0, 0.5) and (0.5, 0) under reference (1, 1): 1*0.5 + 0.5*0.5 = 0.75
    assert hypervolume([[0.0, 0.5], [0.5, 0.0]], [1.0, 1.0]) == pytest.approx(0.75)


def test_a_candidate_that_breaks_a_constraint_is_never_trained(tmp_path):
    # kv heads 1, 2 or 4 of head_dim 8 (context 32, 2 layers): caches of 2, 4 and 8 KiB
    search = write_search(tmp_path, cells={"model.depth": [2]}, scheduler=None, baselines=[], trials_per_cell=3,
                          overrides={"model.heads": 4}, space={"model.kv_heads": {"choice": [1, 2, 4]}}, sampler={"grid": {}},
                          objective=None, objectives=[{"metric": "val_loss"}, {"cost": "kv_cache_bytes"}], constraints={"kv_cache_bytes": {"max": 5000}})
    plan = load_search(search)
    handed = drive(CellSearcher(plan, str(tmp_path / "s")), lambda config: 5.0)
    trained = {dict(c["overrides"])["model.kv_heads"] for c in handed}
    assert trained == {1, 2}
    records = Ledger(tmp_path / "s" / "trials.jsonl").records()
    skipped = [r for r in records if r.status == "infeasible"]
    assert len(skipped) == 1 and skipped[0].overrides["model.kv_heads"] == 4 and "kv_cache_bytes is 8192" in skipped[0].note
    assert all(r.costs["kv_cache_bytes"] in (2048, 4096, 8192) for r in records)


@pytest.mark.parametrize("changes,needle", [
    ({"objectives": [{"cost": "kv_cache_bytes"}, {"metric": "val_loss"}]}, "objectives[0]: must be the quality metric"),
    ({"objectives": [{"metric": "val_loss"}]}, "objectives: lists only the metric"),
    ({"objectives": [{"metric": "val_loss"}, {"cost": "kv_bytes"}]}, "objectives[1].cost: unknown value 'kv_bytes'"),
    ({"objectives": [{"metric": "val_loss"}, {"cost": "parameters"}], "constraints": {"train_tokens_per_s": {"min": 10}}},
     "constraints.train_tokens_per_s: train_tokens_per_s is measured"),
    ({"constraints": {"parameters": {"max": 10}}}, "constraints: constrain costs of a search with a cost axis"),
    ({"objectives": [{"metric": "val_loss"}, {"cost": "parameters"}], "confirm": {"top": 1, "seeds": 1, "max_seeds": 2}}, "confirm.max_seeds"),
])
def test_a_bad_cost_axis_is_one_sentence(tmp_path, changes, needle):
    from blockforge.errors import SpecError

    with pytest.raises(SpecError, match=needle.replace("[", "\\[").replace("]", "\\]")):
        load_search(write_search(tmp_path, **({"objective": None} if "objectives" in changes else {}), **changes))


def test_a_search_with_a_cost_axis_reports_its_front_exports_by_pick_and_budget_and_keeps_it_on_resume(tmp_path, ray_session, capsys):
    from blockforge.cli import main
    from blockforge.search.run.driver import run_search

    path = write_search(tmp_path, cells={"model.depth": [2]}, scheduler=None, baselines=[], trials_per_cell=3,
                        overrides={"model.heads": 4}, space={"model.kv_heads": {"choice": [1, 2, 4]}},
                        objective=None, objectives=[{"metric": "val_loss"}, {"cost": "kv_cache_bytes"}], constraints={"kv_cache_bytes": {"max": 5000}},
                        confirm={"top": 2, "seeds": 1}, sampler={"grid": {}})
    out = tmp_path / "out"
    outcome = run_search(path, out=out, progress_every_s=0)
    assert not any(r.status == "infeasible" and r.steps for r in outcome.records)
    front = json.loads((out / "pareto.json").read_text())["depth=2"]
    on = [p for p in front if p["on_front"]]
    summary = (out / "summary.md").read_text()
    assert on and (out / "pareto.png").exists() and "## Pareto fronts" in summary
    # no Mix-LN and no placement varies here: no alpha columns, plots or law, and no verdicts against Pre-LN
    assert "Post-LN" not in summary and "Pre-LN" not in summary and "alpha_opt" not in summary and not (out / "metric_vs_alpha.png").exists()
    header = (out / "results.csv").read_text().splitlines()[0].split(",")
    assert "kv_cache_bytes" in header and "kv_heads" in header and "alpha" not in header and "post_ln_layers" not in header
    assert not (out / "alpha_law.json").exists()
    import optuna

    from blockforge.search.reports.views import optuna_storage

    study = optuna.load_study(study_name="depth=2", storage=optuna_storage(out / "optuna.journal"))
    assert len(study.directions) == 2 and study.best_trials  # optuna-dashboard shows it as a front
    capsys.readouterr()
    assert main(["export", str(out), "--pick", "0", "--out", str(tmp_path / "pick")]) == 0
    picked = blockforge.load(tmp_path / "pick").spec
    assert {layer.kv_heads for layer in picked.layers} == {on[0]["overrides"]["model.kv_heads"]}
    card = (tmp_path / "pick" / "README.md").read_text()  # the card names the point it holds, with its costs
    assert "Point 0 of cell `depth=2`'s front" in card and f"kv_heads {on[0]['overrides']['model.kv_heads']}" in card
    assert f"kv_cache_bytes {on[0]['costs']['kv_cache_bytes']:,.6g}" in card and "Pre-LN" not in card and "The winner of" not in card
    cheapest = min(p["costs"]["kv_cache_bytes"] for p in on)
    assert main(["export", str(out), "--under", f"kv_cache_bytes={cheapest}", "--out", str(tmp_path / "under")]) == 0
    assert main(["export", str(out), "--under", "kv_cache_bytes=10", "--out", str(tmp_path / "none")]) == 2
    assert "no front point of cell depth=2 is within it" in capsys.readouterr().err
    for flags, needle in [(["--pick", "-1"], "--pick -1: cell depth=2's front has points 0.."), (["--pick", "99"], "--pick 99"),
                          (["--pick", "x"], "--pick: invalid int value"), (["--under", "kv_cache_bytes=abc"], "'abc' is not a number"),
                          (["--under", "speed"], "give COST=X with a cost of this search (kv_cache_bytes)"),
                          (["--under", "parameters=5"], "give COST=X with a cost of this search"),
                          (["--pick", "0", "--under", "kv_cache_bytes=1e9"], "give --pick or --under, not both"),
                          (["--pick", "0", "--dtype", "fp8"], "--dtype: invalid choice")]:
        assert main(["export", str(out), *flags, "--out", str(tmp_path / "bad")]) == 2, flags
        captured = capsys.readouterr()
        err = captured.err.strip()
        assert needle in err and "\n" not in err and "Traceback" not in err and not (tmp_path / "bad").exists(), (flags, err)
    again = run_search(path, out=out, resume=True, progress_every_s=0)
    assert json.loads((out / "pareto.json").read_text())["depth=2"] == front and len(again.records) == len(outcome.records)


def test_the_plan_bounds_what_a_cost_axis_search_trains(tmp_path):
    """Confirmation trains up to 2 * top points of the explored front (plus baselines): the plan's worst case holds it.
    Here quality improves with every cost, so each explored point is on the front."""
    from blockforge.search.reports.plan import search_plan

    path = write_search(tmp_path, cells={"model.depth": [2]}, scheduler=None, trials_per_cell=6, overrides={"model.heads": 4},
                        space={"model.kv_heads": {"choice": [1, 2, 4]}, "model.ffn": {"choice": [32, 48, 64]}}, sampler={"grid": {}},
                        baselines=[{"model.kv_heads": 1, "model.ffn": 32}], objective=None,
                        objectives=[{"metric": "val_loss"}, {"cost": "kv_cache_bytes"}, {"cost": "train_flops_per_token"}],
                        confirm={"top": 2, "seeds": 1})
    plan = load_search(path)
    handed = drive(CellSearcher(plan, str(tmp_path / "s")), lambda config: 6.0 - dict(config["overrides"])["model.kv_heads"]
                   - dict(config["overrides"])["model.ffn"] / 64)
    confirmed = [c for c in handed if c["stage"] == "confirm"]
    (cell,) = search_plan(plan)
    assert len(confirmed) > (2 + 1 + 1) * 1  # more finalists than top + baselines + a Pre-LN reference
    assert len(confirmed) <= cell.trials["confirm"] and len(handed) <= cell.total_trials


@pytest.mark.parametrize("bound,needle", [
    ({"max": 1000}, "constraints.kv_cache_bytes: no candidate meets max 1000: the smallest kv_cache_bytes any candidate reaches is 2048"),
    ({"max": -5}, "constraints.kv_cache_bytes: no candidate meets max -5: the smallest"),
    ({"min": 1e9}, "constraints.kv_cache_bytes: no candidate meets min 1e+09: the largest kv_cache_bytes any candidate reaches is 8192"),
])
def test_a_constraint_no_candidate_meets_is_refused_before_the_search_starts(tmp_path, bound, needle):
    from blockforge.errors import SpecError

    path = write_search(tmp_path, cells={"model.depth": [2]}, scheduler=None, baselines=[], trials_per_cell=3, overrides={"model.heads": 4},
                        space={"model.kv_heads": {"choice": [1, 2, 4]}}, objective=None,
                        objectives=[{"metric": "val_loss"}, {"cost": "kv_cache_bytes"}], constraints={"kv_cache_bytes": bound})
    with pytest.raises(SpecError, match=needle.replace("+", r"\+")):
        load_search(path)


def test_an_empty_objectives_list_is_one_sentence(tmp_path):
    from blockforge.errors import SpecError

    with pytest.raises(SpecError, match=r"objectives: is empty; list the quality metric first"):
        load_search(write_search(tmp_path, objective=None, objectives=[]))
