"""A cell's candidates as summary.md shows them: one row each, with its replicates and its paired differences."""

from __future__ import annotations

from blockforge.search.config import MIX_LN_ALPHA, SearchPlan
from blockforge.search.evidence.evidence import Candidate, CellEvidence, describe, verdict
from blockforge.search.evidence.law import alpha_range
from blockforge.search.records.ledger import TrialRecord
from blockforge.tables import fmt, markdown_table


def alpha_range_text(candidate: Candidate | TrialRecord, plan: SearchPlan, cell: str) -> str:
    if candidate.alpha is None:
        return "-"
    low, high = alpha_range(candidate.alpha, plan.settings[cell].depth)
    return f"{low:.4g}" if low == high else f"{low:.4g}-{high:.4g}"


def candidate_table(plan: SearchPlan, e: CellEvidence) -> str:
    """Every candidate of a cell trained to the full budget: replicates, and paired differences with 95% intervals."""
    extra = other_keys(plan)
    alpha, pre_ln = plan.varies_alpha, e.against_pre_ln
    rows = []
    for c in e.candidates:
        to_pre, to_winner = e.paired(c)
        reference = "Pre-LN reference" if pre_ln and c is e.reference else ""
        role = "winner" if c is e.winner else (reference or ("runner-up" if c is e.runner_up else ""))
        rows.append([
            describe(c), *([alpha_range_text(c, plan, e.cell)] if alpha else []), *(fmt(c.overrides.get(k)) for k in extra),
            ", ".join(str(s) for s in sorted(c.values)), fmt(c.mean), fmt(c.sd) if c.n > 1 else "-", c.n,
            *([to_pre.text() if to_pre else "-", verdict(to_pre, plan.mode) if to_pre else ("reference" if c is e.reference else "-")]
              if pre_ln else []),
            to_winner.text() if to_winner else "-", role,
        ])
    headers = ["model", *(["alpha range"] if alpha else []), *(k.rsplit(".", 1)[-1] for k in extra), "seeds", "mean", "sd", "n",
               *(["minus Pre-LN [95% CI]", "vs Pre-LN"] if pre_ln else []), "minus winner [95% CI]", ""]
    return markdown_table(headers, rows)


def other_keys(plan: SearchPlan) -> list[str]:
    """Searched keys other than Mix-LN's alpha (which the alpha range column shows)."""
    return [d.key for d in plan.dimensions if d.key != MIX_LN_ALPHA]
