"""Search files: a base recipe, cells, a per-cell space, baselines, objective, scheduler, sampler.

A search file is strict YAML like a recipe. Loading it validates every dotted key against the recipe
schema and resolves every cell with every baseline, so a bad search fails before Ray starts.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from blockforge.errors import BlockforgeError, CorruptFolderError, SpecError
from blockforge.io import read_json
from blockforge.spec.family import get_family
from blockforge.spec.recipe import Recipe, apply_overrides, check_dotted_key, read_composed, read_yaml, recipe_from_data
from blockforge.spec.search import (
    SEED_KEY,
    Asha,
    Confirm,
    Guide,
    Resources,
    Sampler,
    SearchFile,
    Transfer,
    apply_search_sets,
    is_search_key,
)
from blockforge.spec.strict import canonical, parse, stable_hash
from blockforge.spec.tracking import Tracking

# The kinds of a searched key: a range [low, high] (uniform, loguniform, int), or listed values (choice, grid); and
# `layers`, Mix-LN's alpha in one cell as the whole layer counts it reaches (Dimension.in_cell).
RANGES = ("uniform", "loguniform", "int")
LISTED = ("choice", "grid")
COUNTED = ("int", "layers")  # whole numbers low..high
DISTRIBUTIONS = RANGES + LISTED  # what a search file may write
DISCRETE = COUNTED + LISTED
MIX_LN_ALPHA = "model.layers.mix_ln.alpha"
MIX_LN_COUNT = "model.layers.mix_ln.k"  # the sampler's name for floor(alpha * depth), the number of early layers
STEPS_KEY = "train.steps"
MARKER = "search.json"  # in a search folder: the search file, --set overrides and start directory it was started with
OBJECTIVE = "objective"  # the key trials report the (penalised) objective under


def cell_slug(cell: str) -> str:
    """A folder name for a cell ('depth=4__width=64')."""
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", cell.replace(",", "__"))


def trial_rel(cell: str, identity: str) -> str:
    """A trial's run folder relative to its search folder (trials/CELL/IDENTITY)."""
    return f"trials/{cell_slug(cell)}/{identity}"


def trial_dir(search_dir: str | os.PathLike, cell: str, identity: str) -> Path:
    return Path(search_dir) / trial_rel(cell, identity)


@dataclass(frozen=True)
class Dimension:
    """One searched key: its distribution and arguments.

    kind `layers` is Mix-LN's alpha as the sampler sees it in one cell: alpha only matters through
    k = floor(alpha * depth), so the sampler proposes k in args (low, high) under the name
    MIX_LN_COUNT and the trial trains alpha = k / depth, the low end of the range that builds it.
    """

    key: str
    kind: str  # uniform | loguniform | int | choice | grid | layers
    args: tuple
    depth: int | None = None  # kind layers: the cell's depth

    @property
    def name(self) -> str:
        """The parameter's name in the sampler."""
        return MIX_LN_COUNT if self.kind == "layers" else self.key

    def optuna(self):
        import optuna.distributions as d

        if self.kind in COUNTED:
            return d.IntDistribution(*self.args)
        if self.kind in RANGES:
            return d.FloatDistribution(*self.args, log=self.kind == "loguniform")
        return d.CategoricalDistribution(self.args)

    def contains(self, value: Any) -> bool:
        """Whether recipe value `value` is a point of this dimension (a baseline's value, say)."""
        if self.kind in RANGES:
            number = int if self.kind in COUNTED else (int, float)
            return isinstance(value, number) and not isinstance(value, bool) and self.args[0] <= value <= self.args[1]
        return any(value == arg and isinstance(value, bool) == isinstance(arg, bool) for arg in self.args)

    def describe(self) -> str:
        return f"{self.kind}: {json.dumps(list(self.args))}"

    def values(self) -> list:
        """Every value of a discrete dimension, in the sampler's terms."""
        if self.kind in COUNTED:
            return list(range(self.args[0], self.args[1] + 1))
        return list(self.args)

    def in_cell(self, depth: int) -> "Dimension":
        """Mix-LN's alpha over a continuous range becomes the distinct layer counts it reaches at `depth`."""
        if self.key != MIX_LN_ALPHA or self.kind != "uniform":
            return self
        from blockforge.spec.resolve import mix_ln_count

        low, high = self.args
        return Dimension(self.key, "layers", (mix_ln_count(low, depth), mix_ln_count(high, depth)), depth)

    def probes(self) -> list:
        """The values a search probes this dimension at before it starts (validity, sizes, memory plans): every listed
        value, or a range's two ends (as recipe values)."""
        if self.kind in LISTED:
            return list(self.args)
        return [self.to_value(self.args[0]), self.to_value(self.args[-1])]

    def to_value(self, param: Any) -> Any:
        """The recipe value for a sampler value."""
        return param / self.depth if self.kind == "layers" else param

    def to_param(self, value: Any) -> Any:
        """The sampler value for a recipe value (a baseline's alpha becomes its layer count)."""
        if self.kind != "layers":
            return value
        from blockforge.spec.resolve import mix_ln_count

        return mix_ln_count(value, self.depth)


def _parse_dimension(key: str, value: Any, path: str) -> Dimension:
    if not isinstance(value, dict) or len(value) != 1:
        raise SpecError(f"must be one mapping like {{uniform: [0.0, 0.5]}}; kinds: {', '.join(DISTRIBUTIONS)}", path=path)
    (kind, args), = value.items()
    if kind not in DISTRIBUTIONS:
        raise SpecError(f"unknown distribution '{kind}'; choose one of: {', '.join(DISTRIBUTIONS)}", path=path)
    if not isinstance(args, list) or not args:
        raise SpecError(f"{kind} takes a list, e.g. {kind}: [0.0, 0.5]", path=f"{path}.{kind}")
    if kind in RANGES:
        number = int if kind in COUNTED else (int, float)
        if len(args) != 2 or not all(isinstance(a, number) and not isinstance(a, bool) for a in args):
            raise SpecError(f"takes two {'integers' if kind == 'int' else 'numbers'} [low, high]", path=f"{path}.{kind}")
        if not all(math.isfinite(a) for a in args):
            raise SpecError(f"takes two finite numbers [low, high], not {args}", path=f"{path}.{kind}")
        low, high = args
        if not low < high:
            raise SpecError(f"low {low} must be below high {high}", path=f"{path}.{kind}")
        if kind == "loguniform" and low <= 0:
            raise SpecError(f"low must be above zero for a log scale, not {low}", path=f"{path}.{kind}")
        args = [float(low), float(high)] if kind != "int" else args
    else:
        infinite = [a for a in args if isinstance(a, float) and not math.isfinite(a)]
        if infinite:
            raise SpecError(f"lists {infinite[0]}; every value must be finite", path=f"{path}.{kind}")
        if len(set(map(json.dumps, args))) != len(args):
            raise SpecError("lists the same value twice", path=f"{path}.{kind}")
    if key == MIX_LN_ALPHA:
        for value in args:
            _check_alpha(value, f"{path}.{kind}")
    return Dimension(key, kind, tuple(args))


def _check_alpha(value: Any, path: str) -> None:
    """Mix-LN's alpha is a fraction of the layers: the rule's own check decides what a value may be."""
    from blockforge.spec.model import MixLN

    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"holds {value!r}; alpha values are numbers in [0, 1]", path=path)
    try:
        MixLN(alpha=value).check(path)
    except SpecError as err:
        raise SpecError(f"alpha {err.message}; search values inside it", path=path) from None


def _overlap(a: str, b: str) -> bool:
    """Whether two dotted keys set the same value (one equals the other or holds it)."""
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def cell_name(cell: dict[str, Any]) -> str:
    """'depth=4,width=64' from {'model.depth': 4, 'model.width': 64}; 'all' when there are no cells."""
    if not cell:
        return "all"
    return ",".join(f"{key.rsplit('.', 1)[-1]}={value}" for key, value in cell.items())


def trial_identity(recipe: Recipe, *, with_seed: bool = True) -> str:
    """A trial's identity: its resolved architecture plus training and data settings (what decides its result).

    with_seed=False names the *model* the trial replicates: the same identity for every training seed.
    """

    train = canonical(recipe.train)
    if not with_seed:
        train.pop("seed")
    return stable_hash({"arch": recipe.spec.arch_hash(), "train": train, "data": canonical(recipe.data)}, length=12)


@dataclass(frozen=True)
class CellSettings:
    """What a cell's recipe fixes that the search reads, once at load: a full trial's train.steps (cells may differ),
    its evaluation interval, its train.seed (exploration trains with it, confirmation adds seed + 1, ...) and depth."""

    steps: int
    eval_every: int
    base_seed: int
    depth: int


@dataclass
class SearchPlan:
    """A validated search: everything the driver, the searcher and the trials need, as plain data."""

    file: str
    name: str
    base_data: dict
    overrides: list[tuple[str, Any]]
    cells: list[dict[str, Any]]
    dimensions: list[Dimension]
    baselines: list[dict[str, Any]]
    trials_per_cell: int
    metric: str
    mode: str
    penalty: float
    asha: Asha | None
    sampler: Sampler
    resources: Resources
    max_concurrent: int | None
    settings: dict[str, CellSettings]  # per cell (targets included): what its recipe fixes that the search reads
    confirm: Confirm | None
    workdir: str  # the driver's working directory: relative data paths name files there, as for `blockforge train`
    inputs_hash: str  # see fingerprint()
    targets: list[dict[str, Any]] = field(default_factory=list)  # transfer: the larger cells the answers are tested at
    transfer: Transfer | None = None
    costs: list[tuple[str, str]] = field(default_factory=list)  # a cost axis: (cost, min | max) after the quality metric
    constraints: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)  # cost -> (min, max)
    adjustments: list[str] = field(default_factory=list)  # what loading changed in the recipes, each a sentence the driver prints
    search_data: dict = field(default_factory=dict)  # the search file's data as read: search.json keeps it with base_data
    memory_needs: dict[str, int] = field(default_factory=dict)  # cell -> bytes per process of its largest model (the driver plans it)
    guide: Guide | None = None  # law-guided cells (spec/search.py Guide)
    order: list[str] = field(default_factory=list)  # with guide: the proxy cells in the order they run (the first guide the rest)
    keep_checkpoints: int | None = None  # each trial's newest whole checkpoints kept (None: thinned to final weights when done)
    # Where the driver prepared the trials' data (search/run/datasets.py): set_key -> the set's folder or URI. Not part of
    # the fingerprint or of any trial's identity: it says where rows are read from, not which.
    prepared: dict[str, str] = field(default_factory=dict)
    # The trackers the driver logs every trial to (the search file's tracking:, else its base recipe's); like `prepared`,
    # not part of the fingerprint: a resumed search may be watched elsewhere.
    tracking: Tracking = field(default_factory=Tracking)

    def varied_keys(self) -> set[str]:
        """Every key that differs between the search's models: its cells' keys, the space's and the baselines'."""
        return {k for c in self.cells for k in c} | {d.key for d in self.dimensions} | {k for b in self.baselines for k in b}

    @property
    def varies_alpha(self) -> bool:
        """Mix-LN's alpha differs between the models: alpha ranges, Post-LN counts, the alpha plots and law apply."""
        return MIX_LN_ALPHA in self.varied_keys() or bool(self.targets)

    @property
    def against_pre_ln(self) -> bool:
        """Where the norms sit differs between the models (Mix-LN or a placement): verdicts against Pre-LN apply.
        A search over other knobs (heads, windows, the learning rate) compares its models with each other only."""
        return self.varies_alpha or any("mix_ln" in k or "placement" in k for k in self.varied_keys())

    def cell_names(self) -> list[str]:
        """The searched (proxy) cells."""
        return [cell_name(c) for c in self.cells]

    def guide_cells(self) -> list[str]:
        """With guidance: the cells whose answers guide the others (the first `guide.after` in the order)."""
        return self.order[: self.guide.after] if self.guide else []

    def before(self, name: str) -> list[str]:
        """With guidance: the cells before `name` in the order (what a guided cell learns from)."""
        return self.order[: self.order.index(name)] if self.guide and name in self.order else []

    def guided(self, name: str) -> bool:
        """Whether cell `name` explores a window the law predicts (a proxy cell after the guiding ones)."""
        return self.guide is not None and name in self.order[self.guide.after:]

    def length_steps(self, name: str) -> list[int]:
        """With confirm.length: the lengths (steps) the cell's winner and Pre-LN reference are continued to."""
        length = self.confirm.length if self.confirm else None
        return [round(f * self.settings[name].steps) for f in length.factors] if length else []

    def target_names(self) -> list[str]:
        """The transfer stage's target cells."""
        return [cell_name(t) for t in self.targets]

    def all_names(self) -> list[str]:
        return self.cell_names() + self.target_names()

    def cell(self, name: str) -> dict[str, Any]:
        everything = self.cells + self.targets
        return everything[self.all_names().index(name)]

    def resources_of(self, name: str) -> Resources:
        """What a trial of cell `name` asks for: the transfer's own resources in a transfer target, when given."""
        return self.transfer.resources if name in self.target_names() and self.transfer.resources else self.resources

    def stops_early(self, name: str) -> bool:
        """Whether exploration trials of cell `name` may be stopped early (ASHA): only with a scheduler, and not in a cell
        that trains each of its points to the full budget (it enumerates its distinct points, or is guided). The one
        statement of the rule: the trials carry it (config `early_stop`), the pipeline and the compute plan read it."""
        return self.asha is not None and self.enumeration(name) is None and not self.guided(name)

    def trial_overrides(self, cell: dict[str, Any], params: dict[str, Any]) -> list[tuple[str, Any]]:
        return self.overrides + list(cell.items()) + list(params.items())

    def seed_overrides(self, name: str, searched: dict[str, Any], seed: int) -> list[tuple[str, Any]]:
        """The overrides of cell `name`'s model `searched`, trained with `seed`."""
        return self.trial_overrides(self.cell(name), searched) + [(SEED_KEY, seed)]

    def dimensions_in(self, name: str) -> list[Dimension]:
        """The searched dimensions as cell `name`'s sampler sees them (alpha as distinct layer counts)."""
        return [d.in_cell(self.settings[name].depth) for d in self.dimensions]

    def searched_values(self, name: str, params: dict[str, Any]) -> dict[str, Any]:
        """Sampler parameters -> the recipe values they stand for (e.g. k -> alpha = k / depth)."""
        return {d.key: d.to_value(params[d.name]) for d in self.dimensions_in(name) if d.name in params}

    def sampler_params(self, name: str, values: dict[str, Any]) -> dict[str, Any]:
        """Recipe values -> sampler parameters (a baseline's alpha -> its layer count)."""
        dims = {d.key: d for d in self.dimensions_in(name)}
        return {dims[k].name: dims[k].to_param(v) for k, v in values.items() if k in dims}

    def enumeration(self, name: str) -> list[dict[str, Any]] | None:
        """Every distinct point of the cell's space, when all are discrete and they fit the trial budget."""
        dims = self.dimensions_in(name)
        if not all(d.kind in DISCRETE for d in dims):
            return None
        if math.prod(len(d.values()) for d in dims) > self.trials_per_cell:
            return None
        return [dict(zip((d.name for d in dims), combo)) for combo in itertools.product(*(d.values() for d in dims))]

    def first_points(self, name: str) -> list[dict[str, Any]]:
        """What cell `name`'s sampler tries before it samples: the baselines, then (when it fits) every distinct point."""
        points = [self.sampler_params(name, b) for b in self.baselines]
        for point in self.enumeration(name) or []:
            if point not in points:
                points.append(point)
        return points

    def shared_lr(self, name: str) -> float:
        """The learning rate cell `name` trains every model at (unless the search varies it)."""
        return self.recipe(self.trial_overrides(self.cell(name), {})).train.lr

    def probes(self, name: str) -> list[dict[str, Any]]:
        """The points cell `name` is probed at before the search starts (compute and memory plans): its base point, each
        baseline, and each searched value alone (Dimension.probes). Loading checks the same values (_check_values)."""
        return [{}] + [dict(b) for b in self.baselines] + [{d.key: v} for d in self.dimensions_in(name) for v in d.probes()]

    def trainable_recipes(self) -> Iterator[tuple[str, dict[str, Any], Recipe]]:
        """Every recipe the plan's trials can train, as (cell, probe point, recipe): each cell's probe points (`probes`),
        transfer targets included. A point no model is built at is left out: its trials fail, and read or hold nothing."""
        for name in self.all_names():
            for probe in self.probes(name):
                try:
                    recipe = self.recipe(self.trial_overrides(self.cell(name), probe))
                except SpecError:
                    continue
                yield name, probe, recipe

    def recipe(self, overrides: list[tuple[str, Any]], prepared: bool = False) -> Recipe:
        """The recipe of a trial with `overrides` as the search file gives it; with `prepared` (what a trial trains), reading
        the set the driver prepared of its data, if any."""
        recipe = recipe_from_data(anchor_data_paths(apply_overrides(self.base_data, overrides), self.workdir), file=self.file)
        sets = getattr(self, "prepared", None)  # a plan unpickled from a search started before prepared sets has none
        if prepared and sets and recipe.data.prepared is None and recipe.data.kind == "text":
            from blockforge.data.prepared import recipe_layout, set_key

            where = sets.get(set_key(recipe.data, recipe_layout(recipe)))
            if where is not None:
                recipe.data = dataclasses.replace(recipe.data, prepared=where)
        return recipe

    @property
    def continues_completed(self) -> bool:
        """Whether a later stage may continue a trial that completed (the length check, from its checkpoint)."""
        return self.confirm is not None and self.confirm.length is not None

    @property
    def checkpoints_kept(self) -> int:
        """Whole checkpoints a trial keeps while it trains: the plan's keep_checkpoints, else only the newest."""
        return getattr(self, "keep_checkpoints", None) or 1

    def fingerprint(self) -> str:
        """What the search was started with: the search file's data, its base recipe's and the --set overrides
        (inputs, not this plan's layout, so a newer blockforge still recognises an unchanged file)."""
        return self.inputs_hash


def anchor_data_paths(data: dict, workdir: str) -> dict:
    """`data` with its relative local paths (data.path, data.prepared, a local data.tokenizer.hf folder) made absolute from workdir.

    Tune starts every trial in a folder of its own, where a path relative to the directory the search was
    started from would name nothing.
    """
    section = data.get("data")
    if not isinstance(section, dict):
        return data

    def anchored(value):
        if not isinstance(value, str) or value.startswith("~") or os.path.isabs(value):
            return value
        return os.path.join(workdir, value)

    section = dict(section)
    if isinstance(section.get("path"), list):
        section["path"] = [anchored(p) for p in section["path"]]
    elif section.get("path") is not None:
        section["path"] = anchored(section["path"])
    if isinstance(section.get("prepared"), str) and "://" not in section["prepared"]:
        section["prepared"] = anchored(section["prepared"])
    tokenizer = section.get("tokenizer")
    if isinstance(tokenizer, dict) and isinstance(tokenizer.get("hf"), str) and os.path.isdir(os.path.join(workdir, tokenizer["hf"])):
        section["tokenizer"] = {**tokenizer, "hf": anchored(tokenizer["hf"])}
    return {**data, "data": section}


def _check_local_data(recipe: Recipe) -> None:
    """Local data that is not there fails now, once, rather than in every trial."""
    from blockforge.data.corpus import expand_paths
    from blockforge.errors import DataError

    data = recipe.data
    if data.source == "text":
        try:
            expand_paths(data.path)
        except DataError as err:
            raise SpecError(str(err).removeprefix("data.path: "), path="data.path") from None
    elif data.source in ("fashion-mnist", "image-folder") and not os.path.isdir(os.path.expanduser(data.path)):
        raise SpecError(f"{data.path!r} is not a folder; point it at the {data.source} data", path="data.path")


def divergence_penalty(metric: str, mode: str, max_loss: float | None) -> float:
    """The objective a diverged trial records, in the metric's own units and worse than any real value: the divergence
    ceiling of the loss (default 100) for a loss, its exponential for a perplexity, -1 for a metric to maximize (an
    accuracy). The sampler learns a diverged trial as the worst it has seen, never as a good one."""
    if mode == "max":
        return -1.0
    ceiling = max_loss or 100.0
    return math.exp(ceiling) if metric.endswith("_ppl") else ceiling


def load_search(path: str | os.PathLike, overrides: list[tuple[str, Any]] | None = None, workdir: str | None = None,
                kept: dict | None = None) -> SearchPlan:
    """Read, validate and pre-flight a search file; any problem is one SpecError naming the key path.

    `workdir`: where relative data paths point (default: the current directory). `kept`: the search file's and its
    base recipe's data as search.json keeps them ({"search": ..., "base": ...}), read instead of the files (a search
    folder on a machine without them); local data paths are not checked then, since nothing trains from them here.
    """
    try:
        return _load_search(Path(path), overrides, workdir or os.getcwd(), kept)
    except SpecError as err:
        raise err.located(str(path)).given_by(overrides) from None


def folder_marker(plan: SearchPlan, overrides: list[tuple[str, Any]] | None) -> dict:
    """What search.json records: enough to rebuild the plan a search folder was started with, on any machine (the
    search file's and its base recipe's data are kept beside their names)."""
    return {"file": str(Path(plan.file).resolve()), "fingerprint": plan.fingerprint(), "name": plan.name,
            "overrides": [[key, value] for key, value in overrides or []], "workdir": plan.workdir,
            "kept": {"search": plan.search_data, "base": plan.base_data}}


def read_marker(search_dir: Path) -> dict:
    """A search folder's search.json; a damaged one is one sentence."""
    path = Path(search_dir) / MARKER
    marker = read_json(path, "the search folder is damaged; start the search again with another --out")
    if not isinstance(marker, dict) or not all(isinstance(marker.get(k), str) for k in ("file", "fingerprint")):
        raise CorruptFolderError(f"{path}: names no search file and fingerprint; the search folder is damaged; "
                                 "start the search again with another --out")
    return marker


def stored_plan(search_dir: Path) -> SearchPlan:
    """The plan a search folder was started with: its file, --set overrides and start directory, checked unchanged.
    A folder whose search.json keeps the files' data is rebuilt from it (the files may be elsewhere, or gone)."""
    marker = read_marker(search_dir)
    kept = marker.get("kept")
    if not (isinstance(kept, dict) and isinstance(kept.get("search"), dict) and isinstance(kept.get("base"), dict)):
        kept = None  # a folder from before search.json kept them: the files must be where they were
    plan = load_search(marker["file"], [tuple(o) for o in marker.get("overrides", [])], workdir=marker.get("workdir"), kept=kept)
    if plan.fingerprint() != marker["fingerprint"]:
        raise BlockforgeError(f"{marker['file']}: changed since the search in {search_dir} started; "
                              "restore the file it ran with (its results belong to that one)")
    return plan


def _check_fixed_or_searched(spec: SearchFile, assignments: list, fail) -> None:
    """A key is fixed (overrides, steps, divergence.max_loss, --set), varied by cells, or searched: never two of these.

    Trials apply fixed values, then the cell's, then the sampler's, so a key set twice would keep only the
    last, and cell labels, baselines and reports would name values the trials never trained.
    """
    fixed = [(k, f"overrides.{k}") for k in spec.overrides]
    fixed += [("train.steps", "steps")] if spec.steps is not None else []
    fixed += [("train.divergence.max_loss", "divergence.max_loss")] if spec.divergence.max_loss is not None else []
    set_flags = [(key, f"--set {key}") for key, _ in assignments]
    for key in spec.cells:
        for other, where in fixed + set_flags:
            if _overlap(key, other):
                raise fail(f"is also fixed by {where}; a key is either fixed or varied by cells: remove one", f"cells.{key}")
    for key in spec.space:
        for other, where in fixed + set_flags + [(k, f"cells.{k}") for k in spec.cells]:
            if _overlap(key, other):
                raise fail(f"is also set by {where}; a key is either fixed or searched: remove one", f"space.{key}")
    for i, (key, where) in enumerate(fixed):
        for other, other_where in fixed[i + 1:]:
            if _overlap(key, other):
                raise fail(f"is also set by {other_where}; set it in one place", where)


def _check_baseline(baseline: dict, dimensions: list[Dimension], where: str, checked, fail) -> None:
    """A baseline is a point of the space: every searched key, nothing else, each value inside its dimension."""
    searched = {d.key: d for d in dimensions}
    for key, value in baseline.items():
        checked(key, f"{where}.{key}")
        if key not in searched:
            raise fail(f"is not searched; a baseline sets exactly the searched keys ({', '.join(searched)})", f"{where}.{key}")
        if not searched[key].contains(value):
            raise fail(f"{value!r} is not a point of the space ({searched[key].describe()}); move the baseline inside it", f"{where}.{key}")
    missing = [key for key in searched if key not in baseline]
    if missing:
        raise fail(f"must set every searched key; missing {', '.join(missing)}", where)


def _check_values(dimensions: list[Dimension], cells: list[dict], build, fail) -> None:
    """Each searched value alone on the base recipe, in every cell: a value no cell can build (a wrong type, a
    number out of range) is refused by name, and so is a dimension none of whose values builds in some cell,
    where every trial would fail. Values valid only in some cells stay (their trials there fail, free).
    Continuous ranges are checked at both ends."""
    for d in dimensions:
        values = d.probes()
        errors: dict[int, dict[str, SpecError]] = {}
        for i, value in enumerate(values):
            for cell in cells:
                try:
                    build(cell, [(d.key, value)])
                except SpecError as err:
                    errors.setdefault(i, {})[cell_name(cell)] = err
        where = f"space.{d.key}.{d.kind}"
        for i, failed in errors.items():
            if len(failed) == len(cells):
                err = next(iter(failed.values()))
                what = f"{values[i]!r}" + (f" (item {i})" if d.kind in LISTED else "")
                raise fail(f"{what} builds no model: {err.path + ': ' if err.path else ''}{err.message}", where)
        for cell in cells:
            name = cell_name(cell)
            if values and all(name in errors.get(i, {}) for i in range(len(values))):
                err = errors[0][name]
                raise fail(f"no value builds a model in cell {name} (e.g. {values[0]!r}: {err.path + ': ' if err.path else ''}{err.message})", where)


LANGUAGE_COSTS = ("kv_cache_bytes", "inference_flops_per_token", "generate_tokens_per_s", "train_tokens_per_s")  # need a token


def _objectives(spec: SearchFile, raw: dict, fail):
    """(the quality objective, [(cost, mode)], {cost: (min, max)}): `objectives` is the quality metric first, then costs."""
    from blockforge.spec.search import COMPUTED_COSTS, Objective

    constraints = {}
    for cost, bound in spec.constraints.items():
        if cost not in COMPUTED_COSTS:
            why = "is measured by the trials, so it is not known before one trains" if cost in ("train_tokens_per_s", "generate_tokens_per_s") else "is no cost"
            raise fail(f"{cost} {why}; constrain one of: {', '.join(COMPUTED_COSTS)}", f"constraints.{cost}")
        constraints[cost] = (bound.min, bound.max)
    if spec.objectives is None:
        if constraints:
            raise fail("constrain costs of a search with a cost axis: give objectives (the metric, then costs)", "constraints")
        return spec.objective, [], {}
    if isinstance(raw, dict) and raw.get("objective") is not None:
        raise fail("give objective or objectives, not both", "objectives")
    if not spec.objectives:
        raise fail("is empty; list the quality metric first, then costs (e.g. [{metric: val_loss}, {cost: kv_cache_bytes}]), "
                   "or use objective", "objectives")
    first, *rest = spec.objectives
    if first.metric is None:
        raise fail("must be the quality metric (e.g. {metric: val_loss}); the costs follow it", "objectives[0]")
    for i, entry in enumerate(rest, start=1):
        if entry.cost is None:
            raise fail("is a second metric; a search has one quality metric, first, and costs after it", f"objectives[{i}]")
    if not rest:
        raise fail("lists only the metric; add a cost, e.g. {cost: kv_cache_bytes}, or use objective", "objectives")
    names = [e.cost for e in rest]
    if len(set(names)) != len(names):
        raise fail("lists a cost twice", "objectives")
    return Objective(metric=first.metric, mode=first.mode), [(e.cost, e.mode) for e in rest], constraints


def _targets(spec: SearchFile, cells: list[dict], dimensions: list[Dimension], checked, fail) -> list[dict]:
    """The transfer stage's target cells: each sets exactly the cell keys, at a combination no proxy cell has."""
    if spec.transfer is None:
        return []
    if MIX_LN_ALPHA not in [d.key for d in dimensions]:
        raise fail(f"predicts Mix-LN's alpha at each target; the space must search {MIX_LN_ALPHA}", "transfer")
    if not spec.cells:
        raise fail("needs cells (the proxies the answers come from), e.g. cells: {model.depth: [4, 8, 16]}", "transfer")
    names = {cell_name(c) for c in cells}
    targets = []
    for i, target in enumerate(spec.transfer.to):
        where = f"transfer.to[{i}]"
        if not isinstance(target, dict) or set(target) != set(spec.cells):
            raise fail(f"must set exactly the cell keys ({', '.join(spec.cells)}), e.g. "
                       f"{{{', '.join(f'{k}: ...' for k in spec.cells)}}}", where)
        for key in target:
            checked(key, f"{where}.{key}")
        target = {key: target[key] for key in spec.cells}  # in the cells' order: its name reads like theirs
        if cell_name(target) in names:
            raise fail(f"{cell_name(target)} is a proxy cell already; a target is a size the search does not search", where)
        if target in targets:
            raise fail("lists the same target twice", where)
        targets.append(target)
    return targets


def _tracking_key(key: str) -> bool:
    return key.split(".", 1)[0].split("[", 1)[0] == "tracking"


def _load_search(path: Path, overrides: list[tuple[str, Any]] | None, workdir: str, kept: dict | None = None) -> SearchPlan:
    raw = read_yaml(path) if kept is None else kept["search"]
    given = list(overrides or [])
    sets = [(k, v) for k, v in given if is_search_key(k)]  # --set of the search file's own keys...
    recipe_sets = [(k, v) for k, v in given if not is_search_key(k)]  # ...and of the recipe's
    effective = apply_search_sets(raw, sets) if sets else raw
    load = _Loader(path, parse(SearchFile, effective), workdir, kept)
    spec, fail = load.spec, load.fail
    fixed = load.fixed(recipe_sets)
    dimensions = load.dimensions(recipe_sets)
    trials = load.trials_per_cell(dimensions)
    cells = [dict(zip(spec.cells, combo)) for combo in itertools.product(*spec.cells.values())]
    targets = _targets(spec, cells, dimensions, load.checked, fail)
    objective, costs, constraints = _objectives(spec, effective, fail)
    settings, warmup = load.preflight(fixed, cells + targets, objective, costs)
    _check_values(dimensions, cells, lambda cell, pairs: load.recipe(fixed + list(cell.items()) + pairs), fail)
    asha = spec.scheduler.asha if spec.scheduler is not None else None
    adjustments = _check_asha(asha, settings, warmup, fixed, fail)
    if costs and spec.confirm is not None and spec.confirm.max_seeds is not None:
        raise fail("races two leaders by one quality; a search with a cost axis confirms its front instead: drop max_seeds", "confirm.max_seeds")
    penalty = spec.divergence.penalty
    if penalty is None:
        penalty = divergence_penalty(objective.metric, objective.mode, spec.divergence.max_loss)
    plan = SearchPlan(
        file=str(path), name=spec.name or path.stem, base_data=load.base_data, overrides=fixed, cells=cells,
        dimensions=dimensions, baselines=spec.baselines, trials_per_cell=trials, metric=objective.metric, mode=objective.mode,
        penalty=float(penalty), asha=asha, sampler=spec.sampler, resources=spec.resources, max_concurrent=spec.max_concurrent,
        settings=settings, confirm=spec.confirm, workdir=workdir,
        inputs_hash=stable_hash({"file": {k: v for k, v in raw.items() if k != "tracking"} if isinstance(raw, dict) else raw, "base": load.base_data,
                                 "set": [[key, value] for key, value in given if not _tracking_key(key)]}),
        targets=targets, transfer=spec.transfer, costs=costs, constraints=constraints, adjustments=adjustments, search_data=raw,
        keep_checkpoints=spec.keep_checkpoints, tracking=load.tracking(),
    )
    _check_length(spec, plan, fail)
    _check_lr_curve(spec, plan, load, fail)
    if spec.guide is not None:
        plan.guide = spec.guide
        plan.order = _guide_order(plan, spec, fail)
    from blockforge.search.costs import check_constraints

    check_constraints(plan)  # costs come from the spec: a constraint nothing meets is refused before anything runs
    return plan


class _Loader:
    """Reading one search file: its base recipe, the keys it fixes and searches, and the recipe of each cell, every
    problem one SpecError that names the file and the key."""

    def __init__(self, path: Path, spec: SearchFile, workdir: str, kept: dict | None):
        self.path, self.spec, self.workdir, self.kept = path, spec, workdir, kept
        self.base_path = path.parent / spec.base
        if kept is None and not self.base_path.is_file():
            raise self.fail(f"base recipe '{spec.base}' not found next to the search file ({self.base_path})", "base")
        self.base_data = read_composed(self.base_path) if kept is None else kept["base"]
        # A base recipe's tracking: is the search's default; trials never log themselves (the driver logs them)
        self.base_tracking = self.base_data.pop("tracking", None) if isinstance(self.base_data, dict) else None

    def tracking(self) -> Tracking:
        """The search file's tracking:, else the base recipe's, else none."""
        if self.spec.tracking is not None:
            return self.spec.tracking
        if self.base_tracking is None:
            return Tracking()
        try:
            return parse(Tracking, self.base_tracking, path="tracking")
        except SpecError as err:
            raise err.located(str(self.base_path)) from None

    def fail(self, message: str, where: str) -> SpecError:
        return SpecError(message, path=where, file=str(self.path))

    def checked(self, key: str, where: str) -> str:
        """`key`, if it names a recipe value; else the error, located at `where` in the search file."""
        try:
            check_dotted_key(Recipe, key)
        except SpecError as err:
            raise self.fail(err.message, where) from None
        return key

    def recipe(self, assignments: list) -> Recipe:
        """The base recipe with `assignments` applied, relative data paths anchored where the search was started."""
        return recipe_from_data(anchor_data_paths(apply_overrides(self.base_data, assignments), self.workdir), file=str(self.base_path))

    def fixed(self, recipe_sets: list) -> list[tuple[str, Any]]:
        """What every trial fixes: the file's overrides, steps and divergence ceiling, then --set over them."""
        spec = self.spec
        fixed = [(self.checked(k, f"overrides.{k}"), v) for k, v in spec.overrides.items()]
        if spec.steps is not None:
            fixed.append(("train.steps", spec.steps))
        if spec.divergence.max_loss is not None:
            fixed.append(("train.divergence.max_loss", spec.divergence.max_loss))
        return fixed + [tuple(o) for o in recipe_sets]

    def dimensions(self, recipe_sets: list) -> list[Dimension]:
        """The searched keys, after the cells' and the baselines' keys are checked."""
        spec, fail = self.spec, self.fail
        for key, values in spec.cells.items():
            self.checked(key, f"cells.{key}")
            if not values:
                raise fail("lists no values", f"cells.{key}")
            if len(set(map(json.dumps, values))) != len(values):
                raise fail("lists the same value twice (two cells would be one)", f"cells.{key}")
        dimensions = [_parse_dimension(self.checked(k, f"space.{k}"), v, f"space.{k}") for k, v in spec.space.items()]
        if not dimensions:
            raise fail("is empty: name at least one key to search, e.g. model.layers.mix_ln.alpha: {uniform: [0.0, 0.5]}", "space")
        _check_fixed_or_searched(spec, recipe_sets, fail)
        for i, baseline in enumerate(spec.baselines):
            _check_baseline(baseline, dimensions, f"baselines[{i}]", self.checked, fail)
        return dimensions

    def trials_per_cell(self, dimensions: list[Dimension]) -> int:
        """The trial budget: the file's, else the grid's points and baselines, else 8."""
        spec = self.spec
        grid_size = None
        if spec.sampler.kind == "grid":
            not_grid = [d.key for d in dimensions if d.kind not in LISTED]
            if not_grid:
                raise self.fail(f"the grid sampler needs grid or choice values; {', '.join(not_grid)} is not", "sampler.grid")
            grid_size = math.prod(len(d.args) for d in dimensions)
        elif any(d.kind == "grid" for d in dimensions):
            raise self.fail("grid values need sampler: {grid: {}}; use choice for tpe or random", "space")
        return spec.trials_per_cell if spec.trials_per_cell is not None else (grid_size + len(spec.baselines) if grid_size else 8)

    def preflight(self, fixed: list, cells: list[dict], objective, costs: list) -> tuple[dict[str, CellSettings], dict[str, int]]:
        """The base with the fixed overrides, in every cell (and target), with every baseline: each builds, and the
        objectives are ones its family reports. Returns each cell's settings and learning-rate warmup."""
        settings, warmup = {}, {}
        for cell in cells:
            name = cell_name(cell)
            for probe in [{}] + self.spec.baselines:
                try:
                    recipe = self.recipe(fixed + list(cell.items()) + list(probe.items()))
                    if not probe and self.kept is None:
                        _check_local_data(recipe)
                except SpecError as err:
                    where = f"cell {name}" + (f" with baseline {probe}" if probe else "")
                    raise SpecError(err.message, path=f"{where}: {err.path}" if err.path else where, file=str(self.path)) from None
                if not probe:
                    train = recipe.train
                    settings[name] = CellSettings(train.steps, train.eval_every, train.seed, recipe.model.depth)
                    warmup[name] = train.warmup_steps
                    self._check_reported(recipe, objective, costs)
        return settings, warmup

    def _check_reported(self, recipe: Recipe, objective, costs: list) -> None:
        family = get_family(recipe.model.family)
        reported = (*family.metrics, "train_loss")
        if objective.metric not in reported:
            where = "objectives[0].metric" if self.spec.objectives else "objective.metric"
            raise self.fail(f"'{objective.metric}' is not reported by model.family {recipe.model.family}; choose one of: {', '.join(reported)}",
                            where)
        named = [(cost, f"objectives[{i + 1}].cost") for i, (cost, _) in enumerate(costs)]
        named += [(cost, f"constraints.{cost}") for cost in self.spec.constraints]
        for cost, where in named:
            if cost in LANGUAGE_COSTS and family.sample_unit != "tok":
                what = "tokens trained per second" if cost == "train_tokens_per_s" else "a KV cache, generated tokens"
                raise self.fail(f"{cost} is a language model's cost ({what}); model.family {recipe.model.family} has none: choose "
                                "parameters, non_embedding_parameters, train_flops_per_token or peak_train_memory_bytes", where)


def _check_asha(asha: Asha | None, settings: dict[str, CellSettings], warmup: dict[str, int], fixed: list, fail) -> list[str]:
    """ASHA's grace period against each cell's budget and warmup; where a cell would evaluate less often than the grace
    period, train.eval_every is set to it (appended to `fixed`, each cell's settings updated) and said."""
    if asha is None:
        return []
    for name, cell in settings.items():
        where = f" (cell {name})" if len(settings) > 1 else ""
        if asha.grace_steps > cell.steps:
            raise fail(f"grace_steps {asha.grace_steps} is more than the {cell.steps} steps of a trial{where}", "scheduler.asha.grace_steps")
        if asha.grace_steps <= warmup[name]:
            raise fail(
                f"grace_steps {asha.grace_steps} ends inside the {warmup[name]}-step learning-rate warmup{where}, where losses do not rank "
                f"trials yet; set it above {warmup[name]}", "scheduler.asha.grace_steps",
            )
    if not any(cell.eval_every == 0 or cell.eval_every > asha.grace_steps for cell in settings.values()):
        return []
    # ASHA compares trials at their reports: evaluate at least at every grace period, or it stops late.
    was = ", ".join(sorted({str(cell.eval_every) for cell in settings.values()}))
    for name, cell in settings.items():
        settings[name] = dataclasses.replace(cell, eval_every=asha.grace_steps)
    fixed.append(("train.eval_every", asha.grace_steps))
    return [f"scheduler.asha: train.eval_every is set to {asha.grace_steps} (from {was}) in every cell, so each trial "
            f"is evaluated at every rung; it is part of every trial's identity. To choose it yourself, set "
            f"train.eval_every to at most {asha.grace_steps} in overrides"]


MAX_EPOCHS = 100  # a run that would pass over its training data more often than this is refused before anything trains
BUILTIN_BYTES = 2_000_000  # the built-in corpus (the standard library's documentation) is about 2.1 MB on every Python


def _check_length(spec: SearchFile, plan: SearchPlan, fail) -> None:
    """The lengths a search trains, checked before anything trains: confirm.length's factors give whole steps and the steps
    are not searched; and no cell, transfer target or continuation trains so long that it passes over its training data
    more than MAX_EPOCHS times (a bound of the data, estimated generously from its size at 2 bytes a token)."""
    length = spec.confirm.length if spec.confirm else None
    if length is not None:
        if STEPS_KEY in spec.space or STEPS_KEY in spec.cells:
            where = "space" if STEPS_KEY in spec.space else "cells"
            raise fail(f"continues finalists to multiples of the steps, and {STEPS_KEY} varies here already ({where}); drop one of them",
                       "confirm.length")
        for name, settings in plan.settings.items():
            for i, factor in enumerate(length.factors):
                steps = factor * settings.steps
                if abs(steps - round(steps)) > 1e-9:
                    raise fail(f"{factor:g} x {settings.steps} steps (cell {name}) is {steps:g}, not a whole number of steps; choose a "
                               f"factor that gives one", f"confirm.length.factors[{i}]")
    longest = max(length.factors) if length is not None else 1.0
    targets = set(plan.target_names())
    for name in plan.all_names():
        recipe = plan.recipe(plan.trial_overrides(plan.cell(name), {}))
        available = _data_bytes(recipe)  # text only: images are trained for many passes by design
        if not available:
            continue
        factor = longest if name not in targets else 1.0
        tokens = factor * recipe.train.steps * recipe.train.batch_size * recipe.model.context
        if tokens * 2 / available > MAX_EPOCHS:
            what, where = (f"transfer target {name}", "transfer.to") if name in targets else (f"cell {name}", "steps")
            if factor > 1:
                what, where = f"cell {name} continued to {factor:g}x its steps", "confirm.length.factors"
            raise fail(f"{what} trains {factor * recipe.train.steps:,.0f} steps, about {tokens:.3g} tokens: more than {MAX_EPOCHS} passes over "
                       f"its {available:,} bytes of training data; train fewer steps or give more data", where)


def _check_lr_curve(spec: SearchFile, plan: SearchPlan, load: "_Loader", fail) -> None:
    """The learning-rate curve (confirm.lr_curve, or confirm.lr / confirm.stability) against each cell: lr_max above the
    cell's learning rate, a grid of a size a search can train, a probe no longer than a trial, and every size it predicts
    at a recipe that builds."""
    from blockforge.spec.search import MAX_CURVE_POINTS, lr_curve_of

    found = lr_curve_of(spec.confirm)
    if found is None:
        return
    check, key = found

    def key_of(name: str) -> str:
        """Where the file gave the curve's setting `name` (confirm.lr gives its bounds only)."""
        if key == "confirm.lr_curve":
            return f"confirm.lr_curve.{name}"
        return f"confirm.stability.{name}" if spec.confirm.stability is not None else "confirm.lr.grid"

    for name in plan.cell_names():
        where = f" (cell {name})" if len(plan.cell_names()) > 1 else ""
        shared = plan.shared_lr(name)
        if key == "confirm.lr_curve" and check.lr_min is not None and not check.lr_min < shared:
            raise fail(f"{check.lr_min:g} is not below the search's learning rate {shared:g}{where}; the curve starts below it (to tell a "
                       "collapse from a model that did not train): give a lower one, or leave it out for one coarse step below", key_of("lr_min"))
        if not check.lr_max > shared:
            raise fail(f"{check.lr_max:g} is not above the search's learning rate {shared:g}{where}; the curve goes from below it up "
                       "to lr_max: give a larger one, e.g. 30 times it", key_of("lr_max"))
        grid = check.grid(shared)
        if grid.points > MAX_CURVE_POINTS:
            from dataclasses import replace

            low_end = check.lr_min is not None and replace(check, lr_min=None).grid(shared).points <= MAX_CURVE_POINTS
            raise fail(f"makes a grid of {grid.points:,} learning rates from {grid.lr(grid.floor):.3g} to {check.lr_max:g}{where}, more than "
                       f"{MAX_CURVE_POINTS} a search trains a curve over; give " + ("a higher lr_min" if low_end else
                       "a coarser resolution (e.g. 1.25) or a narrower range"), key_of("lr_min" if low_end else "resolution"))
        if check.steps is not None and check.steps > plan.settings[name].steps:
            raise fail(f"{check.steps} is above the {plan.settings[name].steps} steps of a trial{where}; a probe is at most as "
                       "long as the search's trials", key_of("steps"))
    for i, size in enumerate(check.predict):
        where = f"{key_of('predict')}[{i}]"
        for dotted in size:
            load.checked(dotted, f"{where}.{dotted}")
        try:
            plan.recipe(plan.overrides + list(size.items()))
        except SpecError as err:
            raise fail(f"builds no model: {err.path + ': ' if err.path else ''}{err.message}", where) from None


def _data_bytes(recipe: Recipe) -> int | None:
    """The size of the training text before it is read (None: a source whose size is only known once it is read)."""
    if recipe.data.source == "builtin":
        return BUILTIN_BYTES
    if recipe.data.source != "text":
        return None
    from blockforge.data.corpus import expand_paths

    try:
        return sum(os.path.getsize(p) for p in expand_paths(recipe.data.path))
    except (OSError, BlockforgeError):
        return None


def _guide_order(plan: SearchPlan, spec: SearchFile, fail) -> list[str]:
    """The proxy cells in the order guidance runs them; what guidance needs of the search, checked."""
    names = plan.cell_names()
    guide = spec.guide
    if len(names) <= guide.after:
        raise fail(f"guides later cells by the first {guide.after} answered ones, and this search has {len(names)} cell(s); add cells "
                   "(e.g. more depths) or drop guide", "guide.after")
    if "model.depth" not in spec.cells:
        raise fail("predicts each cell's alpha from a law over depth (and width), so cells must vary model.depth", "guide")
    if not any(d.key == MIX_LN_ALPHA for d in plan.dimensions):
        raise fail(f"narrows the Post-LN counts a cell explores, and {MIX_LN_ALPHA} is not searched here (space)", "guide")
    others = [d.key for d in plan.dimensions if d.key != MIX_LN_ALPHA and d.kind not in DISCRETE]
    if others:
        raise fail(f"enumerates each window of k with every value of the other searched keys; {', '.join(others)} is a range: give "
                   "it as choice or grid values", "guide")
    if spec.confirm is None:
        raise fail("is fitted to answered cells (a winner with the confirmation's seeds); add confirm: {top: 2, seeds: 2}", "guide")
    if plan.costs:
        raise fail("predicts one best k per cell, and a search with a cost axis answers with a front; drop one of them", "guide")
    if guide.order == "file":
        return names
    from blockforge.nn.flops import trial_flops

    cost = {name: trial_flops(plan.recipe(plan.trial_overrides(plan.cell(name), {})))[2] for name in names}
    return sorted(names, key=lambda name: (cost[name], names.index(name)))
