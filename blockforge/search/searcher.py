"""Ray Tune searcher and scheduler that keep cells apart.

CellSearcher holds one OptunaSearch per cell and hands out trials round-robin across cells, so a
cluster works on every cell at once. Before a trial runs it is loaded and resolved through the same
path as `blockforge train`: an invalid combination is recorded as failed without running, and a trial
whose identity (resolved architecture + training + data settings) equals one already run in its cell
reuses that result. When a cell's exploration ends, its finalists (the best distinct models, the
baselines and the best Pre-LN model) are trained to the full budget with further seeds; racing may
add seeds to the two leaders. CellScheduler gives every cell its own ASHA over exploration trials
only, so early stopping compares trials of one cell and never stops a replicate.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from ray.tune.schedulers import FIFOScheduler, TrialScheduler
from ray.tune.search import Searcher

from blockforge.errors import SpecError
from blockforge.search.config import OBJECTIVE, SearchPlan, trial_dir, trial_identity
from blockforge.search.ledger import Ledger, TrialRecord
from blockforge.search.rungs import asha_rungs, cell_curves, curve_of, rung_checks
from blockforge.train.events import Status

# Duplicates and invalid combinations cost nothing and do not use a cell's trial budget; a cell whose
# sampler keeps proposing only those has exhausted its space and closes after this many in a row.
FREE_ASKS_IN_A_ROW = 10


def make_sampler(plan: SearchPlan, cell_index: int, name: str):
    import optuna

    sampler = plan.sampler
    if sampler.kind == "grid":
        return optuna.samplers.GridSampler({d.name: d.values() for d in plan.dimensions_in(name)}, seed=cell_index)
    settings = sampler.tpe or sampler.random
    seed = settings.seed + 1000 * cell_index  # cells draw independent sequences, reproducibly
    if sampler.kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=settings.startup_trials, constant_liar=True)


def alpha_of(recipe) -> float | None:
    mix = recipe.model.layers.mix_ln
    return mix.alpha if mix is not None else None


class CellSearcher(Searcher):
    """Per cell: an exploration stage (the sampler's proposals, early-stopped by ASHA), then, with
    `confirm`, a confirmation stage (finalists trained to the full budget with further seeds)."""

    def __init__(self, plan: SearchPlan, search_dir: str, *, from_ledger: bool = False):
        """from_ledger: continue the search the ledger records (when Ray Tune's own saved state is missing or
        damaged): its trials keep their numbers and outcomes, the samplers learn what they found, and the
        first points (baselines, enumerations) not yet tried come first, after the trials a stop interrupted."""
        super().__init__(metric=OBJECTIVE, mode=plan.mode)
        import optuna
        from ray.tune.search.optuna import OptunaSearch

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.plan = plan
        self.search_dir = str(search_dir)
        self.ledger = Ledger(Path(search_dir) / "trials.jsonl")
        names = plan.cell_names()
        self.targets = plan.target_names()  # the transfer stage's cells: no sampler, trained once the proxies are done
        records = self.ledger.records() if from_ledger else []
        first = {name: self._first_points(name, records) for name in names}
        # With a cost axis each cell's study has several objectives: the quality, then the costs (TPE handles them)
        metrics = [OBJECTIVE, *(cost for cost, _ in plan.costs)] if plan.costs else OBJECTIVE
        modes = [plan.mode, *(mode for _, mode in plan.costs)] if plan.costs else plan.mode
        self.cells = {
            name: OptunaSearch(
                space={d.name: d.optuna() for d in plan.dimensions_in(name)}, metric=metrics, mode=modes,
                sampler=make_sampler(plan, i, name), points_to_evaluate=first[name] or None,
            )
            for i, name in enumerate(names)
        }
        self.cost_cache: dict[str, dict[str, float]] = {}  # architecture hash -> its computed costs
        everything = names + self.targets
        self.asked = dict.fromkeys(everything, 0)  # trial numbers handed out (sampler asks, confirmation and transfer trials)
        self.runs = dict.fromkeys(everything, 0)  # exploration trials sent to train: the budget
        # A cell whose distinct points fit its budget enumerates them (first_points) and asks no more.
        self.enumerated = {name: len(first[name]) if plan.enumeration(name) is not None else None for name in names}
        self.explore_asks = dict.fromkeys(names, 0)
        self.free_streak = dict.fromkeys(names, 0)  # asks in a row that needed no training
        # explore -> confirm -> done; a target: waiting -> transfer -> done
        self.stage = {**dict.fromkeys(names, "explore"), **dict.fromkeys(self.targets, "waiting")}
        self.queue: dict[str, list[dict]] = {name: [] for name in everything}  # confirmation (or transfer) trials not started yet
        self.finalists: dict[str, list[dict]] = {name: [] for name in names}  # {searched, model} per finalist
        self.extra_seeds = dict.fromkeys(names, 0)  # further seeds given to a cell's finalists so far
        self.promoted: dict[str, dict[str, str]] = {name: {} for name in names}  # cell -> model -> why it was brought back
        self.turn = 0
        self.live: dict[str, dict] = {}  # Tune trial id -> {cell, number, identity, ...}
        self.done: dict[tuple[str, str], dict] = {}  # (cell, identity) -> the outcome that counts for it
        self.waiting: dict[tuple[str, str], list[dict]] = {}  # twins of running trials, resolved when they end
        self.orphans: dict[tuple[str, str], int] = {}  # (cell, identity) -> number of a trial lost with the driver's state
        self._serial = 0
        if from_ledger:
            self._take_in_ledger()
            self._teach_samplers(records)

    def _first_points(self, name: str, records: list[TrialRecord]) -> list[dict]:
        """The points cell `name` tries before it samples: the plan's, less those the ledger has tried, after
        the exploration trials it records as stopped while running (so they continue)."""
        explored = [r for r in records if r.cell == name and r.stage == "explore"]
        params = lambda r: self.plan.sampler_params(name, r.overrides)  # noqa: E731
        stopped = [params(r) for r in explored if r.status in (Status.RUNNING, Status.INTERRUPTED)]
        tried = [params(r) for r in explored]
        points = [p for i, p in enumerate(stopped) if p not in stopped[:i]]
        return points + [p for p in self.plan.first_points(name) if p not in tried]

    def _teach_samplers(self, records: list[TrialRecord]) -> None:
        """Give each cell's sampler the exploration outcomes the ledger records."""
        for r in records:
            if r.stage != "explore" or r.status not in (Status.COMPLETED, Status.DIVERGED, Status.PRUNED, Status.FAILED):
                continue
            value = self.plan.penalty if r.status == Status.DIVERGED else r.value
            if r.status == Status.COMPLETED and value is None:
                continue
            if self.plan.costs and value is not None and r.status in (Status.COMPLETED, Status.DIVERGED):
                value = [value, *(r.costs.get(c) for c, _ in self.plan.costs)]
            self.cells[r.cell].add_evaluated_point(self.plan.sampler_params(r.cell, r.overrides), value,
                                                   error=r.status == Status.FAILED, pruned=r.status == Status.PRUNED)

    # ---- Tune's Searcher interface ------------------------------------------------------------

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True  # everything comes from the plan

    def suggest(self, trial_id: str) -> dict | None:
        names = list(self.cells) + self.targets
        for _ in range(len(names) * (FREE_ASKS_IN_A_ROW + 2)):
            ready = [n for n in names if self._ready(n)]
            if not ready:
                return Searcher.FINISHED if all(self.stage[n] == "done" for n in names) else None
            name = names[self.turn % len(names)]
            self.turn += 1
            if name not in ready:
                continue
            config = self._explore(name, trial_id) if self.stage[name] == "explore" else self._launch(self.queue[name].pop(0), trial_id)
            if config is not None:
                return config
        return None  # only free proposals this time: Tune asks again

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        info = self.live.get(trial_id)
        if info is not None and info["stage"] == "explore" and OBJECTIVE in result and "step" in result and not self.plan.costs:
            self.cells[info["cell"]].on_trial_result(info["optuna_id"], {OBJECTIVE: result[OBJECTIVE], "training_iteration": result.get("step", 0)})

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        info = self.live.pop(trial_id, None)
        if info is None:
            return
        result = result or {}
        if error:
            status, value = Status.FAILED, None
        elif result.get("diverged"):
            status, value = Status.DIVERGED, self.plan.penalty
        elif result.get("step", 0) < info.get("steps", self.plan.steps[info["cell"]]):  # before its own budget (cells may differ)
            status, value = Status.PRUNED, None
        else:
            status, value = Status.COMPLETED, result.get(OBJECTIVE)
        measured = {k.removeprefix("cost_"): v for k, v in result.items() if k.startswith("cost_") and isinstance(v, (int, float))}
        if measured:
            info["costs"] = {**info.get("costs", {}), **measured}
        if info["stage"] == "explore":
            self._tell(info["cell"], info["optuna_id"], status, value, info.get("costs"))
        metrics = {k: v for k, v in result.items() if k.startswith(("val_", "train_")) and isinstance(v, (int, float))}
        record = self._record(info, status, value=result.get(self.plan.metric) if status != Status.DIVERGED else None,
                              steps=result.get("step", 0), metrics=metrics, wall_s=result.get("time_total_s", 0.0),
                              note="" if status != Status.FAILED else "the trial raised; see its error file under tune/")
        self.ledger.append(record)
        outcome = {"status": status, "value": value, "number": info["number"], "record": record, "info": info}
        key = (info["cell"], info["identity"])
        if key not in self.done or status in (Status.COMPLETED, Status.DIVERGED):  # a pruned run finished later counts in full
            self.done[key] = outcome
        for twin in self.waiting.pop(key, []):
            self._settle_duplicate(twin, outcome)

    # ---- exploration --------------------------------------------------------------------------

    def _ready(self, name: str) -> bool:
        """Whether cell `name` has a trial to hand out now; moves it to its next stage when one ends."""
        if name in self.targets:
            return self._ready_target(name)
        if self.stage[name] == "explore":
            enumerated = self.enumerated[name]
            if enumerated is not None and self.explore_asks[name] >= enumerated:
                pass  # every distinct point has been proposed
            elif self.runs[name] < self.plan.trials_per_cell and self.free_streak[name] < FREE_ASKS_IN_A_ROW:
                return True
            if self._busy(name):
                return False
            self._start_confirmation(name)
        if self.stage[name] == "confirm":
            if self.queue[name]:
                return True
            if self._busy(name):
                return False
            if not (self._promote(name) or self._race(name)):
                self.stage[name] = "done"
            return bool(self.queue[name])
        return False

    def _ready_target(self, name: str) -> bool:
        """A target waits for every proxy cell, then trains its candidates around the predicted k."""
        if self.stage[name] == "waiting":
            if any(self.stage[proxy] != "done" for proxy in self.cells):
                return False
            self._start_transfer(name)
        if self.queue[name]:
            return True
        if not self._busy(name):
            self.stage[name] = "done"
        return False

    def _start_transfer(self, name: str) -> None:
        from blockforge.search.config import MIX_LN_ALPHA
        from blockforge.search.transfer import predict
        from blockforge.spec.resolve import mix_ln_count

        self.stage[name] = "transfer"
        prediction = predict(self.plan, self.ledger.records(), name)
        if prediction is None:
            return  # no proxy cell has a winner: nothing to test
        alpha = next(d for d in self.plan.dimensions if d.key == MIX_LN_ALPHA)
        highest = mix_ln_count(max(v for v in alpha.args if isinstance(v, (int, float))), prediction.depth)
        note = f"transfer: predicted {prediction.text()}"
        for k in prediction.candidates(self.plan.transfer.neighbours, highest):
            searched = {MIX_LN_ALPHA: k / prediction.depth, **prediction.searched}
            for i in range(self.plan.transfer.seeds):
                self._enqueue(name, searched, self.plan.base_seeds[name] + i, note=note, stage="transfer")

    def _busy(self, name: str) -> bool:
        return any(info["cell"] == name for info in self.live.values()) or any(cell == name and twins for (cell, _), twins in self.waiting.items())

    def _explore(self, name: str, trial_id: str) -> dict | None:
        self.explore_asks[name] += 1
        config = self._ask(name, trial_id)
        if config is None:
            self.free_streak[name] += 1
            return None
        self.free_streak[name] = 0
        self.runs[name] += 1
        return config

    def _ask(self, name: str, trial_id: str) -> dict | None:
        """Ask the cell's sampler for a trial; returns a Tune config, or None when it needs no run."""
        self._serial += 1
        optuna_id = f"{trial_id}-{self._serial}"
        params = self.cells[name].suggest(optuna_id) or {}
        searched = self.plan.searched_values(name, params)
        info = self._new_info(name, searched, self.plan.base_seeds[name], "explore")
        info["optuna_id"] = optuna_id
        try:
            self._identify(info)
        except SpecError as err:
            self._tell(name, optuna_id, Status.FAILED, None)
            self.ledger.append(self._record(info, Status.FAILED, note=f"invalid: {err}"))
            return None
        broken = self._broken_constraint(info)
        if broken:  # never trained; the sampler learns it as a failure
            self._tell(name, optuna_id, Status.FAILED, None)
            self.ledger.append(self._record(info, Status.INFEASIBLE, note=broken))
            return None
        self._adopt_orphan(info)
        key = (name, info["identity"])
        if key in self.done:
            self._settle_duplicate(info, self.done[key])
            return None
        if any(other["cell"] == name and other["identity"] == info["identity"] for other in self.live.values()):
            self.waiting.setdefault(key, []).append(info)
            return None
        return self._launch(info, trial_id)

    def _new_info(self, name: str, searched: dict, seed: int, stage: str) -> dict:
        number = self.asked[name]
        self.asked[name] += 1
        overrides = self.plan.seed_overrides(name, searched, seed)
        return {"cell": name, "number": number, "searched": searched, "overrides": overrides, "seed": seed, "stage": stage}

    def _identify(self, info: dict) -> None:
        """Load and resolve the trial's recipe (raising SpecError if invalid); fill in its identities and shape."""

        recipe = self.plan.recipe(info["overrides"])
        spec = recipe.spec
        info.update(identity=trial_identity(recipe), model=trial_identity(recipe, with_seed=False), alpha=alpha_of(recipe),
                    post_ln_layers=spec.post_ln_count(), uniform_pre=spec.uniform_pre(), steps=recipe.train.steps)
        if self.plan.costs or self.plan.constraints:
            info["costs"] = self._computed_costs(recipe)

    def _computed_costs(self, recipe) -> dict[str, float]:
        """The computed costs the search's objectives and constraints name, once per architecture."""
        from blockforge.search.costs import COMPUTED, computed_costs

        cache = self.__dict__.setdefault("cost_cache", {})
        names = tuple(dict.fromkeys(c for c in [*(c for c, _ in self.plan.costs), *self.plan.constraints] if c in COMPUTED))
        key = f"{recipe.spec.arch_hash()}|{recipe.train.micro_batch}"
        if key not in cache:
            cache[key] = computed_costs(recipe, names)
        return dict(cache[key])

    def _broken_constraint(self, info: dict) -> str:
        """'' when the candidate keeps every constraint, else a sentence saying which it breaks."""
        for cost, (low, high) in self.plan.constraints.items():
            value = info["costs"][cost]
            if (high is not None and value > high) or (low is not None and value < low):
                bound = f"at most {high:g}" if high is not None and value > high else f"at least {low:g}"
                return f"infeasible: its {cost} is {value:g}, and the constraint asks for {bound}; not trained"
        return ""

    def _adopt_orphan(self, info: dict) -> None:
        """A new trial of a model whose run a stopped driver lost (see _take_in_ledger) continues it under its number."""
        number = self.orphans.pop((info["cell"], info["identity"]), None)
        if number is not None and info["number"] == self.asked[info["cell"]] - 1:
            self.asked[info["cell"]] -= 1  # the number just given out goes back
            info["number"] = number

    def _launch(self, info: dict, trial_id: str) -> dict:
        self.live[trial_id] = info
        self.ledger.append(self._record(info, Status.RUNNING))
        # A cell that enumerates its distinct points trains each to the full budget: no early stopping there.
        return {"cell": info["cell"], "number": info["number"], "identity": info["identity"], "stage": info["stage"],
                "overrides": [list(o) for o in info["overrides"]], "early_stop": self.enumerated.get(info["cell"]) is None}

    # ---- confirmation -------------------------------------------------------------------------

    def _start_confirmation(self, name: str) -> None:
        """Exploration of `name` is over: queue its finalists' replicates (or close it without confirm)."""
        confirm = self.plan.confirm
        self.stage[name] = "confirm"
        if confirm is None:  # no replicates; pruned trials may still be promoted to the full budget
            for r in self.ledger.records():
                if r.cell == name and r.note.startswith("promoted:") and r.model not in self.promoted[name]:
                    self.promoted[name][r.model] = r.note
                    self._enqueue(name, dict(r.overrides), self.plan.base_seeds[name], note=r.note)
            return
        sign = 1.0 if self.plan.mode == "min" else -1.0
        explored = [o for (cell, _), o in self.done.items() if cell == name and o["info"]["stage"] == "explore"]
        ranked = sorted((o for o in explored if o["status"] == Status.COMPLETED and o["value"] is not None), key=lambda o: sign * o["value"])
        ranked += sorted((o for o in explored if o["status"] == Status.PRUNED), key=lambda o: (-o["record"].steps, sign * (o["record"].value or 0.0)))
        finalists = [o["info"] for o in (self._front(ranked) if self.plan.costs else ranked[: confirm.top])]
        for baseline in self.plan.baselines:
            searched = self.plan.searched_values(name, self.plan.sampler_params(name, baseline))
            info = self._new_info(name, searched, self.plan.base_seeds[name], "confirm")
            try:
                self._identify(info)
            except SpecError:
                continue  # an invalid baseline was recorded as failed when it was proposed
            finalists.append(info)
        if not any(f["uniform_pre"] for f in finalists):  # the best Pre-LN model seen is the reference
            finalists += [o["info"] for o in ranked if o["info"]["uniform_pre"]][:1]
        unique = {}
        for f in finalists:
            unique.setdefault(f["model"], {"searched": f["searched"], "model": f["model"], "uniform_pre": f["uniform_pre"]})
        for r in self.ledger.records():  # models an earlier driver promoted stay finalists (a search rebuilt from its ledger)
            if r.cell == name and r.note.startswith("promoted:") and r.model not in unique:
                self.promoted[name][r.model] = r.note
                unique[r.model] = {"searched": dict(r.overrides), "model": r.model, "uniform_pre": r.uniform_pre, "note": r.note}
        self.finalists[name] = list(unique.values())
        seeds = [self.plan.base_seeds[name] + i for i in range(confirm.seeds + 1)]
        self.extra_seeds[name] = confirm.seeds
        for finalist in self.finalists[name]:
            for seed in seeds:
                self._enqueue(name, finalist["searched"], seed, note=finalist.get("note", ""))

    def _front(self, ranked: list[dict]) -> list[dict]:
        """With a cost axis: the explored models no other beats on quality and every cost at once (one seed each),
        best quality first, at most 2 * confirm.top of them; plus the pruned best ones when nothing completed."""
        from blockforge.search.evidence import dominates

        done = [o for o in ranked if o["status"] == Status.COMPLETED]
        signs = [1.0 if self.plan.mode == "min" else -1.0, *(1.0 if m == "min" else -1.0 for _, m in self.plan.costs)]
        point = lambda o: [s * v for s, v in zip(signs, [o["value"], *(o["record"].costs.get(c, 0.0) for c, _ in self.plan.costs)])]  # noqa: E731
        front = [o for o in done if not any(dominates(point(other), point(o)) for other in done if other is not o)]
        return (front or ranked)[: 2 * self.plan.confirm.top]

    def _enqueue(self, name: str, searched: dict, seed: int, note: str = "", stage: str = "confirm") -> None:
        """Queue model `searched` with `seed` unless that replicate already finished, runs or waits."""
        info = self._new_info(name, searched, seed, stage)
        info["note"] = note
        self._identify(info)
        self._adopt_orphan(info)
        key = (name, info["identity"])
        if key in self.done and self.done[key]["status"] in (Status.COMPLETED, Status.DIVERGED, Status.FAILED):
            self.asked[name] -= 1  # nothing to run: give the number back
            return
        taken = [i["identity"] for i in self.live.values() if i["cell"] == name] + [i["identity"] for i in self.queue[name]]
        if info["identity"] in taken:
            self.asked[name] -= 1
            return
        self.queue[name].append(info)

    def _promote(self, name: str) -> bool:
        """Bring back to a full-budget run every pruned exploration trial that was behind, where it was stopped,
        by no more than a margin the cell's full-budget curves were overtaken by there: the evidence says it
        could have ended ahead. A promoted model becomes a finalist (with the confirmation's seeds)."""
        if self.plan.asha is None:
            return False
        from blockforge.search.rungs import pruned_checks

        records = self.ledger.records()
        checks = [c for c in pruned_checks(records, name, self.plan.metric, self.plan.mode) if c.inside]
        promoted = self.promoted.setdefault(name, {})
        queued = False
        for check in checks:
            if check.model in promoted:
                continue
            record = next(r for r in records if r.cell == name and r.trial == check.trial)
            promoted[check.model] = (f"promoted: pruned at step {check.step} {check.margin:.3g} behind the best full-budget curve of its seed, "
                                     f"inside the {check.crossing:.3g} by which full-budget curves were overtaken there")
            self.finalists[name].append({"searched": dict(record.overrides), "model": check.model, "uniform_pre": record.uniform_pre,
                                         "note": promoted[check.model]})
            seeds = [self.plan.base_seeds[name] + i for i in range(1 + (self.extra_seeds[name] if self.plan.confirm else 0))]
            for seed in seeds:
                self._enqueue(name, dict(record.overrides), seed, note=promoted[check.model])
            queued = True
        return queued and bool(self.queue[name])

    def _race(self, name: str) -> bool:
        """When the two leaders are not yet separated, give them (and the Pre-LN reference) one more seed."""
        confirm = self.plan.confirm
        if confirm is None or confirm.max_seeds is None or self.extra_seeds[name] >= confirm.max_seeds:
            return False
        from blockforge.search.evidence import cell_evidence

        evidence = cell_evidence(self.ledger.records(), name, mode=self.plan.mode, penalty=self.plan.penalty, min_seeds=confirm.seeds + 1)
        if evidence.runner_up is None or evidence.vs_runner_up is None or evidence.vs_runner_up.excludes_zero():
            return False
        self.extra_seeds[name] += 1
        seed = self.plan.base_seeds[name] + self.extra_seeds[name]
        racing = {c.model: c for c in (evidence.winner, evidence.runner_up, evidence.reference) if c is not None}
        for candidate in racing.values():
            self._enqueue(name, candidate.overrides, seed)
        return bool(self.queue[name])

    # ---- helpers ------------------------------------------------------------------------------

    def _settle_duplicate(self, info: dict, outcome: dict) -> None:
        self._tell(info["cell"], info["optuna_id"], outcome["status"], outcome["value"], outcome["record"].costs)
        original = outcome["record"]
        self.ledger.append(self._record(
            info, Status.DUPLICATE, value=original.value, steps=0, metrics=original.metrics, duplicate_of=outcome["number"],
            note=f"same model and settings as trial {outcome['number']} ({outcome['status']})",
        ))

    def _tell(self, name: str, optuna_id: str, status: str, value: float | None, costs: dict | None = None) -> None:
        search = self.cells[name]
        if status in (Status.COMPLETED, Status.DIVERGED):
            search.on_trial_complete(optuna_id, result={OBJECTIVE: value, **{c: (costs or {})[c] for c, _ in self.plan.costs}})
        else:  # pruned: Optuna must not take a partial value as a finished one; failed: FAIL
            search.on_trial_complete(optuna_id, result=None, error=status == Status.FAILED)

    def _record(self, info: dict, status: str, **fields) -> TrialRecord:
        identity = info.get("identity", "")
        fields["note"] = fields.get("note") or info.get("note", "")  # e.g. why a pruned model was brought back
        return TrialRecord(
            cell=info["cell"], trial=info["number"], status=status, stage=info["stage"], seed=info["seed"],
            model=info.get("model", ""), uniform_pre=info.get("uniform_pre", False), identity=identity, costs=dict(info.get("costs", {})),
            overrides=dict(info["searched"]), alpha=info.get("alpha"), post_ln_layers=info.get("post_ln_layers"),
            metric=self.plan.metric, run_dir=str(trial_dir(self.search_dir, info["cell"], identity)) if identity else "", **fields,
        )

    def save(self, checkpoint_path: str) -> None:
        import pickle

        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.__dict__, f)

    def restore(self, checkpoint_path: str) -> None:
        import pickle

        with open(checkpoint_path, "rb") as f:
            self.__dict__.update(pickle.load(f))
        self.__dict__.setdefault("promoted", {name: {} for name in self.cells})  # a state saved before promotions existed
        self.__dict__.setdefault("targets", [])  # ...or before transfer
        self._take_in_ledger()

    def _take_in_ledger(self) -> None:
        """After a restore, take in what the ledger recorded after this state was saved (Tune saves it
        every few seconds, the ledger is written at once). Those trials are unknown to the restored state
        and to Tune: their numbers are not given out again; what they finished counts against the budget
        and makes a new proposal of the same model a free duplicate; those still running end as
        interrupted, and a new proposal of the same model continues them, under their number and from
        their run folder."""
        trained_end = (Status.COMPLETED, Status.DIVERGED, Status.PRUNED, Status.FAILED)
        self.orphans = getattr(self, "orphans", {})
        for record in self.ledger.records():
            if record.trial < self.asked[record.cell]:
                continue
            self.asked[record.cell] = record.trial + 1
            if record.status in (Status.RUNNING, Status.INTERRUPTED):
                if record.status == Status.RUNNING:
                    self.ledger.append(replace(record, status=Status.INTERRUPTED, note="running when the search stopped, before its state was saved"))
                self.orphans[(record.cell, record.identity)] = record.trial
                continue
            if record.status not in trained_end or not record.identity:
                continue  # duplicates and invalid proposals cost nothing
            info = {"cell": record.cell, "number": record.trial, "searched": dict(record.overrides), "seed": record.seed, "stage": record.stage}
            info["overrides"] = self.plan.seed_overrides(record.cell, info["searched"], record.seed)
            self._identify(info)
            if record.stage == "explore":
                self.runs[record.cell] += 1
            key = (record.cell, record.identity)
            if key not in self.done or record.status in (Status.COMPLETED, Status.DIVERGED):
                self.done[key] = {"status": record.status, "value": record.value if record.status != Status.DIVERGED else self.plan.penalty,
                                  "number": record.trial, "record": record, "info": info}


class CellScheduler(FIFOScheduler):
    """ASHA per cell over exploration trials, guarded against pruning what may still end ahead.

    At each rung (grace, grace * rf, ... steps) a trial is compared with the cell's exploration trials
    that reached the rung before it, as in ASHA: it is stopped only if it is outside the best 1/rf of them
    *and* behind their cutoff by more than the rung's margin, the largest amount by which one of the
    cell's full-budget curves (same seed) was behind another there and still ended ahead (at least
    `asha.margin`). What the rungs hold is read from the trials' run folders, not kept in memory, so a
    resumed search decides as the first driver would have. Confirmation trials, and exploration trials of
    cells that enumerate their distinct points (config `early_stop` false), always run the full budget.
    """

    def __init__(self, plan: SearchPlan, search_dir: str):
        super().__init__()
        self.plan = plan
        self.search_dir = str(search_dir)
        self.ledger = Ledger(Path(search_dir) / "trials.jsonl")
        self.rungs = {cell: asha_rungs(plan.asha.grace_steps, plan.asha.reduction_factor, plan.steps[cell]) for cell in plan.cell_names()}
        self.passed: dict[str, set[int]] = {}  # Tune trial id -> rungs it has been judged at (this driver)

    def set_search_properties(self, metric, mode, **spec) -> bool:
        return True

    @staticmethod
    def _early_stoppable(trial) -> bool:
        return trial.config.get("stage", "explore") == "explore" and trial.config.get("early_stop", True)

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        if OBJECTIVE not in result or "step" not in result or not self._early_stoppable(trial):
            return TrialScheduler.CONTINUE
        cell, step = trial.config["cell"], int(result["step"])
        judged = self.passed.setdefault(trial.trial_id, set())
        due = [rung for rung in self.rungs[cell] if rung <= step and rung not in judged]
        if not due:
            return TrialScheduler.CONTINUE
        rung = max(due)
        judged.update(due)
        if result.get("diverged"):
            return TrialScheduler.CONTINUE  # the trial ends by itself, as diverged
        decision = self.decide(cell, trial.config["number"], rung, float(result[OBJECTIVE]))
        return TrialScheduler.STOP if decision.stop else TrialScheduler.CONTINUE

    def decide(self, cell: str, number: int, rung: int, value: float) -> "RungDecision":
        """Whether exploration trial `number` of `cell`, at `value` on reaching `rung`, is stopped there."""
        records = self.ledger.records()
        sign = 1.0 if self.plan.mode == "min" else -1.0
        others = []
        for r in records:
            if r.cell != cell or r.stage != "explore" or r.trial == number or not r.run_dir or r.status in (Status.DUPLICATE, Status.FAILED):
                continue
            curve = curve_of(r.run_dir, self.plan.metric)
            reached = [s for s in curve if s >= rung]
            if reached:
                others.append(curve[min(reached)])
        if not others:
            return RungDecision(False, None, None)
        ordered = sorted(sign * v for v in others)  # best first
        cutoff = float(np.percentile(ordered, 100.0 / self.plan.asha.reduction_factor)) * sign  # ASHA's: keep the best 1/rf
        behind = sign * (value - cutoff)
        seed = self.plan.base_seeds[cell]
        curves = [c for c in cell_curves(records, cell, self.plan.metric) if c.seed == seed]
        floor = self.plan.asha.margin
        if floor is None and len(curves) < 2:
            return RungDecision(False, behind, None)  # nothing yet says how far the rung's ranking can be trusted
        margin = max(floor or 0.0, rung_checks(curves, [rung], self.plan.mode)[0].largest)
        return RungDecision(behind > margin, behind, margin)


@dataclass(frozen=True)
class RungDecision:
    stop: bool
    behind: float | None  # behind the rung's cutoff by this much (negative: inside the best 1/rf); None: first at the rung
    margin: float | None  # what it had to be behind by to be stopped (None: not stoppable yet, no full curves to judge by)
