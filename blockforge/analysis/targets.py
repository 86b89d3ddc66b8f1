"""What `analyze` measures: a run folder, an exported model or a recipe, with the data its recipe names.

A run or export folder holds spec.yaml (the model), its weights and recipe.yaml (the data); a recipe
file describes an untrained model. Analysis samples are validation rows (LM) or images first; when a
budget asks for more than the validation split holds, training samples follow, in the run's order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import torch
from torch import nn

from blockforge.errors import BlockforgeError
from blockforge.io import read_json
from blockforge.spec.recipe import Assignment, Recipe, apply_overrides, load_recipe, read_yaml, recipe_from_data


@dataclass
class Target:
    path: Path
    kind: str  # run | export | recipe
    recipe: Recipe
    label: str = ""

    @property
    def trained(self) -> bool:
        return self.kind != "recipe"

    def step(self) -> int | None:
        """The training step of the weights a run or export holds (None when unknown or untrained)."""
        record = {"run": self.path / "checkpoints" / "latest.json", "export": self.path / "metrics.json"}.get(self.kind)
        if record is None or not record.exists():
            return None
        data = read_json(record, "it is damaged; export the run again")
        return data.get("step") if isinstance(data, dict) else None


def open_target(path: str | Path, overrides: Iterable[Assignment] = ()) -> Target:
    """A Target for a run folder, an export folder or a recipe file; `overrides` are --set style."""
    path = Path(path)
    if path.is_file():
        return Target(path, "recipe", load_recipe(path, overrides))
    if not path.is_dir():
        raise BlockforgeError(f"{path}: no such file or folder; give a run folder, an export folder or a recipe YAML")
    if not (path / "spec.yaml").exists():
        raise BlockforgeError(f"{path}: spec.yaml is missing, so this is not a blockforge run or export folder")
    if not (path / "recipe.yaml").exists():
        raise BlockforgeError(f"{path}: recipe.yaml is missing, so the data to analyse on is unknown")
    data = apply_overrides(read_yaml(path / "recipe.yaml"), overrides)
    recipe = recipe_from_data(data, file=str(path / "recipe.yaml"))
    kind = "export" if (path / "model.safetensors").exists() else "run"
    return Target(path, kind, recipe)


def label_targets(targets: list[Target], *, at_init: bool) -> None:
    """Short, distinct labels for figures: the file or folder name, with its parent when names repeat."""
    names = [t.path.stem if t.kind == "recipe" else t.path.name for t in targets]
    if len(set(names)) < len(names):
        names = [f"{t.path.parent.name}/{name}" for t, name in zip(targets, names)]
    for i, (target, name) in enumerate(zip(targets, names)):
        if names.count(name) > 1:
            name = f"{name} #{i + 1}"
        target.label = f"{name} (init)" if at_init and target.trained else name


def untrained_model(target: Target, seed: int, device: torch.device) -> nn.Module:
    """The target's model as initialized with seed `seed` (what train.seed `seed` starts from)."""
    from blockforge.nn.build import build_model

    return build_model(target.recipe.spec, device=device, seed=seed)


def trained_model(target: Target, device: torch.device) -> nn.Module:
    from blockforge.export import load

    return load(target.path, device=device)


def target_dataset(target: Target, cache: dict | None = None):
    """The dataset of the target's recipe (shared through `cache` by targets with the same data and sizes)."""
    from blockforge.data import dataset_for

    recipe = target.recipe
    spec = recipe.spec
    sizes = dict(seq_len=spec.context, vocab=spec.vocab, image_size=spec.image_size, channels=spec.channels, classes=spec.classes)
    key = (repr(recipe.data), spec.family, tuple(sorted(sizes.items())), recipe.train.seed)
    if cache is not None and key in cache:
        return cache[key]
    data = dataset_for(recipe)
    if cache is not None:
        cache[key] = data
    return data


def _size(batch) -> int:
    return (batch[0] if isinstance(batch, (tuple, list)) else batch).shape[0]


def _first(batch, rows: int):
    if isinstance(batch, (tuple, list)):
        return type(batch)(t[:rows] for t in batch)
    return batch[:rows]


class Samples:
    """Batches holding `count` samples (token rows or images): validation ones first, then, when
    `fill_from_train` allows, training ones. Re-iterable; `used` counts what the last pass took."""

    def __init__(self, data, batch_size: int, count: int, *, fill_from_train: bool):
        self.data, self.batch_size, self.count, self.fill_from_train = data, batch_size, count, fill_from_train
        self.used = {"val": 0, "train": 0}

    def __iter__(self) -> Iterator:
        self.used = {"val": 0, "train": 0}
        splits = [("val", self.data.val_batches(self.batch_size, math.ceil(self.count / self.batch_size)))]
        if self.fill_from_train:
            splits.append(("train", self.data.train_batches(self.batch_size)))
        left = self.count
        if left <= 0:
            return
        for split, batches in splits:
            for batch in batches:
                batch = _first(batch, left)
                left -= _size(batch)
                self.used[split] += _size(batch)
                yield batch
                if left <= 0:
                    return
