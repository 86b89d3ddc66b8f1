"""Early stopping checked against full budgets: curves, rank agreement at each rung, crossings.

A trial's curve is its run folder's evaluations (step -> metric). Confirmation trains several models of
a cell to the full budget with the same seeds, so their curves say how far the ranking at an early
step (an ASHA rung) can be trusted: Kendall tau between the ranking there and the final one, and the
pairs that cross (behind at the rung, ahead at the end) with the margin they were behind by.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from blockforge.search.records.ledger import APART, StageName, TrialRecord
from blockforge.spec.search import mode_sign
from blockforge.train.events import Status

if TYPE_CHECKING:
    from blockforge.search.config import SearchPlan


def curve_of(run_dir: str | Path, metric: str) -> dict[int, float]:
    """step -> `metric` at every evaluation in the run folder's metrics.jsonl (the last line per step wins)."""
    path = Path(run_dir) / "metrics.jsonl"
    try:
        stat = path.stat()
    except OSError:
        return {}
    return dict(_read_curve(str(path), metric, stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=4096)
def _read_curve(path: str, metric: str, mtime_ns: int, size: int) -> tuple[tuple[int, float], ...]:
    """The curve of one version of a metrics file (the live view and the scheduler read the same files often)."""
    curve: dict[int, float] = {}
    for line in Path(path).read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:  # a line cut short by a kill
            continue
        if isinstance(event, dict) and event.get("event") == "eval" and isinstance(event.get(metric), (int, float)):
            curve[int(event["step"])] = float(event[metric])
    return tuple(sorted(curve.items()))


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's tau-a between two rankings of the same items (1: same order, -1: reversed); 1.0 below two items."""
    return order_agreement(a, b).tau


@dataclass(frozen=True)
class Agreement:
    """Two rankings of the same items compared pair by pair: the items' pairs, those ranked in opposite orders
    (ties in either ranking are neither), tau-a, and the largest gap in `a` of an opposite pair."""

    pairs: int
    opposite: int
    tau: float
    largest: float


def order_agreement(a: list[float], b: list[float]) -> Agreement:
    """`a` against `b` in O(n log n): sort by b, count the strict inversions of a (merge sort), the ties of each and of
    both, and track, along b's order, the largest a of the items strictly ahead in b."""
    n = len(a)
    pairs = n * (n - 1) // 2
    if pairs == 0:
        return Agreement(0, 0, 1.0, 0.0)
    order = sorted(range(n), key=lambda i: (b[i], a[i]))
    sequence = [a[i] for i in order]
    opposite = _strict_inversions(sequence)
    ties_a = sum(c * (c - 1) // 2 for c in Counter(a).values())
    ties_b = sum(c * (c - 1) // 2 for c in Counter(b).values())
    ties_both = sum(c * (c - 1) // 2 for c in Counter(zip(a, b)).values())
    same = pairs - ties_a - ties_b + ties_both - opposite
    largest, ahead, i = 0.0, None, 0
    while i < n:  # by b, best first; items tied in b are not ahead of one another
        j = i
        while j < n and b[order[j]] == b[order[i]]:
            j += 1
        if ahead is not None:
            largest = max([largest] + [ahead - a[order[k]] for k in range(i, j) if ahead > a[order[k]]])
        group_max = max(a[order[k]] for k in range(i, j))
        ahead = group_max if ahead is None else max(ahead, group_max)
        i = j
    return Agreement(pairs, opposite, (same - opposite) / pairs, largest)


def _strict_inversions(values: list[float]) -> int:
    """Pairs i < j with values[i] > values[j] (equal values are no inversion)."""
    if len(values) < 2:
        return 0
    middle = len(values) // 2
    left, right = values[:middle], values[middle:]
    count = _strict_inversions(left) + _strict_inversions(right)
    left.sort()
    right.sort()
    j = 0
    for value in left:  # right elements strictly below each left one
        while j < len(right) and right[j] < value:
            j += 1
        count += j
    return count


@dataclass(frozen=True)
class Crossing:
    """On one seed: `ahead` ended better than `behind_model` yet was behind it at the step, by `margin`."""

    ahead: str
    behind_model: str
    seed: int
    margin: float


LISTED_PAIRS = 2000  # a seed's crossing pairs are listed one by one (Crossing) up to this many pairs; beyond, only counted


@dataclass
class RungCheck:
    """How far the ranking at `step` agrees with the final one, among a cell's full-budget curves."""

    step: int
    tau: float | None  # Kendall tau, mean over the seeds two or more candidates share; None without such a seed
    seeds: int  # seeds that entered tau
    pairs: int  # candidate pairs compared (over those seeds)
    crossings: list[Crossing] = field(default_factory=list)  # the crossing pairs, listed where a seed has few pairs
    crossed: int = 0  # pairs that cross
    largest: float = 0.0  # the largest margin a candidate was behind by at this step and still ended ahead (0: none)

    def text(self) -> str:
        tau = "no seed shared by two full curves" if self.tau is None else f"Kendall tau {self.tau:+.2f} over {self.seeds} seed(s)"
        cross = f"{self.crossed} of {self.pairs} pairs cross, by up to {self.largest:.3g}" if self.crossed else f"no pair of {self.pairs} crosses"
        return f"step {self.step}: {tau}; {cross}"


@dataclass(frozen=True)
class Curve:
    """A full-budget run of one model with one seed: its evaluations and its final value."""

    model: str
    seed: int
    values: dict[int, float]
    final: float


def value_at(curve: dict[int, float], step: int) -> float | None:
    """The curve's value at `step`, or at its last evaluation before it (None before the first)."""
    earlier = [s for s in curve if s <= step]
    return curve[max(earlier)] if earlier else None


def rung_checks(curves: list[Curve], steps: list[int], mode: str, tau: bool = True) -> list[RungCheck]:
    """Per step: rank agreement with the final values (Kendall tau; left out with tau=False) and the pairs that cross,
    seed by seed, in O(n log n) per seed (order_agreement)."""
    sign = mode_sign(mode)
    by_seed: dict[int, list[Curve]] = {}
    for c in curves:
        by_seed.setdefault(c.seed, []).append(c)
    checks = []
    for step in steps:
        taus, pairs, crossed, largest, crossings = [], 0, 0, 0.0, []
        for seed, group in sorted(by_seed.items()):
            at = [(c, value_at(c.values, step)) for c in group]
            at = [(c, v) for c, v in at if v is not None]
            if len(at) < 2:
                continue
            agreement = order_agreement([sign * v for _, v in at], [sign * c.final for c, _ in at])
            if tau:
                taus.append(agreement.tau)
            pairs, crossed, largest = pairs + agreement.pairs, crossed + agreement.opposite, max(largest, agreement.largest)
            if agreement.opposite and agreement.pairs <= LISTED_PAIRS:
                for (a, va), (b, vb) in itertools.combinations(at, 2):
                    early, late = sign * (va - vb), sign * (a.final - b.final)
                    if early * late < 0:  # the order changed between the step and the end
                        ahead, behind = (a, b) if late < 0 else (b, a)
                        crossings.append(Crossing(ahead.model, behind.model, seed, abs(early)))
        checks.append(RungCheck(step, sum(taus) / len(taus) if taus else None, len(taus), pairs, crossings, crossed, largest))
    return checks


def margin_behind(value: float, step: int, seed: int, curves: list[Curve], mode: str, exclude: str = "") -> float | None:
    """How far `value` at `step` is behind the best full-budget curve on the same seed there (negative: ahead)."""
    sign = mode_sign(mode)
    others = [value_at(c.values, step) for c in curves if c.seed == seed and c.model != exclude]
    others = [v for v in others if v is not None]
    if not others:
        return None
    best = min(others, key=lambda v: sign * v)
    return sign * (value - best)


def cell_curves(records: list, cell: str, metric: str) -> list[Curve]:
    """Every full-budget run of `cell` (any stage) as a Curve of `metric`."""

    out = []
    for r in records:
        if r.cell == cell and r.status == Status.COMPLETED and r.value is not None and r.run_dir and r.stage not in APART:
            out.append(Curve(r.model or r.identity, r.seed, curve_of(r.run_dir, metric), r.value))
    return out


@dataclass(frozen=True)
class PrunedCheck:
    """A pruned exploration trial against the full-budget curves of its cell at the step where it stopped."""

    trial: int
    model: str
    step: int
    margin: float | None  # behind the best full-budget curve of its seed there (None: no such curve)
    crossing: float  # the largest margin by which full-budget curves crossed at that step

    @property
    def inside(self) -> bool:
        """Whether it was behind by no more than a margin that was overtaken: it could have ended ahead."""
        return self.margin is not None and self.margin <= self.crossing and self.crossing > 0


def pruned_checks(records: list, cell: str, metric: str, mode: str, curves: list[Curve] | None = None) -> list[PrunedCheck]:
    """Each pruned exploration trial of `cell` whose model has no full-budget run, checked against the cell's curves."""

    curves = cell_curves(records, cell, metric) if curves is None else curves
    finished = {c.model for c in curves}
    crossing: dict[int, float] = {}  # step -> the largest margin overtaken there (one check per step, not per trial)
    best: dict[tuple[int, int], float | None] = {}  # (seed, step) -> the best full-budget value there
    sign = mode_sign(mode)
    out = []
    for r in records:
        if r.cell != cell or r.stage != StageName.EXPLORE or r.status != Status.PRUNED or (r.model or r.identity) in finished:
            continue
        value = value_at(curve_of(r.run_dir, metric), r.steps) if r.run_dir else None
        value = r.value if value is None else value
        if value is None:
            continue
        if r.steps not in crossing:
            crossing[r.steps] = rung_checks(curves, [r.steps], mode, tau=False)[0].largest
        if (r.seed, r.steps) not in best:
            there = [v for v in (value_at(c.values, r.steps) for c in curves if c.seed == r.seed) if v is not None]
            best[(r.seed, r.steps)] = min(there, key=lambda v: sign * v) if there else None
        margin = sign * (value - best[(r.seed, r.steps)]) if best[(r.seed, r.steps)] is not None else None
        out.append(PrunedCheck(r.trial, r.model or r.identity, r.steps, margin, crossing[r.steps]))
    return out


def asha_rungs(grace: int, reduction_factor: float, max_steps: int) -> list[int]:
    """The steps where ASHA compares trials: grace, grace * rf, ... below the full budget."""
    steps, step = [], float(grace)
    while step < max_steps:
        steps.append(int(round(step)))
        step *= reduction_factor
    return steps


@dataclass
class CellRungs:
    """What a cell's full-budget curves say about its early stopping."""

    cell: str
    rungs: list[int]  # ASHA's rung steps (none without a scheduler)
    checks: list[RungCheck]  # at every evaluated step before the end
    pruned: list[PrunedCheck]
    promoted: dict[int, str]  # trial number of a promoted run -> why

    def at(self, step: int) -> RungCheck | None:
        return next((c for c in self.checks if c.step == step), None)

    def first_agreeing_step(self) -> int | None:
        """The first evaluated step from which on no pair of full-budget curves crossed."""
        clear = None
        for check in reversed(self.checks):
            if check.crossed or check.tau is None:
                break
            clear = check.step
        return clear

    def advice(self) -> str:
        """One sentence when the curves crossed at a rung: what that means for the pruned trials and what to change."""
        crossed = [self.at(r) for r in self.rungs if self.at(r) is not None and self.at(r).crossed]
        if not crossed:
            return ""
        check = crossed[0]
        inside = [p for p in self.pruned if p.inside]
        later = self.first_agreeing_step()
        change = (f"raise scheduler.asha.grace_steps to {later} (from there on no pair crossed)" if later is not None
                  else "no evaluated step before the end was free of crossings: search without a scheduler")
        change += f", or scheduler.asha.margin above {check.largest:.3g}"
        text = (f"{self.cell}: at the rung of step {check.step}, {check.crossed} of {check.pairs} pairs of full-budget curves "
                f"crossed (behind there by up to {check.largest:.3g}, ahead at the end)")
        if inside:
            text += f"; {len(inside)} pruned trial(s) were behind by less there and may have ended ahead"
        if self.promoted:
            text += f"; {len(self.promoted)} run(s) were promoted to the full budget"
        return text + f"; to trust the rung, {change}."


def cell_rungs(plan, records: list, cell: str) -> CellRungs:
    curves = cell_curves(records, cell, plan.metric)
    budget = plan.settings[cell].steps
    steps = sorted({s for c in curves for s in c.values if s < budget})
    rungs = asha_rungs(plan.asha.grace_steps, plan.asha.reduction_factor, budget) if plan.asha is not None else []
    promoted = {r.trial: r.promoted for r in records if r.cell == cell and r.promoted}
    return CellRungs(cell, rungs, rung_checks(curves, steps, plan.mode), pruned_checks(records, cell, plan.metric, plan.mode, curves), promoted)


class RungTable:
    """A cell's rungs: the value each exploration trial had on first reaching each rung, and the largest margin by which
    a full-budget curve of the cell's base seed was behind another there and still ended ahead, and how the full-budget
    curves of each seed rank there against the end (the scheduler's and the live view's figures, kept up to date
    instead of re-read; `records`: the cell's ledger records when it is built)."""

    def __init__(self, plan: SearchPlan, cell: str, base_seed: int, records: list[TrialRecord]):
        self.sign = mode_sign(plan.mode)
        self.rungs = asha_rungs(plan.asha.grace_steps, plan.asha.reduction_factor, plan.settings[cell].steps)
        self.base_seed = base_seed
        self.values = {rung: [] for rung in self.rungs}  # rung -> sign * value of every trial there, sorted
        self.reached: dict[int, dict[int, float]] = {}  # trial number -> rung -> its sign * value there
        self.curves = 0  # full-budget curves of the base seed
        self.with_curve: set[int] = set()  # the trials whose full-budget curve is in: one curve a trial, however often recorded
        self.crossing = dict.fromkeys(self.rungs, 0.0)  # rung -> the largest margin overtaken there on the base seed
        self.orders: dict[int, dict[int, SeedOrder]] = {rung: {} for rung in self.rungs}  # rung -> seed -> its curves
        metric = plan.metric
        for record in records:
            if record.stage == StageName.EXPLORE and record.run_dir and record.status not in (Status.DUPLICATE, Status.FAILED):
                for step, value in sorted(curve_of(record.run_dir, metric).items()):
                    self.observe(record.trial, step, value)
            if record.status == Status.COMPLETED and record.value is not None and record.run_dir and record.stage not in APART:
                self.add_curve(Curve(record.model or record.identity, record.seed, curve_of(record.run_dir, metric), record.value), record.trial)

    def observe(self, number: int, step: int, value: float) -> None:
        """Trial `number` reported `value` at `step`: the rungs it reaches here for the first time hold it."""
        held = self.reached.setdefault(number, {})
        for rung in self.rungs:
            if rung <= step and rung not in held:
                held[rung] = self.sign * value
                bisect.insort(self.values[rung], self.sign * value)

    def forget(self, number: int) -> None:
        """A trial that failed counts at no rung."""
        for rung, value in self.reached.pop(number, {}).items():
            self.values[rung].pop(bisect.bisect_left(self.values[rung], value))

    def add_curve(self, curve: Curve, number: int) -> None:
        """Trial `number`'s full-budget curve: placed among the earlier ones of its seed at each rung (SeedOrder); the base
        seed's crossings set the rung's margin. A trial recorded twice (its end read back from its run folder on resume, then
        reported again by the trial Tune restarts) is one curve."""
        seen = self.__dict__.setdefault("with_curve", set())  # (a table unpickled from a search saved before it had one)
        if number in seen:
            return
        seen.add(number)
        if curve.seed == self.base_seed:
            self.curves += 1
        final = self.sign * curve.final
        for rung in self.rungs:
            value = value_at(curve.values, rung)
            if value is None:
                continue
            largest = self.orders[rung].setdefault(curve.seed, SeedOrder()).add(final, self.sign * value)
            if curve.seed == self.base_seed:
                self.crossing[rung] = max(self.crossing[rung], largest)

    def agreement(self, rung: int) -> tuple[float | None, int, int, float]:
        """(Kendall tau averaged over the seeds two or more full-budget curves share, pairs, pairs that cross, the
        largest margin overtaken) at `rung`: rungs.rung_checks' figures, kept up to date instead of recomputed."""
        orders = [o for o in self.orders[rung].values() if o.pairs]
        if not orders:
            return None, 0, 0, 0.0
        tau = sum((o.concordant - o.discordant) / o.pairs for o in orders) / len(orders)
        return tau, sum(o.pairs for o in orders), sum(o.discordant for o in orders), max(o.largest for o in orders)

    def others(self, number: int, rung: int) -> list[float]:
        """sign * value at `rung` of every trial there but `number`, sorted."""
        values = self.values[rung]
        own = self.reached.get(number, {}).get(rung)
        if own is None:
            return values
        values = list(values)
        values.pop(bisect.bisect_left(values, own))
        return values


class SeedOrder:
    """One seed's full-budget curves at one rung: (sign * final, sign * value there) ordered by final, with the pairs
    ranked alike and oppositely at the rung and at the end (ties in either are neither) and the largest margin by which
    a curve behind at the rung ended ahead."""

    def __init__(self):
        self.finals, self.values = np.empty(0), np.empty(0)
        self.concordant = self.discordant = 0
        self.largest = 0.0

    @property
    def pairs(self) -> int:
        return len(self.finals) * (len(self.finals) - 1) // 2

    def add(self, final: float, value: float) -> float:
        """Place one curve (O(log n) to find, O(n) vectorised to count); returns the largest margin it crossed by."""
        better = bisect.bisect_left(self.finals, final)  # those ending ahead of it: before here
        worse = bisect.bisect_right(self.finals, final)  # those ending behind it: from here on
        ahead, behind = self.values[:better], self.values[worse:]
        self.concordant += int((ahead < value).sum() + (behind > value).sum())
        self.discordant += int((ahead > value).sum() + (behind < value).sum())
        largest = 0.0
        if len(ahead) and ahead.max() > value:  # it ends behind them yet was ahead of one at the rung
            largest = float(ahead.max()) - value
        if len(behind) and behind.min() < value:  # it ends ahead of them yet was behind one at the rung
            largest = max(largest, value - float(behind.min()))
        self.largest = max(self.largest, largest)
        self.finals, self.values = np.insert(self.finals, worse, final), np.insert(self.values, worse, value)
        return largest
