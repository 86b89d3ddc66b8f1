"""summary.md's alpha law: each cell's best alpha, the laws fitted to them with their bootstrap over seeds, and the figure
of best alpha against depth."""

from __future__ import annotations

from pathlib import Path

from blockforge.io import figure, saved
from blockforge.search.evidence.law import BootstrapReport, LawReport, decided_law
from blockforge.tables import fmt, markdown_table


def plot_best_alpha(points: list[dict], law: LawReport, boot: BootstrapReport | None, path: Path | None = None):
    import numpy as np

    from blockforge.search.evidence.law import LAWS

    fig, ax = figure(figsize=(6, 4))
    widths = sorted({p["width"] for p in points})
    depths = np.array(sorted({p["depth"] for p in points}), dtype=float)
    for width in widths:
        mine = sorted((p["depth"], p["alpha"], p["alpha_range"][1], p["cell"]) for p in points if p["width"] == width)
        depth, low, high = (np.array(v, dtype=float) for v in list(zip(*mine))[:3])
        line = ax.plot(depth, low, "o-", label=f"winner k/L, width {width}")[0]
        ax.errorbar(depth, low, yerr=[np.zeros_like(low), high - low], fmt="none", ecolor=line.get_color(), alpha=0.4, capsize=2)
        if boot is not None:
            spans = [boot.cell_intervals.get(m[3]) for m in mine]
            lo = np.array([s[0] if s else a for s, a in zip(spans, low)])
            hi = np.array([s[1] if s else a for s, a in zip(spans, low)])
            ax.errorbar(depth + 0.15, low, yerr=[low - lo, hi - low], fmt="none", ecolor=line.get_color(), elinewidth=2.5, capsize=4)
    best = decided_law(law, boot)
    if best is not None:  # drawn only where the summary names a law
        grid = np.linspace(depths.min(), depths.max(), 100)
        for width in widths:
            ax.plot(grid, LAWS[best.name][2](best.params, grid, np.full_like(grid, width)), "--", alpha=0.7, label=f"law {best.formula} (width {width})")
    else:
        ax.text(0.02, 0.98, "no law drawn: the data cannot decide between them (summary.md)", transform=ax.transAxes, fontsize=7,
                va="top", color="0.35")
    ax.set_xlabel("depth L")
    ax.set_ylabel("best alpha")
    ax.set_title("best Mix-LN alpha per cell\n(thin bars: alphas giving the same model; thick: 95% over seed resamples)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return saved(fig, path)


def law_section(points: list[dict], law: LawReport, boot: BootstrapReport | None, cells: list[dict], metric: str) -> str:
    data = markdown_table(["cell", "depth", "width", "best alpha k/L", "same model up to", "post-LN layers", f"{metric} (mean)", "n", "verdict",
                           "95% over seed resamples"],
                          [[p["cell"], p["depth"], p["width"], fmt(p["alpha"]), fmt(p["alpha_range"][1]), p["post_ln_layers"], fmt(p["value"]),
                            p["n"], p["verdict"], _interval(boot.cell_intervals.get(p["cell"])) if boot else "-"] for p in points])
    fits = markdown_table(["law", "parameters", "RMSE", "AICc", "leave-one-out RMSE", "cells in range"],
                          [[f.formula, ", ".join(f"{p:.4g}" for p in f.params), f"{f.rmse:.4g}", f"{f.aicc:.2f}", f"{f.loo_rmse:.4g}",
                            f"{f.in_range}/{len(points)}"] for f in law.fits])
    text = f"{data}\n\n{fits if law.fits else '(no law could be fitted)'}\n\n{law.verdict}\n"
    if boot is None:
        return text + "\nNo bootstrap over seeds: fewer than two cells have confirmed replicates.\n"
    uncertain = markdown_table(["law", "fits best by 2 AICc in", "parameters, 95% interval"],
                               [[u.formula, f"{u.wins:.0%}", "; ".join(f"[{lo:.4g}, {hi:.4g}]" for lo, hi in zip(u.params_low, u.params_high))]
                                for u in boot.laws])
    seeds = min(len(c["options"][0]["values"]) for c in cells)
    caveat = (f"With {seeds} seeds per cell a resample draws from few distinct seed sets, so these intervals understate the "
              "uncertainty; the paired-t verdicts above are the conservative statement.") if seeds < 6 else ""
    return text + (f"\nOver {boot.resamples} resamples of each cell's seeds (its best re-chosen, every law refitted):\n\n{uncertain}\n\n"
                   f"{boot.verdict} {caveat}\n")


def _interval(span: tuple[float, float] | None) -> str:
    return "-" if span is None else (f"{span[0]:.4g}" if span[0] == span[1] else f"{span[0]:.4g}-{span[1]:.4g}")
