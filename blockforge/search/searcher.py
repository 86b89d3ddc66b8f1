"""Ray Tune searcher and scheduler that keep cells apart.

CellSearcher holds one OptunaSearch per cell and hands out trials round-robin across cells, so a
cluster works on every cell at once. Before a trial runs it is loaded and resolved through the same
path as `blockforge train`: an invalid combination is recorded as failed without running, and a trial
whose identity (resolved architecture + training + data settings) equals one already run in its cell
reuses that result. CellScheduler gives every cell its own ASHA, so early stopping only ever compares
trials of one cell.
"""

from __future__ import annotations

from pathlib import Path

from ray.tune.schedulers import AsyncHyperBandScheduler, FIFOScheduler, TrialScheduler
from ray.tune.search import Searcher

from blockforge.errors import SpecError
from blockforge.search.config import SearchPlan, trial_identity
from blockforge.search.ledger import Ledger, TrialRecord

OBJECTIVE = "objective"  # the key trials report the (penalised) objective under
# Duplicates and invalid combinations cost nothing and do not use a cell's trial budget; a cell whose
# sampler keeps proposing only those has exhausted its space and closes after this many in a row.
FREE_ASKS_IN_A_ROW = 10


def make_sampler(plan: SearchPlan, cell_index: int):
    import optuna

    sampler = plan.sampler
    if sampler.kind == "grid":
        return optuna.samplers.GridSampler({d.key: list(d.args) for d in plan.dimensions}, seed=cell_index)
    settings = sampler.tpe or sampler.random
    seed = settings.seed + 1000 * cell_index  # cells draw independent sequences, reproducibly
    if sampler.kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=settings.startup_trials, constant_liar=True)


def alpha_of(recipe) -> float | None:
    mix = recipe.model.layers.mix_ln
    return mix.alpha if mix is not None else None


class CellSearcher(Searcher):
    def __init__(self, plan: SearchPlan, search_dir: str):
        super().__init__(metric=OBJECTIVE, mode=plan.mode)
        import optuna
        from ray.tune.search.optuna import OptunaSearch

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.plan = plan
        self.search_dir = str(search_dir)
        self.ledger = Ledger(Path(search_dir) / "trials.jsonl")
        names = plan.cell_names()
        space = {d.key: d.optuna() for d in plan.dimensions}
        self.cells = {
            name: OptunaSearch(
                space=space, metric=OBJECTIVE, mode=plan.mode, sampler=make_sampler(plan, i),
                points_to_evaluate=[dict(b) for b in plan.baselines] or None,
            )
            for i, name in enumerate(names)
        }
        self.asked = dict.fromkeys(names, 0)  # sampler asks: the trial numbers
        self.runs = dict.fromkeys(names, 0)  # trials sent to train: the budget
        self.free_streak = dict.fromkeys(names, 0)  # asks in a row that needed no training
        self.turn = 0
        self.live: dict[str, dict] = {}  # Tune trial id -> {cell, number, identity, ...}
        self.done: dict[tuple[str, str], dict] = {}  # (cell, identity) -> outcome of the first trial with it
        self.waiting: dict[tuple[str, str], list[dict]] = {}  # twins of running trials, resolved when they end
        self._serial = 0

    # ---- Tune's Searcher interface ------------------------------------------------------------

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True  # everything comes from the plan

    def suggest(self, trial_id: str) -> dict | None:
        names = list(self.cells)
        while True:
            open_cells = [n for n in names if self.runs[n] < self.plan.trials_per_cell and self.free_streak[n] < FREE_ASKS_IN_A_ROW]
            if not open_cells:
                return Searcher.FINISHED
            name = names[self.turn % len(names)]
            self.turn += 1
            if name not in open_cells:
                continue
            config = self._ask(name, trial_id)
            if config is None:
                self.free_streak[name] += 1
                continue
            self.free_streak[name] = 0
            self.runs[name] += 1
            return config

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        info = self.live.get(trial_id)
        if info is not None and OBJECTIVE in result:
            self.cells[info["cell"]].on_trial_result(info["optuna_id"], {OBJECTIVE: result[OBJECTIVE], "training_iteration": result.get("step", 0)})

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        info = self.live.pop(trial_id, None)
        if info is None:
            return
        result = result or {}
        if error:
            status, value = "failed", None
        elif result.get("diverged"):
            status, value = "diverged", self.plan.penalty
        elif result.get("step", 0) < self.plan.steps:
            status, value = "pruned", None
        else:
            status, value = "completed", result.get(OBJECTIVE)
        self._tell(info["cell"], info["optuna_id"], status, value)
        metrics = {k: v for k, v in result.items() if k.startswith(("val_", "train_")) and isinstance(v, (int, float))}
        record = self._record(info, status, value=result.get(self.plan.metric) if status != "diverged" else None,
                              steps=result.get("step", 0), metrics=metrics, wall_s=result.get("time_total_s", 0.0),
                              note="" if status != "failed" else "the trial raised; see its error file under tune/")
        self.ledger.append(record)
        outcome = {"status": status, "value": value, "number": info["number"], "record": record}
        self.done.setdefault((info["cell"], info["identity"]), outcome)
        for twin in self.waiting.pop((info["cell"], info["identity"]), []):
            self._settle_duplicate(twin, outcome)

    # ---- helpers ------------------------------------------------------------------------------

    def _ask(self, name: str, trial_id: str) -> dict | None:
        """Ask the cell's sampler for a trial; returns a Tune config, or None when it needs no run."""
        self._serial += 1
        optuna_id = f"{trial_id}-{self._serial}"
        params = self.cells[name].suggest(optuna_id) or {}
        number = self.asked[name]
        self.asked[name] += 1
        cell = self.plan.cell(name)
        overrides = self.plan.trial_overrides(cell, params)
        info = {"cell": name, "number": number, "optuna_id": optuna_id, "params": params, "overrides": overrides}
        try:
            recipe = self.plan.recipe(overrides)
            info["identity"] = trial_identity(recipe)
        except SpecError as err:
            self._tell(name, optuna_id, "failed", None)
            self.ledger.append(self._record(info, "failed", note=f"invalid: {err}"))
            return None
        from blockforge.spec.resolve import resolve

        info["alpha"] = alpha_of(recipe)
        info["post_ln_layers"] = resolve(recipe.model).post_ln_count()
        key = (name, info["identity"])
        if key in self.done:
            self._settle_duplicate(info, self.done[key])
            return None
        if any(other["cell"] == name and other["identity"] == info["identity"] for other in self.live.values()):
            self.waiting.setdefault(key, []).append(info)
            return None
        self.live[trial_id] = info
        self.ledger.append(self._record(info, "running"))
        return {"cell": name, "number": number, "identity": info["identity"], "overrides": [list(o) for o in overrides]}

    def _settle_duplicate(self, info: dict, outcome: dict) -> None:
        self._tell(info["cell"], info["optuna_id"], outcome["status"], outcome["value"])
        original = outcome["record"]
        self.ledger.append(self._record(
            info, "duplicate", value=original.value, steps=0, metrics=original.metrics, duplicate_of=outcome["number"],
            note=f"same model and settings as trial {outcome['number']} ({outcome['status']})",
        ))

    def _tell(self, name: str, optuna_id: str, status: str, value: float | None) -> None:
        search = self.cells[name]
        if status in ("completed", "diverged"):
            search.on_trial_complete(optuna_id, result={OBJECTIVE: value})
        else:  # pruned: Optuna must not take a partial value as a finished one; failed: FAIL
            search.on_trial_complete(optuna_id, result=None, error=status == "failed")

    def _record(self, info: dict, status: str, **fields) -> TrialRecord:
        from blockforge.search.trials import trial_dir

        searched = {k: v for k, v in info["overrides"] if k in {d.key for d in self.plan.dimensions} or k in info["params"]}
        identity = info.get("identity", "")
        return TrialRecord(
            cell=info["cell"], trial=info["number"], status=status, identity=identity, overrides=searched,
            alpha=info.get("alpha"), post_ln_layers=info.get("post_ln_layers"), metric=self.plan.metric,
            run_dir=str(trial_dir(self.search_dir, info["cell"], identity)) if identity else "", **fields,
        )

    def save(self, checkpoint_path: str) -> None:
        import pickle

        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.__dict__, f)

    def restore(self, checkpoint_path: str) -> None:
        import pickle

        with open(checkpoint_path, "rb") as f:
            self.__dict__.update(pickle.load(f))


class CellScheduler(FIFOScheduler):
    """One ASHA per cell (created on a cell's first trial), keyed by the trial's config['cell']."""

    def __init__(self, plan: SearchPlan):
        super().__init__()
        self.settings = dict(time_attr="step", metric=OBJECTIVE, mode=plan.mode, max_t=plan.steps,
                             grace_period=plan.asha.grace_steps, reduction_factor=plan.asha.reduction_factor)
        self.by_cell: dict[str, AsyncHyperBandScheduler] = {}

    def _asha(self, trial) -> AsyncHyperBandScheduler:
        cell = trial.config["cell"]
        if cell not in self.by_cell:
            self.by_cell[cell] = AsyncHyperBandScheduler(**self.settings)
        return self.by_cell[cell]

    def set_search_properties(self, metric, mode, **spec) -> bool:
        return True

    def on_trial_add(self, tune_controller, trial) -> None:
        self._asha(trial).on_trial_add(tune_controller, trial)

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        if OBJECTIVE not in result or "step" not in result:
            return TrialScheduler.CONTINUE
        return self._asha(trial).on_trial_result(tune_controller, trial, result)

    def on_trial_complete(self, tune_controller, trial, result: dict) -> None:
        if OBJECTIVE in (result or {}):
            self._asha(trial).on_trial_complete(tune_controller, trial, result)

    def on_trial_remove(self, tune_controller, trial) -> None:
        self._asha(trial).on_trial_remove(tune_controller, trial)

    def debug_string(self) -> str:
        return f"CellScheduler: ASHA per cell over {len(self.by_cell)} cells"

