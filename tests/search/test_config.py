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


def test_progress_view_counts_queued_apart_from_running_and_lists_cells_in_plan_order(tmp_path):
    from types import SimpleNamespace

    from blockforge.search.driver import ProgressView
    from blockforge.search.ledger import Ledger, TrialRecord

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
