"""A proxy a verdict rests on beyond its cell's size, training length: a transfer target that only trains longer gets its
verdict, said plainly, and its gap to Pre-LN along training (the learning rate's proxy is tests/search/test_lr_curve.py)."""

import json
from pathlib import Path

from blockforge.search.config import load_search
from blockforge.search.records.ledger import Ledger
from blockforge.search.reports.report import write_reports
from blockforge.search.run.searcher import CellSearcher

from .conftest import drive, write_search

ALPHA = "model.layers.mix_ln.alpha"


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


