"""The edge (the largest stable learning rate, search/checks/lr_curve.py) across cells: how it moves with depth (and width)
for each kind of candidate, and whether a larger model's learning rate is predicted to lie inside its stable range.

Per kind (Pre-LN; all-Post-LN where the search trains it; Mix-LN at the paper's alpha 0.25; each cell's winner where it is
not Pre-LN) and warm-up fraction, a power law is fitted by least squares on logarithms to the cells' edges (each cell's
geometric mean over its seeds),

    log edge = a + b log depth  (+ c log width, where the cells vary the width)

Cells are the unit. A parameter's 95% interval comes from the cells' scatter around the law (t with cells minus terms
degrees of freedom): it holds the seed noise of each cell's mean and whatever the law misses; seeds within a cell only make
its point. Each interval is widened for the grid: an edge is known within one grid step, and one step at one end of the
depth range tilts a slope by log(step) / (the range of log depth). An edge that is only a lower bound (a seed stable up to
lr_max) is no point: its cell is left out and named, so it can never narrow an interval. With no degree of freedom left
the law has no interval, and everything it would say is "cannot tell".

A kind against Pre-LN is compared over the cells both have exact edges in: the per-cell log ratio is fitted the same way,
and its slope is the kind's depth exponent minus Pre-LN's. "Falls faster (slower) with depth than Pre-LN's" only when its
interval excludes 0; otherwise, or with too few common cells, "cannot tell".

Predictions: at each transfer target and each `predict` size, every law's edge with its 95% prediction interval (the fit's,
widened by one grid step), against the learning rate that size's recipe trains with: `inside` when that rate lies below the
interval, `outside` when above it, else (or without an interval) `cannot tell`. A law fitted on one width predicts at
another width as if width did not matter, and says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from blockforge.search.checks.lr_curve import CandidateCurve, LrCurves, curve_settings
from blockforge.search.config import SearchPlan, cell_name
from blockforge.search.evidence.evidence import CellEvidence, t_quantile

KINDS = ("Pre-LN", "Post-LN", "Mix-LN alpha 0.25", "winner")


@dataclass(frozen=True)
class StabilityPoint:
    cell: str
    depth: int
    width: int
    largest: float  # the edge: the geometric mean over seeds
    low: float | None
    high: float | None
    seeds: dict[int, float]  # seed -> its edge


@dataclass
class Fit:
    """log y = X params by least squares over cells, with 95% intervals from the cells' scatter widened for the grid."""

    terms: list[str]  # "1", "log depth", "log width"
    params: list[float]
    low: list[float] | None  # None: no degree of freedom left
    high: list[float] | None
    dof: int
    scale: float = 0.0  # the residual variance
    inverse: list[list[float]] = field(default_factory=list, repr=False)  # (X'X)^-1
    grid_step: float = 1.0

    def interval_text(self, i: int) -> str:
        value = f"{self.params[i]:+.2f}"
        return f"{value} [{self.low[i]:+.2f}, {self.high[i]:+.2f}]" if self.low is not None else f"{value} (cannot tell: {self.dof} degrees of freedom)"


@dataclass
class StabilityFit:
    kind: str
    warmup: float
    points: list[StabilityPoint]
    fit: Fit
    left_out: list[str] = field(default_factory=list)  # cells whose edge is only a lower bound (stable up to lr_max)
    versus_pre: tuple[float, float | None, float | None] | None = None  # depth exponent minus Pre-LN's, 95% interval (None: none)
    versus_cells: list[str] = field(default_factory=list)  # the cells that comparison is over
    versus_dof: int = 0
    versus_note: str = ""  # why there is no comparison with Pre-LN's exponent, where the kind has cells but no comparison

    @property
    def terms(self) -> list[str]:
        return self.fit.terms

    @property
    def params(self) -> list[float]:
        return self.fit.params

    def formula(self) -> str:
        scale = f"{math.exp(self.params[0]):.3g}"
        powers = [f"{'L' if name == 'log depth' else 'W'}^{value:+.2f}" for name, value in zip(self.terms[1:], self.params[1:])]
        return "edge = " + " * ".join([scale, *powers])

    def exponent_text(self) -> str:
        return "-" if "log depth" not in self.terms else self.fit.interval_text(self.terms.index("log depth"))

    def at(self, depth: int, width: int) -> float:
        return math.exp(sum(p * v for p, v in zip(self.params, _row(self.terms, depth, width))))

    def predict(self, depth: int, width: int) -> tuple[float, float | None, float | None]:
        """The edge at a size, with its 95% prediction interval (None without a degree of freedom)."""
        row = _row(self.terms, depth, width)
        centre = sum(p * v for p, v in zip(self.params, row))
        if self.fit.low is None:
            return math.exp(centre), None, None
        leverage = sum(row[i] * self.fit.inverse[i][j] * row[j] for i in range(len(row)) for j in range(len(row)))
        half = t_quantile(self.fit.dof) * math.sqrt(self.fit.scale * (1 + leverage)) + math.log(self.fit.grid_step)
        return math.exp(centre), math.exp(centre - half), math.exp(centre + half)

    def versus_text(self) -> str:
        if self.versus_pre is None:
            return self.versus_note or "-"
        d, lo, hi = self.versus_pre
        if lo is None:
            return f"{d:+.2f} (cannot tell: {len(self.versus_cells)} cells in common)"
        return f"{d:+.2f} [{lo:+.2f}, {hi:+.2f}] over {len(self.versus_cells)} cells"


@dataclass(frozen=True)
class StabilityPrediction:
    size: str
    depth: int
    width: int
    lr: float  # what the size's recipe trains with
    kind: str
    warmup: float
    largest: float
    low: float | None
    high: float | None
    verdict: str  # inside | outside | cannot tell
    width_assumed: bool  # the law was fitted on one width: width was assumed not to matter

    def text(self) -> str:
        where = {"inside": "inside its stable range", "outside": "outside its stable range", "cannot tell": "cannot tell"}[self.verdict]
        span = f" [{self.low:.3g}, {self.high:.3g}]" if self.low is not None else " (no interval)"
        note = " (fitted on one width: assumes width does not move it)" if self.width_assumed else ""
        return f"{self.size}: {self.kind} (warm-up {self.warmup:g}) edge {self.largest:.3g}{span}; the recipe's lr {self.lr:g} is {where}{note}"


@dataclass
class StabilityLaw:
    fits: list[StabilityFit]
    predictions: list[StabilityPrediction]

    def verdicts(self) -> list[str]:
        """Per kind and warm-up: does its edge fall with depth faster than Pre-LN's? Said only where the cells show it."""
        lines = []
        for f in self.fits:
            if f.versus_pre is None:
                if f.versus_note:
                    lines.append(f"{f.kind} (warm-up {f.warmup:g}): its edge against Pre-LN's with depth: {f.versus_note}")
                continue
            d, lo, hi = f.versus_pre
            cells = ", ".join(f.versus_cells)
            if lo is None:
                said = (f"cannot tell whether it falls faster or slower with depth than Pre-LN's: {len(f.versus_cells)} cells in common "
                        f"({cells}) leave no degree of freedom for an interval")
            elif hi < 0:
                said = f"falls faster with depth than Pre-LN's (depth exponent minus Pre-LN's {d:+.2f} [{lo:+.2f}, {hi:+.2f}] over {cells})"
            elif lo > 0:
                said = f"falls slower with depth than Pre-LN's (depth exponent minus Pre-LN's {d:+.2f} [{lo:+.2f}, {hi:+.2f}] over {cells})"
            else:
                said = (f"cannot tell whether it falls faster or slower with depth than Pre-LN's (depth exponent minus Pre-LN's {d:+.2f} "
                        f"[{lo:+.2f}, {hi:+.2f}] over {cells})")
            lines.append(f"{f.kind} (warm-up {f.warmup:g}): its edge {said}")
        return lines


def kind_of(candidate: CandidateCurve, depth: int, winner: str | None) -> list[str]:
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


def _row(terms: list[str], depth: float, width: float) -> list[float]:
    values = {"1": 1.0, "log depth": math.log(depth), "log width": math.log(width)}
    return [values[t] for t in terms]


def fit_cells(points: list[StabilityPoint], terms: list[str], values: list[float], grid_step: float) -> Fit:
    """Least squares of `values` (logarithms, one per cell) on the terms, with intervals from the cells' scatter, each widened
    by what one grid step at one end of the range does to it."""
    import numpy as np

    X = np.array([_row(terms, p.depth, p.width) for p in points])
    y = np.array(values)
    params, *_ = np.linalg.lstsq(X, y, rcond=None)
    dof = len(points) - len(terms)
    if dof < 1:
        return Fit(terms, [float(v) for v in params], None, None, dof, grid_step=grid_step)
    resid = y - X @ params
    scale = float(resid @ resid) / dof
    inverse = np.linalg.pinv(X.T @ X)
    step = math.log(grid_step)
    widen = [step if t == "1" else step / max(1e-12, float(np.ptp(X[:, i]))) for i, t in enumerate(terms)]
    half = [t_quantile(dof) * math.sqrt(max(0.0, scale * float(inverse[i, i]))) + widen[i] for i in range(len(terms))]
    return Fit(terms, [float(v) for v in params], [float(p - h) for p, h in zip(params, half)], [float(p + h) for p, h in zip(params, half)],
               dof, scale, inverse.tolist(), grid_step)


def _terms(points: list[StabilityPoint]) -> list[str]:
    return (["1"] + (["log depth"] if len({p.depth for p in points}) > 1 else [])
            + (["log width"] if len({p.width for p in points}) > 1 else []))


def stability_law(plan: SearchPlan, curves: dict[str, LrCurves | None], evidence: dict[str, CellEvidence]) -> StabilityLaw | None:
    """The laws of every kind and warm-up with exact edges in two cells or more that differ in size, and their predictions
    (None: no such kind)."""
    points: dict[tuple[str, float], list[StabilityPoint]] = {}
    left_out: dict[tuple[str, float], list[str]] = {}
    steps = []
    for cell, check in curves.items():
        if check is None:
            continue
        steps.append(check.grid.step)
        model = plan.recipe(plan.trial_overrides(plan.cell(cell), {})).model
        winner = evidence[cell].winner.model if evidence[cell].winner is not None else None
        for c in check.candidates:
            for kind in kind_of(c, model.depth, winner):
                if c.edge is not None and c.capped:
                    left_out.setdefault((kind, c.warmup), []).append(cell)
                elif c.edge is not None:
                    seeds = {ch.seed: ch.value for ch in c.chains}
                    points.setdefault((kind, c.warmup), []).append(
                        StabilityPoint(cell, model.depth, model.width, c.edge, c.edge_low, c.edge_high, seeds))
    step = max(steps, default=1.0)
    fits = []
    for (kind, warmup), found in sorted(points.items(), key=lambda item: (KINDS.index(item[0][0]), item[0][1])):
        terms = _terms(found)
        if len(terms) == 1:
            continue
        fits.append(StabilityFit(kind, warmup, found, fit_cells(found, terms, [math.log(p.largest) for p in found], step),
                                 left_out.get((kind, warmup), [])))
    if not fits:
        return None
    for f in fits:
        _versus_pre(f, fits, step)
    return StabilityLaw(fits, _predictions(plan, fits))


def _versus_pre(f: StabilityFit, fits: list[StabilityFit], step: float) -> None:
    """The kind's depth exponent minus Pre-LN's, over the cells both have exact edges in, fitted on their log ratios."""
    pre = next((g for g in fits if g.kind == "Pre-LN" and g.warmup == f.warmup), None)
    if f.kind == "Pre-LN":
        return
    if pre is None:
        f.versus_note = "cannot tell: Pre-LN has no law at this warm-up (no exact edges in two cells of different size)"
        return
    theirs = {p.cell: p for p in pre.points}
    common = [p for p in f.points if p.cell in theirs]
    terms = _terms(common)
    if "log depth" not in terms:
        cells = ", ".join(p.cell for p in common) or "none"
        f.versus_note = f"cannot tell: the cells it shares with Pre-LN ({cells}) do not vary in depth"
        return
    ratio = [math.log(p.largest) - math.log(theirs[p.cell].largest) for p in common]
    fit = fit_cells(common, terms, ratio, step)
    i = terms.index("log depth")
    f.versus_pre = (fit.params[i], fit.low[i] if fit.low else None, fit.high[i] if fit.high else None)
    f.versus_cells, f.versus_dof = [p.cell for p in common], fit.dof


def prediction_sizes(plan: SearchPlan) -> list[tuple[str, object]]:
    """(name, recipe) of every size the laws predict at: the transfer targets, then the curve's `predict` sizes."""
    sizes = [(name, plan.recipe(plan.trial_overrides(plan.cell(name), {}))) for name in plan.target_names()]
    for size in curve_settings(plan).predict:
        sizes.append((cell_name(size), plan.recipe(plan.overrides + list(size.items()))))
    return sizes


def _predictions(plan: SearchPlan, fits: list[StabilityFit]) -> list[StabilityPrediction]:
    out = []
    for name, recipe in prediction_sizes(plan):
        depth, width, lr = recipe.model.depth, recipe.model.width, recipe.train.lr
        for f in fits:
            largest, low, high = f.predict(depth, width)
            verdict = "cannot tell" if low is None else "inside" if lr < low else "outside" if lr > high else "cannot tell"
            assumed = "log width" not in f.terms and width not in {p.width for p in f.points}
            out.append(StabilityPrediction(name, depth, width, lr, f.kind, f.warmup, largest, low, high, verdict, assumed))
    return out
