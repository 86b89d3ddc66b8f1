"""What every stage of a cell's search shares: the typed trial, its outcome, and the Stage protocol.

A cell runs a pipeline of stages (stages/pipeline.py builds it from the plan). The first stage may hand out
trials on demand (exploration asks its sampler); the others queue trials when the cell is idle and every stage
before them has nothing more: confirmation its finalists' replicates, promotion the pruned trials the
full-budget curves say could have ended ahead, racing one more seed for leaders not yet separated, transfer
the candidates around a predicted k. A stage also hears how its trials ended, and says how many trials it
may train at most (the compute plan is the sum of the stages' own worst cases).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from blockforge.search.records.ledger import StageName, TrialRecord
from blockforge.train.events import Status

if TYPE_CHECKING:
    from blockforge.search.config import SearchPlan


class CellLike(Protocol):
    """What a stage that queues trials receives of its cell (search/stages/cell.py's StageView): its finalists, changed through
    their methods; its own trials, asked for through Stage.queue; everything else read only. The exploring stage,
    which is the cell's sampler, receives the Cell itself."""

    name: str
    plan: SearchPlan
    base_seed: int
    finalists: "Finalists"  # shared by the confirming stages, changed through its methods
    done: Mapping[str, "Outcome"]  # identity -> the outcome that counts for it (read only)
    latest: Mapping[int, TrialRecord]  # trial number -> its latest record (read only)

    def records(self) -> list[TrialRecord]: ...

    def evidence(self, min_seeds: int, against_pre_ln: bool = True): ...

    def enqueue(self, searched: dict[str, Any], seed: int, *, owner: "Stage", **kwargs) -> bool: ...

    def new_trial(self, searched: dict[str, Any], seed: int, stage: StageName, **kwargs) -> "Trial": ...

    def identify(self, trial: "Trial") -> "Trial": ...

    def in_flight(self, stage: "Stage") -> list["Trial"]: ...

    def proxies_done(self) -> bool: ...


@dataclass(frozen=True)
class Trial:
    """One trial of a cell: asked for, queued, running or finished. Frozen: what is learnt of it later (its identity
    once its recipe resolves, the number of a run it continues, measured costs) is a new Trial (dataclasses.replace)."""

    cell: str
    number: int
    stage: StageName  # what its record says: explore, confirm or transfer
    searched: dict[str, Any]  # the cell's searched values (and baselines')
    overrides: list  # every override of its recipe, train.seed last
    seed: int
    identity: str = ""  # model + training settings + seed
    model: str = ""  # the same, the seed aside
    alpha: float | None = None
    post_ln_layers: int | None = None
    uniform_pre: bool = False
    steps: int = 0  # its full budget
    costs: dict[str, float] = field(default_factory=dict)
    note: str = ""
    promoted: str = ""  # why it was brought back to the full budget (a promoted model's replicates)
    optuna_id: str | None = None  # an exploration trial: its id in the cell's sampler
    continues: str = ""  # a run folder (relative to the search) whose last checkpoint it starts from (a longer training)
    owner: int | None = None  # the pipeline step (index of the cell's stage) that asked for it: where its outcome goes

    def config(self, early_stop: bool) -> dict:
        """What Tune hands the trainable."""
        return {"cell": self.cell, "number": self.number, "identity": self.identity, "model": self.model, "stage": self.stage.value,
                "steps": self.steps, "overrides": [list(o) for o in self.overrides], "early_stop": early_stop,
                **({"continues": self.continues} if self.continues else {})}


FAILURE = "failure"  # a result key: the trial cannot train for a reason of its own (its spec, its data), in one sentence


def ended_status(result: dict, error: bool, steps: int) -> str:
    """How a trial with a budget of `steps` ended, from its last result: failed (it raised, or said why it cannot train),
    diverged, pruned (stopped before its budget) or completed. The searcher records it; the scheduler's rungs take
    completed curves by it."""
    if error or FAILURE in result:
        return Status.FAILED
    if result.get("diverged"):
        return Status.DIVERGED
    if result.get("step", 0) < steps:
        return Status.PRUNED
    return Status.COMPLETED


@dataclass
class Outcome:
    """How a trained trial ended: what counts for its identity (a later full run replaces a pruned one)."""

    status: str
    value: float | None  # the objective (the penalty when diverged)
    number: int
    record: TrialRecord
    trial: Trial


@dataclass
class Finalist:
    searched: dict[str, Any]
    model: str
    uniform_pre: bool
    note: str = ""
    promoted: str = ""


@dataclass
class Finalists:
    """What a cell's confirming stages share, and change only through these methods: the finalists (Confirm chooses
    them, Promote adds the models it brings back), the further seeds they have had (Confirm's rounds, Race's), and
    those that left the race (Confirm drops them; Race leaves them out)."""

    models: list[Finalist] = field(default_factory=list)
    extra_seeds: int = 0  # further seeds the finalists have so far
    dropped: dict[str, str] = field(default_factory=dict)  # model -> why it left the race (clearly behind the leader)
    promoted: dict[str, str] = field(default_factory=dict)  # model -> why it was brought back to the full budget

    def choose(self, models: list[Finalist]) -> None:
        self.models, self.extra_seeds = list(models), 0

    def promote(self, finalist: Finalist) -> None:
        self.promoted[finalist.model] = finalist.promoted
        self.models.append(finalist)

    def drop(self, model: str, why: str) -> None:
        self.dropped[model] = why

    def next_seed(self) -> int:
        """One more further seed: how many there are now."""
        self.extra_seeds += 1
        return self.extra_seeds

    def racing(self) -> list[Finalist]:
        """The finalists still in the race."""
        return [f for f in self.models if f.model not in self.dropped]

    def seeds(self, base_seed: int) -> list[int]:
        """The seeds the finalists have had so far: the exploration's and each further one."""
        return list(range(base_seed, base_seed + self.extra_seeds + 1))


def promoted_before(cell: CellLike) -> list[Finalist]:
    """The models an earlier driver promoted, as finalists (a search rebuilt from its ledger keeps them; their records say why)."""
    records = cell.records()
    promoted = []
    for model, why in cell.finalists.promoted.items():
        record = next((r for r in records if r.model == model and r.promoted), None)
        if record is not None:  # (one promoted by this driver is a finalist already, and may not be recorded yet)
            promoted.append(Finalist(dict(record.overrides), model, record.uniform_pre, note=why, promoted=why))
    return promoted


class Stage:
    """A stage of a cell's pipeline. Subclasses override what they do; the defaults do nothing."""

    name: StageName  # what the stage is; its trials' records say explore, confirm or transfer (Trial.stage)
    label: str | None = None  # how compute plans name its column (default: name's value)
    on_demand = False  # hands out trials when asked (exploration), rather than queueing them when opened
    answers = True  # its trials decide the cell's answer; False: it tests an answer already given (lr, length, transfer)
    # `open` may be asked while trials this stage queued still run (see `open`); False: only once they have all ended
    opens_beside_own = False

    def active(self, cell: CellLike) -> bool:
        """An on-demand stage: whether it has a trial to hand out now."""
        return False

    def propose(self, cell: CellLike, trial_id: str) -> dict | None:
        """An on-demand stage: a Tune config to train, or None when the proposal needed no training."""
        return None

    def open(self, cell: CellLike) -> bool | None:
        """Every stage before this one has nothing more and none of their trials runs: queue trials (True when any was
        queued), have nothing (False), or not yet be able to tell (None: the cell waits). Trials later stages started
        early may run; so may this stage's own where `opens_beside_own` says so: it then queues only what does not
        depend on them (returning None while what it would decide next does), and it is not done while any of them runs."""
        return False

    def early(self, cell: CellLike) -> bool:
        """Trials still run in the cell and none is there to hand out: queue what this stage will train whatever they
        end with (True when any was queued), so a free slot starts it now rather than at the stage's turn. Only trials
        the stage's `open` would queue anyway, identically; `open` then finds them done or running."""
        return False

    def queue(self, cell, searched: dict[str, Any], seeds: list[int], **kwargs) -> bool:
        """Queue model `searched` with each of `seeds` in `cell` as this stage's trials (their outcomes come back to this
        stage's on_complete, whatever their records' stage says); True when any was queued (others had run, run now or
        wait already). See Cell.enqueue for the keywords."""
        return any([cell.enqueue(searched, seed, owner=self, **kwargs) for seed in seeds])

    def on_result(self, cell: CellLike, trial: Trial, result: dict) -> None:
        """An intermediate result of one of this stage's trials."""

    def on_complete(self, cell: CellLike, trial: Trial, outcome: Outcome) -> None:
        """One of this stage's trials (one it queued, or proposed) finished, was stopped early, diverged or failed."""

    def on_duplicate(self, cell: CellLike, trial: Trial, outcome: Outcome) -> None:
        """One of this stage's proposals is a model and seed that already trained (`outcome`): it costs nothing."""

    def taken_in(self, cell: CellLike, trial: Trial, record: TrialRecord) -> None:
        """A trained trial that a resumed driver learns of from the ledger, given to the first stage whose trials are
        recorded with its stage (the ledger keeps the record's stage, not the step that queued it)."""

    @classmethod
    def key(cls) -> str:
        return cls.label or cls.name.value

    @classmethod
    def worst_case(cls, plan: "SearchPlan", name: str, explored: int) -> int:
        """The most trials this stage may train in cell `name` (`explored`: exploration's own worst case)."""
        return 0

    @classmethod
    def rounds(cls, plan: "SearchPlan") -> int:
        """Stages that wait for one another in a compute plan's critical path: this stage's (one, or racing's rounds)."""
        return 1
