"""A search killed at any point resumes losing nothing: each shipped search shape (ASHA and TPE, a cost axis, transfer
targets, the learning-rate grid, a longer-training target) is driven along the golden curves, killed with a trial in
flight at a third and at two thirds of its trials, and resumed from its ledger to the end. Every trial that finished
before the kill is in the final ledger as it was, the trial in flight is taken up again under its own number, no
model is trained twice on one seed, and every cell ends with an answer."""

from collections import Counter
from pathlib import Path

import pytest
from ray.tune.search import Searcher

from blockforge.search.config import load_search
from blockforge.search.records.ledger import Ledger
from blockforge.search.reports.findings import Findings
from blockforge.search.run.scheduler import CellScheduler
from blockforge.search.run.searcher import CellSearcher
from blockforge.train.events import Status

from .conftest import drive_curves
from .test_golden import NoScheduler, synthetic_curves

ROOT = Path(__file__).resolve().parents[2]
FINISHED = (Status.COMPLETED, Status.DIVERGED)
SEARCHES = {"quickstart": 12, "kv-pareto-cpu": 18, "transfer-cpu": 40, "lr-check-cpu": 12, "length-cpu": 45, "alpha-law-guided-cpu": 90,
            "stability-cpu": 270}  # ~ its trials


def curves_of(name: str, plan):
    """The golden curves; for the stability search, a probe diverges at its first evaluation above a largest stable learning
    rate that falls with the Post-LN layers and with depth (so every chain bisects)."""
    curve = synthetic_curves(plan)
    if name != "stability-cpu":
        return curve

    def unstable_above(config):
        overrides = dict(config["overrides"])
        depth, alpha, lr = overrides["model.depth"], overrides["model.layers.mix_ln.alpha"], overrides.get("train.lr", 3e-3)
        k = int(alpha * depth + 1e-9)
        limit = 0.05 * (4 / depth) ** 0.5 / (1 + k) * (1.5 if overrides.get("train.warmup", 0.1) > 0 else 1.0)
        found = curve(config)
        return {step: None for step in list(found)[:1]} if lr > limit else found

    return unstable_above


def searcher_and_scheduler(plan, folder, resume):
    searcher = CellSearcher(plan, str(folder), from_ledger=resume)
    return searcher, (CellScheduler(plan, str(folder)) if plan.asha is not None else NoScheduler())


@pytest.mark.parametrize("name", list(SEARCHES))
@pytest.mark.parametrize("part", [1, 2])
def test_a_search_killed_with_a_trial_in_flight_resumes_losing_nothing(name, part, tmp_path):
    plan = load_search(ROOT / "searches" / f"{name}.yaml")
    folder, curve = tmp_path / name, curves_of(name, plan)
    searcher, scheduler = searcher_and_scheduler(plan, folder, resume=False)
    drive_curves(searcher, scheduler, curve, stop_after=lambda handed: len(handed) >= part * SEARCHES[name] // 3, checkpoints=True)
    in_flight = None
    for attempt in range(20000):  # the kill comes while the next trial trains: it was handed out, it never reported
        in_flight = searcher.suggest("killed")
        if in_flight is not None:
            break
    assert in_flight not in (None, Searcher.FINISHED)
    ledger = Ledger(folder / "trials.jsonl")
    stopped = ledger.mark_interrupted("stopped with the search")  # what the driver does when it is stopped
    assert [r.identity for r in stopped] == [in_flight["identity"]]
    before = {(r.cell, r.trial): r for r in ledger.records() if r.status in FINISHED}

    searcher, scheduler = searcher_and_scheduler(plan, folder, resume=True)
    handed = drive_curves(searcher, scheduler, curve, limit=5000, checkpoints=True)
    records = Ledger(folder / "trials.jsonl").records()
    after = {(r.cell, r.trial): r for r in records}
    again = [c for c in handed if c["identity"] == in_flight["identity"]]  # the trial in flight, taken up under its own number
    assert [(c["cell"], c["number"]) for c in again] == [(in_flight["cell"], in_flight["number"])]
    assert after[(in_flight["cell"], in_flight["number"])].status in FINISHED
    for key, record in before.items():
        assert after[key] == record, f"{key} changed on resume"
    trained = Counter((r.cell, r.identity, r.seed) for r in records if r.status in FINISHED and r.duplicate_of is None)
    assert max(trained.values()) == 1, [key for key, n in trained.items() if n > 1]
    found = Findings.of(plan, records)
    for cell in plan.cell_names() + plan.target_names():
        assert found.evidence[cell].candidates, f"{cell} has no answer after the resume"
    # Every cell done, every run keeps its final weights only (the kill came before, between or after thinnings).
    runs = [Path(r.run_dir) for r in records if r.run_dir and r.status in (*FINISHED, Status.PRUNED)]
    assert runs and not [run for run in runs if (run / "checkpoints").exists()]
    diverged_at_once = {Path(r.run_dir) for r in records if r.status == Status.DIVERGED and not (Path(r.run_dir) / "metrics.jsonl").exists()}
    assert all((run / "model.safetensors").is_file() for run in runs if run not in diverged_at_once)  # (one that never evaluated has none)
