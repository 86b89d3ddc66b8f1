"""What a cell's trials say, with their evidence: replicates per model, paired differences, verdicts.

A model (a resolved architecture with its training settings, the seed aside) is a *candidate*; each
training seed gives it one replicate. Candidates trained with the same seed share their data order
and initial weights (common random numbers), so candidates are compared by their differences seed by
seed: the mean difference with a 95% paired-t interval over the seeds both have. A winner is called
better than Pre-LN only when that interval excludes zero; otherwise the two are reported as tied.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from blockforge.search.config import SearchPlan
from blockforge.search.records.ledger import APART
from blockforge.spec.search import mode_sign
from blockforge.train.events import Status

LEVEL = 0.95
METHOD = "paired t, 95%"


@dataclass(frozen=True)
class Difference:
    """a - b over the seeds both have: mean, sd, n and the interval (None below two seeds)."""

    mean: float
    sd: float
    n: int
    low: float | None
    high: float | None

    def excludes_zero(self) -> bool:
        return self.low is not None and (self.low > 0 or self.high < 0)

    def text(self) -> str:
        if self.low is None:
            return f"{self.mean:+.3g} (n={self.n}, no interval)"
        return f"{self.mean:+.3g} [{self.low:+.3g}, {self.high:+.3g}] (n={self.n})"


def t_quantile(df: int, level: float = LEVEL) -> float:
    from scipy.stats import t

    return float(t.ppf(0.5 + level / 2, df))


def paired_difference(a: dict[int, float], b: dict[int, float], level: float = LEVEL) -> Difference | None:
    """a - b seed by seed (keys are training seeds); None when they share no seed."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return None
    diffs = [a[s] - b[s] for s in seeds]
    n = len(diffs)
    mean = sum(diffs) / n
    if n < 2:
        return Difference(mean, math.nan, n, None, None)
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    half = t_quantile(n - 1, level) * sd / math.sqrt(n)
    return Difference(mean, sd, n, mean - half, mean + half)


def verdict(diff: Difference | None, mode: str) -> str:
    """'better' / 'worse' when the interval of (candidate - reference) excludes zero, else 'tied'; 'n/a' below two seeds."""
    if diff is None or diff.low is None:
        return "n/a"
    if not diff.excludes_zero():
        return "tied"
    improved = diff.high < 0 if mode == "min" else diff.low > 0
    return "better" if improved else "worse"


@dataclass(repr=False)
class Candidate:
    """One model of a cell and its replicates (seed -> objective value; a diverged seed holds the penalty)."""

    model: str
    overrides: dict[str, Any]
    alpha: float | None
    post_ln_layers: int | None
    uniform_pre: bool
    values: dict[int, float] = field(default_factory=dict)
    diverged: list[int] = field(default_factory=list)
    run_dirs: dict[int, str] = field(default_factory=dict)
    costs: dict[str, float] = field(default_factory=dict)  # a search with a cost axis: what the model costs

    def __repr__(self) -> str:
        seeds = ",".join(str(s) for s in sorted(self.values))
        return f"<Candidate {self.label()}: {self.spread()}, seeds {seeds or '-'}>"

    def label(self) -> str:
        """'1 Post-LN layer, lr 0.003' (describe)."""
        return describe(self)

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return sum(self.values.values()) / self.n

    @property
    def sd(self) -> float:
        if self.n < 2:
            return math.nan
        m = self.mean
        return math.sqrt(sum((v - m) ** 2 for v in self.values.values()) / (self.n - 1))

    def spread(self) -> str:
        """'5.944 ± 0.165 (n=3)'; one seed has no spread."""
        if self.n == 0:
            return "-"
        text = f"{self.mean:.4g}" + (f" ± {self.sd:.2g}" if self.n > 1 else "") + f" (n={self.n})"
        return text + (f", diverged on {len(self.diverged)}" if self.diverged else "")


@dataclass(repr=False)
class CellEvidence:
    cell: str
    candidates: list[Candidate]  # every candidate with at least one full-budget replicate, best mean first
    eligible: list[Candidate]  # those with the confirmation's seeds: where a winner may come from
    winner: Candidate | None
    reference: Candidate | None  # the best uniform Pre-LN candidate
    runner_up: Candidate | None
    vs_reference: Difference | None
    vs_runner_up: Difference | None
    verdict: str  # the winner against Pre-LN: better | tied | worse | n/a | Pre-LN (the winner is Pre-LN)
    mode: str
    against_pre_ln: bool = True  # False: the search varies no placement, so its claims compare models with each other only

    ROW_HEADERS = ["model", "k", "mean ± sd (n)", "minus Pre-LN [95% CI]", "minus winner [95% CI]", "role"]

    def rows(self) -> list[list]:
        """Every candidate in a row (ROW_HEADERS): its replicates and paired intervals against Pre-LN and the winner."""
        from blockforge.search.display import interval

        out = []
        for c in self.candidates:
            to_pre, to_winner = self.paired(c)
            role = "winner" if c is self.winner else "Pre-LN reference" if c is self.reference else "runner-up" if c is self.runner_up else ""
            out.append([describe(c), "-" if c.post_ln_layers is None else c.post_ln_layers, c.spread(), interval(to_pre), interval(to_winner), role])
        return out

    def __repr__(self) -> str:
        from blockforge.tables import text_table

        return f"<CellEvidence {self.cell}: {len(self.candidates)} candidate(s), verdict {self.verdict}\n{text_table(self.ROW_HEADERS, self.rows())}>"

    def _repr_html_(self) -> str:
        import html

        from blockforge.search.display import html_table

        return html_table(self.ROW_HEADERS, self.rows(), caption=f"{html.escape(self.cell)}: every candidate at the full budget")

    def difference_to(self, candidate: Candidate, other: Candidate | None) -> Difference | None:
        return paired_difference(candidate.values, other.values) if other is not None else None

    def paired(self, candidate: Candidate) -> tuple[Difference | None, Difference | None]:
        """`candidate` minus the Pre-LN reference and minus the winner, paired by seed (None against itself)."""
        return (self.difference_to(candidate, self.reference) if candidate is not self.reference else None,
                self.difference_to(candidate, self.winner) if candidate is not self.winner else None)

    def claim(self) -> str:
        """One sentence: the winner, its verdict against Pre-LN, and whether the runner-up is tied with it."""
        if self.winner is None:
            return f"{self.cell}: no model finished the full budget."
        w = self.winner
        text = f"{self.cell}: best mean {describe(w)}, {w.spread()}" + (self._against_pre_ln() if self.against_pre_ln else "")
        tied = self.tied_with_winner()
        if tied:
            text += "; tied with " + ", ".join(f"{describe(c)} ({self.difference_to(c, w).text()})" for c in tied)
        elif self.runner_up is not None and self.vs_runner_up is not None and self.vs_runner_up.low is not None:
            text += f"; ahead of every other finalist (runner-up {describe(self.runner_up)}: {self.vs_runner_up.text()})"
        return text + "."

    def _against_pre_ln(self) -> str:
        if self.verdict == "Pre-LN":
            return "; it is the Pre-LN reference"
        if self.reference is None:
            return "; no Pre-LN model was trained to compare with"
        if self.verdict == "n/a":
            return f"; against Pre-LN {self.vs_reference.text() if self.vs_reference else 'no common seed'}: one seed gives no interval"
        return f"; against Pre-LN {self.vs_reference.text()}: {self.verdict}"

    def tied_with_winner(self) -> list[Candidate]:
        """Finalists whose paired interval against the winner includes zero: the data cannot rank them below it."""
        out = []
        for c in self.eligible:
            if c is self.winner:
                continue
            diff = self.difference_to(c, self.winner)
            if diff is not None and diff.low is not None and not diff.excludes_zero():
                out.append(c)
        return out


def describe(candidate) -> str:
    """'1 Post-LN layer, lr 0.003': a candidate's (or a trial record's) shape and its other searched values."""
    parts = []
    if candidate.post_ln_layers is not None and any(key.endswith("mix_ln.alpha") for key in candidate.overrides):
        k = candidate.post_ln_layers
        parts.append(f"{k} Post-LN layer{'' if k == 1 else 's'}")
    for key, value in candidate.overrides.items():
        if key.endswith("mix_ln.alpha"):
            continue
        parts.append(f"{key.rsplit('.', 1)[-1]} {value:.3g}" if isinstance(value, float) else f"{key.rsplit('.', 1)[-1]} {value}")
    return ", ".join(parts) or (candidate.model or getattr(candidate, "identity", ""))[:8]


def candidates_of(records: list, cell: str, penalty: float) -> list[Candidate]:
    """Group a cell's trained, full-budget records by model; duplicates (no training of their own) are left out."""
    found: dict[str, Candidate] = {}
    for r in records:
        if r.cell != cell or r.status not in (Status.COMPLETED, Status.DIVERGED) or r.stage in APART:
            continue  # the learning-rate curves' and length checks' trials are compared apart (lr_curve, length_check)
        model = r.model or r.identity or f"trial {r.trial}"  # ledgers from before replicates name no model
        c = found.setdefault(model, Candidate(model, dict(r.overrides), r.alpha, r.post_ln_layers, r.uniform_pre))
        c.costs.update(r.costs)
        if r.status == Status.DIVERGED:
            c.values[r.seed] = penalty
            c.diverged.append(r.seed)
        elif r.value is not None:
            c.values[r.seed] = r.value
        c.run_dirs[r.seed] = r.run_dir
    return [c for c in found.values() if c.values]


def cell_evidence(records: list, cell: str, *, mode: str, penalty: float, min_seeds: int = 1, against_pre_ln: bool = True) -> CellEvidence:
    """The cell's candidates, winner, Pre-LN reference and verdicts.

    A winner must have at least `min_seeds` replicates (the confirmation's floor, or as many as any
    candidate reached when confirmation has not finished): a model seen on one seed in exploration
    does not beat a confirmed one by luck.
    """
    sign = mode_sign(mode)
    candidates = sorted(candidates_of(records, cell, penalty), key=lambda c: sign * c.mean)
    floor = min(min_seeds, max((c.n for c in candidates), default=0))
    eligible = [c for c in candidates if c.n >= floor]
    winner = eligible[0] if eligible else None
    runner_up = eligible[1] if len(eligible) > 1 else None
    pre = [c for c in candidates if c.uniform_pre]
    reference = max(pre, key=lambda c: (c.n >= floor, -sign * c.mean)) if pre else None
    vs_reference = paired_difference(winner.values, reference.values) if winner and reference else None
    if winner is not None and winner is reference:
        call = "Pre-LN"
    else:
        call = verdict(vs_reference, mode) if reference is not None else "n/a"
    vs_runner_up = paired_difference(runner_up.values, winner.values) if runner_up else None
    return CellEvidence(cell, candidates, eligible, winner, reference, runner_up, vs_reference, vs_runner_up, call, mode, against_pre_ln)


def min_seeds(plan: SearchPlan) -> int:
    """The replicates a winner needs: exploration's seed plus the confirmation's further seeds."""
    return 1 + (plan.confirm.seeds if plan.confirm else 0)


def evidence_by_cell(plan: SearchPlan, records: list) -> dict[str, CellEvidence]:
    """Every cell's evidence, the transfer's targets included (their candidates have the transfer's seeds)."""
    evidence = {cell: cell_evidence(records, cell, mode=plan.mode, penalty=plan.penalty, min_seeds=min_seeds(plan), against_pre_ln=plan.against_pre_ln)
                for cell in plan.cell_names()}
    for target in plan.target_names():
        evidence[target] = cell_evidence(records, target, mode=plan.mode, penalty=plan.penalty, min_seeds=plan.transfer.seeds)
    return evidence


def dominates(a: list[float], b: list[float]) -> bool:
    """Whether point a is no worse than b in every coordinate and better in one (all to minimise)."""
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))
