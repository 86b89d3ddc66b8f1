"""Fitting alpha_opt(depth, width): a few simple laws, compared honestly on the data a search gave.

Each candidate is fitted by least squares to the best alpha of every cell. The comparison uses AICc
(small-sample corrected) and leave-one-out error; the verdict says plainly when the data cannot tell
the forms apart (too few cells, or AICc differences under 2).
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
    for name, (formula, k, model, guess) in LAWS.items():
        if n < k or (name == "c*W^b/L" and len(set(W)) < 2) or (name == "a+b*log(L)" and len(set(L)) < 2):
            continue
        params = _fit_one(model, guess, L, W, y)
        residual = model(params, L, W) - y
        rss = float(np.sum(residual**2))
        rmse = math.sqrt(rss / n)
        aicc = n * math.log(max(rss / n, 1e-12)) + 2 * k + (2 * k * (k + 1) / (n - k - 1) if n - k - 1 > 0 else math.inf)
        loo = []
        for i in range(n):
            keep = np.arange(n) != i
            if keep.sum() >= k:
                p_i = _fit_one(model, guess, L[keep], W[keep], y[keep])
                loo.append(float(model(p_i, L[i : i + 1], W[i : i + 1])[0] - y[i]))
        loo_rmse = math.sqrt(float(np.mean(np.square(loo)))) if loo else math.nan
        report.fits.append(LawFit(name, formula, [float(v) for v in params], rmse, aicc, loo_rmse))
    report.fits.sort(key=lambda f: (f.aicc, f.rmse))
    report.verdict = _verdict(report.fits, n, len(set(L)))
    return report


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
