"""The alpha law: fits recover known laws, the verdict says when data cannot decide, alpha ranges."""

import math

import pytest

from blockforge.search.evidence.law import alpha_range, decided_law, fit_alpha_law


def points(law, depths, width=256, noise=()):
    noise = list(noise) or [0.0] * len(depths)
    return [{"depth": d, "width": width, "alpha": law(d) + e} for d, e in zip(depths, noise)]


def test_a_c_over_L_law_is_recovered_and_preferred():
    report = fit_alpha_law(points(lambda L: 2.0 / L, [6, 8, 12, 16, 24, 32, 48], noise=[1e-3, -2e-3, 1e-3, 0, -1e-3, 2e-3, -1e-3]))
    best = report.fits[0]
    assert best.name == "c/L" and best.params[0] == pytest.approx(2.0, rel=0.02)
    assert best.formula in report.verdict and "fits best" in report.verdict


def test_a_constant_law_is_recovered():
    report = fit_alpha_law(points(lambda L: 0.25, [6, 12, 18, 24, 32], noise=[0.004, -0.003, 0.002, -0.004, 0.001]))
    assert report.fits[0].name == "constant" and report.fits[0].params[0] == pytest.approx(0.25, abs=0.01)


def test_width_law_only_with_two_widths():
    one_width = fit_alpha_law(points(lambda L: 2.0 / L, [6, 12, 24]))
    assert "c*W^b/L" not in [f.name for f in one_width.fits]
    two = points(lambda L: 2.0 / L, [6, 12, 24, 48], width=128) + points(lambda L: 4.0 / L, [6, 12, 24, 48], width=512)
    report = fit_alpha_law(two)
    fit = {f.name: f for f in report.fits}["c*W^b/L"]
    # 2 (W/256)^b = 2 at W=128 -> c (1/2)^b = 2 and c 2^b = 4  =>  b = 0.5, c = 2 sqrt(2)
    assert fit.params[1] == pytest.approx(0.5, abs=1e-3) and fit.params[0] == pytest.approx(2 * math.sqrt(2), rel=1e-3)
    assert report.fits[0].name == "c*W^b/L"


def test_two_depths_cannot_decide():
    report = fit_alpha_law(points(lambda L: 2.0 / L, [8, 16]))
    assert "cannot decide" in report.verdict and "at least 3 depths" in report.verdict
    assert "no law can be fitted" in fit_alpha_law([]).verdict
    assert decided_law(report, None) is None and decided_law(fit_alpha_law([]), None) is None  # nothing to draw or name


def test_the_decided_law_is_the_one_the_verdict_names():
    clear = fit_alpha_law(points(lambda L: 2.0 / L, [6, 8, 12, 16, 24, 32, 48], noise=[1e-3, -2e-3, 1e-3, 0, -1e-3, 2e-3, -1e-3]))
    assert decided_law(clear, None).name == "c/L" and decided_law(clear, None).formula in clear.verdict
    close = fit_alpha_law([{"depth": d, "width": 256, "alpha": a} for d, a in ((6, 0.25), (8, 0.2), (12, 0.15))])
    assert "cannot decide" in close.verdict and decided_law(close, None) is None


@pytest.mark.parametrize(
    "alpha, depth, expected",
    [(0.2411, 8, (0.125, 0.25)), (0.25, 12, (0.25, 1 / 3)), (0.0625, 32, (0.0625, 3 / 32)), (0.0, 4, (0.0, 0.25)), (1.0, 6, (1.0, 1.0)), (0.29, 100, (0.29, 0.30))],
)
def test_alpha_range_is_every_alpha_with_the_same_post_ln_count(alpha, depth, expected):
    low, high = alpha_range(alpha, depth)
    assert (low, high) == pytest.approx(expected)


def test_laws_inside_every_equivalence_range_are_named():
    # Best model: one Post-LN layer at depths 4, 8, 12 -> k/L = 1/L; the c/L fit is exact, and any law
    # predicting inside [1/L, 2/L) at each depth is as consistent with the data.
    cells = [{"depth": L, "width": 64, "alpha": 1 / L, "alpha_range": [1 / L, 2 / L]} for L in (4, 8, 12)]
    report = fit_alpha_law(cells)
    fits = {f.name: f for f in report.fits}
    assert report.fits[0].name == "c/L" and fits["c/L"].in_range == 3
    assert fits["constant"].in_range < 3  # no constant lies in [0.25, 0.5) and [1/12, 1/6) at once
    expected = [f.name for f in report.fits[1:] if f.in_range == 3]
    assert ("Also inside every cell's range" in report.verdict) == bool(expected)
    for name in expected:
        assert name in report.verdict
