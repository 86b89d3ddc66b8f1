"""The decisions the shipped searches make, pinned: each search file is driven the way Tune drives it (searcher and
scheduler, no Ray, no training) along fixed synthetic curves of known answer, and everything it decides — the trials
it hands out in order, their stages, seeds and statuses, the verdicts, the fronts and the transfer outcomes — must
equal the golden file recorded for it. A change to the search core that changes a decision fails here.

The curves: a model's final loss is lowest at k* = round(0.2 L) Post-LN layers (quadratic around it), rises with
the log-distance of its learning rate from 3e-3, has a small offset of its own (other searched values) and a
per-seed offset every model of that seed shares (common random numbers), plus noise of its own; Post-LN layers
and a pace of its own make it start slower, so early rungs can mislead (promotion). A learning rate above 6e-3 with
30% of the layers Post-LN or more diverges at its first evaluation. The curves are functions of the searched values
to six significant digits (the sampler's last bits differ between CPUs' vector units), and what is pinned is
decisions (stages, seeds, statuses, values, winners, intervals), not the sentences that report them.

    BLOCKFORGE_WRITE_GOLDEN=1 pytest tests/search/test_golden.py   # record them again (after a deliberate change)
"""

import hashlib
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from blockforge.search.config import load_search
from blockforge.search.records.ledger import Ledger
from blockforge.search.run.scheduler import CellScheduler
from blockforge.search.run.searcher import CellSearcher

from .conftest import drive_curves

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
SEARCHES = ("quickstart", "rules-quickstart", "kv-pareto-cpu", "transfer-cpu", "alpha-law-cpu")


class NoScheduler:
    """What Tune's FIFO scheduler does for a search without ASHA: every trial runs its full budget."""

    def on_trial_result(self, tune_controller, trial, result) -> str:
        return "CONTINUE"

    def on_trial_complete(self, tune_controller, trial, result) -> None:
        pass


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
        searched = rounded({key: value for key, value in sorted(dict(config["overrides"]).items()) if "mix_ln" not in key and key != "train.seed"})
        final = (5.9 + 0.03 * (k - round(0.2 * depth)) ** 2 + 0.15 * math.log(rounded(train.lr) / 3e-3) ** 2
                 + _unit("model", config["cell"], searched).uniform(0.0, 0.12)
                 + _unit("seed", config["cell"], train.seed).gauss(0.0, 0.04)
                 + _unit("own", config["cell"], searched, k, train.seed, train.steps).gauss(0.0, 0.02))
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


def who(candidate) -> list:
    """A candidate as data: its Post-LN layer count and its other searched values."""
    return [candidate.post_ln_layers, sorted([k, v] for k, v in candidate.overrides.items() if not k.endswith("mix_ln.alpha"))]


def interval(diff) -> list | None:
    """A paired difference as data: mean, n and the interval."""
    return None if diff is None else [diff.mean, diff.n, diff.low, diff.high]


def decisions(plan, search_dir: Path, handed: list[dict]) -> dict:
    """Everything the search decided, as plain data."""
    from blockforge.search.reports.findings import Findings
    from blockforge.search.reports.transfer_report import transfer_section

    records = Ledger(search_dir / "trials.jsonl").records()
    found = Findings.of(plan, records)
    evidence = found.evidence
    out = {
        "handed": [[c["cell"], c["number"], c["stage"], dict(c["overrides"]).get("train.seed"),
                    sorted((k, v) for k, v in dict(c["overrides"]).items() if k != "train.seed")] for c in handed],
        "ledger": [[r.cell, r.trial, r.stage, r.status, r.seed, r.steps, r.value, r.duplicate_of, bool(r.promoted)] for r in records],
        "verdicts": {cell: [who(e.winner) if e.winner else None, e.verdict, sorted(who(c) for c in e.tied_with_winner()),
                            interval(e.vs_reference)] for cell, e in evidence.items()},
    }
    if plan.costs:
        out["fronts"] = {cell: [[who(p.candidate), p.on_front] for p in front.points] for cell, front in found.fronts.items()}
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


def baseline_vector_code() -> dict[str, str]:
    """An environment in which numpy runs only its baseline vector code. TPE's samples go through numpy's exp and log,
    whose AVX2 and AVX-512 versions differ in the last bits, and a sampler steered by a last bit can propose another
    point: the decisions are pinned as every x86-64 CPU computes them with the baseline code."""
    import numpy

    core = getattr(numpy, "_core", None) or numpy.core
    dispatched = getattr(core._multiarray_umath, "__cpu_dispatch__", [])
    return {**os.environ, "NPY_DISABLE_CPU_FEATURES": " ".join(dispatched)}


@pytest.fixture(scope="module")
def driven(tmp_path_factory) -> dict[str, dict]:
    """Every shipped search's decisions, driven in one child Python that runs numpy's baseline vector code."""
    folder = tmp_path_factory.mktemp("golden")
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from search.test_golden import SEARCHES, drive_search; "
            "from pathlib import Path; folder = Path(sys.argv[2]); "
            "json.dump({name: drive_search(name, folder) for name in SEARCHES}, open(folder / 'decisions.json', 'w'))")
    done = subprocess.run([sys.executable, "-c", code, str(ROOT / "tests"), str(folder)], env=baseline_vector_code(), cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((folder / "decisions.json").read_text())


@pytest.mark.parametrize("name", SEARCHES)
def test_the_shipped_searches_decide_as_recorded(name, driven):
    found = driven[name]
    path = GOLDEN / f"{name}.json"
    if os.environ.get("BLOCKFORGE_WRITE_GOLDEN"):
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(json.dumps(found, indent=0) + "\n")
    expected = json.loads(path.read_text())
    assert len(found["handed"]) > 10
    for part in expected:
        assert found[part] == expected[part], part
