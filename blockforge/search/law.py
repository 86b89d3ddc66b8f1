"""Fitting alpha_opt(depth, width): a few simple laws, compared honestly on the data a search gave.

Each candidate is fitted by least squares to the best alpha of every cell. The comparison uses AICc
(small-sample corrected) and leave-one-out error; the verdict says plainly when the data cannot tell
the forms apart (too few cells, or AICc differences under 2). Because alpha only matters through
floor(alpha * L), a point may carry `alpha_range` [low, high): every alpha in it builds the same model.
Each fit counts the cells whose range holds its prediction, and the verdict names the other laws that
hit every range, which the data cannot rule out however the residuals compare.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

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


def _fit_one(model: Callable, guess: Callable, L: np.ndarray, W: np.ndarray, y: np.ndarray) -> np.ndarray:
    from scipy.optimize import least_squares

    return least_squares(lambda p: model(p, L, W) - y, np.array(guess(L, W, y), dtype=float)).x


def fit_alpha_law(points: list[dict]) -> LawReport:
    """points: [{'depth', 'width', 'alpha'}] (one per cell, the best alpha found there)."""
    report = LawReport(points=points)
    usable = [p for p in points if p.get("alpha") is not None and p.get("depth")]
    n = len(usable)
    if n == 0:
        report.verdict = "No cell has a best alpha with a known depth, so no law can be fitted."
        return report
    L = np.array([p["depth"] for p in usable], dtype=float)
    W = np.array([p.get("width") or 256 for p in usable], dtype=float)
    y = np.array([p["alpha"] for p in usable], dtype=float)
    # A best alpha is only known to within its range: residuals below that resolution (the variance of a
    # uniform error over each range, w^2 / 12) carry no information, so AICc never rewards fitting inside it.
    widths = np.array([p["alpha_range"][1] - p["alpha_range"][0] if p.get("alpha_range") else 0.0 for p in usable], dtype=float)
    rss_floor = float(np.sum(widths**2) / 12.0)
    for name, (formula, k, model, guess) in LAWS.items():
        if n < k or (name == "c*W^b/L" and len(set(W)) < 2) or (name == "a+b*log(L)" and len(set(L)) < 2):
            continue
        params = _fit_one(model, guess, L, W, y)
        residual = model(params, L, W) - y
        rss = float(np.sum(residual**2))
        rmse = math.sqrt(rss / n)
        aicc = n * math.log(max(rss, rss_floor, 1e-12) / n) + 2 * k + (2 * k * (k + 1) / (n - k - 1) if n - k - 1 > 0 else math.inf)
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
