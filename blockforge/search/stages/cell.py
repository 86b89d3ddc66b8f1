"""One cell of a search: its pipeline of stages and everything it holds while the search runs.

A cell numbers its trials, queues those its stages ask for, recognizes a trial whose identity already ran (a free
duplicate) or runs now (it waits for its twin), continues a run a stopped driver lost under its number, and keeps
the latest ledger record of each of its trials, so nothing it decides reads the ledger file again. The searcher
(searcher.py) only hands Tune's calls to the right cell.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

from blockforge.search.config import SearchPlan, trial_dir, trial_identity
from blockforge.search.records.ledger import Ledger, StageName, TrialRecord
from blockforge.search.records.store import SearchStore
from blockforge.search.stages.base import FAILURE, Finalists, Outcome, Stage, Trial, ended_status
from blockforge.train.events import Status

TRAINED_END = (Status.COMPLETED, Status.DIVERGED, Status.PRUNED, Status.FAILED)


@dataclass
class SearchContext:
    """What the cells of one search share: the plan, the folder and its ledger, the trials running (by Tune id). The
    searcher holds it; the scheduler keeps rungs of its own (scheduler.py), so nothing else reaches it."""

    plan: SearchPlan
    store: SearchStore  # where the search is kept; search_dir is its local folder (a remote one's working copy)
    ledger: Ledger
    live: dict[str, Trial] = field(default_factory=dict)
    predictions: object = None  # stages/predictions.Predictions: the transfer targets' (with transfer)
    cells: dict[str, "Cell"] = field(default_factory=dict)  # every cell of the search, proxies first, by name: the one index
    serial: int = 0  # numbers the sampler asks across cells
    guidance: object = None  # stages/guidance.Guidance: the guided cells' windows (with guide)
    cost_cache: dict[str, dict[str, float]] = field(default_factory=dict)  # architecture + micro batch -> computed costs
    memory: dict[str, int] | None = None  # cell -> its largest trial's memory plan (what a memory kill is said against)

    @property
    def search_dir(self) -> str:
        return str(self.store.local)

    def proxies(self) -> list["Cell"]:
        targets = set(self.plan.target_names())
        return [cell for name, cell in self.cells.items() if name not in targets]

    def proxies_done(self) -> bool:
        return all(cell.finished for cell in self.proxies())

    def proxy_records(self) -> list[TrialRecord]:
        return [record for cell in self.proxies() for record in cell.records()]

    def thin(self, cell: "Cell") -> None:
        """A cell is done: no stage will continue its trials, so each keeps only its final weights (unless the plan keeps
        checkpoints). A resumed driver that finds the cell done thins what is left; nothing it runs needs what went."""
        if getattr(self.plan, "keep_checkpoints", None) is not None:
            return
        from blockforge.search.records.store import thin_run

        store = self.store.rebound()
        for record in cell.records():
            if record.run_dir and record.status in TRAINED_END:
                thin_run(store.storage, Path(record.run_dir).relative_to(store.local).as_posix() if Path(record.run_dir).is_absolute()
                         else record.run_dir)

    def memory_need(self, cell: str) -> int:
        """The memory plan of cell `cell`'s largest trial, in bytes per training process (search/preflight.py), once."""
        if not getattr(self.plan, "memory_needs", None):  # the driver plans it before the first trial (a plan unpickled from an older search has none)
            from blockforge.search.preflight import memory_needs

            self.plan.memory_needs = memory_needs(self.plan)
        return self.plan.memory_needs.get(cell, 0)

    def computed_costs(self, recipe) -> dict[str, float]:
        """The computed costs the search's objectives and constraints name, once per architecture."""
        from blockforge.search.costs import COMPUTED, computed_costs

        plan = self.plan
        names = tuple(dict.fromkeys(c for c in [*(c for c, _ in plan.costs), *plan.constraints] if c in COMPUTED))
        key = f"{recipe.spec.arch_hash()}|{recipe.train.micro_batch}"
        if key not in self.cost_cache:
            self.cost_cache[key] = computed_costs(recipe, names)
        return dict(self.cost_cache[key])


class StageView:
    """What a stage that queues trials receives of its cell (stages/base.py CellLike): the finalists, its own queue
    (through Stage.queue) and what it reads; the cell's own bookkeeping (numbers, running trials, twins, orphans, the
    search's other cells) stays out of reach. An exploring stage, the cell's sampler, receives the Cell itself."""

    def __init__(self, cell: "Cell"):
        self._cell = cell
        self.name, self.plan, self.base_seed, self.finalists = cell.name, cell.plan, cell.base_seed, cell.finalists

    @property
    def done(self) -> Mapping[str, Outcome]:
        return MappingProxyType(self._cell.done)

    @property
    def latest(self) -> Mapping[int, TrialRecord]:
        return MappingProxyType(self._cell.latest)

    def records(self) -> list[TrialRecord]:
        return self._cell.records()

    def evidence(self, min_seeds: int, against_pre_ln: bool = True):
        return self._cell.evidence(min_seeds, against_pre_ln)

    def enqueue(self, searched: dict, seed: int, *, owner: Stage, **kwargs) -> bool:
        return self._cell.enqueue(searched, seed, owner=owner, **kwargs)

    def new_trial(self, searched: dict, seed: int, stage: StageName, **kwargs) -> Trial:
        return self._cell.new_trial(searched, seed, stage, **kwargs)

    def identify(self, trial: Trial) -> Trial:
        return self._cell.identify(trial)

    def in_flight(self, stage: Stage) -> list[Trial]:
        return self._cell.in_flight(stage)

    def proxies_done(self) -> bool:
        """Whether every proxy cell of the search is finished (what a transfer target waits for)."""
        return self._cell.context.proxies_done()


class Cell:
    def __init__(self, context: SearchContext, name: str, stages: list[Stage], records: list[TrialRecord]):
        self.context, self.plan, self.name = context, context.plan, name
        self.stages = stages
        self.base_seed = self.plan.settings[name].base_seed
        self.latest = {r.trial: r for r in records if r.cell == name}  # the latest record of each of its trials
        self.asked = 0  # trial numbers handed out
        self.queue: list[Trial] = []  # trials its stages queued, not started yet
        self.running: set[str] = set()  # Tune ids of its trials running now
        self.done: dict[str, Outcome] = {}  # identity -> the outcome that counts for it
        self.waiting: dict[str, list[Trial]] = {}  # identity -> twins of a running trial, settled when it ends
        self.orphans: dict[str, int] = {}  # identity -> number of a trial a stopped driver lost while it ran
        # what its confirming stages share; models an earlier driver promoted stay promoted (a search rebuilt from its ledger)
        self.finalists = Finalists(promoted={r.model: r.promoted for r in self.latest.values() if r.promoted})
        self.view = StageView(self)  # what its queueing stages receive
        self.finished = False
        self.answered = False  # its answer is confirmed: exploration, confirmation, promotion and racing have nothing more
        self.heard = 0  # trials ended so far (what a stage can decide on changes only then)
        self.asked_beside = -1  # `heard` when its stages were last asked for work beside trials still running
        self._evidence = None

    def __getstate__(self) -> dict:  # Tune pickles the searcher: caches are rebuilt, records read again on restore
        return {**self.__dict__, "_evidence": None, "latest": {}, "view": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update({"heard": 0, "asked_beside": -1, **state})  # (a searcher saved before they were kept)
        self.view = StageView(self)

    def given_to(self, stage: Stage) -> "Cell | StageView":
        """What `stage` receives of this cell: the Cell for the exploring (on-demand) stage, else its StageView."""
        return self if stage.on_demand else self.view

    # ---- the pipeline -------------------------------------------------------------------------------------

    def ready(self) -> bool:
        """Whether the cell has a trial to hand out now; when it is idle, its stages are asked in order for more."""
        if self.finished:
            return False
        lead = self.stages[0]
        if lead.on_demand and lead.active(self):
            return True
        if self.queue:
            return True
        owners = set()
        if self.busy():  # the stages wait for the trials running; work that does not depend on them starts in a free slot
            if any(stage.early(self.given_to(stage)) for stage in self.stages[1:]) and self.queue:
                return True
            owners = {id(self.stage_of(trial)) for trial in self.unfinished()}
            if self.asked_beside == self.heard or not all(stage.opens_beside_own for stage in self.stages if id(stage) in owners):
                return False  # (asked already since the last trial ended: nothing they decide on has changed)
            self.asked_beside = self.heard
        for stage in self.stages:
            opened = stage.open(self.given_to(stage))
            if opened is None:
                return False  # waits (a transfer target, for its proxy cells; a stage, for its own trials)
            if opened:
                self.answered = self.answered or not stage.answers
                return bool(self.queue)
            if id(stage) in owners:
                return False  # not done while trials of its own run: the stages after it wait for them
        self.finished = self.answered = True
        self.context.thin(self)
        return False

    def next(self, trial_id: str) -> dict | None:
        """The config of the trial to run next (None: the proposal needed no training)."""
        lead = self.stages[0]
        if lead.on_demand and lead.active(self):
            return lead.propose(self, trial_id)
        return self.launch(self.queue.pop(0), trial_id)

    def stage_of(self, trial: Trial) -> Stage:
        """The stage a trial's outcome goes to: the one that asked for it; for a trial known only from its ledger
        record (a resumed driver), the first stage of the record's stage."""
        if trial.owner is not None:
            return self.stages[trial.owner]
        return next((s for s in self.stages if s.name == trial.stage), self.stages[-1])

    def busy(self) -> bool:
        return bool(self.running) or any(self.waiting.values())

    def unfinished(self) -> list[Trial]:
        """Its trials running now and the twins waiting for them."""
        return [self.context.live[i] for i in self.running] + [t for twins in self.waiting.values() for t in twins]

    def in_flight(self, stage: Stage) -> list[Trial]:
        """Its trials running or waiting now whose outcomes go to `stage`."""
        return [t for t in self.unfinished() if self.stage_of(t) is stage]

    # ---- trials -------------------------------------------------------------------------------------------

    def new_trial(self, searched: dict, seed: int, stage: StageName, note: str = "", promoted: str = "", continues: str = "",
                  owner: Stage | None = None, optuna_id: str | None = None) -> Trial:
        number = self.asked
        self.asked += 1
        return Trial(self.name, number, stage, searched, self.plan.seed_overrides(self.name, searched, seed), seed, note=note, promoted=promoted,
                     continues=continues, owner=None if owner is None else self.stages.index(owner), optuna_id=optuna_id)

    def identify(self, trial: Trial) -> Trial:
        """The trial with its identities, shape and costs, from its resolved recipe (raising SpecError if invalid)."""
        recipe = self.plan.recipe(trial.overrides)
        spec = recipe.spec
        mix = recipe.model.layers.mix_ln
        return replace(trial, identity=trial_identity(recipe), model=trial_identity(recipe, with_seed=False),
                       alpha=mix.alpha if mix is not None else None, post_ln_layers=spec.post_ln_count(), uniform_pre=spec.uniform_pre(),
                       steps=recipe.train.steps, costs=self.context.computed_costs(recipe) if self.plan.costs or self.plan.constraints else {})

    def broken_constraint(self, trial: Trial) -> str:
        """'' when the candidate keeps every constraint, else a sentence saying which it breaks."""
        for cost, (low, high) in self.plan.constraints.items():
            value = trial.costs[cost]
            if (high is not None and value > high) or (low is not None and value < low):
                bound = f"at most {high:g}" if high is not None and value > high else f"at least {low:g}"
                return f"infeasible: its {cost} is {value:g}, and the constraint asks for {bound}; not trained"
        return ""

    def adopt_orphan(self, trial: Trial) -> Trial:
        """A new trial of a model whose run a stopped driver lost continues it under its number (the same trial else)."""
        number = self.orphans.pop(trial.identity, None)
        if number is not None and trial.number == self.asked - 1:
            self.asked -= 1  # the number just given out goes back
            return replace(trial, number=number)
        return trial

    def launch(self, trial: Trial, trial_id: str) -> dict:
        self.context.live[trial_id] = trial
        self.running.add(trial_id)
        self.append(self.record(trial, Status.RUNNING))
        return trial.config(early_stop=trial.stage is StageName.EXPLORE and self.plan.stops_early(self.name))

    def enqueue(self, searched: dict, seed: int, *, owner: Stage, note: str = "", stage: StageName = StageName.CONFIRM, promoted: str = "",
                continues: str = "") -> bool:
        """Queue model `searched` with `seed` for stage `owner` (Stage.queue) unless that replicate already finished, runs or waits
        (`stage`: what its record says; `continues`: the run folder, relative to the search, whose last checkpoint it starts from)."""
        trial = self.new_trial(searched, seed, stage, note=note, promoted=promoted, continues=continues, owner=owner)
        trial = self.adopt_orphan(self.identify(trial))
        outcome = self.done.get(trial.identity)
        if outcome is not None and outcome.status in (Status.COMPLETED, Status.DIVERGED, Status.FAILED):
            self.asked -= 1  # nothing to run: give the number back
            return False
        taken = {self.context.live[i].identity for i in self.running} | {t.identity for t in self.queue}
        if trial.identity in taken:
            self.asked -= 1
            return False
        self.queue.append(trial)
        return True

    def hold_twin(self, trial: Trial) -> None:
        """A proposal whose identity runs now: settled as its duplicate when that trial ends."""
        self.waiting.setdefault(trial.identity, []).append(trial)

    def is_running(self, identity: str) -> bool:
        return any(self.context.live[i].identity == identity for i in self.running)

    def settle_duplicate(self, trial: Trial, outcome: Outcome) -> None:
        stage = self.stage_of(trial)
        stage.on_duplicate(self.given_to(stage), trial, outcome)
        original = outcome.record
        self.append(self.record(trial, Status.DUPLICATE, value=original.value, steps=0, metrics=original.metrics, duplicate_of=outcome.number,
                                note=f"same model and settings as trial {outcome.number} ({outcome.status})"))

    def finish(self, trial_id: str, trial: Trial, result: dict, error: bool) -> None:
        """A trial of this cell ended: record it, tell its stage, and settle the twins that waited for it."""
        self.running.discard(trial_id)
        self.heard += 1
        plan = self.plan
        status = ended_status(result, error, trial.steps or plan.settings[self.name].steps)  # its own budget (cells may differ)
        value = {Status.DIVERGED: plan.penalty, Status.COMPLETED: result.get("objective")}.get(status)
        measured = {k.removeprefix("cost_"): v for k, v in result.items() if k.startswith("cost_") and isinstance(v, (int, float))}
        if measured:
            trial = replace(trial, costs={**trial.costs, **measured})
        metrics = {k: v for k, v in result.items() if k.startswith(("val_", "train_")) and isinstance(v, (int, float))}
        failure = {}
        if status == Status.FAILED:  # its own reason (said in a sentence), or a cause outside it, which a resume trains again
            failure = {"note": result[FAILURE], "retry": False} if FAILURE in result else {"note": self.outside_failure(trial_id), "retry": True}
        unstable = result.get("unstable") if isinstance(result.get("unstable"), str) else ""  # train/stability.py's reason, if any
        record = self.record(trial, status, value=result.get(plan.metric) if status != Status.DIVERGED else None,
                             steps=result.get("step", 0), metrics=metrics, wall_s=result.get("time_total_s", 0.0), unstable=unstable, **failure)
        outcome = Outcome(status, value, trial.number, record, trial)
        stage = self.stage_of(trial)
        stage.on_complete(self.given_to(stage), trial, outcome)
        self.append(record)
        if trial.identity not in self.done or status in (Status.COMPLETED, Status.DIVERGED):  # a pruned run finished later counts in full
            self.done[trial.identity] = outcome
        for twin in self.waiting.pop(trial.identity, []):
            self.settle_duplicate(twin, outcome)

    def outside_failure(self, trial_id: str) -> str:
        """Why Ray ended a trial (its memory monitor, a lost node or process), as Tune logged it, with what to change."""
        from blockforge.cluster import failure_of

        failure = failure_of(trial_id)
        if failure is None:
            return "its process or node was lost, or it raised: see its error file under tune/"
        at_once = 1 + sum(len(cell.running) for cell in self.context.cells.values())  # this one ended a moment ago
        return failure.sentence(self.context.memory_need(self.name) / 2**30, at_once) if failure.kind == "memory" else failure.sentence()

    def record(self, trial: Trial, status: str, **fields) -> TrialRecord:
        fields["note"] = fields.get("note") or trial.note  # e.g. why a pruned model was brought back
        return TrialRecord(
            cell=self.name, trial=trial.number, status=status, stage=trial.stage.value, seed=trial.seed, model=trial.model,
            uniform_pre=trial.uniform_pre, identity=trial.identity, costs=dict(trial.costs), overrides=dict(trial.searched), alpha=trial.alpha,
            post_ln_layers=trial.post_ln_layers, metric=self.plan.metric, promoted=trial.promoted,
            run_dir=str(trial_dir(self.context.search_dir, self.name, trial.identity)) if trial.identity else "", **fields,
        )

    def append(self, record: TrialRecord) -> None:
        self.context.ledger.append(record)
        self.latest[record.trial] = record
        if record.status in (Status.COMPLETED, Status.DIVERGED):
            self._evidence = None

    def records(self) -> list[TrialRecord]:
        """The latest record of each of the cell's trials, by number."""
        return [self.latest[n] for n in sorted(self.latest)]

    def evidence(self, min_seeds: int, against_pre_ln: bool = True):
        """The cell's evidence (evidence.cell_evidence), recomputed only after one of its trials finished."""
        from blockforge.search.evidence.evidence import cell_evidence

        key = (min_seeds, against_pre_ln)
        if self._evidence is None or self._evidence[0] != key:
            self._evidence = (key, cell_evidence(self.records(), self.name, mode=self.plan.mode, penalty=self.plan.penalty,
                                                 min_seeds=min_seeds, against_pre_ln=against_pre_ln))
        return self._evidence[1]

    # ---- resuming -----------------------------------------------------------------------------------------

    def take_in(self, record: TrialRecord) -> None:
        """A record the driver's saved state does not know (written after it was saved): its number is not given out
        again; what it finished counts; one still running ends interrupted and a new proposal of its model continues it."""
        if record.trial < self.asked:
            return
        self.asked = record.trial + 1
        if record.status in (Status.RUNNING, Status.INTERRUPTED):
            if record.status == Status.RUNNING:
                self.append(TrialRecord(**{**record.__dict__, "status": Status.INTERRUPTED,
                                           "note": "running when the search stopped, before its state was saved"}))
            self.orphans[record.identity] = record.trial
            return
        if record.status not in TRAINED_END or not record.identity:
            return  # duplicates and invalid proposals cost nothing
        trial = Trial(self.name, record.trial, StageName(record.stage), dict(record.overrides),
                      self.plan.seed_overrides(self.name, dict(record.overrides), record.seed), record.seed)
        trial = self.identify(trial)
        stage = self.stage_of(trial)
        stage.taken_in(self.given_to(stage), trial, record)
        if trial.identity not in self.done or record.status in (Status.COMPLETED, Status.DIVERGED):
            value = record.value if record.status != Status.DIVERGED else self.plan.penalty
            self.done[trial.identity] = Outcome(record.status, value, record.trial, record, trial)
