"""Verdicts that follow the training length (`confirm: {length: {factors: [2, 4], until_stable: true}}`).

A verdict measured at the search's length may not hold at a longer one (under CompleteP the proxy's wins shrank to ties
at ten times the steps). The length check continues the cell's pair, its best Mix-LN candidate and the Pre-LN reference,
from their checkpoints to each factor times the steps, with the seeds their verdict was measured on, and gives the
verdict (paired t, 95%) at each length beside the proxy's:

- holds: the same verdict (and, for a difference, a seed-by-seed change of the gap whose interval includes zero or
  shrinks it);
- grows: the same direction with a gap that widened (its seed-by-seed change excludes zero), or a tie that became a
  difference;
- shrinks to a tie: a difference that is a tie at the longer length;
- flips: the opposite difference.

How a checkpoint is extended: the continued run keeps the proxy's warm-up steps (train.warmup becomes that number of
steps as a fraction of the longer run) and then follows the longer run's schedule from the step it continues at: with
`schedule: constant` that is exactly training to the longer length from the start; with cosine or linear decay the
learning rate rises at the continuation from where the shorter run's decay left it to where the longer run's schedule
is at that step, so a continued run is not the same as one trained to that length from the start. Each length continues
from the previous one (4x from 2x), so a length costs only its new steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from blockforge.search.config import SearchPlan
from blockforge.search.evidence.evidence import Candidate, CellEvidence, Difference, describe, paired_difference, verdict
from blockforge.search.records.ledger import StageName, TrialRecord
from blockforge.train.events import Status

STEPS_KEY, WARMUP_KEY = "train.steps", "train.warmup"


def length_pair(evidence: CellEvidence) -> tuple[Candidate, Candidate] | None:
    """(candidate, reference) whose verdict the length check follows: the cell's best Mix-LN candidate (its winner, or the
    best eligible one when Pre-LN won) and the Pre-LN reference."""
    reference = evidence.reference
    if reference is None:
        return None
    candidate = next((c for c in evidence.eligible if not c.uniform_pre), None)
    return (candidate, reference) if candidate is not None else None


def continuation(plan: SearchPlan, name: str, searched: dict, steps: int) -> dict:
    """The searched values of `searched` continued to `steps`: the steps, and the proxy's warm-up steps as a fraction of them."""
    recipe = plan.recipe(plan.trial_overrides(plan.cell(name), searched))
    warmup_steps = recipe.train.warmup_steps
    fraction = warmup_steps / steps
    while int(fraction * steps) < warmup_steps:  # the fraction as a float must give back the whole number of steps
        fraction = float.__add__(fraction, 1e-15)
    return {**searched, STEPS_KEY: steps, WARMUP_KEY: fraction}


def proxy_searched(overrides: dict) -> dict:
    """A candidate's searched values at the search's own length (a continuation's, less its steps and warm-up)."""
    return {k: v for k, v in overrides.items() if k not in (STEPS_KEY, WARMUP_KEY)}


@dataclass
class LengthStep:
    steps: int
    factor: float
    difference: Difference | None  # candidate - reference, paired by seed
    verdict: str
    outcome: str  # holds | grows | shrinks to a tie | flips | cannot tell | not trained
    gap_change: Difference | None = None  # the gap here minus the proxy's, seed by seed


@dataclass
class LengthCheck:
    cell: str
    candidate: Candidate
    reference: Candidate
    proxy: Difference | None
    proxy_verdict: str
    proxy_steps: int
    steps: list[LengthStep] = field(default_factory=list)

    @property
    def stopped_early(self) -> bool:
        return any(s.outcome == "not trained" for s in self.steps)

    def text(self) -> str:
        parts = [f"{describe(self.candidate)} against Pre-LN at {self.proxy_steps} steps: {self.proxy_verdict} "
                 f"({self.proxy.text() if self.proxy else 'no common seed'})"]
        for s in self.steps:
            if s.outcome == "not trained":
                parts.append(f"{s.steps} steps: not trained (stable: the two lengths before agree)")
            else:
                parts.append(f"{s.steps} steps: {s.verdict} ({s.difference.text() if s.difference else 'no common seed'}): {s.outcome}")
        return "; ".join(parts)


def outcome(proxy: Difference | None, here: Difference | None, mode: str) -> tuple[str, str, Difference | None]:
    """(verdict here, outcome against the proxy, the seed-by-seed change of the gap)."""
    v0, v = verdict(proxy, mode), verdict(here, mode)
    if "n/a" in (v0, v):
        return v, "cannot tell", None
    if v0 == v == "tied":
        return v, "holds", None
    if v0 == "tied":
        return v, "grows", None
    if v == "tied":
        return v, "shrinks to a tie", None
    if v != v0:
        return v, "flips", None
    return v, "holds", None


def _gap_change(candidate_at: dict, reference_at: dict, candidate0: dict, reference0: dict) -> Difference | None:
    seeds = sorted(set(candidate_at) & set(reference_at) & set(candidate0) & set(reference0))
    if not seeds:
        return None
    here = {s: candidate_at[s] - reference_at[s] for s in seeds}
    there = {s: candidate0[s] - reference0[s] for s in seeds}
    return paired_difference(here, there)


def length_check(plan: SearchPlan, records: list[TrialRecord], evidence: CellEvidence, trained_only: bool = False) -> LengthCheck | None:
    """The cell's length check from its records (None without a pair to follow). `trained_only`: stop at the first
    length not trained yet, as the stage that runs it does."""
    pair = length_pair(evidence)
    if pair is None:
        return None
    candidate, reference = pair
    proxy = paired_difference(candidate.values, reference.values)
    check = LengthCheck(evidence.cell, candidate, reference, proxy, verdict(proxy, plan.mode), plan.settings[evidence.cell].steps)
    at: dict[tuple[str, int], dict[int, float]] = {}
    for r in records:
        if r.cell == evidence.cell and r.stage == StageName.LENGTH and r.status in (Status.COMPLETED, Status.DIVERGED):
            value = plan.penalty if r.status == Status.DIVERGED else r.value
            if value is not None:
                at.setdefault((r.model, r.steps), {})[r.seed] = value
    factors = plan.confirm.length.factors
    previous = check.proxy_verdict
    stable = False
    for factor, steps in zip(factors, plan.length_steps(evidence.cell)):
        cand_model = _model_at(records, evidence.cell, candidate, steps)
        ref_model = _model_at(records, evidence.cell, reference, steps)
        a, b = at.get((cand_model, steps), {}), at.get((ref_model, steps), {})
        seeds = sorted(set(candidate.values) & set(reference.values))
        if stable or not (a and b) or not set(seeds) <= set(a) & set(b):
            if trained_only and not stable:
                break
            check.steps.append(LengthStep(steps, factor, None, "n/a", "not trained"))
            continue
        here = paired_difference({s: a[s] for s in seeds}, {s: b[s] for s in seeds})
        v, result, _ = outcome(proxy, here, plan.mode)
        change = _gap_change(a, b, candidate.values, reference.values)
        if result == "holds" and v in ("better", "worse") and change is not None and change.excludes_zero():
            widened = (change.mean < 0) == (here.mean < 0)
            result = "grows" if widened else "holds"
        check.steps.append(LengthStep(steps, factor, here, v, result, change))
        stable = plan.confirm.length.until_stable and v == previous
        previous = v
    return check


def _model_at(records: list[TrialRecord], cell: str, candidate: Candidate, steps: int) -> str | None:
    """The model identity of `candidate` continued to `steps` (its length-stage records name it)."""
    wanted = proxy_searched(candidate.overrides)
    for r in records:
        if r.cell == cell and r.stage == StageName.LENGTH and r.steps == steps and proxy_searched(r.overrides) == wanted:
            return r.model
    return None
