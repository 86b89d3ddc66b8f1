"""The largest stable learning rate across cells: how it moves with depth (and width) for each kind of candidate, and
whether a larger model's learning rate is predicted to lie inside its stable range.

Per kind (Pre-LN; all-Post-LN where the search trains it; Mix-LN at the paper's alpha 0.25; each cell's winner where it is
not Pre-LN) and warm-up fraction, a power law is fitted to the cells' geometric means by least squares on logarithms,

    log lr* = a + b log depth  (+ c log width, where the cells vary the width)

and bootstrapped over seeds: each resample draws every cell's seeds with replacement (the same draw for every kind of a
cell, so kinds stay paired by seed), takes the geometric mean of the drawn seeds' largest stable learning rates, and
refits. The intervals are the middle 95% of the resamples. A kind's depth exponent minus Pre-LN's, over the same
resamples, says whether its margin shrinks with depth faster than Pre-LN's (KEEL's claim for Mix-LN) or not.

Predictions: at each transfer target and each `confirm.stability.predict` size, every law's largest stable learning rate
with its interval, against the learning rate that size's recipe trains with (under muP / CompleteP the same one, since the
learning rate is meant to transfer): `inside` when the recipe's learning rate lies below the interval, `outside` when
above it, else `cannot tell`. A law fitted on one width predicts at another width as if width did not matter, and says so.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from blockforge.search.checks.stability_check import CandidateStability, StabilityCheck
from blockforge.search.config import SearchPlan, cell_name
from blockforge.search.evidence.evidence import CellEvidence

RESAMPLES = 1000
KINDS = ("Pre-LN", "Post-LN", "Mix-LN alpha 0.25", "winner")


@dataclass(frozen=True)
class StabilityPoint:
    cell: str
    depth: int
    width: int
    largest: float  # the geometric mean over seeds
    low: float | None
    high: float | None
    seeds: dict[int, float]  # seed -> its largest stable learning rate


@dataclass
class StabilityFit:
    kind: str
    warmup: float
    points: list[StabilityPoint]
    terms: list[str]  # "1", "log depth", "log width"
    params: list[float]
    low: list[float]  # 95% over seed resamples, per parameter
    high: list[float]
    draws: list[list[float]] = field(default_factory=list, repr=False)  # the resamples' parameters (for predictions)
    versus_pre: tuple[float, float, float] | None = None  # the depth exponent minus Pre-LN's: estimate, 95% interval

    def formula(self) -> str:
        scale = f"{math.exp(self.params[0]):.3g}"
        powers = [f"{'L' if name == 'log depth' else 'W'}^{value:+.2f}" for name, value in zip(self.terms[1:], self.params[1:])]
        return "lr* = " + " * ".join([scale, *powers])

    def exponent_text(self) -> str:
        if "log depth" not in self.terms:
            return "-"
        i = self.terms.index("log depth")
        return f"{self.params[i]:+.2f} [{self.low[i]:+.2f}, {self.high[i]:+.2f}]"

    def at(self, params: list[float], depth: int, width: int) -> float:
        values = {"1": 1.0, "log depth": math.log(depth), "log width": math.log(width)}
        return math.exp(sum(p * values[t] for p, t in zip(params, self.terms)))

    def predict(self, depth: int, width: int) -> tuple[float, float, float]:
        point = self.at(self.params, depth, width)
        drawn = sorted(self.at(p, depth, width) for p in self.draws) or [point]
        cut = int(0.025 * len(drawn))
        return point, drawn[cut], drawn[len(drawn) - 1 - cut]


@dataclass(frozen=True)
class StabilityPrediction:
    size: str
    depth: int
    width: int
    lr: float  # what the size's recipe trains with
    kind: str
    warmup: float
    largest: float
    low: float
    high: float
    verdict: str  # inside | outside | cannot tell
    width_assumed: bool  # the law was fitted on one width: width was assumed not to matter

    def text(self) -> str:
        where = {"inside": "inside its stable range", "outside": "outside its stable range",
                 "cannot tell": "within the interval: cannot tell"}[self.verdict]
        note = " (fitted on one width: assumes width does not move it)" if self.width_assumed else ""
        return (f"{self.size}: {self.kind} (warm-up {self.warmup:g}) largest stable lr {self.largest:.3g} [{self.low:.3g}, "
                f"{self.high:.3g}]; the recipe's lr {self.lr:g} is {where}{note}")


@dataclass
class StabilityLaw:
    fits: list[StabilityFit]
    predictions: list[StabilityPrediction]

    def verdicts(self) -> list[str]:
        """Per kind and warm-up: does its largest stable lr fall with depth faster than Pre-LN's?"""
        lines = []
        for f in self.fits:
            if f.versus_pre is None:
                continue
            d, lo, hi = f.versus_pre
            if hi < 0:
                said = "falls faster with depth than Pre-LN's"
            elif lo > 0:
                said = "falls slower with depth than Pre-LN's"
            else:
                said = "falls neither faster nor slower with depth than Pre-LN's, within the interval"
            lines.append(f"{f.kind} (warm-up {f.warmup:g}): its largest stable lr {said} (depth exponent minus Pre-LN's {d:+.2f} "
                         f"[{lo:+.2f}, {hi:+.2f}])")
        return lines


def kind_of(candidate: CandidateStability, depth: int, winner: str | None) -> list[str]:
    """The kinds a probed candidate stands for in its cell (the winner may also be the paper's alpha)."""
    from blockforge.spec.resolve import mix_ln_count

    kinds = []
    if candidate.uniform_pre:
        kinds.append("Pre-LN")
    if candidate.post_ln_layers == depth:
        kinds.append("Post-LN")
    k = mix_ln_count(0.25, depth)
    if candidate.post_ln_layers == k and 0 < k < depth:
        kinds.append("Mix-LN alpha 0.25")
    if candidate.model == winner and not candidate.uniform_pre:
        kinds.append("winner")
    return kinds


def _point(cell: str, depth: int, width: int, c: CandidateStability) -> StabilityPoint | None:
    seeds = {b.seed: b.value for b in c.brackets if b.value is not None}
    if c.largest is None or len(seeds) != len(c.brackets):  # a seed unstable at the search's lr, or not finished: no point
        return None
    return StabilityPoint(cell, depth, width, c.largest, c.low, c.high, seeds)


def stability_law(plan: SearchPlan, checks: dict[str, StabilityCheck | None], evidence: dict[str, CellEvidence]) -> StabilityLaw | None:
    """The laws of every kind and warm-up with points in two cells or more, and their predictions (None: fewer than two cells)."""
    import numpy as np

    points: dict[tuple[str, float], list[StabilityPoint]] = {}
    for cell, check in checks.items():
        if check is None:
            continue
        model = plan.recipe(plan.trial_overrides(plan.cell(cell), {})).model
        winner = evidence[cell].winner.model if evidence[cell].winner is not None else None
        for c in check.candidates:
            point = _point(cell, model.depth, model.width, c)
            if point is not None:
                for kind in kind_of(c, model.depth, winner):
                    points.setdefault((kind, c.warmup), []).append(point)
    fits = []
    for (kind, warmup), found in sorted(points.items(), key=lambda item: (KINDS.index(item[0][0]), item[0][1])):
        depths, widths = {p.depth for p in found}, {p.width for p in found}
        terms = ["1"] + (["log depth"] if len(depths) > 1 else []) + (["log width"] if len(widths) > 1 else [])
        if len(found) < 2 or len(terms) == 1 or len(found) < len(terms):
            continue
        fits.append(StabilityFit(kind, warmup, found, terms, *_fit(found, terms, np)))
    if not fits:
        return None
    _bootstrap(fits, np)
    return StabilityLaw(fits, _predictions(plan, fits))


def _design(points: list[StabilityPoint], terms: list[str], np):
    columns = {"1": lambda p: 1.0, "log depth": lambda p: math.log(p.depth), "log width": lambda p: math.log(p.width)}
    return np.array([[columns[t](p) for t in terms] for p in points])


def _fit(points: list[StabilityPoint], terms: list[str], np, values: list[float] | None = None) -> tuple[list[float], list[float], list[float]]:
    y = np.log(np.array(values if values is not None else [p.largest for p in points]))
    params = np.linalg.lstsq(_design(points, terms, np), y, rcond=None)[0]
    return [float(v) for v in params], [float(v) for v in params], [float(v) for v in params]


def _bootstrap(fits: list[StabilityFit], np) -> None:
    """Every fit's parameters over seed resamples (each cell's seeds drawn once per resample, for every kind), their 95%
    intervals, and each kind's depth exponent against Pre-LN's at the same warm-up."""
    rng = random.Random(0)
    cells = sorted({p.cell for f in fits for p in f.points})
    seeds = {cell: sorted({s for f in fits for p in f.points if p.cell == cell for s in p.seeds}) for cell in cells}
    for _ in range(RESAMPLES):
        drawn = {cell: [rng.choice(seeds[cell]) for _ in seeds[cell]] for cell in cells}
        for f in fits:
            values = [math.exp(sum(math.log(p.seeds[s]) for s in drawn[p.cell]) / len(drawn[p.cell])) for p in f.points]
            f.draws.append(_fit(f.points, f.terms, np, values)[0])
    for f in fits:
        columns = list(zip(*f.draws))
        cut = int(0.025 * len(f.draws))
        f.low = [sorted(c)[cut] for c in columns]
        f.high = [sorted(c)[len(c) - 1 - cut] for c in columns]
    for f in fits:
        pre = next((g for g in fits if g.kind == "Pre-LN" and g.warmup == f.warmup), None)
        if f.kind == "Pre-LN" or pre is None or "log depth" not in f.terms or "log depth" not in pre.terms:
            continue
        i, j = f.terms.index("log depth"), pre.terms.index("log depth")
        differences = sorted(a[i] - b[j] for a, b in zip(f.draws, pre.draws))
        cut = int(0.025 * len(differences))
        f.versus_pre = (f.params[i] - pre.params[j], differences[cut], differences[len(differences) - 1 - cut])


def prediction_sizes(plan: SearchPlan) -> list[tuple[str, object]]:
    """(name, recipe) of every size the laws predict at: the transfer targets, then confirm.stability.predict's."""
    sizes = [(name, plan.recipe(plan.trial_overrides(plan.cell(name), {}))) for name in plan.target_names()]
    for size in plan.confirm.stability.predict:
        sizes.append((cell_name(size), plan.recipe(plan.overrides + list(size.items()))))
    return sizes


def _predictions(plan: SearchPlan, fits: list[StabilityFit]) -> list[StabilityPrediction]:
    out = []
    for name, recipe in prediction_sizes(plan):
        depth, width, lr = recipe.model.depth, recipe.model.width, recipe.train.lr
        for f in fits:
            largest, low, high = f.predict(depth, width)
            verdict = "inside" if lr < low else "outside" if lr > high else "cannot tell"
            assumed = "log width" not in f.terms and width not in {p.width for p in f.points}
            out.append(StabilityPrediction(name, depth, width, lr, f.kind, f.warmup, largest, low, high, verdict, assumed))
    return out
