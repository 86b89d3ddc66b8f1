"""How a search's answers show in a notebook and a terminal: compact tables, the verdict and its interval first, never a
dump of every field. Each answer object's `_repr_html_` (Jupyter) and `__repr__` (a console) come from here; the objects
themselves keep every field for code to read. (The objects are findings.CellAnswer, evidence.CellEvidence and Candidate,
lr_curve.LrCurves, api.Search and LawAnswer: they import this module, which imports none of them.)"""

from __future__ import annotations

import html
from typing import Iterable

from blockforge.tables import text_table

STYLE = "border-collapse:collapse;font-size:0.9em"  # what pandas' DataFrame HTML looks like in a notebook, kept small


def html_table(headers: list[str], rows: Iterable[list], caption: str = "") -> str:
    """A small HTML table (escaped), in the 'dataframe' class notebooks style as pandas' tables."""
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    title = f"<caption style='text-align:left'>{caption}</caption>" if caption else ""
    return f"<table class='dataframe' style='{STYLE}'>{title}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def interval(difference) -> str:
    return difference.text() if difference is not None else "-"


# ---- one cell's answer -------------------------------------------------------------------------------------------------

ANSWER_HEADERS = ["cell", "verdict", "vs Pre-LN [95% CI]", "winner", "mean ± sd (n)", "tied with", "status"]


def answer_row(answer) -> list:
    """A cell's answer in one row: its verdict and interval first, then the winner, its replicates and what it ties with."""
    w = answer.winner
    status = answer.progress.text() if answer.progress is not None else "-"
    return [answer.name, answer.verdict, interval(answer.vs_pre_ln) if answer.verdict not in ("Pre-LN", "n/a") else "-",
            w.label() if w else "-", w.spread() if w else "-", ", ".join(c.label() for c in answer.tied) or "-", status]


def checks(answer) -> list[str]:
    """One line per check the cell has: longer training, the learning-rate curve, transfer."""
    lines = []
    if answer.length is not None:
        lines.append("length: " + "; ".join(f"{s.steps} steps {s.outcome}" for s in answer.length.steps))
    if answer.curves is not None:
        lines.append(f"lr curve: {answer.curves.answer}")
    if answer.outcome is not None:
        lines.append(f"transfer: {answer.outcome.outcome} ({answer.outcome.detail})")
    return lines


def cell_text(answer) -> str:
    """A cell's answer in a few lines (well under 2 KB): the verdict with its interval, the winner, the checks."""
    head = f"{answer.name}: {answer.verdict}"
    if answer.vs_pre_ln is not None and answer.verdict not in ("Pre-LN", "n/a"):
        head += f", {answer.vs_pre_ln.text()} against Pre-LN"
    status = answer.progress.text() if answer.progress is not None else ""
    lines = [head + (f" ({status})" if status and status != "final" else ""), f"  claim: {_short(answer.claim, 400)}"]
    lines += [f"  {line}" for line in checks(answer)]
    candidates = answer.evidence.candidates
    lines.append(f"  {len(candidates)} candidate(s) in .evidence.candidates; .plot() draws their curves")
    return "<CellAnswer " + "\n".join(lines) + ">"


def cell_html(answer) -> str:
    """A cell's answer: its row (verdict and interval first), its checks, and its candidates' table."""
    parts = [html_table(ANSWER_HEADERS, [answer_row(answer)])]
    if checks(answer):
        parts.append("<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in checks(answer)) + "</ul>")
    parts.append(answer.evidence._repr_html_())
    return "".join(parts)


def cells_text(answers: Iterable) -> str:
    answers = list(answers)
    return text_table(ANSWER_HEADERS, [answer_row(a) for a in answers]) if answers else "(no cell)"


def cells_html(answers: Iterable) -> str:
    return html_table(ANSWER_HEADERS, [answer_row(a) for a in answers])


# ---- learning-rate curves ---------------------------------------------------------------------------------------------

CURVE_HEADERS = ["candidate", "warm-up", "best lr", "edge [95% CI]", "edge vs Pre-LN", "LR sensitivity [95% CI]", "vs Pre-LN",
                 "shared lr"]


def curve_rows(curves) -> list[list]:
    return [[c.name, f"{c.warmup:g}", f"{c.best:.3g}" if c.best is not None else "-", c.edge_text(), c.edge_verdict_text(),
             c.sensitivity_text(), (f"{c.sensitivity_verdict} ({c.sensitivity_vs_pre.text()})" if c.sensitivity_vs_pre else c.sensitivity_verdict)
             or "-", curves.standing(c)] for c in curves.candidates]


def curves_html(curves) -> str:
    return html_table(CURVE_HEADERS, curve_rows(curves), caption=f"{html.escape(curves.cell)}: {html.escape(curves.answer)}")


def curves_text(curves) -> str:
    return f"<LrCurves {curves.cell}: {curves.answer}\n" + text_table(CURVE_HEADERS, curve_rows(curves)) + ">"


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---- the search, its cells and its laws ------------------------------------------------------------------------------


class Cells(dict):
    """Every cell's answer by name, in the search file's order (the transfer targets after the proxies): a dict whose keys
    complete in IPython (`search.cells()["depth=8"]`) and which shows as one table."""

    def _ipython_key_completions_(self) -> list[str]:
        return list(self)

    def __repr__(self) -> str:
        return cells_text(self.values())

    def _repr_html_(self) -> str:
        return cells_html(self.values())


def search_head(search) -> str:
    """'search quickstart at runs/search-quickstart: 45 trials (2 running)'."""
    running = sum(r.status == "running" for r in search.records)
    return f"search {search.plan.name} at {search.where}: {len(search.records)} trials" + (f" ({running} running)" if running else "")


def search_text(search) -> str:
    law = search.law()
    return (f"<blockforge {search_head(search)}\n{cells_text(search.cells().values())}" + (f"\n{_short(law.verdict, 300)}" if law else "")
            + "\n(.cells(), .results(), .law(), .curves(), .plot())>")


def search_html(search) -> str:
    law = search.law()
    verdict = f"<p>{html.escape(law.verdict)}</p>" if law else ""
    return f"<p><b>{html.escape(search_head(search))}</b></p>{cells_html(search.cells().values())}{verdict}"


LAW_HEADERS = ["law", "parameters", "AICc", "leave-one-out RMSE", "fits best (resamples)"]


def law_rows(law) -> list[list]:
    wins = {u.formula: f"{u.wins:.0%}" for u in law.bootstrap.laws} if law.bootstrap else {}
    return [[f.formula, ", ".join(f"{p:.3g}" for p in f.params), f"{f.aicc:.2f}", f"{f.loo_rmse:.3g}", wins.get(f.formula, "-")]
            for f in law.fits.fits]


def law_text(law) -> str:
    stability = f"\nstability law: {len(law.stability.fits)} fit(s); .stability.fits, .stability.predictions" if law.stability else ""
    return f"<LawAnswer {_short(law.verdict, 400)}\n{text_table(LAW_HEADERS, law_rows(law))}{stability}>"


def law_html(law) -> str:
    parts = [f"<p><b>{html.escape(law.verdict)}</b></p>", html_table(LAW_HEADERS, law_rows(law))]
    if law.stability:
        rows = [[f.kind, f"{f.warmup:g}", len(f.points), f.formula(), f.exponent_text(), f.versus_text()] for f in law.stability.fits]
        parts.append(html_table(["kind", "warm-up", "cells", "edge", "depth exponent [95%]", "minus Pre-LN's [95%]"], rows,
                                caption="the edge (largest stable learning rate) across cells"))
    return "".join(parts)
