"""Which candidate is safe, not only which is best (`confirm: {stability: {lr_max: 0.1, resolution: 1.25, ...}}`).

A verdict at the search's learning rate says nothing of how close to divergence each candidate trains there. The
stability check finds, for every finalist, the baselines and the Pre-LN reference, the **largest stable learning rate**:
per seed of the confirmation, by bisection in log space between the search's learning rate and `lr_max`. The learning
rates probed lie on one grid per cell, `lr_j = lr * (lr_max / lr) ** (j / 2**levels)`, with `levels` the fewest halvings
that bring the grid's step to `resolution` or less; so every candidate is probed at the same points, and two of them
compare index by index. A chain probes the search's learning rate and lr_max first (the first is free where a probe
equals the confirmation's run), stops there when the candidate is already unstable at the search's learning rate (said
so, not bisected) or stable at lr_max (stable "up to lr_max"), and otherwise halves the bracket until its two ends are
neighbours on the grid: at most 2 + levels probes. A probe is stable unless it is unstable by train/stability.py's rule.

Each probe is a trial of its own (stage `stability`, its recipe the candidate's with `train.lr`, and the probe's
`train.steps` and `train.warmup` where they differ), so it resumes, is counted by `--plan` and shows in results.csv; a
chain's state is nothing but which of its probes' identities have trained, so the stage and the reports replay it the
same way. A probe trains `steps` steps (default: the cell's own) with the candidate's warm-up fraction and schedule over
them: it says whether a learning rate is stable over a run that long, not over a longer one.

Per candidate and warm-up: the largest stable learning rate's geometric mean over seeds with a 95% t interval (on
logarithms), and its ratio to Pre-LN's, paired by seed. The ratio's interval is widened on each side by one step of
the grid (the bisection's resolution), so two candidates whose brackets differ by one grid step on every seed are not
called different: `less stable` / `more stable` only when that widened interval excludes a ratio of 1, else `as stable`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from blockforge.search.checks.length_check import STEPS_KEY, WARMUP_KEY
from blockforge.search.config import SearchPlan, trial_identity
from blockforge.search.evidence.evidence import Candidate, CellEvidence, describe, paired_difference, t_quantile
from blockforge.search.records.ledger import TrialRecord
from blockforge.spec.search import LR_KEY
from blockforge.train.events import Status

STABLE, UNSTABLE, FAILED = "stable", "unstable", "failed"


@dataclass(frozen=True)
class Grid:
    """The learning rates a cell's chains probe: 2**levels + 1 points, evenly spaced in log space from `low` (the
    search's) to `high` (lr_max)."""

    low: float
    high: float
    levels: int

    @property
    def top(self) -> int:
        return 2 ** self.levels

    @property
    def step(self) -> float:
        """The ratio of two neighbouring learning rates: what the largest stable one is known within."""
        return (self.high / self.low) ** (1 / self.top)

    def lr(self, index: int) -> float:
        if index == 0:
            return self.low
        if index == self.top:
            return self.high
        return float(f"{self.low * self.step ** index:.6g}")  # six figures: a readable override, the same on every machine


def grid(plan: SearchPlan, cell: str) -> Grid:
    check = plan.confirm.stability
    low = plan.shared_lr(cell)
    span = math.log(check.lr_max / low) / math.log(check.resolution)
    return Grid(low, check.lr_max, max(0, math.ceil(math.log2(span))) if span > 1 else 0)


def probe_steps(plan: SearchPlan, cell: str) -> int:
    return plan.confirm.stability.steps or plan.settings[cell].steps


def warmups(plan: SearchPlan) -> list[float | None]:
    """The warm-up fractions probed (None: the recipe's own)."""
    return list(plan.confirm.stability.warmup or [None])


def warmup_fraction(plan: SearchPlan, cell: str, warmup: float | None) -> float:
    return warmup if warmup is not None else plan.recipe(plan.trial_overrides(plan.cell(cell), {})).train.warmup


def probe_searched(plan: SearchPlan, cell: str, searched: dict, lr: float, warmup: float | None) -> dict:
    """A candidate's searched values as one probe trains them: its learning rate, and the probe's steps and warm-up where
    they differ from the cell's (the rest of its schedule follows the recipe, scaled to the probe's steps)."""
    out = {**searched, LR_KEY: lr}
    steps = plan.confirm.stability.steps
    if steps is not None and steps != plan.settings[cell].steps:
        out[STEPS_KEY] = steps
    if warmup is not None:
        out[WARMUP_KEY] = warmup
    return out


def probe_state(record: TrialRecord | None) -> str | None:
    """What a probe's record says: stable, unstable (diverged, or unstable by train/stability.py's rule), failed, or None (not
    trained: none, running, stopped before its end)."""
    if record is None:
        return None
    if record.status == Status.DIVERGED or (record.status == Status.COMPLETED and record.unstable):
        return UNSTABLE
    if record.status == Status.COMPLETED:
        return STABLE
    if record.status == Status.FAILED:
        return FAILED
    return None


@dataclass(frozen=True)
class Bracket:
    """One chain (a candidate, a seed, a warm-up) as far as it went."""

    seed: int
    stable: float | None  # the largest learning rate found stable (None: none, e.g. unstable at the search's)
    unstable: float | None  # the smallest found unstable above it (None: stable up to lr_max, or not reached)
    probes: int  # probes trained
    state: str  # found | up to lr_max | unstable at the search's lr | failed | not finished
    why: str = ""  # the reason a probe was unstable at the search's lr, or failed
    spikes: int | None = None  # spikes of the run at `stable` (train/stability.py)

    @property
    def value(self) -> float | None:
        """The largest stable learning rate this seed gives (lr_max, a lower bound, where it was stable up to there)."""
        return self.stable if self.state in ("found", "up to lr_max") else None

    def text(self) -> str:
        if self.state == "found":
            return f"seed {self.seed}: {self.stable:.3g} stable, {self.unstable:.3g} not"
        if self.state == "up to lr_max":
            return f"seed {self.seed}: stable up to lr_max {self.stable:.3g}"
        if self.state == "unstable at the search's lr":
            return f"seed {self.seed}: unstable at the search's lr ({self.why})"
        return f"seed {self.seed}: {self.state}" + (f" ({self.why})" if self.why else "")


def replay(state: Callable[[int], str | None], top: int) -> tuple[list[int], tuple[int | None, int | None, str] | None]:
    """A chain on a grid of top + 1 points from what its probes say (`state(index)`): (indices to probe next, None) while
    it goes on, else ([], (largest stable index, smallest unstable index, how it ended))."""
    ends = {0: state(0), top: state(top)}
    if FAILED in ends.values():
        return [], (None, None, "failed")
    if ends[0] == UNSTABLE:
        return [], (None, 0, "unstable at the search's lr")
    missing = [i for i, s in ends.items() if s is None]
    if missing:
        return missing, None
    if ends[top] == STABLE:
        return [], (top, None, "up to lr_max")
    low, high = 0, top
    while high - low > 1:
        middle = (low + high) // 2
        here = state(middle)
        if here is None:
            return [middle], None
        if here == FAILED:
            return [], (None, None, "failed")
        low, high = (middle, high) if here == STABLE else (low, middle)
    return [], (low, high, "found")


def candidate_name(candidate: Candidate) -> str:
    """'Pre-LN', or describe()'s '2 Post-LN layers' (with its other searched values)."""
    name = describe(candidate)
    return name.replace("0 Post-LN layers", "Pre-LN", 1) if candidate.uniform_pre else name


def probed(plan: SearchPlan, evidence: CellEvidence) -> list[Candidate]:
    """The candidates a cell's chains probe: its finalists with the confirmation's seeds, the Pre-LN reference and every
    baseline that trained (a finalist whose race ended early has fewer seeds and is left out, unless it is one of those)."""
    baselines = [dict(b) for b in plan.baselines]
    chosen = [c for c in evidence.candidates if c in evidence.eligible or c is evidence.reference
              or any(c.overrides == b for b in baselines)]
    return chosen


class Probes:
    """The probes of one cell: each probe's identity (its recipe's, computed once), and what its record says."""

    def __init__(self, plan: SearchPlan, cell: str, record_of: Callable[[str], TrialRecord | None]):
        self.plan, self.cell, self.record_of = plan, cell, record_of
        self.grid = grid(plan, cell)
        self._identities: dict[tuple, str] = {}

    def searched(self, candidate: dict, index: int, warmup: float | None) -> dict:
        return probe_searched(self.plan, self.cell, candidate, self.grid.lr(index), warmup)

    def identity(self, candidate: dict, seed: int, index: int, warmup: float | None) -> str:
        import json

        key = (json.dumps(candidate, sort_keys=True, default=str), seed, index, warmup)
        if key not in self._identities:
            overrides = self.plan.seed_overrides(self.cell, self.searched(candidate, index, warmup), seed)
            self._identities[key] = trial_identity(self.plan.recipe(overrides))
        return self._identities[key]

    def record(self, candidate: dict, seed: int, index: int, warmup: float | None) -> TrialRecord | None:
        return self.record_of(self.identity(candidate, seed, index, warmup))

    def chain(self, candidate: dict, seed: int, warmup: float | None) -> tuple[list[int], Bracket | None]:
        """(indices to probe next, None) while the chain goes on; ([], its Bracket) once it has ended."""
        state = lambda i: probe_state(self.record(candidate, seed, i, warmup))  # noqa: E731
        following, end = replay(state, self.grid.top)
        if end is None:
            return following, None
        low, high, how = end
        trained = sum(probe_state(self.record(candidate, seed, i, warmup)) is not None for i in range(self.grid.top + 1))
        why, spikes = "", None
        if how == "unstable at the search's lr":
            why = self.record(candidate, seed, 0, warmup).unstable or "it diverged"
        elif how == "failed":
            failed = next(r for i in range(self.grid.top + 1) if (r := self.record(candidate, seed, i, warmup)) is not None
                          and r.status == Status.FAILED)
            why = failed.note
        if low is not None:
            spikes = self.record(candidate, seed, low, warmup).metrics.get("train_spikes")
        return [], Bracket(seed, self.grid.lr(low) if low is not None else None, self.grid.lr(high) if high is not None else None,
                           trained, how, why, int(spikes) if spikes is not None else None)


@dataclass(frozen=True)
class Ratio:
    """A candidate's largest stable learning rate over Pre-LN's, paired by seed: the geometric mean of the seed ratios and
    its 95% interval (t on logarithms, widened by one grid step on each side)."""

    mean: float
    low: float | None
    high: float | None
    n: int

    def text(self) -> str:
        if self.low is None:
            return f"x{self.mean:.2g} (n={self.n}, no interval)"
        return f"x{self.mean:.2g} [{self.low:.2g}, {self.high:.2g}] (n={self.n})"


@dataclass(frozen=True)
class CandidateStability:
    """One candidate's largest stable learning rate at one warm-up fraction, and how it compares with Pre-LN's."""

    name: str
    model: str
    post_ln_layers: int | None
    uniform_pre: bool
    warmup: float
    brackets: list[Bracket]
    largest: float | None  # the geometric mean over seeds (None: no seed gave one)
    low: float | None  # its 95% interval (None below two seeds)
    high: float | None
    vs_pre_ln: Ratio | None
    verdict: str  # reference | as stable | less stable | more stable | unstable at the search's lr | cannot compare | not finished
    used: float | None  # the search's learning rate as a fraction of `largest`

    @property
    def capped(self) -> bool:
        """Stable up to lr_max on some seed: `largest` is a lower bound there."""
        return any(b.state == "up to lr_max" for b in self.brackets)

    def largest_text(self) -> str:
        if self.largest is None:
            return "-"
        at_least = ">= " if self.capped else ""
        span = f" [{self.low:.3g}, {self.high:.3g}]" if self.low is not None else ""
        return f"{at_least}{self.largest:.3g}{span}"

    def verdict_text(self) -> str:
        if self.verdict in ("less stable", "more stable", "as stable") and self.vs_pre_ln is not None:
            return f"{self.verdict} ({self.vs_pre_ln.text()} of Pre-LN's largest stable lr)"
        return self.verdict


@dataclass(frozen=True, repr=False)
class StabilityCheck:
    """The stability check of one cell: every probed candidate at every warm-up, and the cell's answer weighing both."""

    cell: str
    shared: float  # the search's learning rate
    lr_max: float
    step: float  # the grid's step: what a largest stable learning rate is known within
    steps: int  # a probe's steps
    cell_steps: int
    warmups: list[float]
    candidates: list[CandidateStability] = field(default_factory=list)
    answer: str = ""  # e.g. "better but less stable (x0.3 of Pre-LN's largest stable lr)"

    def __repr__(self) -> str:
        from blockforge.search.display import stability_text

        return stability_text(self)

    def _repr_html_(self) -> str:
        from blockforge.search.display import stability_html

        return stability_html(self)

    def of(self, model: str, warmup: float | None = None) -> CandidateStability | None:
        """A candidate's stability at `warmup` (default: the first warm-up probed)."""
        warmup = self.warmups[0] if warmup is None else warmup
        return next((c for c in self.candidates if c.model == model and c.warmup == warmup), None)

    @property
    def finished(self) -> bool:
        return all(b.state != "not finished" for c in self.candidates for b in c.brackets)

    def probe_text(self) -> str:
        length = "the cell's own" if self.steps == self.cell_steps else f"{self.steps} of the cell's {self.cell_steps}"
        return (f"probes of {self.steps} steps ({length}) between the search's lr {self.shared:g} and lr_max {self.lr_max:g}, found "
                f"within x{self.step:.3g}: stable means stable over a run that long")

    def text(self) -> str:
        """One line per candidate and warm-up, after the cell's answer."""
        lines = [f"{self.cell}: {self.answer}"]
        for c in self.candidates:
            used = f"; the search's lr uses {c.used:.0%} of its range" if c.used is not None else ""
            lines.append(f"  {c.name}, warm-up {c.warmup:g}: largest stable lr {c.largest_text()}, {c.verdict_text()}{used}")
        return "\n".join(lines)


def stability_check(plan: SearchPlan, records: list[TrialRecord], evidence: CellEvidence) -> StabilityCheck | None:
    """The stability check of one cell from its records (None without confirm.stability, or before the cell has candidates)."""
    if plan.confirm is None or plan.confirm.stability is None or not evidence.candidates:
        return None
    cell = evidence.cell
    latest: dict[str, TrialRecord] = {}
    for r in records:  # by identity: a probe's record, or the confirmation's run a probe at the search's lr is the same as
        if r.cell == cell and r.identity and r.status != Status.DUPLICATE:
            if r.identity not in latest or probe_state(r) in (STABLE, UNSTABLE) or probe_state(latest[r.identity]) is None:
                latest[r.identity] = r
    probes = Probes(plan, cell, latest.get)
    seeds = [plan.settings[cell].base_seed + i for i in range(plan.confirm.seeds + 1)]
    out = StabilityCheck(cell, probes.grid.low, probes.grid.high, probes.grid.step, probe_steps(plan, cell), plan.settings[cell].steps,
                         [warmup_fraction(plan, cell, w) for w in warmups(plan)])
    candidates = probed(plan, evidence)
    for warmup in warmups(plan):
        chains = {c.model: [probes.chain(c.overrides, seed, warmup)[1] or Bracket(seed, None, None, 0, "not finished") for seed in seeds]
                  for c in candidates}
        reference = chains.get(evidence.reference.model) if evidence.reference is not None else None
        for c in candidates:
            out.candidates.append(_candidate(c, c is evidence.reference, warmup_fraction(plan, cell, warmup), chains[c.model], reference,
                                             probes.grid, plan.against_pre_ln))
    return _answered(out, evidence)


def _candidate(c: Candidate, is_reference: bool, warmup: float, brackets: list[Bracket], reference: list[Bracket] | None,
               grid: Grid, against_pre_ln: bool) -> CandidateStability:
    values = {b.seed: b.value for b in brackets if b.value is not None}
    largest = low = high = None
    if values:
        logs = [math.log(v) for v in values.values()]
        mean = sum(logs) / len(logs)
        largest = math.exp(mean)
        if len(logs) > 1:
            half = t_quantile(len(logs) - 1) * math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1)) / math.sqrt(len(logs))
            low, high = math.exp(mean - half), math.exp(mean + half)
    ratio, verdict = None, "not finished"
    if any(b.state == "unstable at the search's lr" for b in brackets):
        verdict = "unstable at the search's lr"
    elif any(b.state in ("not finished", "failed") for b in brackets):
        verdict = "not finished" if any(b.state == "not finished" for b in brackets) else "cannot compare (a probe failed)"
    elif is_reference:
        verdict = "reference"
    elif not against_pre_ln or reference is None:
        verdict = "no Pre-LN reference"
    else:
        ratio, verdict = _ratio(values, {b.seed: b.value for b in reference if b.value is not None}, grid, reference)
    used = grid.low / largest if largest else None
    return CandidateStability(candidate_name(c), c.model, c.post_ln_layers,
                              c.uniform_pre, warmup, brackets, largest, low, high, ratio, verdict, used)


def _ratio(mine: dict[int, float], pre: dict[int, float], grid: Grid, reference: list[Bracket]) -> tuple[Ratio | None, str]:
    if any(b.state == "unstable at the search's lr" for b in reference):
        return None, "cannot compare (Pre-LN is unstable at the search's lr)"
    if any(b.state != "found" and b.state != "up to lr_max" for b in reference):
        return None, "cannot compare (Pre-LN's probes did not finish)"
    diff = paired_difference({s: math.log(v) for s, v in mine.items()}, {s: math.log(v) for s, v in pre.items()})
    if diff is None:
        return None, "cannot compare (no seed in common)"
    if diff.low is None:
        return Ratio(math.exp(diff.mean), None, None, diff.n), "n/a (one seed)"
    widen = math.log(grid.step)
    low, high = diff.low - widen, diff.high + widen
    verdict = "less stable" if high < 0 else "more stable" if low > 0 else "as stable"
    return Ratio(math.exp(diff.mean), math.exp(low), math.exp(high), diff.n), verdict


def _answered(check: StabilityCheck, evidence: CellEvidence) -> StabilityCheck:
    """The check with the cell's answer: the winner's verdict against Pre-LN and its stability against Pre-LN's, in one phrase."""
    winner = evidence.winner
    mine = check.of(winner.model) if winner is not None else None
    if winner is None or mine is None:
        answer = "no winner to weigh yet"
    elif evidence.verdict == "Pre-LN":
        answer = f"Pre-LN won; its largest stable lr {mine.largest_text()}" if mine.largest is not None else f"Pre-LN won; {mine.verdict}"
    else:
        conflict = (evidence.verdict == "better" and mine.verdict == "less stable") or (evidence.verdict == "worse" and mine.verdict == "more stable")
        joined = "but" if conflict else "and"
        if mine.verdict in ("as stable", "less stable", "more stable"):
            ratio = f" (x{mine.vs_pre_ln.mean:.2g} of Pre-LN's largest stable lr)" if mine.verdict != "as stable" else ""
            answer = f"{evidence.verdict} {joined} {mine.verdict}{ratio}"
        else:
            answer = f"{evidence.verdict}; stability: {mine.verdict}"
    return StabilityCheck(check.cell, check.shared, check.lr_max, check.step, check.steps, check.cell_steps, check.warmups, check.candidates,
                          answer + ("" if check.finished else " (probes not finished)"))
