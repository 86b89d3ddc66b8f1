"""Search files: defaults that are left out behave like the values they stand for."""

import yaml

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
    plan = load_search(write_search(tmp_path, objective={"metric": "val_acc"}))
    assert (plan.metric, plan.mode) == ("val_acc", "max")
