"""What a search leaves behind: results.csv, best/<cell>.yaml, summary.md, plots and the alpha law."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import yaml

from blockforge.io import atomic_write_json, atomic_write_text
from blockforge.search.config import SearchPlan
from blockforge.search.law import LawReport, fit_alpha_law
from blockforge.search.ledger import Ledger, TrialRecord, best_records
from blockforge.spec.resolve import mix_ln_count, resolve
from blockforge.spec.serialize import save_spec
from blockforge.spec.strict import to_plain
from blockforge.tables import fmt, markdown_table, text_table


def cell_rows(plan: SearchPlan, records: list[TrialRecord]) -> tuple[list[str], list[list]]:
    """The summary table: per cell, trial counts by status, the best trial and the uniform Pre-LN baseline."""
    best = best_records(records, plan.mode)
    headers = ["cell", "trials", "completed", "pruned", "diverged", "failed", "duplicate", "best alpha range", "post-LN layers", f"best {plan.metric}", f"{plan.metric} at alpha 0"]
    rows = []
    for cell in plan.cell_names():
        mine = [r for r in records if r.cell == cell]
        counts = Counter(r.status for r in mine)
        pre = [r.value for r in mine if r.alpha == 0.0 and r.status in ("completed", "duplicate") and r.value is not None]
        b = best.get(cell)
        rows.append([cell, len(mine), counts["completed"], counts["pruned"], counts["diverged"], counts["failed"], counts["duplicate"],
                     alpha_range_text(b, plan, cell) if b else "-", fmt(b.post_ln_layers) if b else "-", fmt(b.value) if b else "-",
                     fmt(pre[0]) if pre else "-"])
    return headers, rows


def alpha_range(alpha: float, depth: int) -> tuple[float, float]:
    """Every alpha in [low, high) builds the same stack as `alpha` at this depth: floor(alpha * depth) Post-LN layers."""
    k = mix_ln_count(alpha, depth)
    return k / depth, ((k + 1) / depth if k < depth else 1.0)


def alpha_range_text(record: TrialRecord, plan: SearchPlan, cell: str) -> str:
    if record.alpha is None:
        return "-"
    low, high = alpha_range(record.alpha, cell_depth(plan, cell))
    return f"{low:.4g}" if low == high else f"{low:.4g}-{high:.4g}"


def cell_depth(plan: SearchPlan, cell: str) -> int:
    return plan.recipe(plan.trial_overrides(plan.cell(cell), {})).model.depth


def law_points(plan: SearchPlan, records: list[TrialRecord]) -> list[dict]:
    """The best alpha of each cell with the cell's depth and width (from the resolved base recipe).

    A trial's sampled alpha is one arbitrary point of the range that builds its model, so the law is
    fitted to the fraction of Post-LN layers that model has, k / L (the low end of the range); the
    sampled value and the whole range are kept beside it.
    """
    points = []
    best = best_records(records, plan.mode)
    for cell in plan.cell_names():
        record = best.get(cell)
        if record is None or record.alpha is None:
            continue
        recipe = plan.recipe(plan.trial_overrides(plan.cell(cell), {}))
        low, high = alpha_range(record.alpha, recipe.model.depth)
        points.append({"cell": cell, "depth": recipe.model.depth, "width": recipe.model.width, "alpha": low,
                       "alpha_range": [low, high], "sampled_alpha": record.alpha,
                       "post_ln_layers": record.post_ln_layers, "value": record.value})
    return points


def plot_metric_vs_alpha(plan: SearchPlan, records: list[TrialRecord], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = plan.cell_names()
    columns = min(3, len(cells))
    rows = -(-len(cells) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.3 * rows), squeeze=False)
    style = {"completed": ("o", "tab:blue"), "pruned": ("x", "tab:gray"), "diverged": ("v", "tab:red"), "duplicate": (".", "tab:cyan")}
    for ax, cell in zip(axes.flat, cells):
        for status, (marker, color) in style.items():
            pts = [(r.alpha, r.value) for r in records if r.cell == cell and r.status == status and r.alpha is not None and r.value is not None]
            if pts:
                ax.scatter(*zip(*pts), marker=marker, color=color, label=status)
        diverged = [r.alpha for r in records if r.cell == cell and r.status == "diverged" and r.alpha is not None]
        if diverged:  # no value to place them at: mark them along the top edge
            ax.scatter(diverged, [ax.get_ylim()[1]] * len(diverged), marker="v", color=style["diverged"][1], label="diverged", clip_on=False)
        ax.set_title(cell, fontsize=10)
        ax.set_xlabel("alpha (fraction of Post-LN layers)")
        ax.set_ylabel(plan.metric)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(cells):]:
        ax.axis("off")
    legend = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    if legend:
        fig.legend(legend.values(), legend.keys(), loc="lower center", ncol=4, fontsize=8)
    fig.suptitle(f"{plan.name}: {plan.metric} vs alpha per cell (pruned points are partial)")
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_best_alpha(points: list[dict], law: LawReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from blockforge.search.law import LAWS

    fig, ax = plt.subplots(figsize=(6, 4))
    widths = sorted({p["width"] for p in points})
    depths = np.array(sorted({p["depth"] for p in points}), dtype=float)
    for width in widths:
        mine = sorted((p["depth"], p["alpha"], p["alpha_range"][1]) for p in points if p["width"] == width)
        depth, low, high = (np.array(v, dtype=float) for v in zip(*mine))
        line = ax.plot(depth, low, "o-", label=f"best k/L, width {width}")[0]
        ax.errorbar(depth, low, yerr=[np.zeros_like(low), high - low], fmt="none", ecolor=line.get_color(), alpha=0.5, capsize=3)
    if law.fits and len(depths) > 1:
        grid = np.linspace(depths.min(), depths.max(), 100)
        best = law.fits[0]
        for width in widths:
            ax.plot(grid, LAWS[best.name][2](best.params, grid, np.full_like(grid, width)), "--", alpha=0.7, label=f"{best.formula} (width {width})")
    ax.set_xlabel("depth L")
    ax.set_ylabel("best alpha (bars: every alpha giving the same model)")
    ax.set_title("best Mix-LN alpha per cell")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_best_specs(plan: SearchPlan, records: list[TrialRecord], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for cell, record in best_records(records, plan.mode).items():
        slug = re.sub(r"[^A-Za-z0-9_.=-]+", "_", cell.replace(",", "__"))
        overrides = plan.trial_overrides(plan.cell(cell), record.overrides)
        recipe = plan.recipe(overrides)
        save_spec(resolve(recipe.model), folder / f"{slug}.yaml")
        atomic_write_text(folder / f"{slug}.recipe.yaml", yaml.safe_dump(to_plain(recipe), sort_keys=False))


def write_reports(search_dir: Path, plan: SearchPlan, ledger: Ledger) -> str:
    """Write every report file; returns the summary table as text (what the CLI prints)."""
    records = ledger.records()
    ledger.write_csv(search_dir / "results.csv")
    write_best_specs(plan, records, search_dir / "best")
    headers, rows = cell_rows(plan, records)
    points = law_points(plan, records)
    law = fit_alpha_law(points)
    atomic_write_json(search_dir / "alpha_law.json", {"points": points, "fits": [asdict(f) for f in law.fits], "verdict": law.verdict})
    plot_metric_vs_alpha(plan, records, search_dir / "metric_vs_alpha.png")
    if points:
        plot_best_alpha(points, law, search_dir / "best_alpha_vs_depth.png")
    fits = markdown_table(["law", "parameters", "RMSE", "AICc", "leave-one-out RMSE", "cells in range"],
                           [[f.formula, ", ".join(f"{p:.4g}" for p in f.params), f"{f.rmse:.4g}", f"{f.aicc:.2f}", f"{f.loo_rmse:.4g}",
                             f"{f.in_range}/{len(points)}"] for f in law.fits])
    data = markdown_table(["cell", "depth", "width", "best alpha k/L", "same model up to", "post-LN layers", plan.metric],
                           [[p["cell"], p["depth"], p["width"], fmt(p["alpha"]), fmt(p["alpha_range"][1]), p["post_ln_layers"], fmt(p["value"])]
                            for p in points])
    summary = f"""# Search {plan.name}

Objective: {plan.mode} {plan.metric} after {plan.steps} steps; {plan.trials_per_cell} trials per cell; sampler {plan.sampler.kind}; scheduler {'ASHA' if plan.asha else 'none'}.

{markdown_table(headers, rows)}

Every trial: `results.csv`. Best spec per cell: `best/`. Plots: `metric_vs_alpha.png`, `best_alpha_vs_depth.png`.

## alpha_opt(depth, width)

Each cell's best model has k Post-LN layers out of L; every alpha in [k/L, (k+1)/L) builds it. The laws
below are fitted to k/L.

{data}

{fits if law.fits else '(no law could be fitted)'}

{law.verdict}
"""
    atomic_write_text(search_dir / "summary.md", summary)
    return text_table(headers, rows) + "\n\n" + law.verdict
