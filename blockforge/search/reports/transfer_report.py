"""summary.md's transfer section: per target, the prediction, its candidates, whether it held and what it cost, the curves
against Pre-LN along training and the figure."""

from __future__ import annotations

from pathlib import Path

from blockforge.io import figure, saved
from blockforge.search.config import SearchPlan
from blockforge.search.evidence.evidence import CellEvidence, describe
from blockforge.search.reports.candidates import candidate_table
from blockforge.search.reports.findings import Findings
from blockforge.train.events import Status


def gap_text(gaps: list[tuple[int, float, float, float]]) -> str:
    """'-0.05 at step 150, -0.1 at 750, -0.12 at 1500': the gap at the first, middle and last evaluation."""
    picks = sorted({0, len(gaps) // 2, len(gaps) - 1})
    return ", ".join(f"{gaps[i][1]:+.3g} at step {gaps[i][0]}" for i in picks)


def plot_target_curves(plan: SearchPlan, evidence: dict[str, CellEvidence], gaps: dict, path: Path | None = None):
    """Per transfer target: each candidate's evaluation curve (mean over its seeds) and, below, its difference to
    Pre-LN step by step, paired by seed (the band: the seeds' range). Whether a gain grows or shrinks with training
    is read off the lower row."""
    from blockforge.search.checks.transfer import seed_curves

    targets = [t for t in plan.target_names() if evidence[t].candidates]
    fig, axes = figure(2, len(targets), figsize=(max(6.4, 5.2 * len(targets)), 6.4), squeeze=False, sharex="col")
    for col, target in enumerate(targets):
        top, bottom = axes[0][col], axes[1][col]
        e, colors = evidence[target], {}
        for c in sorted(e.candidates, key=lambda c: c.post_ln_layers or 0):
            by_seed = seed_curves(c, plan.metric)
            if not by_seed:
                continue
            steps = sorted(set.intersection(*(set(v) for v in by_seed.values())))
            style = {"color": "black", "linestyle": "--"} if c is e.reference else {}
            line, = top.plot(steps, [sum(v[t] for v in by_seed.values()) / len(by_seed) for t in steps], label=f"{describe(c)} (n={len(by_seed)})", **style)
            colors[describe(c)] = line.get_color()
        for name, gap in gaps.get(target, {}).items():
            steps = [g[0] for g in gap]
            bottom.plot(steps, [g[1] for g in gap], color=colors.get(name))
            bottom.fill_between(steps, [g[2] for g in gap], [g[3] for g in gap], color=colors.get(name), alpha=0.15)
        bottom.axhline(0.0, color="black", linestyle="--", linewidth=0.8)
        top.set_title(target, fontsize=9)
        top.set_ylabel(plan.metric)
        top.grid(alpha=0.3)
        if colors:
            top.legend(fontsize=7)
        bottom.set_xlabel("step")
        bottom.set_ylabel("minus Pre-LN (paired by seed)")
        bottom.grid(alpha=0.3)
    fig.suptitle(f"{plan.name}: the transfer targets' curves (band: the seeds' range)", fontsize=10)
    fig.tight_layout()
    return saved(fig, path)


def transfer_section(found: Findings) -> tuple[str, list[str], list[dict]]:
    """The transfer stage per target: prediction, candidates, held or not, verdict, and compute against a full search
    of the target. Returns the markdown, one console line per target and the records for transfer.json."""
    plan, records, evidence = found.plan, found.records, found.evidence
    parts, lines, data = [], [], []
    for target in plan.target_names():
        prediction = found.predictions.get(target)
        if prediction is None:
            parts.append(f"### {target}\n\nNo proxy cell has a winner yet: nothing to predict.\n")
            continue
        outcome = found.outcomes[target]
        full = found.full_plans[target]
        mine = [r for r in records if r.cell == target and r.status in (Status.COMPLETED, Status.DIVERGED, Status.INTERRUPTED, Status.PRUNED)]
        spent = sum(r.steps for r in mine) * full.trial_flops / plan.settings[target].steps
        compute = (f"{len(mine)} runs, {spent:.3g} FLOPs: {spent / full.total_flops:.0%} of a full search of this cell by its plan "
                   f"({full.total_trials} trials at most, {full.total_flops:.3g} FLOPs)")
        table = candidate_table(plan, evidence[target]) if evidence[target].candidates else "(no candidate has finished)"
        gaps = found.gaps.get(target, {})
        along = ("\n\nAgainst Pre-LN along training (mean difference over the paired seeds, from the run folders; plot: "
                 "transfer_curves.png): " + "; ".join(f"{name}: {gap_text(g)}" for name, g in gaps.items() if g) + ".") if any(gaps.values()) else ""
        parts.append(f"### {target}\n\nPredicted: {prediction.text()}; other searched values from {prediction.nearest}: "
                     f"{prediction.searched or 'none'}.\n\n{table}\n\n**{outcome.outcome}**: {outcome.detail}. The predicted k against "
                     f"Pre-LN here: {outcome.versus_pre}. Compute: {compute}.{along}\n")
        lines.append(f"{target}: predicted k={prediction.k} ({prediction.source.split(' (')[0]}), best k={outcome.observed}: {outcome.outcome}; "
                     f"against Pre-LN: {outcome.versus_pre}; compute {spent / full.total_flops:.0%} of a full search")
        data.append({"target": target, "depth": prediction.depth, "width": prediction.width, "predicted_alpha": prediction.alpha,
                     "predicted_k": prediction.k, "interval": [prediction.low, prediction.high], "source": prediction.source,
                     "nearest": prediction.nearest, "searched": prediction.searched, "observed_k": outcome.observed, "outcome": outcome.outcome,
                     "versus_pre_ln": outcome.versus_pre, "detail": outcome.detail, "flops_spent": spent, "flops_full_search": full.total_flops})
    return "\n".join(parts), lines, data


def transfer_summary(plan: SearchPlan, markdown: str) -> str:
    if not plan.targets:
        return ""
    return ("## Transfer: the answers tested at larger sizes\n\nEach target trains the predicted k, its neighbours and "
            f"Pre-LN with {plan.transfer.seeds} paired seeds (see blockforge/search/checks/transfer.py).\n\n{markdown}\n")
