"""Whether a cell's answer is final: read from its records alone, so a running search, one stopped partway and a
finished one are told apart wherever the answer is shown (the Python view, the live view, summary.md).

A cell's answer is **provisional** while any of its trials is running or was stopped (interrupted), or while a stage
its plan has has not given what it gives: exploration (no confirmation trial yet; without confirmation, fewer explored
trials than its budget), confirmation (the winner lacks the confirmation's seeds), racing (the leaders are not separated
and seeds are left), and the checks (the longer lengths, the learning-rate curves), or a transfer
target's outcome. It says how many trials trained against the cell's worst case, and which stages are pending.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from blockforge.search.records.ledger import StageName, TrialRecord
from blockforge.train.events import Status

if TYPE_CHECKING:
    from blockforge.search.config import SearchPlan
    from blockforge.search.evidence.evidence import CellEvidence


@dataclass(frozen=True)
class Progress:
    trained: int  # trials that trained (completed, diverged or stopped early)
    planned: int  # the cell's worst case (`--plan`'s trials at most); 0 where not known
    running: int  # trials running now, or stopped with the search (interrupted)
    pending: list[str] = field(default_factory=list)  # stages that have not given their part yet

    @property
    def final(self) -> bool:
        return not self.running and not self.pending

    def text(self) -> str:
        """'final', or 'provisional: 12 of at most 45 trials trained, 2 running; pending: confirmation, lr curve'."""
        if self.final:
            return "final"
        trained = f"{self.trained} of at most {self.planned} trials trained" if self.planned else f"{self.trained} trials trained"
        running = f", {self.running} running or stopped" if self.running else ""
        pending = f"; pending: {', '.join(self.pending)}" if self.pending else ""
        return f"provisional: {trained}{running}{pending}"


def quick_progress(plan: "SearchPlan", records: list[TrialRecord], name: str, evidence: "CellEvidence", planned: int = 0) -> Progress:
    """A cell's progress from its records and evidence: running trials, exploration, confirmation and racing (what the live
    view can afford at every update); the checks are `progress`'s."""
    from blockforge.search.evidence.evidence import min_seeds

    mine = [r for r in records if r.cell == name]
    running = sum(r.status in (Status.RUNNING, Status.INTERRUPTED) for r in mine)
    trained = sum(r.status in (Status.COMPLETED, Status.DIVERGED, Status.PRUNED) for r in mine)
    pending = []
    if name in plan.target_names():
        return Progress(trained, planned, running, pending)
    winner, confirm = evidence.winner, plan.confirm
    if confirm is None:
        from blockforge.search.stages.pipeline import stage_types

        budget = stage_types(plan, name)[0].budget(plan, name)
        if sum(r.stage == StageName.EXPLORE and r.status != Status.RUNNING for r in mine) < budget:
            pending.append("exploration")
        return Progress(trained, planned, running, pending)
    if not any(r.stage == StageName.CONFIRM for r in mine):
        pending.append("exploration")
    if winner is None or winner.n < min_seeds(plan):
        pending.append("confirmation")
    elif confirm.max_seeds and evidence.vs_runner_up is not None and not evidence.vs_runner_up.excludes_zero() \
            and winner.n < 1 + confirm.max_seeds:
        pending.append("racing")
    return Progress(trained, planned, running, pending)


def progress(found, name: str) -> Progress:
    """A cell's progress in what a search found (findings.Findings): `quick_progress`, and the checks its plan has (length,
    the learning-rate curve) or a target's outcome."""
    plan = found.plan
    planned = found.cell_plans[name].total_trials if name in found.cell_plans else 0
    quick = quick_progress(plan, found.records, name, found.evidence[name], planned)
    pending = list(quick.pending)
    if name in plan.target_names():
        if found.outcomes.get(name) is None:
            pending.append("transfer")
    elif plan.confirm is not None and "confirmation" not in pending:
        if plan.confirm.length is not None and _length_pending(found, name):
            pending.append("length")
        curves = found.curves.get(name)
        if name in found.curves and (curves is None or not curves.finished):  # the search asks for a learning-rate curve
            pending.append("lr curve")
    return Progress(quick.trained, planned, quick.running, pending)


def _length_pending(found, name: str) -> bool:
    """Whether a longer length the check will still train is missing (not one `until_stable` skipped)."""
    check = found.lengths.get(name)
    if check is None:
        return found.evidence[name].reference is not None and any(not c.uniform_pre for c in found.evidence[name].eligible)
    verdicts = [check.proxy_verdict]
    for step in check.steps:
        if step.outcome == "not trained":
            stable = found.plan.confirm.length.until_stable and len(verdicts) > 1 and verdicts[-1] == verdicts[-2]
            return not stable
        verdicts.append(step.verdict)
    return False
