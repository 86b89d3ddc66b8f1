"""Confirmation: the cell's finalists trained to the full budget with further seeds, and racing among them.

`Confirm` takes the `top` best distinct explored models (completed ones by value, then the pruned ones that got
furthest), the baselines and the best Pre-LN model seen, and gives them the confirmation's seeds one round at a time
(a seed each per round); `Front`, for a search with a cost axis, takes up to 2 * top points of the explored front
instead. Models an earlier driver promoted stay finalists. From the second seed on, before each round, a finalist
that is clearly behind the leader leaves the race (`race_drops`: a sequential paired t-test whose error over every
look is bounded by Bonferroni). `Race` then gives the two leaders and the Pre-LN reference one more seed at a time
while their paired interval includes zero, up to max_seeds. Their trials are recorded as the confirmation's.
"""

from __future__ import annotations

from blockforge.errors import SpecError
from blockforge.search.config import SearchPlan
from blockforge.search.records.ledger import StageName
from blockforge.search.stages.base import CellLike, Finalist, Outcome, Stage, promoted_before
from blockforge.spec.search import mode_sign
from blockforge.train.events import Status

RACE_ERROR = 0.05  # the chance, over every look of a race, that a finalist no worse than the leader is dropped
RACE_METHOD = (f"sequential paired t-test against the leader before each further seed, Bonferroni over the race's looks "
               f"(family-wise error {RACE_ERROR:g})")


def describe_confirmation(plan: SearchPlan) -> str:
    """What confirmation does in this search, in a clause (the summary's first line)."""
    confirm = plan.confirm
    if confirm is None:
        return "no confirmation (one seed per model: no intervals)"
    finalists = f"up to {Front.top(plan)} points of the explored front" if plan.costs else f"the {Confirm.top(plan)} best distinct models"
    return (f"confirmation: {finalists}, the baselines" + (" and the best Pre-LN model" if plan.against_pre_ln else "") + ", each trained to the full "
            f"budget with {confirm.seeds} further seed(s)" + (f", racing up to {confirm.max_seeds}" if confirm.max_seeds else ""))


def race_looks(plan: SearchPlan) -> int:
    """How many times a cell's finalists are compared before a further seed: at 2, 3, ... up to all but the last seed."""
    confirm = plan.confirm
    return max(1, max(confirm.seeds, confirm.max_seeds or 0) - 1)


def race_drops(in_race: list, seeds: list[int], plan: SearchPlan) -> dict[str, tuple[object, object]]:
    """The finalists that leave the race now: model -> (the leader it is clearly behind, the difference to it).

    `in_race`: candidates (evidence.Candidate) still racing, each with `seeds` done. The leader is the best mean over
    them; a finalist leaves when its paired interval against the leader at level 1 - RACE_ERROR / race_looks excludes
    zero on the losing side, so that looking again after every seed does not raise the chance of a wrong drop. The
    Pre-LN reference never leaves: the verdict against it is the cell's claim, made on every confirmation seed."""
    from blockforge.search.evidence.evidence import paired_difference

    if len(seeds) < 2 or len(in_race) < 2:
        return {}
    sign = mode_sign(plan.mode)
    on = lambda c: {s: c.values[s] for s in seeds if s in c.values}  # noqa: E731
    leader = min(in_race, key=lambda c: sign * sum(on(c).values()) / max(1, len(on(c))))
    level = 1.0 - RACE_ERROR / race_looks(plan)
    drops = {}
    for c in in_race:
        if c is leader or c.uniform_pre:
            continue
        diff = paired_difference(on(c), on(leader), level=level)
        if diff is not None and diff.low is not None and (diff.low > 0 if plan.mode == "min" else diff.high < 0):
            drops[c.model] = (leader, diff)
    return drops


def race_history(plan: SearchPlan, evidence, base_seed: int) -> dict[str, tuple[object, object]]:
    """The finalists that left a cell's race, replayed from its evidence as Confirm decided it: model -> (leader, difference)."""
    in_race = [c for c in evidence.candidates if base_seed + 1 in c.values]  # every finalist has the first further seed
    out = {}
    for extra in range(1, plan.confirm.seeds):  # the looks before the 2nd, 3rd, ... further seed
        seeds = list(range(base_seed, base_seed + extra + 1))
        drops = race_drops([c for c in in_race if all(s in c.values for s in seeds)], seeds, plan)
        out.update(drops)
        in_race = [c for c in in_race if c.model not in drops]
    return out


class Confirm(Stage):
    name = StageName.CONFIRM
    opens_beside_own = True  # a round's seeds start while the baselines' early ones run; the next round waits for this one's

    def __init__(self, plan: SearchPlan):
        self.plan = plan
        self.opened = False

    def open(self, cell: CellLike) -> bool:
        if not self.opened:
            self.opened = True
            self._choose(cell)
        finalists = cell.finalists
        while finalists.extra_seeds < self.plan.confirm.seeds:  # one round: a further seed for every finalist still racing
            if any(t.seed <= cell.base_seed + finalists.extra_seeds for t in cell.in_flight(self)):
                return None  # who races on is decided on this round's seeds, all of them
            self._drop_behind(cell)
            finalists.next_seed()
            seeds = finalists.seeds(cell.base_seed)  # a promoted finalist catches up on earlier ones
            queued = [self.queue(cell, f.searched, seeds, note=f.note, promoted=f.promoted) for f in finalists.racing()]
            if any(queued):
                return True
        return False

    def early(self, cell: CellLike) -> bool:
        """Before the ranking is known: the baselines' first further seed, which every confirmation trains (a baseline is a
        finalist whatever the ranking, and no finalist leaves the race before its second further seed). While a round's
        last trials run: the Pre-LN reference's seed of the next round (it never leaves the race)."""
        if self.opened:
            finalists = cell.finalists
            if finalists.extra_seeds >= self.plan.confirm.seeds:
                return False
            seed = cell.base_seed + finalists.extra_seeds + 1
            return any([self.queue(cell, f.searched, [seed]) for f in finalists.racing() if f.uniform_pre])
        if getattr(self, "asked_early", False):  # once: what it queues runs or ran after that
            return False
        self.asked_early = True
        queued = False
        for baseline in self.plan.baselines:
            searched = self.plan.searched_values(cell.name, self.plan.sampler_params(cell.name, baseline))
            try:
                queued |= self.queue(cell, searched, [cell.base_seed + 1])
            except SpecError:
                continue  # an invalid baseline was recorded as failed when it was proposed
        return queued

    def _choose(self, cell: CellLike) -> None:
        unique: dict[str, Finalist] = {}
        for f in self.finalists(cell, self.ranked(cell)):
            unique.setdefault(f.model, Finalist(f.searched, f.model, f.uniform_pre))
        for f in promoted_before(cell):
            unique.setdefault(f.model, f)
        cell.finalists.choose(list(unique.values()))

    def _drop_behind(self, cell: CellLike) -> None:
        """Before a further seed: the finalists clearly behind the leader on the seeds so far leave the race."""
        from blockforge.search.evidence.evidence import describe

        finalists = cell.finalists
        if finalists.extra_seeds < 1:
            return
        by_model = {c.model: c for c in cell.evidence(1).candidates}
        in_race = [by_model[f.model] for f in finalists.racing() if f.model in by_model]
        for model, (leader, diff) in race_drops(in_race, finalists.seeds(cell.base_seed), self.plan).items():
            finalists.drop(model, f"left the race after {diff.n} seeds: behind {describe(leader)} by {diff.text()}")

    def ranked(self, cell: CellLike) -> list[Outcome]:
        """The cell's explored models: completed ones best first, then pruned ones, furthest and best first."""
        sign = mode_sign(self.plan.mode)
        explored = [o for o in cell.done.values() if o.trial.stage == StageName.EXPLORE]
        ranked = sorted((o for o in explored if o.status == Status.COMPLETED and o.value is not None), key=lambda o: sign * o.value)
        return ranked + sorted((o for o in explored if o.status == Status.PRUNED), key=lambda o: (-o.record.steps, sign * (o.record.value or 0.0)))

    def finalists(self, cell: CellLike, ranked: list[Outcome]) -> list[Finalist]:
        """The best `top` explored models, the baselines and (when none of them is) the best Pre-LN model seen."""
        chosen = [self._finalist(o) for o in self.choose(ranked)]
        for baseline in self.plan.baselines:
            searched = self.plan.searched_values(cell.name, self.plan.sampler_params(cell.name, baseline))
            trial = cell.new_trial(searched, cell.base_seed, StageName.CONFIRM)
            try:
                trial = cell.identify(trial)
            except SpecError:
                continue  # an invalid baseline was recorded as failed when it was proposed
            chosen.append(Finalist(trial.searched, trial.model, trial.uniform_pre))
        if not any(f.uniform_pre for f in chosen):  # the best Pre-LN model seen is the reference
            chosen += [self._finalist(o) for o in ranked if o.trial.uniform_pre][:1]
        return chosen

    def choose(self, ranked: list[Outcome]) -> list[Outcome]:
        return ranked[: self.plan.confirm.top]

    @staticmethod
    def _finalist(outcome: Outcome) -> Finalist:
        trial = outcome.trial
        return Finalist(trial.searched, trial.model, trial.uniform_pre)

    @classmethod
    def rounds(cls, plan: SearchPlan) -> int:
        return plan.confirm.seeds

    @classmethod
    def worst_case(cls, plan: SearchPlan, name: str, explored: int) -> int:
        pruning = plan.stops_early(name)
        finalists = min(cls.top(plan) + len(plan.baselines) + 1, explored + len(plan.baselines))
        return finalists * plan.confirm.seeds + (finalists if pruning else 0)  # those stopped early finish their run too

    @staticmethod
    def top(plan: SearchPlan) -> int:
        return plan.confirm.top


class Front(Confirm):
    """Confirmation with a cost axis: the explored models no other beats on quality and every cost at once (one
    seed each), best quality first, at most 2 * top of them; the pruned best ones when nothing completed."""

    def choose(self, ranked: list[Outcome]) -> list[Outcome]:
        from blockforge.search.evidence.evidence import dominates

        plan = self.plan
        done = [o for o in ranked if o.status == Status.COMPLETED]
        signs = [mode_sign(plan.mode), *(mode_sign(m) for _, m in plan.costs)]
        point = lambda o: [s * v for s, v in zip(signs, [o.value, *(o.record.costs.get(c, 0.0) for c, _ in plan.costs)])]  # noqa: E731
        front = [o for o in done if not any(dominates(point(other), point(o)) for other in done if other is not o)]
        return (front or ranked)[: 2 * plan.confirm.top]

    @staticmethod
    def top(plan: SearchPlan) -> int:
        return 2 * plan.confirm.top


class Race(Stage):
    """One more seed for the two leaders (and the Pre-LN reference) while their paired interval includes zero."""

    name = StageName.RACING

    def __init__(self, plan: SearchPlan):
        self.plan = plan

    def open(self, cell: CellLike) -> bool:
        confirm = self.plan.confirm
        if cell.finalists.extra_seeds >= confirm.max_seeds:
            return False
        evidence = cell.evidence(confirm.seeds + 1)
        if evidence.runner_up is None or evidence.vs_runner_up is None or evidence.vs_runner_up.excludes_zero():
            return False
        seed = cell.base_seed + cell.finalists.next_seed()
        dropped = cell.finalists.dropped
        racing = {c.model: c for c in (evidence.winner, evidence.runner_up, evidence.reference) if c is not None and c.model not in dropped}
        return any([self.queue(cell, candidate.overrides, [seed]) for candidate in racing.values()])

    @classmethod
    def worst_case(cls, plan: SearchPlan, name: str, explored: int) -> int:
        return 3 * cls.rounds(plan)

    @classmethod
    def rounds(cls, plan: SearchPlan) -> int:
        return plan.confirm.max_seeds - plan.confirm.seeds
