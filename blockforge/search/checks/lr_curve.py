"""One learning-rate curve per candidate (`confirm: {lr_curve: {lr_max: 0.1, ...}}`; `confirm.lr` and `confirm.stability`
ask for the same curve).

A verdict at one shared learning rate says neither how far each candidate sits from its own best learning rate nor how
close to failing it trains there. The curve answers both from one set of probes. For every finalist, the baselines and
the Pre-LN reference, per seed of the confirmation and per warm-up fraction, the final validation loss is measured over
one log grid per cell, `lr_j = lr * f**j` (j whole; f at most `resolution`, chosen so that lr_max is a point), in coarse
steps of `every` points (about `step`):

- a chain (one candidate, seed and warm-up) trains every coarse point from `lr_min` (default: one coarse step below the
  search's learning rate) up to the search's (which is free where it is the confirmation's own run), then one coarse point
  at a time upwards until a run is unstable or lr_max is reached, then bisects between the last coarse point that is not
  unstable and the first that is, down to one grid step: the candidate's **edge**, its largest stable learning rate;
- a candidate's curve grows down, at most `below` coarse steps, while its lowest point is unstable on some seed or still
  its best (mean over seeds).

Each run is judged among the runs of its own model and seed (train/stability.judge_sweep): unstable when it diverged or
its loss level rose, or when it collapsed (learnt less than a fraction of what a lower learning rate learnt, against the
count model of the very tokens its loss is measured on); "did not train" when no learning rate up to it learnt; so a
slow model is never called unstable, and a collapse is told from slow learning by a lower learning rate of the same
model and seed. Every deciding probe's margin is kept; an edge that rests on a margin under the seed-to-seed noise of a
final loss is said to be near the threshold.

From the curve, per candidate and warm-up:
- its **best learning rate** (the coarse point with the best mean over seeds), with how often seed resamples choose it and
  the range they choose within; unstable runs, and the coarse points above a chain's first unstable one, count at the
  initial loss l0 (a uniform guess: ln of the vocabulary, or of the classes);
- its **edge**: the geometric mean of the seeds' largest stable learning rates with a 95% t interval (on logarithms), a
  lower bound where a seed was stable up to lr_max, and its ratio to Pre-LN's paired by seed, the ratio's interval widened
  by one grid step on each side: `less stable` / `more stable` only when that interval excludes 1;
- its **LR sensitivity** as Wortsman et al. 2023 define it: over the coarse points of the fixed range [lr_min, lr_max],
  the mean of min(loss, l0) minus the best loss, per seed; its mean with a 95% t interval, and its difference to Pre-LN's
  paired by seed.
The cell's answer gives the verdict at the shared learning rate (the confirmation's), the verdict of the winner at its own
best against Pre-LN at its own, the edge and the sensitivity, and where the shared rate sits on each one's curve.

Each probe is a trial of its own (stage `lr`, its recipe the candidate's with `train.lr`, and the probe's `train.steps` and
`train.warmup` where they differ), so it resumes, is counted by `--plan` and shows in results.csv; a chain's state is
nothing but which of its probes' identities have trained, so the stage and the reports replay it the same way.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from typing import Callable

from blockforge.search.checks.length_check import STEPS_KEY, WARMUP_KEY
from blockforge.search.config import SearchPlan, trial_identity
from blockforge.search.evidence.evidence import Candidate, CellEvidence, Difference, describe, paired_difference, t_quantile, verdict
from blockforge.search.records.ledger import StageName, TrialRecord
from blockforge.spec.search import LR_KEY, CurveGrid as Grid, LrCurve, lr_curve_of
from blockforge.train.events import Status
from blockforge.train.stability import RULE, STABLE, UNSTABLE, Stability, SweepPoint, judge_sweep

FAILED = "failed"
RESAMPLES = 1000


def curve_settings(plan: SearchPlan) -> LrCurve | None:
    """The curve the search file asks for (confirm.lr_curve, or confirm.lr / confirm.stability), or None."""
    found = lr_curve_of(plan.confirm)
    return None if found is None else found[0]


def grid(plan: SearchPlan, cell: str) -> Grid:
    return curve_settings(plan).grid(plan.shared_lr(cell))


def probe_steps(plan: SearchPlan, cell: str) -> int:
    return curve_settings(plan).steps or plan.settings[cell].steps


def warmups(plan: SearchPlan) -> list[float | None]:
    """The warm-up fractions probed (None: the recipe's own)."""
    return list(curve_settings(plan).warmup or [None])


def warmup_fraction(plan: SearchPlan, cell: str, warmup: float | None) -> float:
    return warmup if warmup is not None else plan.recipe(plan.trial_overrides(plan.cell(cell), {})).train.warmup


def initial_loss(plan: SearchPlan, cell: str) -> float:
    """l0: the loss of a uniform guess (ln of the vocabulary, or of the classes), about where training starts."""
    model = plan.recipe(plan.trial_overrides(plan.cell(cell), {})).model
    return math.log(model.classes if getattr(model, "classes", None) else model.vocab)


def probe_searched(plan: SearchPlan, cell: str, searched: dict, lr: float, warmup: float | None) -> dict:
    """A candidate's searched values as one probe trains them: its learning rate, and the probe's steps and warm-up where
    they differ from the cell's (the rest of its schedule follows the recipe, scaled to the probe's steps)."""
    out = {**searched, LR_KEY: lr}
    steps = curve_settings(plan).steps
    if steps is not None and steps != plan.settings[cell].steps:
        out[STEPS_KEY] = steps
    if warmup is not None:
        out[WARMUP_KEY] = warmup
    return out


@dataclass(frozen=True)
class ProbeRun:
    """A trained probe: its Stability judged on its own, its final validation loss (None: diverged), its stage."""

    run: Stability
    loss: float | None
    stage: str


def probe_run(record: TrialRecord | None) -> ProbeRun | str | None:
    """What a probe's record says: a ProbeRun, FAILED, or None (not trained: none, running, stopped before its end)."""
    if record is None:
        return None
    if record.status == Status.FAILED:
        return FAILED
    metrics = record.metrics or {}
    if record.status == Status.DIVERGED:
        return ProbeRun(Stability(unstable=record.unstable or "diverged"), None, str(record.stage))
    if record.status != Status.COMPLETED:
        return None
    loss, baseline = metrics.get("val_loss"), metrics.get("val_baseline")
    known = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (loss, baseline))
    # only a rise is the run's own to judge: a record judged by the absolute level before it was the sweep's is judged again
    unstable = record.unstable if "rose" in (record.unstable or "") else ""
    rise = metrics.get("train_rise")
    return ProbeRun(Stability(unstable, rise=float(rise) if isinstance(rise, (int, float)) else 0.0,
                              learnt=baseline - loss if known else None), loss if isinstance(loss, (int, float)) else None, str(record.stage))


@dataclass(frozen=True)
class Chain:
    """One candidate, seed and warm-up as far as its probes went."""

    seed: int
    points: dict[int, SweepPoint]  # grid index -> the run there, judged among the chain's
    losses: dict[int, float]  # grid index -> final validation loss (runs that finished)
    state: str  # found | up to lr_max | below the range | did not train at this length | failed | not finished
    stable: float | None = None  # the edge: the largest stable learning rate
    unstable: float | None = None  # the smallest unstable one above it
    probes: int = 0  # probes this stage trained (the confirmation's run is not one)
    why: str = ""

    @property
    def value(self) -> float | None:
        """The edge this seed gives (lr_max, a lower bound, where it was stable up to there)."""
        return self.stable if self.state in ("found", "up to lr_max") else None

    @property
    def deciding(self) -> list[SweepPoint]:
        """The runs the edge rests on: the largest stable one and the smallest unstable one above it."""
        return [p for p in self.points.values() if p.lr in (self.stable, self.unstable)]

    @property
    def near(self) -> bool:
        return any(p.near() for p in self.deciding)

    def text(self) -> str:
        margins = ", ".join(f"{p.lr:.3g} {p.state} by {p.margin:.3f}" for p in self.deciding if p.margin is not None)
        margins = f" (margins: {margins}{'; near the threshold' if self.near else ''})" if margins else ""
        if self.state == "found":
            return f"seed {self.seed}: {self.stable:.3g} stable, {self.unstable:.3g} not{margins}"
        if self.state == "up to lr_max":
            return f"seed {self.seed}: stable up to lr_max {self.stable:.3g}"
        if self.state == "below the range":
            return f"seed {self.seed}: unstable already at {self.unstable:.3g}, its lowest learning rate ({self.why})"
        return f"seed {self.seed}: {self.state}" + (f" ({self.why})" if self.why else "")


def replay(state: Callable[[int], ProbeRun | str | None], grid: Grid, floor: int) -> tuple[list[int], dict | None]:
    """A chain from what its probes say (`state(index)`): (indices to probe next, None) while it goes on, else
    ([], {index: ProbeRun} of every probe it trained, with "edge": (stable index, unstable index, how it ended))."""
    runs: dict[int, ProbeRun] = {}

    def take(indices: list[int]) -> list[int] | str:
        """The indices not trained yet; FAILED when one failed."""
        missing = []
        for j in indices:
            found = state(j)
            if found == FAILED:
                return FAILED
            if found is None:
                missing.append(j)
            else:
                runs[j] = found
        return missing

    def end(low: int | None, high: int | None, how: str) -> tuple[list[int], dict]:
        return [], {**runs, "edge": (low, high, how)}

    missing = take(list(range(floor, 1, grid.every)))  # the coarse points from the floor up to the search's learning rate
    if missing == FAILED:
        return end(None, None, FAILED)
    if missing:
        return missing, None
    judged = lambda: dict(zip(sorted(runs), judge_sweep([(grid.lr(j), runs[j].run) for j in sorted(runs)])))  # noqa: E731
    while True:
        points = judged()
        first = next((j for j in sorted(points) if points[j].state == UNSTABLE), None)
        if first is not None:
            break
        highest = max(runs)
        if highest >= grid.top:
            return end(highest, None, "up to lr_max")
        missing = take([highest + grid.every])
        if missing == FAILED:
            return end(None, None, FAILED)
        if missing:
            return missing, None
    if first == min(runs):
        return end(None, first, "below the range")
    low, high = first - grid.every, first
    while high - low > 1:
        middle = (low + high) // 2
        missing = take([middle])
        if missing == FAILED:
            return end(None, None, FAILED)
        if missing:
            return missing, None
        low, high = (low, middle) if judged()[middle].state == UNSTABLE else (middle, high)
    return end(low, high, "found")


def candidate_name(candidate: Candidate) -> str:
    """'Pre-LN', or describe()'s '2 Post-LN layers' (with its other searched values)."""
    name = describe(candidate)
    return name.replace("0 Post-LN layers", "Pre-LN", 1) if candidate.uniform_pre else name


def probed(plan: SearchPlan, evidence: CellEvidence) -> list[Candidate]:
    """The candidates a cell's curves are trained for: its finalists with the confirmation's seeds, the Pre-LN reference
    and every baseline that trained (a finalist whose race ended early has fewer seeds and is left out, unless it is one
    of those)."""
    baselines = [dict(b) for b in plan.baselines]
    return [c for c in evidence.candidates if c in evidence.eligible or c is evidence.reference or any(c.overrides == b for b in baselines)]


class Probes:
    """The probes of one cell: each probe's identity (its recipe's, computed once), and what its record says."""

    def __init__(self, plan: SearchPlan, cell: str, record_of: Callable[[str], TrialRecord | None]):
        self.plan, self.cell, self.record_of = plan, cell, record_of
        self.grid = grid(plan, cell)
        self.seeds = [plan.settings[cell].base_seed + i for i in range(plan.confirm.seeds + 1)]
        self._identities: dict[tuple, str] = {}

    def searched(self, candidate: dict, index: int, warmup: float | None) -> dict:
        return probe_searched(self.plan, self.cell, candidate, self.grid.lr(index), warmup)

    def identity(self, candidate: dict, seed: int, index: int, warmup: float | None) -> str:
        key = (json.dumps(candidate, sort_keys=True, default=str), seed, index, warmup)
        if key not in self._identities:
            overrides = self.plan.seed_overrides(self.cell, self.searched(candidate, index, warmup), seed)
            self._identities[key] = trial_identity(self.plan.recipe(overrides))
        return self._identities[key]

    def state(self, candidate: dict, seed: int, warmup: float | None) -> Callable[[int], ProbeRun | str | None]:
        return lambda index: probe_run(self.record_of(self.identity(candidate, seed, index, warmup)))

    def floor(self, candidate: dict, warmup: float | None) -> int:
        """How far down the candidate's curve goes: one coarse step under its lowest point while that point is unstable on
        some seed or better than the one above it (mean over seeds), at most `below` coarse steps under lr_min."""
        grid, states = self.grid, [self.state(candidate, seed, warmup) for seed in self.seeds]
        floor = grid.bottom
        while floor > grid.floor:
            here = [state(floor) for state in states]
            above = [state(floor + grid.every) for state in states]
            if any(not isinstance(run, ProbeRun) for run in here + above):
                break
            if not any(run.run.unstable for run in here):
                if any(run.loss is None for run in above):
                    break
                if any(run.loss is None for run in here) or not sum(r.loss for r in here) < sum(r.loss for r in above):
                    break  # the loss turned worse (or stayed level) going down: the curve has its low end
            floor -= grid.every
        return floor

    def chain(self, candidate: dict, seed: int, warmup: float | None, floor: int) -> tuple[list[int], Chain | None]:
        """(indices to probe next, None) while the chain goes on; ([], its Chain) once it has ended."""
        following, ended = replay(self.state(candidate, seed, warmup), self.grid, floor)
        if ended is None:
            return following, None
        low, high, how = ended.pop("edge")
        order = sorted(ended)
        points = dict(zip(order, judge_sweep([(self.grid.lr(j), ended[j].run) for j in order])))
        losses = {j: run.loss for j, run in ended.items() if run.loss is not None}
        probes = sum(run.stage == StageName.LR for run in ended.values())
        if how == FAILED:
            failed = next((r for j in range(floor, self.grid.top + 1)
                           if (r := self.record_of(self.identity(candidate, seed, j, warmup))) is not None and r.status == Status.FAILED), None)
            return [], Chain(seed, points, losses, FAILED, probes=probes, why=failed.note if failed else "")
        if not any(p.state == STABLE for p in points.values()):
            unstable = [p for p in points.values() if p.state == UNSTABLE]
            why = f"no learning rate learnt {RULE.learnt:g} nats" + (f"; unstable from {unstable[0].lr:.3g}" if unstable else "")
            return [], Chain(seed, points, losses, "did not train at this length", probes=probes, why=why)
        lr = lambda j: None if j is None else self.grid.lr(j)  # noqa: E731
        why = points[high].why if high is not None and how == "below the range" else ""
        return [], Chain(seed, points, losses, how, lr(low), lr(high), probes, why)


@dataclass(frozen=True)
class Ratio:
    """A candidate's edge over Pre-LN's, paired by seed: the geometric mean of the seed ratios and its 95% interval (t on
    logarithms, widened by one grid step on each side)."""

    mean: float
    low: float | None
    high: float | None
    n: int

    def text(self) -> str:
        if self.low is None:
            return f"x{self.mean:.2g} (n={self.n}, no interval)"
        return f"x{self.mean:.2g} [{self.low:.2g}, {self.high:.2g}] (n={self.n})"


@dataclass(frozen=True)
class CandidateCurve:
    """One candidate's curve at one warm-up fraction, and what it says against Pre-LN's."""

    name: str
    model: str
    post_ln_layers: int | None
    uniform_pre: bool
    warmup: float
    chains: list[Chain]
    outcome: str  # trained | did not train at this length | not finished | failed
    curve: dict[float, dict[int, float]] = field(default_factory=dict)  # coarse lr -> seed -> loss (l0 where unstable)
    best: float | None = None  # the best learning rate (mean over seeds)
    share: float | None = None  # the fraction of seed resamples that choose it
    best_low: float | None = None  # the lowest and highest learning rate 95% of the resamples choose
    best_high: float | None = None
    edge: float | None = None  # the geometric mean of the seeds' edges
    edge_low: float | None = None  # its 95% interval (None below two seeds)
    edge_high: float | None = None
    edge_vs_pre: Ratio | None = None
    edge_verdict: str = ""  # reference | as stable | less stable | more stable | ... (why no comparison)
    sensitivities: dict[int, float] = field(default_factory=dict)  # seed -> its LR sensitivity over the fixed range
    sensitivity: float | None = None  # their mean
    sensitivity_low: float | None = None
    sensitivity_high: float | None = None
    sensitivity_vs_pre: Difference | None = None
    sensitivity_verdict: str = ""  # reference | as sensitive | more sensitive | less sensitive | ...

    @property
    def capped(self) -> bool:
        """Stable up to lr_max on some seed: `edge` is a lower bound there."""
        return any(c.state == "up to lr_max" for c in self.chains)

    @property
    def near(self) -> bool:
        return any(c.near for c in self.chains)

    @property
    def probes(self) -> int:
        return sum(c.probes for c in self.chains)

    def edge_text(self) -> str:
        if self.edge is None:
            return "-" if self.outcome == "trained" else self.outcome
        span = f" [{self.edge_low:.3g}, {self.edge_high:.3g}]" if self.edge_low is not None else ""
        return f"{'>= ' if self.capped else ''}{self.edge:.3g}{span}" + (" (near the threshold)" if self.near else "")

    def best_text(self) -> str:
        if self.best is None:
            return "-"
        span = f"{self.best_low:.3g}" if self.best_low == self.best_high else f"{self.best_low:.3g}-{self.best_high:.3g}"
        return f"{self.best:.3g} (chosen in {self.share:.0%} of seed resamples; 95% within {span})"

    def sensitivity_text(self) -> str:
        if self.sensitivity is None:
            return "-"
        span = f" [{self.sensitivity_low:.3g}, {self.sensitivity_high:.3g}]" if self.sensitivity_low is not None else ""
        return f"{self.sensitivity:.3g}{span}"

    def edge_verdict_text(self) -> str:
        if self.edge_vs_pre is not None and "stable" in self.edge_verdict and not self.edge_verdict.startswith("cannot"):
            return f"{self.edge_verdict} ({self.edge_vs_pre.text()} of Pre-LN's edge)" + (" near the threshold" if self.near else "")
        return self.edge_verdict

    def mean_at(self, lr: float) -> float | None:
        values = self.curve.get(lr)
        return sum(values.values()) / len(values) if values else None


@dataclass(frozen=True, repr=False)
class LrCurves:
    """The learning-rate curves of one cell: every probed candidate at every warm-up, and the cell's answer."""

    cell: str
    shared: float  # the search's learning rate
    grid: Grid
    steps: int  # a probe's steps
    cell_steps: int
    warmups: list[float]
    initial: float  # l0
    candidates: list[CandidateCurve] = field(default_factory=list)
    at_shared: Difference | None = None  # the winner minus Pre-LN at the shared lr (the confirmation's runs)
    shared_verdict: str = "n/a"
    versus: str | None = None  # the candidate compared with Pre-LN at each one's best (the winner, or the best other finalist)
    at_best: Difference | None = None  # ... at its best against Pre-LN at its best, paired by seed
    best_verdict: str = "n/a"
    answer: str = ""

    def __repr__(self) -> str:
        from blockforge.search.display import curves_text

        return curves_text(self)

    def _repr_html_(self) -> str:
        from blockforge.search.display import curves_html

        return curves_html(self)

    def of(self, model: str, warmup: float | None = None) -> CandidateCurve | None:
        """A candidate's curve at `warmup` (default: the first warm-up probed)."""
        warmup = self.warmups[0] if warmup is None else warmup
        return next((c for c in self.candidates if c.model == model and c.warmup == warmup), None)

    @property
    def finished(self) -> bool:
        return all(c.outcome != "not finished" for c in self.candidates)

    @property
    def probes(self) -> int:
        """The probes this check trained (the confirmation's runs it reads are not counted)."""
        return sum(c.probes for c in self.candidates)

    @property
    def robust(self) -> bool | None:
        """Whether the verdict at each one's best is the verdict at the shared learning rate (None: nothing to compare)."""
        return None if self.versus is None or self.best_verdict == "n/a" else self.best_verdict == self.shared_verdict

    def probe_text(self) -> str:
        length = "the cell's own" if self.steps == self.cell_steps else f"{self.steps} of the cell's {self.cell_steps}"
        return (f"probes of {self.steps} steps ({length}) from {self.grid.lr(self.grid.bottom):.3g} to lr_max {self.grid.high:g} in coarse "
                f"steps of x{self.grid.step ** self.grid.every:.3g}, edges found within x{self.grid.step:.3g}; {self.probes} probes trained")

    def text(self) -> str:
        """One line per candidate and warm-up, after the cell's answer."""
        lines = [f"{self.cell}: {self.answer}"]
        for c in self.candidates:
            lines.append(f"  {c.name}, warm-up {c.warmup:g}: best lr {c.best_text()}; edge {c.edge_text()}, {c.edge_verdict_text()}; "
                         f"LR sensitivity {c.sensitivity_text()}" + (f", {c.sensitivity_verdict}" if c.sensitivity_verdict else "")
                         + f"; {self.standing(c)}")
        return "\n".join(lines)

    def standing(self, c: CandidateCurve) -> str:
        """Where the shared learning rate sits on a candidate's own curve."""
        if c.best is None:
            return c.outcome
        parts = [f"the shared lr {self.shared:g} is x{self.shared / c.best:.2g} its best"]
        if c.edge is not None:
            parts.append(f"{self.shared / c.edge:.0%} of its edge")
        return ", ".join(parts)


def lr_curves(plan: SearchPlan, records: list[TrialRecord], evidence: CellEvidence) -> LrCurves | None:
    """The learning-rate curves of one cell from its records (None without a curve, or before the cell has candidates)."""
    if curve_settings(plan) is None or not evidence.candidates:
        return None
    cell = evidence.cell
    latest: dict[str, TrialRecord] = {}
    for r in records:  # by identity: a probe's record, or the confirmation's run a probe at the search's lr is the same as
        if r.cell == cell and r.identity and r.status != Status.DUPLICATE:
            if r.identity not in latest or probe_run(r) is not None or probe_run(latest[r.identity]) is None:
                latest[r.identity] = r
    probes = Probes(plan, cell, latest.get)
    out = LrCurves(cell, probes.grid.low, probes.grid, probe_steps(plan, cell), plan.settings[cell].steps,
                   [warmup_fraction(plan, cell, w) for w in warmups(plan)], initial_loss(plan, cell))
    candidates = probed(plan, evidence)
    for warmup in warmups(plan):
        chains = {}
        for c in candidates:
            floor = probes.floor(c.overrides, warmup)
            chains[c.model] = (floor, [probes.chain(c.overrides, seed, warmup, floor)[1] or Chain(seed, {}, {}, "not finished")
                                      for seed in probes.seeds])
        reference = evidence.reference.model if evidence.reference is not None else None
        built = {c.model: _candidate(c, warmup_fraction(plan, cell, warmup), *chains[c.model], probes.grid, out.initial) for c in candidates}
        for c in candidates:
            out.candidates.append(_compared(built[c.model], built.get(reference) if plan.against_pre_ln else None,
                                            c.model == reference, probes.grid))
    return _answered(out, evidence)


def _candidate(c: Candidate, warmup: float, floor: int, chains: list[Chain], grid: Grid, initial: float) -> CandidateCurve:
    """A candidate's curve, best learning rate, edge and sensitivity from its chains (no comparison yet)."""
    base = dict(name=candidate_name(c), model=c.model, post_ln_layers=c.post_ln_layers, uniform_pre=c.uniform_pre, warmup=warmup,
                chains=chains)
    if any(ch.state == "not finished" for ch in chains):
        return CandidateCurve(**base, outcome="not finished")
    if any(ch.state == FAILED for ch in chains):
        return CandidateCurve(**base, outcome=FAILED)
    if all(ch.state == "did not train at this length" for ch in chains):
        return CandidateCurve(**base, outcome="did not train at this length")
    curve = {grid.lr(j): {ch.seed: _clipped(ch, j, initial) for ch in chains} for j in grid.coarse(floor)}
    best, share, low, high = best_lr(curve)
    fixed = [grid.lr(j) for j in grid.coarse()]  # the sensitivity's range: lr_min to lr_max, the same for every candidate
    by_seed = {ch.seed: sum(curve[lr][ch.seed] for lr in fixed) / len(fixed) - min(curve[lr][ch.seed] for lr in fixed) for ch in chains}
    sens, sens_low, sens_high = _mean_interval(list(by_seed.values()))
    edge = edge_low = edge_high = None
    if all(ch.value is not None for ch in chains):  # a seed unstable at its lowest lr, or that never trained, has no edge to average
        mean, low_log, high_log = _mean_interval([math.log(ch.value) for ch in chains])
        edge = math.exp(mean)
        edge_low, edge_high = (math.exp(low_log), math.exp(high_log)) if low_log is not None else (None, None)
    return CandidateCurve(**base, outcome="trained", curve=curve, best=best, share=share, best_low=low, best_high=high, edge=edge,
                          edge_low=edge_low, edge_high=edge_high, sensitivities=by_seed, sensitivity=sens, sensitivity_low=sens_low,
                          sensitivity_high=sens_high)


def _clipped(chain: Chain, index: int, initial: float) -> float:
    """A chain's loss at a coarse point for the curve's statistics: l0 where the run was unstable, or above the chain's
    first unstable point (never trained: the grid stops growing there), else its loss, at most l0."""
    point = chain.points.get(index)
    if point is None or point.state == UNSTABLE or index not in chain.losses:
        return initial
    return min(chain.losses[index], initial)


def best_lr(curve: dict[float, dict[int, float]]) -> tuple[float, float, float, float]:
    """The learning rate with the best mean over the seeds (the lower one on a tie), how often seed resamples choose it and
    the lowest and highest learning rate 95% of them choose."""
    seeds = sorted(set.intersection(*(set(v) for v in curve.values())))

    def best_of(chosen: list[int]) -> float:
        return min(curve, key=lambda lr: (sum(curve[lr][s] for s in chosen) / len(chosen), lr))

    best = best_of(seeds)
    rng = random.Random(0)
    picks = sorted(best_of([rng.choice(seeds) for _ in seeds]) for _ in range(RESAMPLES))
    cut = int(0.025 * len(picks))
    return best, picks.count(best) / len(picks), picks[cut], picks[len(picks) - 1 - cut]


def _mean_interval(values: list[float]) -> tuple[float | None, float | None, float | None]:
    """The mean and its 95% t interval (None below two values)."""
    if not values:
        return None, None, None
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None, None
    half = t_quantile(len(values) - 1) * math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def _compared(mine: CandidateCurve, pre: CandidateCurve | None, is_reference: bool, grid: Grid) -> CandidateCurve:
    """The candidate with its edge and sensitivity against Pre-LN's, paired by seed."""
    from dataclasses import replace

    if mine.outcome != "trained":
        return replace(mine, edge_verdict=mine.outcome, sensitivity_verdict="")
    if is_reference:
        return replace(mine, edge_verdict="reference", sensitivity_verdict="reference")
    if pre is None:
        return replace(mine, edge_verdict="no Pre-LN reference", sensitivity_verdict="")
    if pre.outcome != "trained":
        why = f"cannot compare (Pre-LN: {pre.outcome})"
        return replace(mine, edge_verdict=why, sensitivity_verdict=why)
    ratio, edge_verdict = _edge_ratio(mine, pre, grid)
    sens = paired_difference(mine.sensitivities, pre.sensitivities)
    sens_verdict = ("n/a" if sens is None or sens.low is None else "more sensitive" if sens.low > 0 else "less sensitive" if sens.high < 0
                    else "as sensitive")
    return replace(mine, edge_vs_pre=ratio, edge_verdict=edge_verdict, sensitivity_vs_pre=sens, sensitivity_verdict=sens_verdict)


def _edge_ratio(mine: CandidateCurve, pre: CandidateCurve, grid: Grid) -> tuple[Ratio | None, str]:
    """Mine over Pre-LN's edge, paired by seed, and the verdict; an edge stable up to lr_max is only a lower bound."""
    for c, whose in ((mine, "its"), (pre, "Pre-LN's")):
        if c.edge is None:
            missing = next(ch for ch in c.chains if ch.value is None)
            return None, f"cannot compare ({whose} seed {missing.seed}: {missing.state})"
    diff = paired_difference({ch.seed: math.log(ch.value) for ch in mine.chains}, {ch.seed: math.log(ch.value) for ch in pre.chains})
    if diff is None:
        return None, "cannot compare (no seed in common)"
    if diff.low is None:
        return Ratio(math.exp(diff.mean), None, None, diff.n), "n/a (one seed)"
    widen = math.log(grid.step)
    low, high = diff.low - widen, diff.high + widen
    ratio = Ratio(math.exp(diff.mean), math.exp(low), math.exp(high), diff.n)
    if high < 0:
        return ratio, "less stable" if not mine.capped else "cannot tell (its edge is a lower bound: stable up to lr_max)"
    if low > 0:
        return ratio, "more stable" if not pre.capped else "cannot tell (Pre-LN's edge is a lower bound: stable up to lr_max)"
    if mine.capped and pre.capped:
        return ratio, "cannot tell (both stable up to lr_max)"
    return ratio, "at least as stable" if mine.capped else "at most as stable" if pre.capped else "as stable"


def _answered(curves: LrCurves, evidence: CellEvidence) -> LrCurves:
    """The curves with the cell's answer: the verdict at the shared learning rate and at each one's best, the winner's edge
    and sensitivity against Pre-LN's, and where the shared rate sits on its curve."""
    from dataclasses import replace

    winner, reference = evidence.winner, evidence.reference
    if winner is None or reference is None:
        return replace(curves, answer="no winner and Pre-LN to compare yet" + ("" if curves.finished else " (probes not finished)"))
    first = curves.warmups[0]
    pre = curves.of(reference.model, first)
    if winner is not reference:
        mine = curves.of(winner.model, first)
    else:  # Pre-LN won: the best other candidate at its own best, if any
        others = [c for c in curves.candidates if c.warmup == first and c.model != reference.model and c.best is not None]
        mine = min(others, key=lambda c: c.mean_at(c.best), default=None)
    at_shared = evidence.vs_reference if winner is not reference else None
    shared_verdict = evidence.verdict
    at_best, best_verdict = None, "n/a"
    if mine is not None and pre is not None and mine.best is not None and pre.best is not None:
        at_best = paired_difference(mine.curve[mine.best], pre.curve[pre.best])
        best_verdict = verdict(at_best, "min")
    parts = [f"at the shared lr {curves.shared:g}: {shared_verdict}" + (f" ({at_shared.text()})" if at_shared else "")]
    if mine is not None and mine.best is not None and pre is not None and pre.best is not None:
        parts.append(f"at each one's best ({mine.name} at {mine.best:.3g}, Pre-LN at {pre.best:.3g}): {best_verdict}"
                     + (f" ({at_best.text()})" if at_best else ""))
    if mine is not None and mine.edge_vs_pre is not None:
        parts.append(f"edge {mine.edge_verdict_text()}")
    elif mine is not None and mine.model != reference.model:
        parts.append(f"edge: {mine.edge_verdict or mine.outcome}")
    if mine is not None and mine.sensitivity_vs_pre is not None:
        parts.append(f"LR sensitivity {mine.sensitivity_verdict} ({mine.sensitivity_vs_pre.text()})")
    answer = "; ".join(parts) + ("" if curves.finished else " (probes not finished)")
    return replace(curves, at_shared=at_shared, shared_verdict=shared_verdict, versus=mine.name if mine else None, at_best=at_best,
                   best_verdict=best_verdict, answer=answer)
