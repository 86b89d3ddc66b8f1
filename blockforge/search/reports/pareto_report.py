"""summary.md's Pareto fronts (quality against cost, with paired evidence), their console lines, pareto.json's rows and
the figure."""

from __future__ import annotations

from pathlib import Path

from blockforge.io import figure, saved
from blockforge.search.config import SearchPlan
from blockforge.search.evidence.evidence import describe
from blockforge.search.reports.findings import Findings
from blockforge.tables import fmt, markdown_table


def pareto_section(plan: SearchPlan, fronts: dict) -> tuple[str, list[str]]:
    """The fronts as markdown tables (point numbers are what `export --pick` takes), and one console line per cell."""
    parts, lines = [], []
    names = [c for c, _ in plan.costs]
    for cell, front in fronts.items():
        rows = []
        for i, p in enumerate(front.points):
            rows.append([i if p.on_front else "-", describe(p.candidate), *(fmt(p.costs[c]) for c in names), p.candidate.spread(),
                         "yes" if p.on_front else "no",
                         "; ".join(f"{describe(q)} ({d.text()})" for q, d in p.dominated_by) or "-",
                         "; ".join(f"{describe(q)} ({d.text()})" for q, d in p.tied_with) or "-"])
        hv = "-" if front.hypervolume is None else (f"{front.hypervolume:.3g}" + (
            f" [{front.low:.3g}, {front.high:.3g}] over {front.seeds} seeds" if front.low is not None else " (one seed: no interval)"))
        table = markdown_table(["point", "model", *names, f"{plan.metric} mean ± sd (n)", "on front", "dominated by (quality difference)",
                                "tied with"], rows) if rows else "(no candidate has the confirmation's seeds yet)"
        parts.append(f"### {cell}\n\n{table}\n\nHypervolume: {hv}.\n")
        on = front.front()
        lines.append(f"{cell}: front of {len(on)} point(s), hypervolume {hv}" + (":" if on else ""))
        lines += [f"  {i}: {describe(p.candidate)}: {plan.metric} {p.candidate.spread()}; " + ", ".join(f"{c} {fmt(p.costs[c])}" for c in names)
                  for i, p in enumerate(on)]
    return "\n".join(parts), lines


def plot_fronts(plan: SearchPlan, fronts: dict, path: Path | None = None):
    """Per cell and cost: quality (mean with its 95% t interval over seeds) against the cost; front points filled."""

    from blockforge.search.evidence.evidence import t_quantile

    cells, names = list(fronts), [c for c, _ in plan.costs]
    # front points are labelled with their number (the table's, and what `export --pick` takes), listed under the plots
    key = [f"{cell}: " + "; ".join(f"{i} = {describe(p.candidate)}" for i, p in enumerate(fronts[cell].front())) for cell in cells]
    fig, axes = figure(len(cells), len(names), figsize=(4.4 * len(names), 3.4 * len(cells) + 0.3 * len(key)), squeeze=False)
    for r, cell in enumerate(cells):
        numbers = {id(p): i for i, p in enumerate(fronts[cell].front())}
        for c, cost in enumerate(names):
            ax = axes[r][c]
            for p in fronts[cell].points:
                n = p.candidate.n
                half = t_quantile(n - 1) * p.candidate.sd / n ** 0.5 if n > 1 else 0.0
                ax.errorbar([p.costs[cost]], [p.candidate.mean], yerr=[[half], [half]], fmt="o" if p.on_front else "x",
                            color="tab:blue" if p.on_front else "tab:gray", capsize=3, markersize=5)
                if id(p) in numbers:
                    ax.annotate(str(numbers[id(p)]), (p.costs[cost], p.candidate.mean), xytext=(4, 3), textcoords="offset points",
                                fontsize=8, fontweight="bold")
            ax.set_xlabel(cost)
            ax.set_ylabel(plan.metric)
            ax.set_title(cell, fontsize=9)
            ax.grid(alpha=0.3)
    fig.suptitle(f"{plan.name}: {plan.metric} against each cost (filled: on the front; bars: 95% over seeds)", fontsize=10)
    fig.text(0.01, 0.01, "\n".join(key), fontsize=7, va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.3 * len(key) / fig.get_figheight() + 0.02, 1, 1))
    return saved(fig, path)


def pareto_summary(plan: SearchPlan, found: Findings) -> tuple[str, list[str]]:
    if not plan.costs:
        return "", []
    markdown, lines = pareto_section(plan, found.fronts)
    return ("## Pareto fronts: quality against cost\n\nA point is on the front unless another is no more costly on "
            "every cost and better in quality by a paired 95% interval excluding zero; `blockforge export SEARCH --cell "
            "CELL --pick N` exports point N, `--under COST=X` the best quality within that budget. Plot: pareto.png.\n\n"
            + markdown + "\n"), lines
