"""summary.md's early stopping: per cell, the ranking at each evaluated step against the final one, the pruned trials
against the full-budget curves, and the runs promoted back."""

from __future__ import annotations

from blockforge.search.evidence.evidence import describe
from blockforge.search.reports.findings import Findings
from blockforge.tables import fmt, markdown_table


def early_stopping_section(found: Findings) -> str:
    """Per cell: the ranking at each evaluated step against the final one among full-budget curves (same seed),
    the pruned trials against those curves where they stopped, and the runs promoted back to the full budget."""
    plan = found.plan
    if plan.asha is None:
        return "No early stopping: every trial ran its full budget.\n"
    by_trial = {(r.cell, r.trial): r for r in found.records}
    parts = []
    for cell in plan.cell_names():
        rungs = found.rungs[cell]
        if not rungs.checks:
            parts.append(f"### {cell}\n\nNo two full-budget curves share a seed yet.\n")
            continue
        table = markdown_table(
            ["step", "ASHA rung", "Kendall tau vs final", "seeds", "pairs", "crossing", "largest crossing margin"],
            [[c.step, "yes" if c.step in rungs.rungs else "", "-" if c.tau is None else f"{c.tau:+.2f}", c.seeds, c.pairs,
              c.crossed, fmt(c.largest) if c.crossed else "-"] for c in rungs.checks])
        pruned = markdown_table(
            ["trial", "model", "stopped at", "behind the best full curve", "curves overtaken by up to", "could have ended ahead"],
            [[p.trial, describe(by_trial[(cell, p.trial)]), p.step, "-" if p.margin is None else fmt(p.margin), fmt(p.crossing),
              "yes" if p.inside else "no"] for p in rungs.pruned]) if rungs.pruned else "No pruned trial is left without a full-budget run."
        promoted = "".join(f"\n- trial {n} ({describe(by_trial[(cell, n)])}, seed {by_trial[(cell, n)].seed}): {why}"
                           for n, why in sorted(rungs.promoted.items()))
        advice = rungs.advice()
        parts.append(f"### {cell}\n\n{table}\n\n{pruned}\n" + (f"\nPromoted to the full budget:{promoted}\n" if promoted else "")
                     + (f"\n{advice}\n" if advice else ""))
    return "\n".join(parts)
