"""A length check continues runs from their checkpoints (search/checks/length_check.py): with a constant learning rate after the
warm-up that is exactly training to the longer length from the start; with a decaying schedule it is not, as documented."""

import json

import pytest

from blockforge.search.checks.length_check import continuation
from blockforge.search.config import load_search
from blockforge.search.run.trials import start_from
from blockforge.storage import Storage
from blockforge.train.loop import train

from .conftest import write_search


def curve(run_dir):
    return [(e["step"], e["loss"]) for e in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if e.get("event") == "train"]


@pytest.mark.parametrize("schedule,equal", [("constant", True), ("cosine", False)])
def test_continuing_a_checkpoint_equals_training_that_long_from_the_start_only_where_the_schedule_allows(tmp_path, schedule, equal):
    plan = load_search(write_search(tmp_path, cells={"model.depth": [2]}, space={"model.layers.mix_ln.alpha": {"choice": [0.5]}},
                                    baselines=[], trials_per_cell=1, scheduler=None, sampler={"grid": {}},
                                    overrides={"train.steps": 12, "train.warmup": 0.25, "train.schedule": schedule, "train.eval_every": 6,
                                               "train.checkpoint_every": 6, "train.log_every": 1}))
    searched = {"model.layers.mix_ln.alpha": 0.5}
    recipe = lambda values: plan.recipe(plan.seed_overrides("depth=2", values, 0))  # noqa: E731
    longer = continuation(plan, "depth=2", searched, 36)
    assert recipe(longer).train.warmup_steps == recipe(searched).train.warmup_steps == 3  # the proxy's warm-up, kept
    train(recipe(searched), tmp_path / "search" / "proxy", progress=False)
    start_from(Storage.open(tmp_path / "search"), "proxy", tmp_path / "continued")
    continued = train(recipe(longer), tmp_path / "continued", resume=True, progress=False)
    fresh = train(recipe(longer), tmp_path / "fresh", progress=False)
    assert continued.step == fresh.step == 36
    assert (curve(tmp_path / "continued") == curve(tmp_path / "fresh")) is equal
    assert (continued.metrics["val_loss"] == fresh.metrics["val_loss"]) is equal
