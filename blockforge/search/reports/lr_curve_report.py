"""What a search with `confirm.stability` says of stability: summary.md's Stability section, the console table's column,
stability.json and the figure of the largest stable learning rate against depth."""

from __future__ import annotations

from pathlib import Path

from blockforge.io import figure, saved
from blockforge.search.reports.findings import Findings
from blockforge.tables import markdown_table
from blockforge.train.stability import RULE, Rule


def stability_column(found: Findings, cell: str) -> str:
    """The console table's cell: the winner's stability against Pre-LN's, in a few words."""
    check = found.stability.get(cell)
    e = found.evidence[cell]
    mine = check.of(e.winner.model) if check is not None and e.winner is not None else None
    if mine is None:
        return "-"
    if mine.verdict == "reference":
        return f"Pre-LN: {mine.largest_text()}" if mine.largest is not None else "Pre-LN"
    if mine.verdict in ("less stable", "more stable") and mine.vs_pre_ln is not None:
        return f"{mine.verdict} x{mine.vs_pre_ln.mean:.2g}"
    return mine.verdict


def stability_lines(found: Findings) -> list[str]:
    """One console line per cell: its answer weighing quality and stability."""
    return [f"{cell}: stability: {check.answer}" for cell, check in found.stability.items() if check is not None]


def stability_markdown(found: Findings, rule: Rule = RULE) -> str:
    """summary.md's Stability section (empty without confirm.stability)."""
    plan = found.plan
    if plan.confirm is None or plan.confirm.stability is None:
        return ""
    parts = [f"## Stability: each candidate's largest stable learning rate\n\nA run is unstable when it diverges, {rule.text()} "
             "(blockforge/train/stability.py). Per seed of the confirmation, the largest stable learning rate is found by bisection in log "
             "space between the search's learning rate and lr_max (blockforge/search/checks/stability_check.py); below, its geometric mean over "
             "seeds with a 95% t interval, and its ratio to Pre-LN's paired by seed, whose interval is widened by one step of the grid: "
             "`less stable` or `more stable` only when that interval excludes 1.\n"]
    for cell, check in found.stability.items():
        if check is None:
            parts.append(f"### {cell}\n\nNo candidate has finished yet.\n")
            continue
        rows = [[c.name, f"{c.warmup:g}", "; ".join(b.text() for b in c.brackets), c.largest_text(),
                 c.vs_pre_ln.text() if c.vs_pre_ln else "-", c.verdict, f"{c.used:.0%}" if c.used is not None else "-",
                 ", ".join(str(b.spikes) for b in c.brackets if b.spikes is not None) or "-"] for c in check.candidates]
        table = markdown_table(["candidate", "warm-up", "per seed", "largest stable lr [95% CI]", "vs Pre-LN [95% CI]", "verdict",
                                "search lr uses", "spikes at it"], rows)
        parts.append(f"### {cell}\n\n**{check.answer}.** Measured with {check.probe_text()}.\n\n{table}\n")
    law = found.stability_law
    if law is None:
        parts.append("No stability law: it needs a kind of candidate measured in two cells or more that vary depth or width.\n")
        return "\n".join(parts)
    fits = markdown_table(["kind", "warm-up", "cells", "law", "depth exponent [95%]", "minus Pre-LN's [95%]"],
                          [[f.kind, f"{f.warmup:g}", len(f.points), f.formula(), f.exponent_text(),
                            f"{f.versus_pre[0]:+.2f} [{f.versus_pre[1]:+.2f}, {f.versus_pre[2]:+.2f}]" if f.versus_pre else "-"]
                           for f in law.fits])
    parts.append("### Across cells\n\nPower laws of the largest stable learning rate in depth (and width), fitted to each kind's cells "
                 "and bootstrapped over seeds (blockforge/search/checks/stability_law.py):\n\n" + fits + "\n\n"
                 + "\n".join(f"- {line}" for line in law.verdicts()) + "\n")
    if law.predictions:
        rows = [[p.size, p.kind, f"{p.warmup:g}", f"{p.largest:.3g} [{p.low:.3g}, {p.high:.3g}]", f"{p.lr:g}", p.verdict
                 + (" (width assumed not to matter)" if p.width_assumed else "")] for p in law.predictions]
        parts.append("Predicted at larger sizes, against the learning rate each size's recipe trains with:\n\n"
                     + markdown_table(["size", "kind", "warm-up", "largest stable lr [95%]", "recipe's lr", "the recipe's lr is"], rows) + "\n")
    return "\n".join(parts)


def stability_data(found: Findings) -> dict:
    """stability.json: every cell's probed candidates and the laws, as plain data."""
    cells = {}
    for cell, check in found.stability.items():
        if check is None:
            continue
        cells[cell] = {"answer": check.answer, "search_lr": check.shared, "lr_max": check.lr_max, "step": check.step, "probe_steps": check.steps,
                       "candidates": [{"name": c.name, "model": c.model, "post_ln_layers": c.post_ln_layers, "warmup": c.warmup,
                                       "largest": c.largest, "low": c.low, "high": c.high, "verdict": c.verdict, "search_lr_uses": c.used,
                                       "vs_pre_ln": None if c.vs_pre_ln is None else {"ratio": c.vs_pre_ln.mean, "low": c.vs_pre_ln.low,
                                                                                     "high": c.vs_pre_ln.high, "n": c.vs_pre_ln.n},
                                       "seeds": [{"seed": b.seed, "stable": b.stable, "unstable": b.unstable, "state": b.state, "why": b.why,
                                                  "probes": b.probes, "spikes": b.spikes} for b in c.brackets]}
                                      for c in check.candidates]}
    law = found.stability_law
    laws = [] if law is None else [{"kind": f.kind, "warmup": f.warmup, "terms": f.terms, "params": f.params, "low": f.low, "high": f.high,
                                     "formula": f.formula(), "depth_exponent_minus_pre_ln": f.versus_pre,
                                     "points": [{"cell": p.cell, "depth": p.depth, "width": p.width, "largest": p.largest} for p in f.points]}
                                    for f in law.fits]
    predictions = [] if law is None else [{"size": p.size, "depth": p.depth, "width": p.width, "lr": p.lr, "kind": p.kind, "warmup": p.warmup,
                                           "largest": p.largest, "low": p.low, "high": p.high, "verdict": p.verdict} for p in law.predictions]
    return {"rule": RULE.__dict__, "cells": cells, "laws": laws, "predictions": predictions}


def plot_stability(found: Findings, path: Path | None = None):
    """The largest stable learning rate against depth, per kind of candidate and warm-up (bars: 95% over seeds), with the
    search's learning rate dashed and each law drawn where one was fitted."""
    import numpy as np

    from blockforge.search.checks.stability_law import kind_of

    plan = found.plan
    series: dict[tuple[str, float, int], list[tuple[int, float, float, float]]] = {}
    shared = set()
    for cell, check in found.stability.items():
        if check is None:
            continue
        model = plan.recipe(plan.trial_overrides(plan.cell(cell), {})).model
        winner = found.evidence[cell].winner
        shared.add(check.shared)
        for c in check.candidates:
            if c.largest is None:
                continue
            for kind in kind_of(c, model.depth, winner.model if winner else None) or [c.name]:
                low, high = c.low or c.largest, c.high or c.largest
                series.setdefault((kind, c.warmup, model.width), []).append((model.depth, c.largest, low, high))
    fig, ax = figure(figsize=(6.4, 4.2))
    for (kind, warmup, width), points in sorted(series.items()):
        points.sort()
        depth, mid, low, high = (np.array(v, dtype=float) for v in zip(*points))
        label = f"{kind}, warm-up {warmup:g}" + (f", width {width}" if len({k[2] for k in series}) > 1 else "")
        line = ax.errorbar(depth, mid, yerr=[mid - low, high - mid], fmt="o-", capsize=3, markersize=4, label=label)
        fit = next((f for f in (found.stability_law.fits if found.stability_law else []) if f.kind == kind and f.warmup == warmup), None)
        if fit is not None and len(depth) > 1:
            grid = np.geomspace(depth.min(), depth.max(), 50)
            ax.plot(grid, [fit.at(fit.params, d, width) for d in grid], "--", color=line[0].get_color(), alpha=0.6)
    for lr in sorted(shared):
        ax.axhline(lr, color="0.4", linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    depths = sorted({d for points in series.values() for d, *_ in points})
    if depths:  # the cells' depths as the x axis's ticks, written plainly
        from matplotlib.ticker import NullFormatter

        ax.set_xticks(depths, [str(d) for d in depths])
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("depth L")
    ax.set_ylabel("largest stable learning rate")
    ax.set_title(f"{plan.name}: largest stable lr per candidate\n(bars: 95% over seeds; dotted: the search's lr; dashed: fitted law)", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    if series:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return saved(fig, path)
