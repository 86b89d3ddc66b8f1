"""What a search found, computed once from its ledger: every report file, the console summary and `export` read it.

Each cell's evidence, its rung analysis (with a scheduler), the alpha law and its bootstrap, the fronts (with a
cost axis), the transfer targets' predictions and outcomes, and the compute plan are each computed here exactly
once, so the reports cost what one pass over the ledger costs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from blockforge.search.config import SearchPlan
from blockforge.search.evidence.evidence import Candidate, CellEvidence, Difference, evidence_by_cell
from blockforge.search.records.ledger import TrialRecord
from blockforge.search.reports.progress import Progress, progress

if TYPE_CHECKING:
    from blockforge.search.checks.length_check import LengthCheck
    from blockforge.search.checks.lr_curve import LrCurves
    from blockforge.search.checks.stability_law import StabilityLaw
    from blockforge.search.checks.transfer import Prediction, TargetOutcome
    from blockforge.search.evidence.law import BootstrapReport, LawReport, LawWindow
    from blockforge.search.evidence.pareto import Front
    from blockforge.search.evidence.rungs import CellRungs
    from blockforge.search.reports.plan import CellPlan

Cell = str  # a proxy cell's name, e.g. "depth=8"
Target = str  # a transfer target's name


@dataclass(frozen=True, repr=False)
class CellAnswer:
    """What a search found in one cell (or transfer target), as the reports state it."""

    name: str  # the cell's name, e.g. "depth=8" ("depth=8,width=256" with two keys)
    target: bool  # a transfer target (the answers tested at a larger size or a longer training)
    evidence: CellEvidence  # every candidate that reached the full budget: mean, sd, n over seeds, best mean first
    winner: Candidate | None  # the best mean among the candidates with the confirmation's seeds
    verdict: str  # the winner against Pre-LN: better | tied | worse | n/a | Pre-LN (the winner is Pre-LN)
    vs_pre_ln: Difference | None  # the winner minus the Pre-LN reference, paired over shared seeds, with its 95% interval
    tied: list[Candidate]  # finalists whose paired interval against the winner includes zero
    claim: str  # the sentence summary.md writes
    window: LawWindow | None = None  # guidance: the Post-LN counts the laws predicted for it
    raced_out: dict[str, tuple[Candidate, Difference]] = field(default_factory=dict)  # racing: model -> (leader, difference)
    promoted: dict[str, str] = field(default_factory=dict)  # promotion: model -> why it was brought back
    length: LengthCheck | None = None  # confirm.length: the verdict at each longer length
    curves: LrCurves | None = None  # confirm.lr_curve: each probed candidate's curve, best lr, edge and LR sensitivity, and the answer
    rungs: CellRungs | None = None  # early stopping against the full-budget curves (with a scheduler)
    front: Front | None = None  # with a cost axis: quality against cost
    prediction: Prediction | None = None  # a transfer target: the k the proxies predicted
    outcome: TargetOutcome | None = None  # ... and whether it held
    progress: Progress | None = None  # whether the answer is final, or provisional (trials trained, running, stages pending)
    metric: str = "val_loss"  # the objective the candidates' values are of

    def __repr__(self) -> str:
        from blockforge.search.display import cell_text

        return cell_text(self)

    def _repr_html_(self) -> str:
        from blockforge.search.display import cell_html

        return cell_html(self)

    def plot(self):
        """A matplotlib figure of the cell's curves: the objective at every evaluation of each candidate's full-budget runs,
        one colour per candidate (k), one line per seed, the winner and Pre-LN named in the legend."""
        from blockforge.search.reports.figures import cell_curves

        return cell_curves(self)

    @property
    def provisional(self) -> bool:
        """Whether the answer may still change: a trial of the cell runs (or was stopped), or a stage has not given its part."""
        return self.progress is not None and not self.progress.final

    @classmethod
    def of(cls, found: "Findings", name: str) -> "CellAnswer":
        """Cell `name`'s answer in what the reports are written from."""
        e = found.evidence[name]
        return cls(name=name, target=name in set(found.plan.target_names()), evidence=e, winner=e.winner, verdict=e.verdict,
                   vs_pre_ln=e.vs_reference, tied=e.tied_with_winner(), claim=e.claim(), window=found.windows.get(name),
                   raced_out=dict(found.races.get(name, {})),
                   promoted={r.model: r.promoted for r in found.records if r.cell == name and r.promoted},
                   length=found.lengths.get(name), curves=found.curves.get(name), rungs=found.rungs.get(name),
                   front=found.fronts.get(name), prediction=found.predictions.get(name), outcome=found.outcomes.get(name),
                   progress=progress(found, name), metric=found.plan.metric)


@dataclass
class Findings:
    """Each field is one kind of finding, by the cell (or transfer target) it is about; a search without the stage or
    setting that makes a kind has it empty."""

    plan: SearchPlan
    records: list[TrialRecord]
    evidence: dict[Cell | Target, CellEvidence]
    rungs: dict[Cell, "CellRungs"] = field(default_factory=dict)  # with a scheduler
    points: list[dict] = field(default_factory=list)  # the cells' winners as law points
    law: "LawReport | None" = None
    resampled: list = field(default_factory=list)  # law.bootstrap_cells
    boot: "BootstrapReport | None" = None
    fronts: dict[Cell, "Front"] = field(default_factory=dict)  # with a cost axis
    predictions: dict[Target, "Prediction | None"] = field(default_factory=dict)
    outcomes: dict[Target, "TargetOutcome"] = field(default_factory=dict)  # targets with a prediction
    gaps: dict[Target, dict[str, list[tuple[int, float, float, float]]]] = field(default_factory=dict)  # each candidate against Pre-LN along training
    cell_plans: dict[Cell | Target, "CellPlan"] = field(default_factory=dict)
    full_plans: dict[Target, "CellPlan"] = field(default_factory=dict)  # the plan of a full search of each target
    windows: dict[Cell, "LawWindow | None"] = field(default_factory=dict)  # guided cells, from the cells before each
    races: dict[Cell, dict[str, tuple[Candidate, Difference]]] = field(default_factory=dict)  # model -> (leader, difference): left the race
    lengths: dict[Cell, "LengthCheck | None"] = field(default_factory=dict)  # with confirm.length
    curves: dict[Cell, "LrCurves | None"] = field(default_factory=dict)  # with a learning-rate curve (confirm.lr_curve, .lr, .stability)
    stability_law: "StabilityLaw | None" = None  # ... the edges across cells, and their predictions

    @property
    def law_verdict(self) -> str:
        """The sentence the reports give of the alpha law: the bootstrap's where there is one, else the fits'."""
        return self.boot.verdict if self.boot else self.law.verdict

    @classmethod
    def of(cls, plan: SearchPlan, records: list[TrialRecord]) -> "Findings":
        from blockforge.search.evidence.law import bootstrap_cells, bootstrap_laws, fit_alpha_law, law_points
        from blockforge.search.evidence.rungs import cell_rungs
        from blockforge.search.reports.plan import cell_plan, search_plan

        evidence = evidence_by_cell(plan, records)
        by_cell: dict[str, list[TrialRecord]] = {}
        for record in records:
            by_cell.setdefault(record.cell, []).append(record)
        found = cls(plan, records, evidence)
        if plan.asha is not None:
            found.rungs = {cell: cell_rungs(plan, by_cell.get(cell, []), cell) for cell in plan.cell_names()}
        found.points = law_points(plan, evidence)
        found.law = fit_alpha_law(found.points)
        found.resampled = bootstrap_cells(plan, evidence, found.points)
        found.boot = bootstrap_laws(found.resampled)
        if plan.costs:
            from blockforge.search.evidence.pareto import front_evidence

            found.fronts = {cell: front_evidence(evidence[cell].eligible, plan.costs, plan.mode) for cell in plan.cell_names()}
        if plan.targets:
            from blockforge.search.checks.transfer import judge, predictions, target_gaps

            proxies = [r for r in records if r.cell in set(plan.cell_names())]
            found.predictions = predictions(plan, proxies, plan.target_names(), evidence, found.boot, found.points)
            found.outcomes = {t: judge(plan, records, p) for t, p in found.predictions.items() if p is not None}
            found.gaps = {t: target_gaps(plan, evidence[t]) for t in plan.target_names()}
        if plan.guide is not None:
            from blockforge.search.stages.guidance import guide_window

            found.windows = {cell: guide_window(plan, cell, records) for cell in plan.cell_names() if plan.guided(cell)}
        if plan.confirm is not None:
            from blockforge.search.stages.confirm import race_history

            found.races = {cell: race_history(plan, evidence[cell], plan.settings[cell].base_seed) for cell in plan.cell_names()}
            if plan.confirm.length is not None:
                from blockforge.search.checks.length_check import length_check

                found.lengths = {cell: length_check(plan, by_cell.get(cell, []), evidence[cell]) for cell in plan.cell_names()}
            from blockforge.search.checks.lr_curve import curve_settings, lr_curves

            if curve_settings(plan) is not None:
                from blockforge.search.checks.stability_law import stability_law

                found.curves = {cell: lr_curves(plan, by_cell.get(cell, []), evidence[cell]) for cell in plan.cell_names()}
                found.stability_law = stability_law(plan, found.curves, evidence)
        found.cell_plans = {c.cell: c for c in search_plan(plan)}
        found.full_plans = {target: cell_plan(plan, target, as_proxy=True) for target in plan.target_names()}
        return found
