"""Search files: defaults that are left out behave like the values they stand for."""

import math
from pathlib import Path

import pytest
import yaml

from blockforge.errors import SpecError
from blockforge.search.config import load_search

from .conftest import write_search


def drop(path, key):
    data = yaml.safe_load(path.read_text())
    del data[key]
    path.write_text(yaml.safe_dump(data))
    return path


def test_objective_left_out_is_the_metrics_natural_direction(tmp_path):
    plan = load_search(drop(write_search(tmp_path), "objective"))
    assert (plan.metric, plan.mode) == ("val_loss", "min")


def test_explicit_objective_mode_is_kept(tmp_path):
    plan = load_search(write_search(tmp_path, objective={"metric": "val_loss", "mode": "max"}))
    assert (plan.metric, plan.mode) == ("val_loss", "max")  # kept, although val_loss is naturally minimized
    plan = load_search(write_search(tmp_path, objective={"metric": "val_ppl"}))
    assert (plan.metric, plan.mode) == ("val_ppl", "min")


def test_progress_view_counts_queued_apart_from_running_and_lists_cells_in_plan_order(tmp_path):
    from types import SimpleNamespace

    from blockforge.search.records.ledger import Ledger, TrialRecord
    from blockforge.search.reports.live import ProgressView

    plan = load_search(write_search(tmp_path, cells={"model.depth": [4, 12]}))
    ledger = Ledger(tmp_path / "trials.jsonl")
    for cell, trial, status, value in [("depth=4", 0, "completed", 5.0), ("depth=12", 0, "completed", 6.0),
                                        ("depth=12", 1, "running", None), ("depth=4", 1, "running", None)]:
        ledger.append(TrialRecord(cell=cell, trial=trial, status=status, alpha=0.25, post_ln_layers=1, value=value))
    view = ProgressView(ledger, plan)
    assert "2 running | 2 completed" in view.line()
    line = view.line([SimpleNamespace(status=s) for s in ("TERMINATED", "TERMINATED", "RUNNING", "PENDING")])
    assert "1 queued | 1 running | 2 completed" in line
    assert line.index("depth=4:") < line.index("depth=12:")


def test_mix_ln_alpha_is_proposed_as_distinct_layer_counts_and_enumerated_when_they_fit(tmp_path):
    plan = load_search(write_search(tmp_path, cells={"model.depth": [8, 12]}, trials_per_cell=6,
                                    space={"model.layers.mix_ln.alpha": {"uniform": [0.0, 0.5]}},
                                    baselines=[{"model.layers.mix_ln.alpha": 0.0}, {"model.layers.mix_ln.alpha": 0.25}]))
    (d8,) = plan.dimensions_in("depth=8")
    assert (d8.kind, d8.args, d8.name) == ("layers", (0, 4), "model.layers.mix_ln.k")
    assert plan.searched_values("depth=8", {"model.layers.mix_ln.k": 3}) == {"model.layers.mix_ln.alpha": 3 / 8}
    # Depth 8: k = 0..4, five distinct models within a budget of 6: enumerated, baselines first, each once.
    assert plan.enumeration("depth=8") is not None
    assert [p["model.layers.mix_ln.k"] for p in plan.first_points("depth=8")] == [0, 2, 1, 3, 4]
    # Depth 12: k = 0..6 is seven models, more than the budget: the sampler chooses, baselines first.
    assert plan.enumeration("depth=12") is None
    assert [p["model.layers.mix_ln.k"] for p in plan.first_points("depth=12")] == [0, 3]
    # Every k the sampler may propose builds exactly that many Post-LN layers.
    from blockforge.spec.resolve import resolve

    for k in range(5):
        recipe = plan.recipe(plan.seed_overrides("depth=8", plan.searched_values("depth=8", {"model.layers.mix_ln.k": k}), 0))
        assert resolve(recipe.model).post_ln_count() == k


def test_spaces_of_several_keys_keep_free_duplicates_and_sample(tmp_path):
    plan = load_search(write_search(tmp_path, space={"model.layers.mix_ln.alpha": {"uniform": [0.0, 0.5]},
                                                     "train.lr": {"loguniform": [1e-3, 1e-2]}},
                                    baselines=[{"model.layers.mix_ln.alpha": 0.0, "train.lr": 3e-3}]))
    assert plan.enumeration("depth=4") is None
    assert [d.kind for d in plan.dimensions_in("depth=4")] == ["layers", "loguniform"]


def test_confirm_settings_are_checked(tmp_path, capsys):
    from blockforge.cli import main

    plan = load_search(write_search(tmp_path, confirm={"top": 3, "seeds": 2, "max_seeds": 4}))
    assert (plan.confirm.top, plan.confirm.seeds, plan.confirm.max_seeds) == (3, 2, 4)
    assert {name: s.base_seed for name, s in plan.settings.items()} == {"depth=2": 0, "depth=4": 0}
    for confirm, needle in [({"top": 0}, "confirm.top"), ({"seeds": 0}, "confirm.seeds"), ({"seeds": 3, "max_seeds": 2}, "confirm.max_seeds"),
                            ({"tops": 1}, "confirm.tops")]:
        path = write_search(tmp_path, confirm=confirm)
        assert main(["search", str(path), "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err.strip()
        assert needle in err and err.count("\n") == 0, err
    path = write_search(tmp_path, confirm={"seeds": 2}, space={"model.layers.mix_ln.alpha": {"uniform": [0.0, 0.5]}, "train.seed": {"int": [0, 9]}},
                        baselines=[])
    assert main(["search", str(path), "--out", str(tmp_path / "out")]) == 2
    assert "space.train.seed" in capsys.readouterr().err


def test_a_cell_that_sets_the_training_seed_trains_with_it(tmp_path):
    plan = load_search(write_search(tmp_path, cells={"model.depth": [2], "train.seed": [0, 5]}))
    assert {name: s.base_seed for name, s in plan.settings.items()} == {"depth=2,seed=0": 0, "depth=2,seed=5": 5}
    recipe = plan.recipe(plan.seed_overrides("depth=2,seed=5", {}, plan.settings["depth=2,seed=5"].base_seed))
    assert recipe.train.seed == 5


def relative_data(tmp_path, monkeypatch, path):
    """The tiny search with its corpus named relative to tmp_path, the directory the search is started from."""
    search = write_search(tmp_path)
    recipe = yaml.safe_load((tmp_path / "tiny.yaml").read_text())
    recipe["data"]["path"] = path
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(recipe))
    monkeypatch.chdir(tmp_path)
    return search


def test_relative_data_paths_name_files_where_the_search_was_started(tmp_path, monkeypatch):
    plan = load_search(relative_data(tmp_path, monkeypatch, "corpus.txt"))
    monkeypatch.chdir("/")  # trials run in folders of their own
    assert plan.recipe(plan.overrides).data.path == str(tmp_path / "corpus.txt")


def test_missing_local_data_fails_before_any_trial(tmp_path, monkeypatch):
    import pytest

    from blockforge.errors import SpecError

    with pytest.raises(SpecError) as caught:
        load_search(relative_data(tmp_path, monkeypatch, "nowhere/*.txt"))
    assert "data.path" in str(caught.value) and "matches no files" in str(caught.value)


def test_reports_compare_with_pre_ln_only_where_placements_vary(tmp_path):
    alpha = load_search(write_search(tmp_path))
    placement = load_search(write_search(tmp_path, space={"model.layers.default.placement": {"choice": ["pre", "post"]}}, baselines=[]))
    heads = load_search(write_search(tmp_path, space={"model.kv_heads": {"choice": [1, 2]}}, baselines=[], overrides={"model.heads": 2}))
    assert (alpha.varies_alpha, alpha.against_pre_ln) == (True, True)
    assert (placement.varies_alpha, placement.against_pre_ln) == (False, True)
    assert (heads.varies_alpha, heads.against_pre_ln) == (False, False)


@pytest.mark.parametrize("objective,penalty", [({"metric": "val_loss", "mode": "min"}, 20.0),
                                               ({"metric": "val_ppl", "mode": "min"}, math.exp(20.0))])
def test_a_diverged_trial_scores_worse_than_any_real_one_in_the_objectives_units(tmp_path, objective, penalty):
    """A perplexity search must not record the loss ceiling (20) as a diverged trial's perplexity: it would beat every model."""
    plan = load_search(write_search(tmp_path, objective=objective))
    assert plan.penalty == pytest.approx(penalty)


def test_asha_says_when_it_sets_train_eval_every(tmp_path):
    plan = load_search(write_search(tmp_path, overrides={"train.eval_every": 30}))  # the rung is at step 10
    (note,) = plan.adjustments
    assert "train.eval_every is set to 10 (from 30)" in note and "part of every trial's identity" in note
    assert ("train.eval_every", 10) in plan.overrides
    assert not load_search(write_search(tmp_path, overrides={"train.eval_every": 10})).adjustments


def test_a_vit_search_on_tokens_per_second_is_refused_before_it_starts(tmp_path):
    root = Path(__file__).resolve().parents[2]
    search = {"name": "vit", "base": str(root / "recipes" / "vit-digits-pre.yaml"), "steps": 10, "trials_per_cell": 2,
              "space": {"train.lr": {"choice": [1e-3, 3e-3]}}, "objectives": [{"metric": "val_loss"}, {"cost": "train_tokens_per_s"}]}
    path = tmp_path / "vit.yaml"
    path.write_text(yaml.safe_dump(search))
    with pytest.raises(SpecError, match=r"objectives\[1\]\.cost: train_tokens_per_s is a language model's cost .* model.family vit has none"):
        load_search(path)


def test_set_reaches_the_search_files_own_keys_as_strictly_as_recipe_keys(tmp_path, capsys):
    from blockforge.cli import main
    from blockforge.io import atomic_write_json
    from blockforge.search.config import folder_marker, stored_plan

    path = write_search(tmp_path, confirm={"top": 2, "seeds": 2})
    sets = [("trials_per_cell", 3), ("steps", 20), ("confirm.seeds", 3), ("cells.model.depth", [4]),
            ("scheduler.asha.grace_steps", 5), ("train.eval_batches", 1)]
    plan = load_search(path, sets)
    assert plan.trials_per_cell == 3 and plan.confirm.seeds == 3 and plan.asha.grace_steps == 5
    assert plan.cell_names() == ["depth=4"] and plan.settings["depth=4"].steps == 20
    assert ("train.eval_batches", 1) in plan.overrides
    # The same plan as a file that says so itself, and a folder started with the --sets is rebuilt with them.
    (tmp_path / "written").mkdir()
    written = write_search(tmp_path / "written", confirm={"top": 2, "seeds": 3}, trials_per_cell=3, steps=20, cells={"model.depth": [4]},
                           scheduler={"asha": {"grace_steps": 5, "reduction_factor": 2}}, overrides={"train.eval_batches": 1})
    same = load_search(written)
    assert (same.trials_per_cell, same.confirm, same.asha, same.cells, same.settings) == (plan.trials_per_cell, plan.confirm, plan.asha,
                                                                                          plan.cells, plan.settings)
    folder = tmp_path / "folder"
    folder.mkdir()
    atomic_write_json(folder / "search.json", folder_marker(plan, sets))
    assert stored_plan(folder).confirm.seeds == 3 and stored_plan(folder).fingerprint() == plan.fingerprint()
    assert load_search(path, sets[:-2]).fingerprint() != plan.fingerprint()  # another --set: a resume is refused (driver)
    # Wrong keys and values are one sentence naming the key.
    for flag, needle in [("trials_per_cel=4", "did you mean 'trials_per_cell'"), ("confirm.seedz=4", "did you mean 'seeds'"),
                         ("steps=abc", "steps (from --set steps=abc): must be an integer"), ("cells.model.dept=[4]", "cells.model.dept"),
                         ("trials_per_cell.x=3", "holds a single value"), ("steps=0", "steps"),
                         ("train.lr=abc", "cell depth=2: train.lr (from --set train.lr=abc): must be a number")]:
        capsys.readouterr()
        assert main(["search", str(path), "--plan", "--set", flag]) == 2, flag
        err = capsys.readouterr().err.strip()
        assert needle in err and len(err.splitlines()) == 1 and "Traceback" not in err, (flag, err)
