"""What a search with a learning-rate curve (confirm.lr_curve, or confirm.lr / confirm.stability) says: summary.md's
section, the console table's column and lines, stability.json, the figure of each cell's curves (lr_curves.png) and the
figure of the edge against depth (stability_vs_depth.png)."""

from __future__ import annotations

from pathlib import Path

from blockforge.io import figure, saved
from blockforge.search.reports.findings import Findings
from blockforge.tables import markdown_table
from blockforge.train.stability import RULE, Rule


def curve_column(found: Findings, cell: str) -> str:
    """The console table's cell: the winner's verdict at its own best and its edge against Pre-LN's, in a few words."""
    curves = found.curves.get(cell)
    e = found.evidence[cell]
    mine = curves.of(e.winner.model) if curves is not None and e.winner is not None else None
    if mine is None:
        return "-"
    if e.winner is e.reference:
        return f"Pre-LN: best lr {mine.best:.3g}, edge {mine.edge_text()}" if mine.best is not None else f"Pre-LN: {mine.outcome}"
    ratio = f" x{mine.edge_vs_pre.mean:.2g}" if mine.edge_vs_pre is not None and mine.edge_verdict in ("less stable", "more stable") else ""
    return f"at best: {curves.best_verdict}; {mine.edge_verdict}{ratio}"


def curve_lines(found: Findings) -> list[str]:
    """One console line per cell: its answer from the curves."""
    return [f"{cell}: lr curve: {curves.answer}" for cell, curves in found.curves.items() if curves is not None]


def curves_markdown(found: Findings, rule: Rule = RULE) -> str:
    """summary.md's section on the learning-rate curves (empty without one)."""
    if not found.curves:
        return ""
    parts = [f"## Learning-rate curves: best learning rate, edge and LR sensitivity\n\nA run is unstable when it diverges, {rule.text()} "
             "(blockforge/train/stability.py). Per candidate, seed and warm-up the final validation loss is measured over one log grid "
             "of learning rates (blockforge/search/checks/lr_curve.py): the best learning rate is the coarse point with the best mean "
             "over seeds (unstable runs count at the initial loss l0, ln of the vocabulary or of the classes); the edge is the largest stable learning rate, its geometric "
             "mean over seeds with a 95% t interval and its ratio to Pre-LN's paired by seed, whose interval is widened by one grid "
             "step (`less stable` or `more stable` only when that interval excludes 1; `>=` marks a lower bound: stable up to lr_max); "
             "the LR sensitivity (Wortsman et al. 2023) is the mean of min(loss, initial loss) over the fixed range minus the best "
             "loss. Margins are how far (nats) the deciding runs lay from their threshold; under the seed-to-seed noise "
             f"({rule.noise:g} nats) an edge is near the threshold. Plot: lr_curves.png.\n"]
    for cell, curves in found.curves.items():
        if curves is None:
            parts.append(f"### {cell}\n\nNo candidate has finished yet.\n")
            continue
        rows = [[c.name, f"{c.warmup:g}", c.best_text(), c.edge_text(), c.edge_verdict_text() or "-", c.sensitivity_text(),
                 (f"{c.sensitivity_verdict} ({c.sensitivity_vs_pre.text()})" if c.sensitivity_vs_pre else c.sensitivity_verdict) or "-",
                 "; ".join(ch.text() for ch in c.chains)] for c in curves.candidates]
        table = markdown_table(["candidate", "warm-up", "best lr", "edge [95% CI]", "edge vs Pre-LN", "LR sensitivity [95% CI]",
                                "vs Pre-LN", "per seed"], rows)
        parts.append(f"### {cell}\n\n**{curves.answer}.** Measured with {curves.probe_text()}.\n\n{table}\n")
    parts.append(_law_markdown(found))
    return "\n".join(parts)


def _law_markdown(found: Findings) -> str:
    law = found.stability_law
    if law is None:
        return "No law of the edge: it needs a kind of candidate with exact edges in two cells or more that differ in depth or width.\n"
    fits = markdown_table(["kind", "warm-up", "cells", "law", "depth exponent [95%]", "minus Pre-LN's [95%]", "left out (lower bounds)"],
                          [[f.kind, f"{f.warmup:g}", ", ".join(p.cell for p in f.points), f.formula(), f.exponent_text(), f.versus_text(),
                            ", ".join(f.left_out) or "-"] for f in law.fits])
    text = ("### Across cells\n\nPower laws of the edge in depth (and width), fitted to each kind's cells; intervals from the cells' "
            "scatter (cells are the unit) widened by the grid's step, a kind against Pre-LN over the cells both have "
            "(blockforge/search/checks/stability_law.py):\n\n" + fits + "\n\n" + "\n".join(f"- {line}" for line in law.verdicts()) + "\n")
    if law.predictions:
        rows = [[p.size, p.kind, f"{p.warmup:g}", f"{p.largest:.3g}" + (f" [{p.low:.3g}, {p.high:.3g}]" if p.low is not None else " (no interval)"),
                 f"{p.lr:g}", p.verdict + (" (width assumed not to matter)" if p.width_assumed else "")] for p in law.predictions]
        text += ("\nPredicted at larger sizes, against the learning rate each size's recipe trains with:\n\n"
                 + markdown_table(["size", "kind", "warm-up", "edge [95%]", "recipe's lr", "the recipe's lr is"], rows) + "\n")
    return text


def curves_data(found: Findings) -> dict:
    """stability.json: every cell's curves and the laws of the edge, as plain data."""
    cells = {}
    for cell, curves in found.curves.items():
        if curves is None:
            continue
        grid = curves.grid
        cells[cell] = {
            "answer": curves.answer, "search_lr": curves.shared, "lr_min": grid.lr(grid.bottom), "lr_max": grid.high, "step": grid.step,
            "coarse_step": grid.step ** grid.every, "probe_steps": curves.steps, "initial_loss": curves.initial, "probes": curves.probes,
            "verdict_at_shared_lr": curves.shared_verdict, "verdict_at_best": curves.best_verdict, "versus": curves.versus,
            "at_best": None if curves.at_best is None else {"mean": curves.at_best.mean, "low": curves.at_best.low, "high": curves.at_best.high,
                                                            "n": curves.at_best.n},
            "candidates": [_candidate_data(c) for c in curves.candidates]}
    law = found.stability_law
    laws = [] if law is None else [{"kind": f.kind, "warmup": f.warmup, "terms": f.terms, "params": f.params, "low": f.fit.low,
                                     "high": f.fit.high, "dof": f.fit.dof, "formula": f.formula(), "left_out": f.left_out,
                                     "depth_exponent_minus_pre_ln": f.versus_pre, "over_cells": f.versus_cells,
                                     "points": [{"cell": p.cell, "depth": p.depth, "width": p.width, "edge": p.largest} for p in f.points]}
                                    for f in law.fits]
    predictions = [] if law is None else [{"size": p.size, "depth": p.depth, "width": p.width, "lr": p.lr, "kind": p.kind, "warmup": p.warmup,
                                           "edge": p.largest, "low": p.low, "high": p.high, "verdict": p.verdict} for p in law.predictions]
    return {"rule": RULE.__dict__, "cells": cells, "laws": laws, "predictions": predictions}


def _candidate_data(c) -> dict:
    return {"name": c.name, "model": c.model, "post_ln_layers": c.post_ln_layers, "warmup": c.warmup, "outcome": c.outcome,
            "curve": {f"{lr:g}": values for lr, values in sorted(c.curve.items())}, "best_lr": c.best, "best_share": c.share,
            "best_range": [c.best_low, c.best_high], "edge": c.edge, "edge_low": c.edge_low, "edge_high": c.edge_high,
            "edge_is_lower_bound": c.capped, "edge_near_threshold": c.near, "edge_verdict": c.edge_verdict,
            "edge_vs_pre_ln": None if c.edge_vs_pre is None else {"ratio": c.edge_vs_pre.mean, "low": c.edge_vs_pre.low,
                                                                  "high": c.edge_vs_pre.high, "n": c.edge_vs_pre.n},
            "lr_sensitivity": c.sensitivity, "lr_sensitivity_low": c.sensitivity_low, "lr_sensitivity_high": c.sensitivity_high,
            "lr_sensitivity_by_seed": c.sensitivities, "lr_sensitivity_verdict": c.sensitivity_verdict,
            "lr_sensitivity_vs_pre_ln": None if c.sensitivity_vs_pre is None else {
                "mean": c.sensitivity_vs_pre.mean, "low": c.sensitivity_vs_pre.low, "high": c.sensitivity_vs_pre.high, "n": c.sensitivity_vs_pre.n},
            "probes": c.probes,
            "seeds": [{"seed": ch.seed, "state": ch.state, "stable": ch.stable, "unstable": ch.unstable, "why": ch.why, "probes": ch.probes,
                       "near_threshold": ch.near,
                       "runs": [{"lr": p.lr, "state": p.state, "why": p.why, "margin": p.margin, "learnt": p.learnt,
                                 "loss": ch.losses.get(index)} for index, p in sorted(ch.points.items())]} for ch in c.chains]}


def plot_curves(found: Findings, path: Path | None = None):
    """Per cell (and warm-up): the final loss against the learning rate, one line per candidate (the mean over its seeds at
    the points every seed trained and kept stable), each seed's runs as points (crosses: unstable), each one's edge marked
    with a triangle on the axis and its best ringed; the shared learning rate dashed."""
    import math

    from matplotlib.ticker import NullFormatter

    panels = [(cell, w) for cell, curves in found.curves.items() if curves is not None for w in curves.warmups]
    fig, axes = figure(1, max(1, len(panels)), figsize=(max(6.4, 4.8 * len(panels)), 4.0), squeeze=False)
    for ax, (cell, warmup) in zip(axes[0], panels):
        curves = found.curves[cell]
        for c in (c for c in curves.candidates if c.warmup == warmup):
            runs = [(p, ch.losses.get(index), ch.seed) for ch in c.chains for index, p in ch.points.items()]
            stable: dict[float, dict[int, float]] = {}
            for p, loss, seed in runs:
                if p.state != "unstable" and loss is not None:
                    stable.setdefault(p.lr, {})[seed] = loss
            lrs = sorted(lr for lr, seeds in stable.items() if len(seeds) == len(c.chains))
            means = [sum(stable[lr].values()) / len(c.chains) for lr in lrs]
            line, = ax.plot(lrs, means, "-", label=f"{c.name} (n={len(c.chains)})")
            color = line.get_color()
            for p, loss, _ in runs:
                shown = loss if loss is not None and math.isfinite(loss) else curves.initial
                ax.scatter([p.lr], [min(shown, curves.initial)], marker="x" if p.state == "unstable" else "o", s=14, alpha=0.5, color=color)
            if c.best in lrs:
                ax.scatter([c.best], [means[lrs.index(c.best)]], s=120, facecolors="none", edgecolors=color)
            if c.edge is not None:
                ax.scatter([c.edge], [0.0], marker="^", s=60, color=color, transform=ax.get_xaxis_transform(), clip_on=False)
        ax.axvline(curves.shared, color="black", linestyle="--", linewidth=0.8, label=f"shared lr {curves.shared:g}")
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # decades only: the minor ticks' labels crowd each other
        ax.set_xlabel("learning rate")
        ax.set_ylabel("final validation loss")
        ax.set_title(f"{cell}, warm-up {warmup:g}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{found.plan.name}: loss against learning rate (x: unstable; ring: best; triangle: edge)", fontsize=10)
    fig.tight_layout()
    return saved(fig, path)


def plot_stability(found: Findings, path: Path | None = None):
    """The edge against depth, per kind of candidate and warm-up (bars: 95% over seeds; open markers: a lower bound), with
    the search's learning rate dotted and each law drawn where one was fitted."""
    import numpy as np

    from blockforge.search.checks.stability_law import kind_of

    plan = found.plan
    series: dict[tuple[str, float, int], list[tuple[int, float, float, float, bool]]] = {}
    shared = set()
    for cell, curves in found.curves.items():
        if curves is None:
            continue
        model = plan.recipe(plan.trial_overrides(plan.cell(cell), {})).model
        winner = found.evidence[cell].winner
        shared.add(curves.shared)
        for c in curves.candidates:
            if c.edge is None:
                continue
            for kind in kind_of(c, model.depth, winner.model if winner else None) or [c.name]:
                low, high = c.edge_low or c.edge, c.edge_high or c.edge
                series.setdefault((kind, c.warmup, model.width), []).append((model.depth, c.edge, low, high, c.capped))
    fig, ax = figure(figsize=(6.4, 4.2))
    fits = found.stability_law.fits if found.stability_law else []
    for (kind, warmup, width), points in sorted(series.items()):
        points.sort()
        depth, mid, low, high = (np.array(v, dtype=float) for v in list(zip(*points))[:4])
        label = f"{kind}, warm-up {warmup:g}" + (f", width {width}" if len({k[2] for k in series}) > 1 else "")
        line = ax.errorbar(depth, mid, yerr=[mid - low, high - mid], fmt="o-", capsize=3, markersize=4, label=label)
        capped = [p for p in points if p[4]]
        if capped:
            ax.scatter([p[0] for p in capped], [p[1] for p in capped], marker="^", s=50, facecolors="none", edgecolors=line[0].get_color())
        fit = next((f for f in fits if f.kind == kind and f.warmup == warmup), None)
        if fit is not None and len(depth) > 1:
            grid = np.geomspace(depth.min(), depth.max(), 50)
            ax.plot(grid, [fit.at(d, width) for d in grid], "--", color=line[0].get_color(), alpha=0.6)
    for lr in sorted(shared):
        ax.axhline(lr, color="0.4", linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    depths = sorted({p[0] for points in series.values() for p in points})
    if depths:  # the cells' depths as the x axis's ticks, written plainly
        from matplotlib.ticker import NullFormatter

        ax.set_xticks(depths, [str(d) for d in depths])
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("depth L")
    ax.set_ylabel("edge: largest stable learning rate")
    ax.set_title(f"{plan.name}: edge per candidate\n(bars: 95% over seeds; triangles: lower bounds;\ndotted: the search's lr; dashed: fitted law)",
                 fontsize=9)
    ax.grid(alpha=0.3, which="both")
    if series:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return saved(fig, path)
