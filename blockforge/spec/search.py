"""Search files: the settings a search YAML holds (what `blockforge.search.config.load_search` validates)."""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from blockforge.errors import SpecError, unknown_key_message
from blockforge.spec.strict import bounded, choice
from blockforge.spec.tracking import Tracking

METRICS = {"val_loss": "min", "val_ppl": "min", "train_loss": "min", "val_acc": "max"}
# Costs a search may trade quality against (blockforge.search.costs computes or measures them), with their natural direction
COMPUTED_COSTS = ("parameters", "non_embedding_parameters", "train_flops_per_token", "inference_flops_per_token", "kv_cache_bytes",
                  "peak_train_memory_bytes")
MEASURED_COSTS = ("train_tokens_per_s", "generate_tokens_per_s")
COSTS = {**dict.fromkeys(COMPUTED_COSTS, "min"), **dict.fromkeys(MEASURED_COSTS, "max")}
SEED_KEY = "train.seed"  # the training seed: confirmation's replicates vary it
LR_KEY = "train.lr"  # the learning rate: confirm.lr varies it
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=+-]{0,99}")  # a search's name is a folder name: runs/search-<name>


@dataclass(kw_only=True)
class Objective:
    metric: str = choice(*METRICS, default="val_loss")
    mode: str | None = choice("min", "max", default=None)  # default: the metric's natural direction

    def check(self, path: str) -> None:
        if self.mode is None:
            self.mode = METRICS[self.metric]


@dataclass(kw_only=True)
class ObjectiveEntry:
    """One objective of a search with a cost axis: a metric the trials report, or a cost (blockforge.search.costs)."""

    metric: str | None = choice(*METRICS, default=None)
    cost: str | None = field(default=None, metadata={"choices": tuple(COSTS)})
    mode: str | None = choice("min", "max", default=None)  # default: the metric's or cost's natural direction

    def check(self, path: str) -> None:
        if (self.metric is None) == (self.cost is None):
            raise SpecError("give metric (e.g. val_loss) or cost (e.g. kv_cache_bytes), one of them", path=path)
        if self.mode is None:
            self.mode = METRICS[self.metric] if self.metric is not None else COSTS[self.cost]


@dataclass(kw_only=True)
class Bound:
    min: float | None = None
    max: float | None = None

    def check(self, path: str) -> None:
        if self.min is None and self.max is None:
            raise SpecError("bounds nothing; give max (or min), e.g. {max: 1.0e+6}", path=path)
        for name in ("min", "max"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise SpecError(f"must be a finite number, not {value}", path=f"{path}.{name}")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise SpecError(f"min {self.min:g} is above max {self.max:g}", path=path)


@dataclass(kw_only=True)
class Asha:
    grace_steps: int = bounded(50, at_least=1)
    reduction_factor: float = bounded(3.0, above=1)
    # A trial is stopped at a rung only when behind the rung's cutoff by more than the largest margin by which
    # full-budget curves of its cell (same seed) were overtaken there, and by more than `margin` (in the
    # objective's units). Without `margin`, nothing is stopped until two full-budget curves can be compared.
    margin: float | None = bounded(None, at_least=0, note="in the objective's units")


@dataclass(kw_only=True)
class Scheduler:
    asha: Asha | None = None


@dataclass(kw_only=True)
class SeededSampler:
    seed: int = bounded(0, at_least=0)
    startup_trials: int = bounded(3, at_least=0)  # tpe only: random trials (baselines included) before the model takes over


@dataclass(kw_only=True)
class Sampler:
    tpe: SeededSampler | None = None
    random: SeededSampler | None = None
    grid: dict[str, Any] | None = None

    def check(self, path: str) -> None:
        chosen = [name for name in ("tpe", "random", "grid") if getattr(self, name) is not None]
        if len(chosen) != 1:
            raise SpecError("give exactly one of tpe, random, grid (e.g. sampler: {tpe: {seed: 0}})", path=path)

    @property
    def kind(self) -> str:
        return next(name for name in ("tpe", "random", "grid") if getattr(self, name) is not None)


@dataclass(kw_only=True)
class Divergence:
    # the training loss ceiling after warmup (train.divergence.max_loss)
    max_loss: float | None = bounded(None, above=0, why="is a training-loss ceiling and ")
    penalty: float | None = None  # the objective recorded for a diverged trial (default: a value worse than any)


@dataclass(kw_only=True)
class Resources:
    cpu: float = bounded(1.0, above=0)
    gpu: float = bounded(0.0, at_least=0)
    workers: int | None = bounded(None, at_least=1)  # data-parallel processes per trial (default: one per GPU, at least one)

    def check(self, path: str) -> None:
        if self.gpu > 1 and self.gpu != int(self.gpu):
            raise SpecError(f"a trial uses part of one GPU or whole GPUs; {self.gpu:g} is neither: use a fraction below 1 or {int(self.gpu)}", path=f"{path}.gpu")
        if self.gpu == 0 and self.data_parallel > self.cpu:
            raise SpecError(f"{self.data_parallel} worker processes need at least {self.data_parallel} CPUs; set cpu to {self.data_parallel} or lower workers", path=f"{path}.workers")
        if self.gpu > 1 and self.workers is not None and self.workers != int(self.gpu):
            raise SpecError(f"with {self.gpu:g} GPUs a trial runs one worker per GPU; drop workers or set it to {int(self.gpu)}", path=f"{path}.workers")

    @property
    def data_parallel(self) -> int:
        return self.workers or max(1, int(self.gpu))


@dataclass(kw_only=True)
class LrGrid:
    """Learning rates each finalist and the Pre-LN reference are also trained at (with the confirmation's seeds), so a
    verdict can be given at each candidate's own best learning rate beside the shared one. It asks for the learning-rate
    curve (LrCurve, confirm.lr_curve) from the grid's lowest learning rate to its highest."""

    grid: list[float] = field(metadata={"help": "learning rates, e.g. [0.0015, 0.003, 0.006, 0.012]"})

    def check(self, path: str) -> None:
        if len(self.grid) < 2:
            raise SpecError("lists fewer than two learning rates; give a grid around the shared one, e.g. [0.0015, 0.003, 0.006]",
                            path=f"{path}.grid")
        for i, lr in enumerate(self.grid):
            if not (math.isfinite(lr) and lr > 0):
                raise SpecError(f"must be a finite learning rate above 0, not {lr}", path=f"{path}.grid[{i}]")
        if len(set(self.grid)) != len(self.grid):
            raise SpecError("lists a learning rate twice", path=f"{path}.grid")


@dataclass(kw_only=True)
class LengthCheck:
    """The cell's winner and Pre-LN reference continued from their checkpoints to `factors` times the steps, with the
    confirmation's seeds, so the verdict is also given at longer training; `until_stable` stops once the verdicts at two
    consecutive lengths agree."""

    factors: list[float] = field(metadata={"help": "multiples of the steps, each above 1, e.g. [2, 4]"})
    until_stable: bool = False

    def check(self, path: str) -> None:
        if not self.factors:
            raise SpecError("lists no factor; give e.g. [2, 4] (twice and four times the steps)", path=f"{path}.factors")
        for i, factor in enumerate(self.factors):
            if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor) or factor <= 1:
                raise SpecError(f"must be a number above 1 (a length beyond the search's), not {factor!r}", path=f"{path}.factors[{i}]")
        if sorted(self.factors) != list(self.factors) or len(set(self.factors)) != len(self.factors):
            raise SpecError(f"must rise, each factor once, e.g. [2, 4]; not {list(self.factors)}", path=f"{path}.factors")


@dataclass(kw_only=True)
class StabilityCheck:
    """Each finalist's largest stable learning rate (the baselines' and the Pre-LN reference's too), up to `lr_max`, found
    within a factor `resolution`; each probe trains `steps` steps (default: the cell's own), once per warm-up fraction in
    `warmup` (default: the recipe's own); `predict` names sizes the stability law predicts at. It asks for the
    learning-rate curve (LrCurve, confirm.lr_curve) with these settings: the edge is read off that curve."""

    lr_max: float = field(metadata={"help": "the highest learning rate probed, above the search's, e.g. 0.1"})
    resolution: float = 1.25
    steps: int | None = bounded(None, at_least=1, note="a probe's steps, at most the cell's own")
    warmup: list[float] | None = None
    predict: list[dict[str, Any]] = field(default_factory=list)

    def check(self, path: str) -> None:
        if not (math.isfinite(self.lr_max) and 0 < self.lr_max <= 1e3):
            raise SpecError(f"must be a learning rate above 0 and at most 1000, not {self.lr_max}", path=f"{path}.lr_max")
        if not (math.isfinite(self.resolution) and 1 < self.resolution <= 4):
            raise SpecError(f"is the factor the largest stable learning rate is found within, above 1 and at most 4 (e.g. 1.25), "
                            f"not {self.resolution}", path=f"{path}.resolution")
        _probe_settings(self.warmup, self.predict, path)


MAX_CURVE_POINTS = 256  # learning rates one curve's grid may hold, from its lowest to lr_max: a bound on what a typo costs


@dataclass(kw_only=True)
class LrCurve:
    """One learning-rate curve per candidate: every finalist, the baselines and the Pre-LN reference, per seed of the
    confirmation and per warm-up fraction, trained over a log grid of learning rates from `lr_min` (default: one coarse
    `step` below the search's) up to `lr_max`, in coarse steps of about `step`; the grid grows up until a run is unstable
    (then the edge between the two is found by bisection to within `resolution`), and down, at most `below` more coarse
    steps, while the lowest point is still the best or unstable. Each probe trains `steps` steps (default: the cell's own)
    with the candidate's schedule. From the curve: each one's best learning rate, the verdict at each one's best, its edge
    (the largest stable learning rate) and its LR sensitivity. `predict` names sizes (recipe keys, e.g. {model.depth: 48})
    the stability law says the recipe's learning rate is, or is not, stable at. train/stability.py says what an unstable
    run is. `confirm.lr` ({grid}) and `confirm.stability` ({lr_max, ...}) ask for this same curve."""

    lr_max: float = bounded(above=0, at_most=1000, why="is a learning rate and ", help="the highest learning rate probed, above the search's, e.g. 0.1")
    lr_min: float | None = bounded(None, above=0, at_most=1000, why="is a learning rate and ", note="below the search's, rounded down onto the grid; default: one coarse step below the search's")
    step: float = bounded(2.0, above=1, at_most=10, why="is the factor between the curve's coarse learning rates and ")
    resolution: float = bounded(1.25, above=1, why="is the factor the edge is found within and ", note="and at most step")
    below: int = bounded(2, at_least=0, at_most=8, why="is how many coarse steps the curve may grow below lr_min and ")
    steps: int | None = bounded(None, at_least=1, note="a probe's steps, at most the cell's own")
    warmup: list[float] | None = None
    predict: list[dict[str, Any]] = field(default_factory=list)

    def check(self, path: str) -> None:
        for key in ("lr_max", "lr_min", "step", "resolution"):
            value = getattr(self, key)
            if value is not None and not math.isfinite(value):
                raise SpecError(f"must be a finite number, not {value}", path=f"{path}.{key}")
        if self.lr_min is not None and not self.lr_min < self.lr_max:
            raise SpecError(f"must lie below lr_max {self.lr_max:g}, not {self.lr_min:g}", path=f"{path}.lr_min")
        if not self.resolution <= self.step:
            raise SpecError(f"is the factor the edge is found within: at most step ({self.step:g}), e.g. 1.25; not {self.resolution}",
                            path=f"{path}.resolution")
        _probe_settings(self.warmup, self.predict, path)

    def grid(self, low: float) -> "CurveGrid":
        """The learning rates of a cell whose search trains at `low`."""
        return _curve_grid(low, self)


@dataclass(frozen=True)
class CurveGrid:
    """The learning rates of a cell's curves: index 0 is the search's, `top` is lr_max, coarse points every `every`
    indices; the fixed range starts at `bottom` (lr_min), and a curve may grow `below` more coarse steps under it."""

    low: float
    high: float
    top: int
    every: int
    bottom: int
    below: int

    @property
    def step(self) -> float:
        """The ratio of two neighbouring learning rates: what an edge is known within."""
        return (self.high / self.low) ** (1 / self.top)

    @property
    def floor(self) -> int:
        return self.bottom - self.below * self.every

    @property
    def points(self) -> int:
        return self.top - self.floor + 1

    def lr(self, index: int) -> float:
        if index == 0:
            return self.low
        if index == self.top:
            return self.high
        return float(f"{self.low * self.step ** index:.6g}")  # six figures: a readable override, the same on every machine

    def coarse(self, lowest: int | None = None) -> list[int]:
        return list(range(self.bottom if lowest is None else lowest, self.top + 1, self.every))


def _curve_grid(low: float, settings: "LrCurve") -> CurveGrid:
    """The grid of a cell whose search trains at `low`: fine steps of at most `resolution`, coarse ones of about `step`."""
    every = max(1, round(math.log(settings.step) / math.log(settings.resolution)))
    up = max(1, math.ceil(math.log(settings.lr_max / low) / (every * math.log(settings.resolution)) - 1e-9))
    top = every * up
    coarse = (settings.lr_max / low) ** (every / top)
    down = 1 if settings.lr_min is None else max(1, math.ceil(math.log(low / settings.lr_min) / math.log(coarse) - 1e-9))
    return CurveGrid(low, settings.lr_max, top, every, -every * down, settings.below)


def _probe_settings(warmup: list[float] | None, predict: list, path: str) -> None:
    """The warm-up fractions probed and the sizes predicted at, as confirm.lr_curve and confirm.stability take them (a
    probe's steps are checked as they are parsed: `bounded`)."""
    if warmup is not None:
        if not warmup:
            raise SpecError("lists no warm-up fraction; give e.g. [0.0, 0.1], or leave it out for the recipe's own", path=f"{path}.warmup")
        for i, fraction in enumerate(warmup):
            if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction < 1:
                raise SpecError(f"is a fraction of a probe's steps in [0, 1), not {fraction!r}", path=f"{path}.warmup[{i}]")
        if len(set(warmup)) != len(warmup):
            raise SpecError("lists a warm-up fraction twice", path=f"{path}.warmup")
    for i, size in enumerate(predict):
        if not isinstance(size, dict) or not size:
            raise SpecError("must be a mapping of recipe keys to values, e.g. {model.depth: 48, model.width: 256}", path=f"{path}.predict[{i}]")


def lr_curve_of(confirm: "Confirm | None") -> tuple[LrCurve, str] | None:
    """The learning-rate curve a search's confirmation asks for, and the key that asked: confirm.lr_curve as given; or
    confirm.lr and confirm.stability as the same curve, their grid's lowest rate its lr_min and the highest of the grid and
    confirm.stability.lr_max its lr_max (the rest of confirm.stability as given). None: no curve."""
    if confirm is None:
        return None
    curve, grid, stability = getattr(confirm, "lr_curve", None), confirm.lr, confirm.stability
    if curve is not None:
        return curve, "confirm.lr_curve"
    if grid is None and stability is None:
        return None
    rates = sorted(grid.grid) if grid is not None else []
    lr_max = max([*rates, *([stability.lr_max] if stability is not None else [])])
    settings = {"lr_min": rates[0] if rates else None}
    if stability is not None:
        settings.update(resolution=stability.resolution, step=max(2.0, stability.resolution), steps=stability.steps,
                        warmup=stability.warmup, predict=stability.predict)
    keys = " and ".join(k for k, given in (("confirm.lr", grid), ("confirm.stability", stability)) if given is not None)
    return LrCurve(lr_max=lr_max, **{k: v for k, v in settings.items() if v is not None}), keys


GUIDE_AFTER_MIN = 2  # why: see Guide


@dataclass(kw_only=True)
class Guide:
    """Law-guided cells: cells run in an order (`order`: cheapest trial first, or as the file lists them); once the first
    `after` are answered (confirmed), every later cell first explores only the Post-LN counts k the alpha laws, refitted
    on resampled seeds of those cells, predict for it (their 95% range), `margin` more on each side, and Pre-LN; the window
    grows while the cell's best explored k sits on its edge. Two cells are enough for an interval: a one-parameter law
    fits two points exactly, so AICc cannot choose among the laws (n - k - 1 = 0) and each one-parameter law predicts,
    the window spanning their disagreement; from three cells on, the law with the lowest AICc predicts in each resample.
    One cell cannot tell how alpha moves with depth at all. Three is the default: on the known-answer grid of
    benchmarks/search_reliability.py --multi, windows from two cells were wide enough to cost more than they saved."""

    after: int = 3
    margin: int = 1
    order: str = choice("cost", "file", default="cost")

    def check(self, path: str) -> None:
        if isinstance(self.after, bool) or not isinstance(self.after, int) or self.after < GUIDE_AFTER_MIN:
            raise SpecError(f"must be a whole number of at least {GUIDE_AFTER_MIN}, not {self.after!r}: one answered cell cannot say "
                            "how alpha moves with depth", path=f"{path}.after")
        if isinstance(self.margin, bool) or not isinstance(self.margin, int) or self.margin < 0:
            raise SpecError(f"must be a whole number of Post-LN layers, 0 or more, not {self.margin!r}", path=f"{path}.margin")


@dataclass(kw_only=True)
class Confirm:
    """After a cell's exploration: its `top` best distinct models and its baselines, each trained to the full
    budget with `seeds` further training seeds; racing adds seeds to the two leaders (and the Pre-LN
    reference) until their interval excludes zero or `max_seeds` further seeds are spent. With `lr_curve` (or the keys that
    ask for the same curve, `lr` and `stability`), the finalists, baselines and the reference are also trained over a
    learning-rate curve."""

    top: int = bounded(2, at_least=1)
    seeds: int = bounded(2, at_least=1, note="one more seed gives two replicates")
    max_seeds: int | None = None
    lr: LrGrid | None = None
    length: LengthCheck | None = None
    stability: StabilityCheck | None = None
    lr_curve: LrCurve | None = None

    def check(self, path: str) -> None:
        if self.lr_curve is not None and (self.lr is not None or self.stability is not None):
            given = "confirm.lr" if self.lr is not None else "confirm.stability"
            raise SpecError(f"asks for the same learning-rate curve as {given}; give one of them (lr_curve takes lr_min, lr_max, step, "
                            "resolution, below, steps, warmup and predict)", path=f"{path}.lr_curve")
        if self.max_seeds is not None and self.max_seeds < self.seeds:
            raise SpecError(f"must be at least seeds ({self.seeds}), not {self.max_seeds}", path=f"{path}.max_seeds")


@dataclass(kw_only=True)
class Transfer:
    """After the proxy cells: each target (a combination of the cell keys at a larger size) trains the predicted
    Mix-LN k, `neighbours` k on each side and Pre-LN, with `seeds` paired seeds each at the full budget."""

    to: list[dict[str, Any]] = field(metadata={"help": "target cells, e.g. [{model.width: 256, model.depth: 24}]"})
    seeds: int = bounded(3, at_least=2, note="a paired interval needs two seeds")
    neighbours: int = bounded(1, at_least=0)
    resources: Resources | None = None  # per target trial (default: the search's)

    def check(self, path: str) -> None:
        if not self.to:
            raise SpecError("lists no target; give e.g. to: [{model.width: 256, model.depth: 24}]", path=f"{path}.to")


@dataclass(kw_only=True)
class SearchFile:
    base: str = field(metadata={"help": "the base recipe, relative to the search file"})
    name: str | None = None
    steps: int | None = bounded(None, at_least=1)  # the step budget of a full trial (sets train.steps)
    overrides: dict[str, Any] = field(default_factory=dict)
    cells: dict[str, list[Any]] = field(default_factory=dict)
    space: dict[str, Any] = field(default_factory=dict)
    baselines: list[dict[str, Any]] = field(default_factory=list)
    trials_per_cell: int | None = bounded(None, at_least=1)  # trials trained per cell (duplicates are free); default 8, or the grid size
    objective: Objective = field(default_factory=Objective)
    scheduler: Scheduler | None = None
    sampler: Sampler = field(default_factory=lambda: Sampler(tpe=SeededSampler()))
    divergence: Divergence = field(default_factory=Divergence)
    resources: Resources = field(default_factory=Resources)
    max_concurrent: int | None = bounded(None, at_least=1)
    # Whole checkpoints (with optimizer state) each trial keeps, the newest first; default: its final weights, and its newest
    # checkpoint only while a later stage may continue it
    keep_checkpoints: int | None = bounded(None, at_least=1)
    confirm: Confirm | None = None
    transfer: Transfer | None = None
    guide: Guide | None = None
    # A cost axis: the quality metric first, then one or more costs; constraints keep candidates within cost bounds
    objectives: list[ObjectiveEntry] | None = None
    constraints: dict[str, Bound] = field(default_factory=dict)
    # Experiment trackers every trial is logged to (default: the base recipe's tracking:); not part of what the search is
    tracking: Tracking | None = None

    def check(self, path: str) -> None:  # the root of a search file: key paths start here
        if self.name is not None and (not SAFE_NAME.fullmatch(self.name) or ".." in self.name):
            raise SpecError(
                f"{self.name!r} cannot name a folder; use letters, digits and . _ = + - (up to 100, no '..', no '/')", path="name",
            )
        if self.confirm is not None:
            self._check_confirm()

    def _check_confirm(self) -> None:
        """Confirmation trains its finalists over seeds (and, with lr, learning rates) itself: the search may not vary them."""
        varied = lambda key: "space" if key in self.space else "cells" if key in self.cells else None  # noqa: E731
        if self.confirm.lr is not None and varied(LR_KEY):
            raise SpecError(f"trains the finalists over its own learning-rate grid, and {LR_KEY} varies here already ({varied(LR_KEY)}); "
                            "drop one of them", path="confirm.lr")
        if self.confirm.stability is not None and varied(LR_KEY):
            raise SpecError(f"probes each finalist's learning rate up to lr_max itself, and {LR_KEY} varies here already ({varied(LR_KEY)}); "
                            "drop one of them", path="confirm.stability")
        if getattr(self.confirm, "lr_curve", None) is not None and varied(LR_KEY):
            raise SpecError(f"trains each finalist over its own learning-rate curve, and {LR_KEY} varies here already ({varied(LR_KEY)}); "
                            "drop one of them", path="confirm.lr_curve")
        if varied(SEED_KEY):
            raise SpecError(f"confirmation trains every finalist with several seeds itself; remove {SEED_KEY} here or drop confirm",
                            path=f"{varied(SEED_KEY)}.{SEED_KEY}")



def is_search_key(key: str) -> bool:
    """Whether a --set key names a search file's own setting (trials_per_cell, confirm.seeds, cells.model.depth, ...)
    rather than a recipe value (model..., train..., data...); a key that is neither is refused by name."""
    from blockforge.spec.recipe import Recipe

    root = key.split(".", 1)[0].split("[", 1)[0]
    search_keys = [f.name for f in dataclasses.fields(SearchFile)]
    recipe_keys = [f.name for f in dataclasses.fields(Recipe)]
    if root not in search_keys + recipe_keys:
        raise SpecError(unknown_key_message(root, recipe_keys + search_keys), path=key, file="--set")
    return root in search_keys


def apply_search_sets(raw: dict, sets: list[tuple[str, Any]]) -> dict:
    """A copy of a search file's data with each --set of one of its own keys applied, checked against the file's
    settings as strictly as a recipe key. A mapping keyed by dotted recipe keys (cells, space, overrides, constraints)
    takes the rest of the key as one name: --set cells.model.depth=[4,8]."""
    from blockforge.spec.recipe import key_parts

    data = copy.deepcopy(raw)
    for key, value in sets:
        node, tp, walked = data, SearchFile, []
        parts = key_parts(key)
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            tp = _settings_class(tp)
            if typing.get_origin(tp) is dict:  # the rest of the key is one name of the mapping
                part, last = ".".join(parts[i:]), True
            elif dataclasses.is_dataclass(tp):
                hints = typing.get_type_hints(tp)
                names = [f.name for f in dataclasses.fields(tp)]
                if part not in names:
                    raise SpecError(unknown_key_message(part, names), path=".".join([*walked, part]), file="--set")
                tp = hints[part]
            else:
                raise SpecError(f"'{'.'.join(walked)}' holds a single value or a list, not keys; set it whole", path=key, file="--set")
            if last:
                node[part] = value
                break
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node, walked = node[part], [*walked, part]
    return data


def _settings_class(tp: Any) -> Any:
    """An annotation without its None alternative (a setting that may be left out)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        tp = next(t for t in typing.get_args(tp) if t is not type(None))
    return tp


def mode_sign(mode: str) -> float:
    """1 for a quantity to minimize, -1 for one to maximize: mode_sign(mode) * value is smaller the better it is."""
    return 1.0 if mode == "min" else -1.0
