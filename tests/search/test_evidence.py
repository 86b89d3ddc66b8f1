"""Replicate statistics: the paired interval against a hand-computed case, verdicts, winners and ties."""

import math

import pytest

from blockforge.search.evidence.evidence import cell_evidence, paired_difference, verdict
from blockforge.search.records.ledger import TrialRecord


def test_paired_t_interval_matches_a_hand_computed_case():
    # Depth 8, 150 steps: k = 1 minus k = 0 per seed was -0.217, -0.093, -0.030.
    # mean = -0.34 / 3 = -0.11333; sd = sqrt(0.018105 / 2) = 0.095144; t(0.975, 2 df) = 4.302653;
    # half-width = 4.302653 * 0.095144 / sqrt(3) = 0.23635.
    k0 = {0: 5.989, 1: 6.054, 2: 6.131}
    k1 = {0: 5.989 - 0.217, 1: 6.054 - 0.093, 2: 6.131 - 0.030}
    diff = paired_difference(k1, k0)
    assert diff.n == 3
    assert diff.mean == pytest.approx(-0.113333, abs=1e-5)
    assert diff.sd == pytest.approx(0.095144, abs=1e-5)
    assert diff.high - diff.mean == pytest.approx(0.23635, abs=1e-4)
    assert verdict(diff, "min") == "tied"


def test_verdicts_follow_the_interval_and_the_objective_direction():
    base = {s: 6.0 + 0.01 * s for s in range(5)}
    lower = {s: v - 0.2 + 0.001 * (s % 2) for s, v in base.items()}  # a consistent improvement
    assert verdict(paired_difference(lower, base), "min") == "better"
    assert verdict(paired_difference(lower, base), "max") == "worse"
    assert verdict(paired_difference(base, lower), "min") == "worse"
    assert verdict(paired_difference({0: 1.0}, {0: 2.0}), "min") == "n/a"  # one seed: no interval
    assert paired_difference({0: 1.0}, {1: 2.0}) is None  # no common seed
    # Pairing: a shared per-seed offset cancels; unpaired, the same data would be far noisier.
    noisy = {s: 6.0 + (0.5 if s % 2 else -0.5) for s in range(6)}
    shifted = {s: v - 0.05 for s, v in noisy.items()}
    assert paired_difference(shifted, noisy).excludes_zero()


def record(cell, trial, model, seed, value, *, k, pre=False, status="completed", stage="confirm"):
    return TrialRecord(cell=cell, trial=trial, status=status, stage=stage, seed=seed, model=model, uniform_pre=pre,
                       value=value, alpha=k / 8, post_ln_layers=k, overrides={"model.layers.mix_ln.alpha": k / 8}, identity=f"{model}-{seed}")


def test_the_winner_needs_the_confirmation_seeds_and_ties_are_reported():
    values = {"pre": [6.0, 6.1, 6.2], "k1": [5.9, 6.12, 6.15], "k2": [6.5, 6.52, 6.55]}
    records = [record("d8", i * 3 + s, m, s, v[s], k={"pre": 0, "k1": 1, "k2": 2}[m], pre=m == "pre") for i, (m, v) in enumerate(values.items()) for s in range(3)]
    # An exploration-only model with one lucky seed does not win against replicated ones.
    records.append(record("d8", 20, "k3", 0, 5.0, k=3, stage="explore"))
    e = cell_evidence(records, "d8", mode="min", penalty=20.0, min_seeds=3)
    assert e.winner.model == "k1" and e.reference.model == "pre" and e.runner_up.model == "pre"
    assert e.verdict == "tied"  # -0.043 mean, but the interval over 3 seeds includes zero
    assert "tied with" in e.claim() and "better" not in e.claim()
    assert [c.model for c in e.tied_with_winner()] == ["pre"]
    assert math.isclose(e.winner.mean, 6.056666, rel_tol=1e-5) and e.winner.n == 3


def test_a_diverged_replicate_counts_as_the_penalty_and_is_flagged():
    records = [record("c", s, "pre", s, 6.0 + 0.01 * s, k=0, pre=True) for s in range(3)]
    records += [record("c", 10 + s, "post", s, 5.5, k=1) for s in range(2)]
    records.append(record("c", 12, "post", 2, None, k=1, status="diverged"))
    e = cell_evidence(records, "c", mode="min", penalty=20.0, min_seeds=3)
    post = next(c for c in e.candidates if c.model == "post")
    assert post.values[2] == 20.0 and post.diverged == [2] and "diverged on 1" in post.spread()
    assert e.winner.model == "pre" and e.verdict == "Pre-LN"
