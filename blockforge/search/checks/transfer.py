"""The transfer stage: test a small search's answer at larger sizes, with seeds, before anyone trusts it.

After the proxy cells finish, each target cell gets a prediction of Mix-LN's alpha: from the fitted law
when the bootstrap over seeds decides one (it leads by 2 AICc in at least 95% of the resamples), else from
the nearest proxy cell (by log-depth and log-width) whose winner's fraction of Post-LN layers k/L is carried
over. The other searched values (a learning rate, say) come from that nearest proxy's winner. At the target
the predicted k, `neighbours` k on each side and Pre-LN are trained with the transfer's seeds, paired, at
the full budget. The prediction held when the predicted k is in the target's tied-best set (its paired
interval against the best includes zero) and that set is not everything trained there; it did not hold when
the best beats it with an interval that excludes zero; a target cannot tell without two shared seeds, or
when every candidate, Pre-LN included, is tied with the best (then a tie would say nothing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from blockforge.search.config import MIX_LN_ALPHA, SearchPlan
from blockforge.spec.resolve import mix_ln_count


@dataclass
class Prediction:
    target: str
    depth: int
    width: int | None
    alpha: float  # the predicted fraction of Post-LN layers
    low: float  # its interval (alpha)
    high: float
    source: str  # where it came from, in words
    nearest: str  # the proxy cell the other searched values (and, without a law, alpha) come from
    searched: dict = field(default_factory=dict)  # the searched values other than alpha

    @property
    def k(self) -> int:
        return mix_ln_count(self.alpha, self.depth)

    def k_range(self) -> tuple[int, int]:
        return mix_ln_count(self.low, self.depth), mix_ln_count(self.high, self.depth)

    def candidates(self, neighbours: int, highest: int) -> list[int]:
        """The k to train: the predicted one, `neighbours` on each side (within 0..highest) and Pre-LN (0)."""
        ks = {0, *(k for k in range(self.k - neighbours, self.k + neighbours + 1) if 0 <= k <= highest)}
        return sorted(ks)

    def text(self) -> str:
        lo, hi = self.k_range()
        return (f"k={self.k} of {self.depth} (alpha {self.alpha:.3g}; interval {self.low:.3g}-{self.high:.3g}, k {lo}-{hi}) "
                f"from {self.source}")


def _size(plan: SearchPlan, name: str) -> tuple[int, int | None]:
    recipe = plan.recipe(plan.trial_overrides(plan.cell(name), {}))
    return recipe.model.depth, recipe.model.width


def predict(plan: SearchPlan, records: list, target: str) -> Prediction | None:
    """The prediction for `target` from the proxy cells' evidence in `records` (None when no proxy has a winner)."""
    return predictions(plan, records, [target])[target]


def predictions(plan: SearchPlan, records: list, targets: list[str], evidence: dict | None = None, boot=None, points=None) -> dict:
    """Each target's prediction, from one computation of the proxies' evidence, law points and law bootstrap (given, or
    made here from `records`)."""
    from blockforge.search.evidence.evidence import evidence_by_cell
    from blockforge.search.evidence.law import bootstrap_cells, bootstrap_laws, law_points

    evidence = evidence_by_cell(plan, records) if evidence is None else evidence
    if points is None:
        points = law_points(plan, evidence)
        boot = bootstrap_laws(bootstrap_cells(plan, evidence, points))
    return {target: _predict(plan, evidence, points, boot, target) for target in targets}


def _predict(plan: SearchPlan, evidence: dict, points: list, boot, target: str) -> Prediction | None:
    from blockforge.search.evidence.law import LAWS, fit_alpha_law

    depth, width = _size(plan, target)
    proxies = [name for name in plan.cell_names() if evidence[name].winner is not None and evidence[name].winner.alpha is not None]
    if not proxies:
        return None

    def distance(name: str) -> tuple[float, int]:
        d, w = _size(plan, name)
        return (math.log2(depth / d) ** 2 + (math.log2(width / w) ** 2 if width and w else 0.0), -d)

    nearest = min(proxies, key=distance)
    winner = evidence[nearest].winner
    searched = {k: v for k, v in winner.overrides.items() if k != MIX_LN_ALPHA}
    decided = boot is not None and boot.laws and boot.laws[0].wins >= 0.95 and len({p["depth"] for p in points}) >= 3
    if decided:
        law = boot.laws[0]
        fit = next(f for f in fit_alpha_law(points).fits if f.name == law.name)
        model = LAWS[law.name][2]
        at = lambda params: float(model(params, _array(depth), _array(width or 256))[0])  # noqa: E731
        corners = [at([lo if pick else hi for pick, lo, hi in zip(choice, law.params_low, law.params_high)])
                   for choice in _corners(len(law.params_low))]
        alpha = _clip(at(fit.params))
        source = (f"the fitted law {law.formula} ({', '.join(f'{p:.3g}' for p in fit.params)}; it leads in {law.wins:.0%} of the "
                  f"seed resamples), interval over its parameters' 95% ranges")
        return Prediction(target, depth, width, alpha, _clip(min(corners)), _clip(max(corners)), source, nearest, searched)
    d, _ = _size(plan, nearest)
    tied = [winner, *evidence[nearest].tied_with_winner()]
    fractions = [mix_ln_count(c.alpha, d) / d for c in tied if c.alpha is not None]
    alpha = mix_ln_count(winner.alpha, d) / d
    source = (f"the nearest proxy cell {nearest} (its winner k={winner.post_ln_layers} of {d}; no law decided), interval over the "
              f"k tied with it there")
    # Carried as a fraction; the interval's ends as fractions of the target's depth (the upper end just below the next k).
    return Prediction(target, depth, width, alpha, min(fractions), max(fractions), source, nearest, searched)


def _array(value):
    import numpy as np

    return np.array([float(value)])


def _corners(n: int):
    import itertools

    return itertools.product((True, False), repeat=n)


def _clip(alpha: float) -> float:
    return min(1.0, max(0.0, alpha))


@dataclass
class TargetOutcome:
    prediction: Prediction
    observed: int | None  # the best-mean k at the target
    outcome: str  # held | did not hold | cannot tell
    versus_pre: str  # the predicted k against Pre-LN there: better | tied | worse | n/a | Pre-LN
    detail: str


def judge(plan: SearchPlan, records: list, prediction: Prediction) -> TargetOutcome:
    """Predicted against observed at the target, from its candidates' paired replicates."""
    from blockforge.search.evidence.evidence import cell_evidence, paired_difference, verdict

    e = cell_evidence(records, prediction.target, mode=plan.mode, penalty=plan.penalty, min_seeds=plan.transfer.seeds)
    by_k = {c.post_ln_layers: c for c in e.candidates}
    predicted = by_k.get(prediction.k)
    if e.winner is None or predicted is None:
        return TargetOutcome(prediction, None, "cannot tell", "n/a", "the predicted model has not finished at the target")
    observed = e.winner.post_ln_layers
    pre = by_k.get(0)
    versus = "Pre-LN" if prediction.k == 0 else verdict(paired_difference(predicted.values, pre.values), plan.mode) if pre else "n/a"
    edge = ("; the best lies at the edge of what was trained, so a k beyond it may be better still"
            if observed == max(by_k) or (observed > 1 and observed == min(k for k in by_k if k)) else "")
    below = [c for c in e.eligible if c is not e.winner and (d := e.difference_to(c, e.winner)) is not None and d.low is not None
             and d.excludes_zero()]
    if not below:  # nothing, Pre-LN included, is ranked below the best: a tie with it says nothing
        return TargetOutcome(prediction, observed, "cannot tell", versus,
                             f"every candidate trained here, Pre-LN included, is tied with the best mean (k={observed}): the seeds "
                             f"disagree too much to rank them; more seeds (transfer.seeds) would tell")
    if predicted is e.winner:
        return TargetOutcome(prediction, observed, "held", versus, f"the predicted k={prediction.k} has the best mean ({predicted.spread()}){edge}")
    diff = paired_difference(predicted.values, e.winner.values)
    if diff is None or diff.low is None:
        return TargetOutcome(prediction, observed, "cannot tell", versus, "fewer than two seeds shared with the best")
    if diff.excludes_zero():
        return TargetOutcome(prediction, observed, "did not hold", versus,
                             f"k={observed} is better than the predicted k={prediction.k} by {diff.mean if plan.mode == 'min' else -diff.mean:.3g} "
                             f"({diff.text()}){edge}")
    return TargetOutcome(prediction, observed, "held", versus, f"the predicted k={prediction.k} is tied with the best k={observed} ({diff.text()}){edge}")


def seed_curves(candidate, metric: str) -> dict[int, dict[int, float]]:
    """seed -> (step -> `metric`) of a candidate's replicates, from their run folders' evaluations (none: left out)."""
    from blockforge.search.evidence.rungs import curve_of

    curves = {s: curve_of(d, metric) for s, d in candidate.run_dirs.items() if s in candidate.values}
    return {s: c for s, c in curves.items() if c}


def target_gaps(plan: SearchPlan, e) -> dict[str, list[tuple[int, float, float, float]]]:
    """Each candidate of a transfer target beside Pre-LN along training: describe(candidate) -> [(step, mean, lowest,
    highest)] of its difference to Pre-LN at every evaluation both have, paired by seed (from the run folders)."""
    from blockforge.search.evidence.evidence import describe

    if e.reference is None:
        return {}
    ref = seed_curves(e.reference, plan.metric)
    gaps = {}
    for c in e.candidates:
        mine = {s: curve for s, curve in seed_curves(c, plan.metric).items() if s in ref} if c is not e.reference else {}
        if not mine:
            continue
        steps = sorted(set.intersection(*(set(v) & set(ref[s]) for s, v in mine.items())))
        rows = [[mine[s][t] - ref[s][t] for s in mine] for t in steps]
        gaps[describe(c)] = [(t, sum(d) / len(d), min(d), max(d)) for t, d in zip(steps, rows)]
    return gaps
