"""summary.md's sections on how a search spent less and checked more: law-guided cells (which k each never trained, the
law and interval that left them out, whether its window grew), finalists that left confirmation's race (and by which
test), and verdicts followed to longer training, with the alpha law fitted per length."""

from __future__ import annotations

from blockforge.search.evidence.evidence import describe
from blockforge.search.records.ledger import StageName
from blockforge.search.reports.findings import Findings
from blockforge.train.events import Status


def guidance_lines(found: Findings) -> list[str]:
    """Per guided cell: the law's window, the k it trained and never trained, whether the window grew."""
    plan = found.plan
    if plan.guide is None:
        return []
    from blockforge.search.config import MIX_LN_COUNT

    lines = []
    for cell in plan.cell_names():
        if not plan.guided(cell):
            continue
        dims = {d.name: d for d in plan.dimensions_in(cell)}
        lowest, highest = dims[MIX_LN_COUNT].args
        depth = plan.settings[cell].depth
        trained = sorted({r.post_ln_layers for r in found.records if r.cell == cell and r.stage == StageName.EXPLORE
                          and r.status not in (Status.DUPLICATE, Status.FAILED, Status.INFEASIBLE) and r.post_ln_layers is not None})
        never = [k for k in range(lowest, highest + 1) if k not in trained]
        window = found.windows.get(cell)
        law = window.text(depth) if window is not None else "no law could be compared (its whole range was explored)"
        margin = plan.guide.margin
        if window is not None:
            planned = set(range(max(lowest, window.low - margin), min(highest, window.high + margin) + 1)) | set(_baseline_ks(plan, cell))
            grew = sorted(k for k in trained if k not in planned)
            growth = f"the window grew to k {', '.join(map(str, grew))} (its best k sat on an edge)" if grew else "the window did not grow"
        else:
            growth = "no window"
        lines.append(f"{cell}: the law predicted {law}; explored k {_ks(trained)} ({margin} beyond the prediction on each side, and the "
                     f"baselines); never trained: {_ks(never) if never else 'none'}; {growth}.")
    return lines


def _baseline_ks(plan, cell: str) -> list[int]:
    from blockforge.search.config import MIX_LN_COUNT

    ks = [plan.sampler_params(cell, b).get(MIX_LN_COUNT) for b in plan.baselines]
    return [k for k in ks if k is not None] + [0]


def _ks(ks: list[int]) -> str:
    return ", ".join(map(str, ks)) if ks else "none"


def race_lines(found: Findings) -> list[str]:
    """Finalists that left a cell's race before its last seed, with the test that let them go."""
    lines = []
    for cell, dropped in found.races.items():
        for model, (leader, diff) in dropped.items():
            candidate = next(c for c in found.evidence[cell].candidates if c.model == model)
            lines.append(f"{cell}: {describe(candidate)} left the race after {diff.n} seeds, behind {describe(leader)} by {diff.text()}")
    return lines


def length_lines(found: Findings) -> list[str]:
    return [f"{cell}: {check.text()}" for cell, check in found.lengths.items() if check is not None]


def law_per_length(found: Findings) -> list[str]:
    """The alpha law fitted at each length the length checks reached in every cell: each cell's answer there is the better
    of its pair (its best Mix-LN candidate, or Pre-LN with k = 0)."""
    from blockforge.search.evidence.law import alpha_range, fit_alpha_law

    plan = found.plan
    checks = {cell: check for cell, check in found.lengths.items() if check is not None}
    if not checks or not plan.varies_alpha:
        return []
    lines = []
    for i, factor in enumerate(plan.confirm.length.factors):
        points = []
        for cell, check in checks.items():
            step = check.steps[i] if i < len(check.steps) else None
            if step is None or step.difference is None:
                continue
            better_mix = step.difference.mean < 0 if plan.mode == "min" else step.difference.mean > 0
            depth = plan.settings[cell].depth
            alpha = check.candidate.alpha if better_mix else 0.0
            low, high = alpha_range(alpha, depth)
            points.append({"cell": cell, "depth": depth, "width": plan.recipe(plan.trial_overrides(plan.cell(cell), {})).model.width,
                           "alpha": low, "alpha_range": [low, high]})
        if len(points) < 2:
            lines.append(f"at {factor:g}x the steps: {len(points)} cell(s) measured there; too few for a law")
            continue
        report = fit_alpha_law(points)
        lines.append(f"at {factor:g}x the steps ({len(points)} cells): {report.verdict}")
    return lines


def checks_markdown(found: Findings) -> str:
    """The sections, as markdown (empty for a search that has none of them)."""
    from blockforge.search.stages.confirm import RACE_METHOD

    parts = []
    guided = guidance_lines(found)
    if guided:
        parts.append("## Law-guided cells\n\nCells ran in the order " + ", ".join(found.plan.order) + f"; after the first {found.plan.guide.after}, "
                     "each explored only the k the alpha laws predicted for it (refitted on seed resamples of every cell before it), and grew "
                     "the window while its best k sat on an edge. The prior chose what was explored; each cell's own seeds decided its "
                     "answer.\n\n" + "\n".join("- " + line for line in guided) + "\n")
    raced = race_lines(found)
    if found.races:
        stays = "; the Pre-LN reference always stays" if found.plan.against_pre_ln else ""
        parts.append(f"## Racing\n\nBefore each further confirmation seed, a finalist clearly behind the leader left the race ({RACE_METHOD}"
                     f"{stays}).\n\n" + ("\n".join("- " + line for line in raced) if raced else "No finalist left a race.") + "\n")
    lengths = length_lines(found)
    if lengths:
        parts.append("## Verdicts at longer training\n\nEach cell's best Mix-LN candidate and the Pre-LN reference continued from their "
                     "checkpoints with the same seeds (blockforge/search/checks/length_check.py says how warm-up and decay are handled). Holds, "
                     "grows, shrinks to a tie or flips: the verdict at each length against the search's own.\n\n"
                     + "\n".join("- " + line for line in lengths) + "\n\nThe alpha law at each length:\n\n"
                     + "\n".join("- " + line for line in law_per_length(found)) + "\n")
    return "\n".join(parts)
