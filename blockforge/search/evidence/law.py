"""Fitting alpha_opt(depth, width): a few simple laws, compared honestly on the data a search gave.

Each candidate is fitted by least squares to the best alpha of every cell. The comparison uses AICc
(small-sample corrected) and leave-one-out error; the verdict says plainly when the data cannot tell
the forms apart (too few cells, or AICc differences under 2). Because alpha only matters through
floor(alpha * L), a point may carry `alpha_range` [low, high): every alpha in it builds the same model.
Each fit counts the cells whose range holds its prediction, and the verdict names the other laws that
hit every range, which the data cannot rule out however the residuals compare.

A cell's best alpha is itself an estimate from noisy training. `bootstrap_laws` resamples each cell's
seeds (the same seeds for all its candidates, which were trained paired), re-chooses the cell's best,
refits every law, and reports an interval for each parameter, how often each law fits best by a clear
margin (AICc at least 2 below every other law; otherwise the resample is undecided), and "cannot
decide" unless one law wins at least 95% of the resamples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from blockforge.search.config import SearchPlan
from blockforge.search.evidence.evidence import CellEvidence
from blockforge.spec.resolve import mix_ln_count

# name -> (formula text, number of parameters, model f(params, L, W), starting point g(L, W, alpha))
LAWS: dict[str, tuple[str, int, Callable, Callable]] = {
    "constant": ("alpha = a", 1, lambda p, L, W: np.full_like(L, p[0]), lambda L, W, y: [y.mean()]),
    "c/L": ("alpha = c / L", 1, lambda p, L, W: p[0] / L, lambda L, W, y: [(y * L).mean()]),
    "c/sqrt(L)": ("alpha = c / sqrt(L)", 1, lambda p, L, W: p[0] / np.sqrt(L), lambda L, W, y: [(y * np.sqrt(L)).mean()]),
    "a+b*log(L)": ("alpha = a + b log L", 2, lambda p, L, W: p[0] + p[1] * np.log(L), lambda L, W, y: [y.mean(), 0.0]),
    "c*W^b/L": ("alpha = c (W/256)^b / L", 2, lambda p, L, W: p[0] * (W / 256.0) ** p[1] / L, lambda L, W, y: [(y * L).mean(), 0.0]),
}


@dataclass
class LawFit:
    name: str
    formula: str
    params: list[float]
    rmse: float
    aicc: float
    loo_rmse: float
    in_range: int  # cells whose range of equivalent alphas holds the law's prediction


@dataclass
class LawReport:
    points: list[dict]
    fits: list[LawFit] = field(default_factory=list)
    verdict: str = ""


@dataclass
class LawUncertainty:
    """A law across bootstrap resamples: how often it fits best, and 95% percentile intervals of its parameters."""

    name: str
    formula: str
    wins: float  # the fraction of resamples in which its AICc was at least 2 below every other law's
    params_low: list[float]
    params_high: list[float]


@dataclass
class BootstrapReport:
    resamples: int
    undecided: float  # the fraction of resamples in which no law led by 2 AICc
    laws: list[LawUncertainty]
    cell_intervals: dict[str, tuple[float, float]]  # per cell: 2.5 and 97.5 percentiles of its best k/L
    verdict: str


def _prepare(points: list[dict]):
    usable = [p for p in points if p.get("alpha") is not None and p.get("depth")]
    L = np.array([p["depth"] for p in usable], dtype=float)
    W = np.array([p.get("width") or 256 for p in usable], dtype=float)
    y = np.array([p["alpha"] for p in usable], dtype=float)
    # A best alpha is only known to within its range: residuals below that resolution (the variance of a
    # uniform error over each range, w^2 / 12) carry no information, so AICc never rewards fitting inside it.
    widths = np.array([p["alpha_range"][1] - p["alpha_range"][0] if p.get("alpha_range") else 0.0 for p in usable], dtype=float)
    return usable, L, W, y, float(np.sum(widths**2) / 12.0)


def _applicable(name: str, k: int, n: int, L: np.ndarray, W: np.ndarray) -> bool:
    return not (n < k or (name == "c*W^b/L" and len(set(W)) < 2) or (name == "a+b*log(L)" and len(set(L)) < 2))


def _aicc(rss: float, rss_floor: float, n: int, k: int) -> float:
    return n * math.log(max(rss, rss_floor, 1e-12) / n) + 2 * k + (2 * k * (k + 1) / (n - k - 1) if n - k - 1 > 0 else math.inf)


def _fit_one(model: Callable, guess: Callable, L: np.ndarray, W: np.ndarray, y: np.ndarray) -> np.ndarray:
    from scipy.optimize import least_squares

    return least_squares(lambda p: model(p, L, W) - y, np.array(guess(L, W, y), dtype=float)).x


def fit_alpha_law(points: list[dict]) -> LawReport:
    """points: [{'depth', 'width', 'alpha'}] (one per cell, the best alpha found there)."""
    report = LawReport(points=points)
    usable, L, W, y, rss_floor = _prepare(points)
    n = len(usable)
    if n == 0:
        report.verdict = "No cell has a best alpha with a known depth, so no law can be fitted."
        return report
    for name, (formula, k, model, guess) in LAWS.items():
        if not _applicable(name, k, n, L, W):
            continue
        params = _fit_one(model, guess, L, W, y)
        residual = model(params, L, W) - y
        rss = float(np.sum(residual**2))
        rmse = math.sqrt(rss / n)
        aicc = _aicc(rss, rss_floor, n, k)
        loo = []
        for i in range(n):
            keep = np.arange(n) != i
            if keep.sum() >= k:
                p_i = _fit_one(model, guess, L[keep], W[keep], y[keep])
                loo.append(float(model(p_i, L[i : i + 1], W[i : i + 1])[0] - y[i]))
        loo_rmse = math.sqrt(float(np.mean(np.square(loo)))) if loo else math.nan
        predicted = model(params, L, W)
        in_range = sum(_holds(p.get("alpha_range"), float(v)) for p, v in zip(usable, predicted))
        report.fits.append(LawFit(name, formula, [float(v) for v in params], rmse, aicc, loo_rmse, in_range))
    report.fits.sort(key=lambda f: (f.aicc, f.rmse))
    report.verdict = _verdict(report.fits, n, len(set(L)))
    if all(p.get("alpha_range") for p in usable):
        consistent = [f.name for f in report.fits[1:] if f.in_range == n]
        if consistent:
            report.verdict += f" Also inside every cell's range of equivalent alphas: {', '.join(consistent)}; finer depths would separate them."
    return report


def _holds(alpha_range: list[float] | None, value: float) -> bool:
    if not alpha_range:
        return False
    low, high = alpha_range
    return low - 1e-9 <= value < high or (low == high and abs(value - low) < 1e-9)


def _verdict(fits: list[LawFit], n: int, depths: int) -> str:
    if depths < 3:
        return f"The data cannot decide: {depths} distinct depth(s) cannot separate laws that differ in how alpha scales with depth; search at least 3 depths."
    finite = [f for f in fits if math.isfinite(f.aicc)]
    if len(finite) < 2:
        return f"The data cannot decide: {n} cells are too few to compare the laws with a small-sample AICc; add cells."
    best, second = finite[0], finite[1]
    if second.aicc - best.aicc < 2.0:
        close = [f.name for f in finite if f.aicc - best.aicc < 2.0]
        return f"The data cannot decide between {', '.join(close)} (AICc within 2 of the best); {best.name} fits best by a small margin."
    return f"{best.formula} fits best (AICc {best.aicc:.2f}, {second.aicc - best.aicc:.1f} below {second.name}; leave-one-out RMSE {best.loo_rmse:.3g})."


def bootstrap_laws(cells: list[dict], *, resamples: int = 1000, seed: int = 0) -> BootstrapReport | None:
    """Refit the laws on resampled seeds.

    cells: [{'cell', 'depth', 'width', 'options': [{'alpha': k/L, 'alpha_range': [low, high], 'values': [...]}], 'mode'}]
    where every option (a confirmed candidate) lists its objective on the same seeds, in the same order.
    Each resample draws the seeds of every cell with replacement, takes the option with the best mean
    as the cell's best alpha, and fits every law. None when fewer than two cells have options.
    """
    cells = [c for c in cells if c["options"]]
    if len(cells) < 2:
        return None
    rng = np.random.default_rng(seed)
    fitted: dict[tuple, tuple[str | None, dict[str, np.ndarray]]] = {}  # choices -> (winner, params) memo
    wins: dict[str, int] = {}
    params: dict[str, list[np.ndarray]] = {name: [] for name in LAWS}
    chosen_alpha: dict[str, list[float]] = {c["cell"]: [] for c in cells}
    for _ in range(resamples):
        choice = []
        for c in cells:
            values = np.array([o["values"] for o in c["options"]], dtype=float)  # (options, seeds)
            columns = rng.integers(0, values.shape[1], values.shape[1])
            means = values[:, columns].mean(axis=1)
            best = int(np.argmin(means) if c.get("mode", "min") == "min" else np.argmax(means))
            choice.append(best)
            chosen_alpha[c["cell"]].append(c["options"][best]["alpha"])
        key = tuple(choice)
        if key not in fitted:
            points = [dict(depth=c["depth"], width=c["width"], **{k: c["options"][i][k] for k in ("alpha", "alpha_range")})
                      for c, i in zip(cells, choice)]
            fitted[key] = _fit_all(points)
        winner, by_law = fitted[key]
        if winner is not None:
            wins[winner] = wins.get(winner, 0) + 1
        for name, p in by_law.items():
            params[name].append(p)
    laws = []
    for name, (formula, *_rest) in LAWS.items():
        if not params[name]:
            continue
        stacked = np.array(params[name])
        laws.append(LawUncertainty(name, formula, wins.get(name, 0) / resamples,
                                   np.percentile(stacked, 2.5, axis=0).tolist(), np.percentile(stacked, 97.5, axis=0).tolist()))
    laws.sort(key=lambda u: -u.wins)
    intervals = {cell: (float(np.percentile(a, 2.5)), float(np.percentile(a, 97.5))) for cell, a in chosen_alpha.items()}
    undecided = 1.0 - sum(wins.values()) / resamples
    return BootstrapReport(resamples, undecided, laws, intervals, _bootstrap_verdict(laws, undecided, len({c["depth"] for c in cells})))


def _fit_all(points: list[dict]) -> tuple[str | None, dict[str, np.ndarray]]:
    """Every applicable law fitted to `points`; the name of the law whose AICc is at least 2 below all others (else None)."""
    usable, L, W, y, rss_floor = _prepare(points)
    n = len(usable)
    out, scores = {}, {}
    for name, (formula, k, model, guess) in LAWS.items():
        if not _applicable(name, k, n, L, W):
            continue
        p = _fit_one(model, guess, L, W, y)
        out[name] = p
        scores[name] = _aicc(float(np.sum((model(p, L, W) - y) ** 2)), rss_floor, n, k)
    finite = sorted((a, name) for name, a in scores.items() if math.isfinite(a))
    if not finite or (len(finite) > 1 and finite[1][0] - finite[0][0] < 2.0):
        return None, out
    return finite[0][1], out


def decided_law(law: LawReport, boot: BootstrapReport | None) -> LawFit | None:
    """The law the verdict names (the one the summary states), or None where it says the data cannot decide: with a
    bootstrap, a law that leads by 2 AICc in 95% of the seed resamples; without one, by 2 AICc on the winners."""
    depths = len({p["depth"] for p in law.points if p.get("alpha") is not None and p.get("depth")})
    finite = [f for f in law.fits if math.isfinite(f.aicc)]
    if depths < 3 or not finite:
        return None
    if boot is not None:
        top = boot.laws[0] if boot.laws else None
        return next((f for f in finite if top is not None and top.wins >= WIN_SHARE and f.name == top.name), None)
    return finite[0] if len(finite) >= 2 and finite[1].aicc - finite[0].aicc >= 2.0 else None


WIN_SHARE = 0.95  # the share of seed resamples a law must lead by 2 AICc for the bootstrap to name it


def _bootstrap_verdict(laws: list[LawUncertainty], undecided: float, depths: int) -> str:
    if depths < 3:
        return f"Cannot decide: {depths} distinct depth(s) cannot separate the laws, however the seeds are resampled."
    top = laws[0] if laws else None
    if top is not None and top.wins >= WIN_SHARE:
        return f"{top.formula} fits best (AICc at least 2 below every other law) in {top.wins:.0%} of the seed resamples."
    shares = ", ".join(f"{u.name} {u.wins:.0%}" for u in laws if u.wins > 0)
    return (f"Cannot decide: in {undecided:.0%} of the seed resamples no law leads by 2 AICc"
            + (f"; a clear winner otherwise: {shares}" if shares else "") + "; no law wins 95% of them.")


def alpha_range(alpha: float, depth: int) -> tuple[float, float]:
    """Every alpha in [low, high) builds the same stack as `alpha` at this depth: floor(alpha * depth) Post-LN layers."""
    k = mix_ln_count(alpha, depth)
    return k / depth, ((k + 1) / depth if k < depth else 1.0)


def law_points(plan: SearchPlan, evidence: dict[str, CellEvidence]) -> list[dict]:
    """The winner's alpha of each cell with the cell's depth and width.

    A trial's alpha is one point of the range that builds its model, so the law is fitted to the
    fraction of Post-LN layers the winner has, k / L (the low end of the range); the range is kept.
    """
    points = []
    for cell in plan.cell_names():
        w = evidence[cell].winner
        if w is None or w.alpha is None:
            continue
        recipe = plan.recipe(plan.trial_overrides(plan.cell(cell), {}))
        low, high = alpha_range(w.alpha, recipe.model.depth)
        points.append({"cell": cell, "depth": recipe.model.depth, "width": recipe.model.width, "alpha": low,
                       "alpha_range": [low, high], "post_ln_layers": w.post_ln_layers, "value": w.mean, "n": w.n,
                       "verdict": evidence[cell].verdict})
    return points


def bootstrap_cells(plan: SearchPlan, evidence: dict[str, CellEvidence], points: list[dict]) -> list[dict]:
    """Per cell with a law point, the confirmed candidates on the seeds they all share (for bootstrap_laws)."""
    cells = []
    for p in points:
        e = evidence[p["cell"]]
        options = [c for c in e.eligible if c.alpha is not None]
        seeds = sorted(set.intersection(*(set(c.values) for c in options))) if options else []
        if len(seeds) < 2:
            continue
        cells.append({"cell": p["cell"], "depth": p["depth"], "width": p["width"], "mode": plan.mode, "options": [
            {"alpha": alpha_range(c.alpha, p["depth"])[0], "alpha_range": list(alpha_range(c.alpha, p["depth"])),
             "values": [c.values[s] for s in seeds]} for c in options]})
    return cells


@dataclass
class LawWindow:
    """The Post-LN counts the alpha laws predict for one cell, over seed resamples of the guiding cells."""

    low: int  # 2.5 and 97.5 percentiles of the predicted k
    high: int
    laws: dict[str, float]  # law -> the share of resamples in which it had the lowest AICc (and so predicted)
    cells: list[str]  # the guiding cells
    resamples: int

    def text(self, depth: int) -> str:
        chosen = ", ".join(f"{name} {share:.0%}" for name, share in sorted(self.laws.items(), key=lambda kv: -kv[1]))
        return (f"k {self.low}-{self.high} of {depth} (95% of {self.resamples} seed resamples of {', '.join(self.cells)}; the law with the "
                f"lowest AICc in each: {chosen})")


def law_window(cells: list[dict], depth: int, width: int | None, *, resamples: int = 1000, seed: int = 0) -> LawWindow | None:
    """The range of k the laws predict at (`depth`, `width`): per seed resample of `cells` (bootstrap_laws' format), every
    law is refitted to the re-chosen winners, and every law within 2 AICc of the best predicts (from two cells, where AICc
    cannot choose because a one-parameter law fits two points exactly, every one-parameter law). The range is the middle
    95% of the predictions. None below two cells."""
    cells = [c for c in cells if c["options"]]
    if len(cells) < 2:
        return None
    rng = np.random.default_rng(seed)
    memo: dict[tuple, list[tuple[str, int]]] = {}
    predicted, chosen = [], {}
    for _ in range(resamples):
        choice = []
        for c in cells:
            values = np.array([o["values"] for o in c["options"]], dtype=float)
            columns = rng.integers(0, values.shape[1], values.shape[1])
            means = values[:, columns].mean(axis=1)
            choice.append(int(np.argmin(means) if c.get("mode", "min") == "min" else np.argmax(means)))
        key = tuple(choice)
        if key not in memo:
            points = [dict(depth=c["depth"], width=c["width"], **{k: c["options"][i][k] for k in ("alpha", "alpha_range")})
                      for c, i in zip(cells, choice)]
            memo[key] = _predictions(points, depth, width or 256)
        for name, k in memo[key]:
            predicted.append(k)
            chosen[name] = chosen.get(name, 0) + 1
    if not predicted:
        return None
    low, high = np.percentile(predicted, [2.5, 97.5])
    return LawWindow(int(math.floor(low)), int(math.ceil(high)), {name: n / len(predicted) for name, n in chosen.items()},
                     [c["cell"] for c in cells], resamples)


def _predictions(points: list[dict], depth: int, width: float) -> list[tuple[str, int]]:
    """(law, predicted k) of every law the data cannot set apart from the best: those within 2 AICc of the lowest (the
    lead this module asks of a law that "fits best"), or, when no AICc is finite (two points), every one-parameter law."""
    usable, L, W, y, rss_floor = _prepare(points)
    n = len(usable)
    fitted = []
    for name, (_, k, model, guess) in LAWS.items():
        if not _applicable(name, k, n, L, W) or (n - k - 1 <= 0 and k > 1):
            continue
        params = _fit_one(model, guess, L, W, y)
        aicc = _aicc(float(np.sum((model(params, L, W) - y) ** 2)), rss_floor, n, k)
        alpha = float(model(params, np.array([float(depth)]), np.array([float(width)]))[0])
        fitted.append((aicc, name, mix_ln_count(min(1.0, max(0.0, alpha)), depth)))
    finite = [f for f in fitted if math.isfinite(f[0])]
    if finite:
        lowest = min(f[0] for f in finite)
        return [(name, k) for aicc, name, k in finite if aicc - lowest < 2.0]
    return [(name, k) for _, name, k in fitted]
