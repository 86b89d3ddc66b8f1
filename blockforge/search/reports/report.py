"""What a search leaves behind: results.csv, best/<cell>.yaml, summary.md, plots and the alpha law.

Every answer carries its evidence: per cell, the winner with its replicates (mean, sd, n over
training seeds), its paired difference to the Pre-LN reference and to the runner-up with a 95%
interval, and a verdict that calls it better than Pre-LN only when the interval excludes zero.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from pathlib import Path

import yaml

from blockforge.io import atomic_write_json, atomic_write_text, figure, saved
from blockforge.search.config import SearchPlan, cell_slug
from blockforge.search.evidence.evidence import METHOD, CellEvidence
from blockforge.search.records.ledger import Ledger, StageName, TrialRecord
from blockforge.search.reports.candidates import alpha_range_text, candidate_table, other_keys
from blockforge.search.reports.early_stopping_report import early_stopping_section
from blockforge.search.reports.findings import Findings
from blockforge.search.reports.law_report import law_section, plot_best_alpha
from blockforge.search.reports.pareto_report import pareto_summary, plot_fronts
from blockforge.search.reports.progress import progress
from blockforge.search.reports.transfer_report import plot_target_curves, transfer_section, transfer_summary
from blockforge.search.reports.views import write_optuna_storage, write_results_csv, write_tensorboard
from blockforge.spec.serialize import save_spec
from blockforge.spec.strict import to_plain
from blockforge.tables import fmt, markdown_table, text_table
from blockforge.train.events import Status

CONSOLE_LEAVES_OUT = ("completed", "failed", "diverged", "Pre-LN mean ± sd (n)", "runner-up gap [95% CI]")  # summary.md has them


def cell_rows(plan: SearchPlan, records: list[TrialRecord], evidence: dict[str, CellEvidence], found: Findings | None = None) -> tuple[list[str], list[list]]:
    """The summary table: per cell, trial counts by status, the winner with its replicates, and its verdict against Pre-LN
    (with a learning-rate curve and `found`: the verdict at each one's best and the edge against Pre-LN's too)."""
    from blockforge.search.reports.lr_curve_report import curve_column

    curved = ["lr curve vs Pre-LN"] if found is not None and found.curves else []
    extra = other_keys(plan)
    infeasible = ["infeasible"] if plan.constraints else []
    alpha = ["best alpha range", "post-LN layers"] if plan.varies_alpha else []
    pre_ln = ["Pre-LN mean ± sd (n)", "vs Pre-LN [95% CI]", "verdict"] if plan.against_pre_ln else []
    headers = ["cell", "trials", "completed", "pruned", "diverged", "failed", "duplicate", *infeasible, *alpha,
               *(f"best {k.rsplit('.', 1)[-1]}" for k in extra), f"{plan.metric} mean ± sd (n)", *pre_ln, *curved, "runner-up gap [95% CI]"]
    rows = []
    for cell in plan.cell_names():
        mine = [r for r in records if r.cell == cell]
        counts = Counter(str(r.status) for r in mine)
        e = evidence[cell]
        w = e.winner
        rows.append([
            cell, len(mine), counts["completed"], counts["pruned"], counts["diverged"], counts["failed"], counts["duplicate"],
            *(counts["infeasible"] for _ in infeasible),
            *([alpha_range_text(w, plan, cell) if w else "-", fmt(w.post_ln_layers) if w else "-"] if alpha else []),
            *(fmt(w.overrides.get(k)) if w else "-" for k in extra),
            w.spread() if w else "-",
            *([e.reference.spread() if e.reference else "-", e.vs_reference.text() if e.vs_reference and e.verdict != "Pre-LN" else "-",
               e.verdict] if pre_ln else []),
            *([curve_column(found, cell)] if curved else []),
            e.vs_runner_up.text() if e.vs_runner_up else "-",
        ])
    return headers, rows


def plot_metric_vs_alpha(plan: SearchPlan, records: list[TrialRecord], evidence: dict[str, CellEvidence], path: Path | None = None):

    cells = plan.cell_names()
    columns = min(3, len(cells))
    rows = -(-len(cells) // columns)
    fig, axes = figure(rows, columns, figsize=(4.2 * columns, 3.3 * rows), squeeze=False)
    style = {Status.COMPLETED: ("o", "tab:blue"), Status.PRUNED: ("x", "tab:gray"), Status.DIVERGED: ("v", "tab:red")}
    for ax, cell in zip(axes.flat, cells):
        for status, (marker, color) in style.items():
            pts = [(r.alpha, r.value) for r in records if r.cell == cell and r.status == status and r.alpha is not None and r.value is not None]
            if pts:
                ax.scatter(*zip(*pts), marker=marker, color=color, s=14, alpha=0.6, label=f"{status} (one seed)")
        diverged = [r.alpha for r in records if r.cell == cell and r.status == Status.DIVERGED and r.alpha is not None]
        if diverged:  # no value to place them at: mark them along the top edge
            ax.scatter(diverged, [ax.get_ylim()[1]] * len(diverged), marker="v", color=style[Status.DIVERGED][1], label="diverged", clip_on=False)
        confirmed = [c for c in evidence[cell].candidates if c.n > 1 and c.alpha is not None]
        if confirmed:
            ax.errorbar([c.alpha for c in confirmed], [c.mean for c in confirmed], yerr=[c.sd for c in confirmed], fmt="s",
                        color="black", capsize=3, markersize=4, label="replicates: mean ± sd")
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
    pruned = any(r.status == Status.PRUNED and r.cell in cells for r in records)
    fig.suptitle(f"{plan.name}: {plan.metric} vs alpha per cell" + (" (pruned points are partial)" if pruned else ""))
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    return saved(fig, path)


def write_best_specs(plan: SearchPlan, evidence: dict[str, CellEvidence], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for cell, e in evidence.items():
        if e.winner is None:
            continue
        slug = cell_slug(cell)
        recipe = plan.recipe(plan.trial_overrides(plan.cell(cell), e.winner.overrides))
        save_spec(recipe.spec, folder / f"{slug}.yaml")
        atomic_write_text(folder / f"{slug}.recipe.yaml", yaml.safe_dump(to_plain(recipe), sort_keys=False))


def compute_section(found: Findings) -> str:
    """Per cell: the plan's worst case beside what the search actually trained (trials, steps, FLOPs, trial-seconds)."""
    plan = found.plan
    pruned_explored: dict[tuple[str, str], int] = {}  # (cell, identity) -> steps its pruned exploration run reached
    for r in found.records:
        if r.stage == StageName.EXPLORE and r.status == Status.PRUNED:
            key = (r.cell, r.identity)
            pruned_explored[key] = max(pruned_explored.get(key, 0), r.steps)
    rows = []
    for cell in found.cell_plans.values():
        trained = [r for r in found.records if r.cell == cell.cell and r.status in (Status.COMPLETED, Status.PRUNED, Status.DIVERGED, Status.INTERRUPTED)]
        # a promoted run continues its pruned exploration run, a length check's run the length before it: only the steps
        # after those are its own
        lengths = [plan.settings[cell.cell].steps, *plan.length_steps(cell.cell)] if not cell.target else []

        def own_steps(r) -> int:
            if r.stage == StageName.EXPLORE:
                return r.steps
            if r.stage == StageName.LENGTH:
                return r.steps - max((n for n in lengths if n < r.steps), default=0)
            return r.steps - pruned_explored.get((r.cell, r.identity), 0)

        steps = sum(own_steps(r) for r in trained)
        per_step = cell.trial_flops / plan.settings[cell.cell].steps
        rows.append([cell.cell, cell.total_trials, f"{cell.total_flops:.3g}", len(trained), steps, f"{steps * per_step:.3g}",
                     f"{sum(r.wall_s for r in trained):,.0f}"])
    return markdown_table(["cell", "trials planned (at most)", "FLOPs planned (at most)", "trials trained", "steps trained", "FLOPs trained",
                           "trial-seconds"], rows)


def basis_section(found: Findings) -> list[str]:
    """Per cell, what its verdict rests on: the training length and learning rate it was measured at, and whether a
    check at another length (a transfer target that lengthens training) or over each candidate's learning-rate curve
    (confirm.lr_curve) exists, with its outcome."""
    from blockforge.spec.family import get_family

    plan = found.plan
    lines = []
    for cell in plan.cell_names():
        recipe = plan.recipe(plan.trial_overrides(plan.cell(cell), {}))
        train, family = recipe.train, get_family(recipe.model.family)
        per_step = train.batch_size * (recipe.model.context if family.sample_unit == "tok" else 1)
        unit = "tokens" if family.sample_unit == "tok" else "samples"
        lr = "searched lr" if any(d.key == "train.lr" for d in plan.dimensions) else f"shared lr {train.lr:g}"
        text = f"{cell}: measured at {train.steps} steps ({train.steps * per_step:,} {unit}), {lr}"
        longer = [f"{t} at {plan.settings[t].steps} steps: {outcome.outcome}" for t, outcome in found.outcomes.items()
                  if outcome.prediction.nearest == cell and plan.settings[t].steps != plan.settings[cell].steps]
        own = found.lengths.get(cell)
        longer += [f"{s.steps} steps: {s.outcome}" for s in own.steps] if own is not None else []
        text += "; length check: " + ("; ".join(longer) if longer else "none (no transfer target trains longer than it, no confirm.length)")
        if cell in found.curves:
            curves = found.curves[cell]
            text += "; lr curve: " + (f"{curves.answer}; {curves.probe_text()}" if curves else "not trained yet")
        else:
            text += "; lr curve: none (confirm.lr_curve trains the finalists and baselines over learning rates)"
        lines.append(text + ".")
    return lines


def budget_text(plan: SearchPlan) -> str:
    """'150 steps', or each cell's steps when cells differ."""
    budgets = {s.steps for s in plan.settings.values()}
    if len(budgets) == 1:
        return f"{budgets.pop()} steps"
    return "per cell " + ", ".join(f"{cell}: {s.steps}" for cell, s in plan.settings.items()) + " steps"


def write_reports(search_dir: Path, plan: SearchPlan, ledger: Ledger, location: str | None = None, found: Findings | None = None) -> str:
    """Write every report file; returns the summary table and claims as text (what the CLI prints). `location`: where
    the search is kept, as its views should name it (a remote search's URI; default: `search_dir`). `found`: the
    ledger's findings, when the caller computed them already."""
    records = ledger.records()
    found = found or Findings.of(plan, records)
    transfer_markdown, transfer_lines, transfer_data = transfer_section(found) if plan.targets else ("", [], [])
    tensorboard = _write_data(search_dir, plan, records, found, transfer_data)
    plots = _write_plots(search_dir, plan, records, found)
    evidence = found.evidence
    headers, rows = cell_rows(plan, records, evidence, found)
    claims = [evidence[cell].claim() for cell in plan.cell_names()]
    provisional = [f"{cell}: {said.text()}" for cell in plan.all_names() if not (said := progress(found, cell)).final]
    pareto_markdown, pareto_lines = pareto_summary(plan, found)
    sections = {"table": markdown_table(headers, rows), "claims": claims, "provisional": provisional,
                "views": _views_text(plan, plots, search_dir, location, tensorboard),
                "pareto": pareto_markdown, "transfer": transfer_summary(plan, transfer_markdown)}
    atomic_write_text(search_dir / "summary.md", _summary(plan, found, sections))
    verdict_line = found.law_verdict
    keep = [i for i, h in enumerate(headers) if h not in CONSOLE_LEAVES_OUT]
    console = text_table([headers[i] for i in keep], [[row[i] for i in keep] for row in rows])
    advice = [a for a in (found.rungs[cell].advice() for cell in plan.cell_names()) if a] if plan.asha else []
    from blockforge.search.reports.lr_curve_report import curve_lines

    return (console + "\n\n" + "\n".join(claims + provisional + pareto_lines + curve_lines(found) + advice)
            + ("\n\n" + verdict_line if plan.varies_alpha else "")
            + ("\n\n" + "\n".join(transfer_lines) if transfer_lines else ""))


def _write_data(search_dir: Path, plan: SearchPlan, records: list, found: Findings, transfer_data: list[dict]) -> bool:
    """The data files: results.csv, the Optuna journal, TensorBoard (True when written), best/, alpha_law.json,
    pareto.json and transfer.json (`transfer_data`, from transfer_section)."""
    write_results_csv(plan, records, search_dir / "results.csv")
    write_optuna_storage(search_dir, plan, records)
    tensorboard = write_tensorboard(search_dir, records, plan)
    write_best_specs(plan, found.evidence, search_dir / "best")
    if plan.varies_alpha:  # a search that varies no alpha has no alpha law to write
        atomic_write_json(search_dir / "alpha_law.json", {
            "points": found.points, "fits": [asdict(f) for f in found.law.fits], "verdict": found.law.verdict,
            "bootstrap": asdict(found.boot) if found.boot else None,
        })
    if plan.costs:
        atomic_write_json(search_dir / "pareto.json", {cell: [{"point": i, "model": p.candidate.model, "overrides": p.candidate.overrides,
                                                                "costs": p.costs, "mean": p.candidate.mean, "n": p.candidate.n, "on_front": p.on_front}
                                                               for i, p in enumerate(front.points)] for cell, front in found.fronts.items()})
    if plan.targets:
        atomic_write_json(search_dir / "transfer.json", transfer_data)
    if found.curves:
        from blockforge.search.reports.lr_curve_report import curves_data

        atomic_write_json(search_dir / "stability.json", curves_data(found))
    return tensorboard


def _write_plots(search_dir: Path, plan: SearchPlan, records: list, found: Findings) -> list[str]:
    """Draw the plots the search has data for; returns their file names (what the summary lists)."""
    drawn = []
    for name, draw in figures_of(found).items():
        draw(search_dir / f"{name}.png")
        drawn.append(f"{name}.png")
    return drawn


def figures_of(found: Findings) -> dict:
    """The plots a search has data for, by name (its PNG's, without .png): each a function drawing its figure (and writing
    it, given a path). The reports write them; the Python view returns them."""
    plan, records, evidence = found.plan, found.records, found.evidence
    plots = {
        "metric_vs_alpha": (plan.varies_alpha, lambda path=None: plot_metric_vs_alpha(plan, records, evidence, path)),
        "best_alpha_vs_depth": (bool(found.points), lambda path=None: plot_best_alpha(found.points, found.law, found.boot, path)),
        "pareto": (bool(plan.costs), lambda path=None: plot_fronts(plan, found.fronts, path)),
        "lr_curves": (any(c is not None for c in found.curves.values()), lambda path=None: _plot_curves(found, path)),
        "transfer_curves": (bool(plan.targets) and any(evidence[t].candidates for t in plan.target_names()),
                            lambda path=None: plot_target_curves(plan, evidence, found.gaps, path)),
        "stability_vs_depth": (any(c is not None and any(x.edge is not None for x in c.candidates) for c in found.curves.values()),
                               lambda path=None: _plot_stability(found, path)),
    }
    return {name: draw for name, (wanted, draw) in plots.items() if wanted}


def _provisional_text(lines: list[str]) -> str:
    """summary.md's note of the cells whose answers may still change (empty when every answer is final)."""
    if not lines:
        return ""
    return ("\nProvisional answers (a trial runs or was stopped, or a stage has not finished; `--resume` continues the search):\n\n"
            + "\n".join("- " + line for line in lines) + "\n")


def _plot_stability(found: Findings, path: Path | None):
    from blockforge.search.reports.lr_curve_report import plot_stability

    return plot_stability(found, path)


def _plot_curves(found: Findings, path: Path | None):
    from blockforge.search.reports.lr_curve_report import plot_curves

    return plot_curves(found, path)


def _views_text(plan: SearchPlan, plots: list[str], search_dir: Path, location: str | None, tensorboard: bool) -> str:
    """Where to look next: the CSV, best specs, plots, the Optuna journal and TensorBoard, named relative to the search
    folder (a copied or downloaded search still finds them)."""
    curves = ("Curves of every trial: `tensorboard --logdir tensorboard`." if tensorboard
              else "Curves of every trial: install tensorboard (pip install tensorboard), then `blockforge search FILE --resume` writes them.")
    remote = bool(location) and location != str(search_dir)
    return ("Every trial: `results.csv` (`pandas.read_csv`), or every answer as objects: `blockforge.open_search(FOLDER)`. "
            "Best spec per cell: `best/`." + (f" Plots: {', '.join(f'`{p}`' for p in plots)}." if plots else "")
            + f"\nFrom this folder: `optuna-dashboard optuna.journal` (Optuna studies, one per cell). {curves}"
            + (f" (Take the folder down first: optuna-dashboard and TensorBoard read local files; `blockforge.open_search('{location}')` "
               "reads it where it is.)" if remote else ""))


def _summary(plan: SearchPlan, found: Findings, sections: dict) -> str:
    """summary.md: the objective and method, the table and claims, then a section per kind of evidence."""
    from blockforge.search.reports.checks_report import checks_markdown
    from blockforge.search.reports.lr_curve_report import curves_markdown
    from blockforge.search.stages.confirm import describe_confirmation
    from blockforge.search.stages.promote import PROMOTION_RULE

    evidence = found.evidence
    details = "\n\n".join(f"### {cell}\n\n{candidate_table(plan, evidence[cell])}" for cell in plan.cell_names() if evidence[cell].candidates)
    summary = f"""# Search {plan.name}

Objective: {plan.mode} {plan.metric} after {budget_text(plan)}; {plan.trials_per_cell} exploration trials per cell; sampler {plan.sampler.kind}; scheduler {'ASHA' if plan.asha else 'none'}; {describe_confirmation(plan)}.
Intervals: {METHOD} over the training seeds two models share (candidates trained with one seed see the same data order and start from the same weights).{''.join(chr(10) + 'Adjusted: ' + a + '.' for a in plan.adjustments)}

{sections["table"]}

{chr(10).join('- ' + c for c in sections["claims"])}
{_provisional_text(sections["provisional"])}
What each answer rests on:

{chr(10).join('- ' + line for line in basis_section(found))}

{sections["views"]}

## Candidates per cell

{details or '(no model finished the full budget)'}

## Early stopping checked against full budgets

{PROMOTION_RULE}

{early_stopping_section(found)}
{checks_markdown(found)}
{curves_markdown(found)}
{sections["pareto"]}{sections["transfer"]}## Compute: the plan beside what was trained

Planned: the worst case `blockforge search FILE --plan` prints. Trained: runs that trained (duplicates and
invalid points cost nothing), their steps, those steps' FLOPs at the cell's planned FLOPs per step, and
the seconds their trials reported.

{compute_section(found)}
""" + (f"""
## alpha_opt(depth, width)

Each cell's winner has k Post-LN layers out of L; every alpha in [k/L, (k+1)/L) builds it. The laws
below are fitted to k/L.

{law_section(found.points, found.law, found.boot, found.resampled, plan.metric)}""" if plan.varies_alpha else "")
    return summary
