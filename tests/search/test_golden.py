"""The decisions the shipped searches make, pinned: each search file is driven the way Tune drives it (searcher and
scheduler, no Ray, no training) along fixed synthetic curves of known answer, and everything it decides — the trials
it hands out in order, their stages, seeds and statuses, the verdicts, the fronts and the transfer outcomes — must
equal the golden file recorded for it. A change to the search core that changes a decision fails here.

The curves: a model's final loss is lowest at k* = round(0.2 L) Post-LN layers (quadratic around it), rises with
the log-distance of its learning rate from 3e-3, has a small offset of its own (other searched values) and a
per-seed offset every model of that seed shares (common random numbers), plus noise of its own; Post-LN layers
and a pace of its own make it start slower, so early rungs can mislead (promotion). A learning rate above 6e-3 with
30% of the layers Post-LN or more diverges at its first evaluation.

    BLOCKFORGE_WRITE_GOLDEN=1 pytest tests/search/test_golden.py   # record them again (after a deliberate change)
"""

import hashlib
import json
import math
import os
import random
from pathlib import Path

import pytest

from blockforge.search.config import load_search
from blockforge.search.ledger import Ledger
from blockforge.search.scheduler import CellScheduler
from blockforge.search.searcher import CellSearcher

from .conftest import drive_curves

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
SEARCHES = ("quickstart", "rules-quickstart", "kv-pareto-cpu", "transfer-cpu", "alpha-law-cpu")


class NoScheduler:
    """What Tune's FIFO scheduler does for a search without ASHA: every trial runs its full budget."""

    def on_trial_result(self, tune_controller, trial, result) -> str:
        return "CONTINUE"


def _unit(*parts) -> random.Random:
    return random.Random(int(hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:12], 16))


def synthetic_curves(plan):
    recipes = {}

    def curve(config) -> dict[int, float | None]:
        key = json.dumps(config["overrides"])
        if key not in recipes:
            recipes[key] = plan.recipe([tuple(pair) for pair in config["overrides"]])
        recipe = recipes[key]
        spec, train = recipe.spec, recipe.train
        depth, k = spec.depth, spec.post_ln_count()
        searched = {key: value for key, value in sorted(dict(config["overrides"]).items()) if "mix_ln" not in key and key != "train.seed"}
        final = (5.9 + 0.03 * (k - round(0.2 * depth)) ** 2 + 0.15 * math.log(train.lr / 3e-3) ** 2
                 + _unit("model", config["cell"], searched).uniform(0.0, 0.12)
                 + _unit("seed", config["cell"], train.seed).gauss(0.0, 0.04) + _unit("own", config["identity"]).gauss(0.0, 0.02))
        slow = 1.0 + 0.15 * k + _unit("pace", config["cell"], searched).uniform(0.0, 1.5)  # some models start slower
        every = train.eval_every or train.steps
        steps = sorted({*range(every, train.steps + 1, every), train.steps})
        out = {}
        for step in steps:
            if train.lr > 6e-3 and 10 * k >= 3 * depth:
                out[step] = None
                break
            out[step] = final + 1.6 * math.exp(-3.0 * step / train.steps / slow)
        return out

    return curve


def rounded(value):
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v) for v in value]
    return value


def decisions(plan, search_dir: Path, handed: list[dict]) -> dict:
    """Everything the search decided, as plain data."""
    from blockforge.search.evidence import describe
    from blockforge.search.findings import Findings
    from blockforge.search.report import transfer_section

    records = Ledger(search_dir / "trials.jsonl").records()
    found = Findings.of(plan, records)
    evidence = found.evidence
    out = {
        "handed": [[c["cell"], c["number"], c["stage"], dict(c["overrides"]).get("train.seed"),
                    sorted((k, v) for k, v in dict(c["overrides"]).items() if k != "train.seed")] for c in handed],
        "ledger": [[r.cell, r.trial, r.stage, r.status, r.seed, r.steps, r.value, r.duplicate_of, r.note] for r in records],
        "verdicts": {cell: [describe(e.winner) if e.winner else None, e.verdict, sorted(describe(c) for c in e.tied_with_winner()),
                            e.vs_reference.text() if e.vs_reference else None] for cell, e in evidence.items()},
    }
    if plan.costs:
        out["fronts"] = {cell: [[describe(p.candidate), p.on_front] for p in front.points] for cell, front in found.fronts.items()}
    if plan.targets:
        _, _, data = transfer_section(found)
        out["transfer"] = [[d["target"], d["predicted_k"], d["observed_k"], d["outcome"]] for d in data]
    return rounded(out)


def drive_search(name: str, folder: Path) -> dict:
    plan = load_search(ROOT / "searches" / f"{name}.yaml")
    search_dir = folder / name
    searcher = CellSearcher(plan, str(search_dir))
    scheduler = CellScheduler(plan, str(search_dir)) if plan.asha is not None else NoScheduler()
    handed = drive_curves(searcher, scheduler, synthetic_curves(plan), limit=5000)
    return decisions(plan, search_dir, handed)


@pytest.mark.parametrize("name", SEARCHES)
def test_the_shipped_searches_decide_as_recorded(name, tmp_path):
    found = drive_search(name, tmp_path)
    path = GOLDEN / f"{name}.json"
    if os.environ.get("BLOCKFORGE_WRITE_GOLDEN"):
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(json.dumps(found, indent=0) + "\n")
    expected = json.loads(path.read_text())
    assert len(found["handed"]) > 10
    for part in expected:
        assert found[part] == expected[part], part
