"""Figures a notebook asks for that the reports do not write: a cell's curves, each candidate in its colour."""

from __future__ import annotations

from blockforge.io import figure


def cell_curves(answer):
    """The objective at every evaluation of each full-budget run of a cell (findings.CellAnswer), one colour per candidate
    and one line per seed; the winner and the Pre-LN reference named as such (a remote search's view took its runs' curves
    down before its answers)."""
    import itertools

    import matplotlib

    from blockforge.search.evidence.evidence import describe
    from blockforge.search.records.runs import evaluations

    fig, ax = figure(figsize=(6.4, 4.2))
    e = answer.evidence
    colours = itertools.cycle(matplotlib.rcParams["axes.prop_cycle"].by_key()["color"])  # one colour per candidate
    for candidate in e.candidates:
        colour = next(colours)
        role = " (winner)" if candidate is e.winner else " (Pre-LN reference)" if candidate is e.reference else ""
        label = f"{describe(candidate)}{role}"
        for seed, run_dir in sorted(candidate.run_dirs.items()):
            points = [(step, metrics[answer.metric]) for step, metrics in evaluations(run_dir) if answer.metric in metrics]
            if points:
                ax.plot(*zip(*points), color=colour, alpha=0.8, linewidth=1.2, label=label)
                label = None  # one legend entry per candidate
    ax.set_xlabel("step")
    ax.set_ylabel(answer.metric)
    ax.set_title(f"{answer.name}: {answer.metric} per candidate (a line per seed)", fontsize=9)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
