"""Recipe files: YAML with `base:` composition, strict parsing and dotted overrides (`--set a.b=1`).

A recipe has three separate sections, `model`, `train` and `data` (and `tracking`, where a run is logged); `base:` names one or more recipe
files (relative to this one) that are merged first, mappings key by key and everything else replaced.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, NamedTuple

import yaml

from blockforge.errors import SpecError, unknown_key_message
from blockforge.spec.data import SOURCES, DataConfig
from blockforge.spec.family import get_family
from blockforge.spec.model import ModelSpec, ResolvedSpec
from blockforge.spec.resolve import resolve
from blockforge.spec.strict import parse
from blockforge.spec.strict_yaml import load_text, read_yaml
from blockforge.spec.tracking import Tracking
from blockforge.spec.train import TrainConfig


@dataclass(kw_only=True)
class Recipe:
    hash_excluded = frozenset({"tracking"})  # where a run is watched, not what it trains

    model: ModelSpec = field(metadata={"help": "a recipe needs a model section"})
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tracking: Tracking = field(default_factory=Tracking)

    def check(self, path: str) -> None:
        chosen = self.train.activation_checkpointing
        if not isinstance(chosen, bool):
            from blockforge.spec.resolve import select_layers

            select_layers(chosen, self.model.depth, "train.activation_checkpointing")
        kind = get_family(self.model.family).data_kind
        if self.data.kind != kind:
            raise SpecError(
                f"'{self.data.source}' does not fit model.family {self.model.family}; choose one of: {', '.join(SOURCES[kind])}",
                path="data.source",
            )

    @functools.cached_property
    def spec(self) -> ResolvedSpec:
        """The resolved model, computed once (a recipe is not changed after loading)."""
        return resolve(self.model)


def deep_merge(base: Mapping, top: Mapping) -> dict:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def read_composed(path: str | os.PathLike, _chain: tuple[Path, ...] = ()) -> dict:
    """The recipe at `path` as plain data, with its `base:` files merged underneath."""
    path = Path(path)
    resolved = path.resolve()
    if resolved in _chain:
        raise SpecError("`base:` files include each other in a cycle; break the cycle", path="base", file=str(path))
    data = read_yaml(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError("must be a mapping with model, train and data sections, not a single value or list", file=str(path))
    bases = data.pop("base", None)
    if bases is None:
        return data
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise SpecError("must be a file name or a list of file names", path="base", file=str(path))
    merged: dict = {}
    for base in bases:
        base_path = path.parent / base
        if not base_path.is_file():
            raise SpecError(f"base file '{base}' not found next to this file ({base_path})", path="base", file=str(path))
        merged = deep_merge(merged, read_composed(base_path, _chain + (resolved,)))
    return deep_merge(merged, data)


# ---- dotted overrides -------------------------------------------------------------------------


class Assignment(NamedTuple):
    """One dotted override: `--set KEY=VALUE` on the command line, a fixed or searched key in a search."""

    key: str
    value: Any

    def __str__(self) -> str:
        return f"{self.key}={json.dumps(self.value)}"


def parse_assignment(text: str) -> Assignment:
    """'model.layers.mix_ln.alpha=0.125' -> Assignment('model.layers.mix_ln.alpha', 0.125); values read as YAML."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise SpecError(f"'{text}' is not KEY=VALUE; write e.g. --set model.layers.mix_ln.alpha=0.125", file="--set")
    try:
        parsed = load_text(value, file="--set", base_60_as_text=True) if value.strip() else ""
    except yaml.YAMLError:
        parsed = value
    except SpecError as err:  # a key given twice in a mapping value, an alias bomb
        raise SpecError(f"'{text}': {err.message}", path=key, file="--set") from None
    except RecursionError:
        raise SpecError(f"'{text}' nests too deeply", path=key, file="--set") from None
    return Assignment(key, parsed)


def _field_type(cls: type, key: str) -> Any:
    hints, names = _fields_of(cls)
    if key not in names:
        return None, list(names)
    return hints[key], list(names)


@functools.lru_cache(maxsize=None)
def _fields_of(cls: type) -> tuple[dict, tuple[str, ...]]:
    """A settings class's type hints and init fields (resolving hints is slow; every --set and search trial asks)."""
    return typing.get_type_hints(cls), tuple(f.name for f in dataclasses.fields(cls) if f.init)


def _unwrap(tp: Any) -> list[Any]:
    """The alternatives of a (possibly Optional / union) annotation, minus None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return [t for t in typing.get_args(tp) if t is not type(None)]
    return [tp]


_KEY_PIECE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*|-?\d+)((?:\[-?\d+\])*)")


def key_parts(key: str) -> list[str]:
    """'model.layers.overrides[0].window' (or '...overrides.0.window') -> ['model', 'layers', 'overrides', '0', 'window'].

    Every part must be a name or an index: 'model..width' and 'model.width.' are refused, not read as model.width.
    """
    parts = []
    for piece in key.split("."):
        match = _KEY_PIECE.fullmatch(piece)
        if match is None:
            what = "an empty part" if piece == "" else f"a part {piece!r} that is neither a name nor an index"
            raise SpecError(f"is not a dotted key: it has {what}; write names and list indices joined by single dots, "
                            "e.g. model.layers.mix_ln.alpha or model.layers.overrides[0].window", path=key, file="--set")
        parts.append(match.group(1))
        parts += re.findall(r"-?\d+", match.group(2))
    return parts


def check_dotted_key(root: type, key: str) -> None:
    """Raise SpecError unless `key` names a field reachable from dataclass `root` (list items by index: [0] or .0)."""
    options = [root]
    walked = []
    for part in key_parts(key):
        next_options = []
        known: list[str] = []
        for tp in options:
            if dataclasses.is_dataclass(tp):
                child, names = _field_type(tp, part)
                known += names
                if child is not None:
                    next_options += _unwrap(child)
            elif typing.get_origin(tp) in (list, tuple) and part.lstrip("-").isdigit():
                next_options += _unwrap(typing.get_args(tp)[0])
            elif typing.get_origin(tp) is dict or tp is Any:
                next_options.append(Any)
        if not next_options:
            where = ".".join(walked + [part])
            if known:
                raise SpecError(unknown_key_message(part, dict.fromkeys(known)), path=where, file="--set")
            raise SpecError(f"'{'.'.join(walked)}' holds a single value, not keys", path=where, file="--set")
        options = next_options
        walked.append(part)


def set_dotted(data: dict, key: str, value: Any) -> None:
    """Assign `value` at dotted `key` inside plain data, creating mappings on the way."""
    parts = key_parts(key)
    node: Any = data
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            if not part.lstrip("-").isdigit():
                where = ".".join(parts[:i])
                raise SpecError(f"is a list in the recipe, so '{part}' cannot be set in it; make {where} a mapping, or give a list index",
                                path=where, file="--set")
            index = int(part)
            if not -len(node) <= index < len(node):
                raise SpecError(f"index {index} is out of range (the list has {len(node)} items)", path=".".join(parts[: i + 1]), file="--set")
            if last:
                node[index] = value
            else:
                node = node[index]
            continue
        if last:
            node[part] = value
        else:
            if node.get(part) is None:
                node[part] = {}
            elif not isinstance(node[part], (dict, list)):
                where = ".".join(parts[: i + 1])
                raise SpecError(f"holds the single value {node[part]!r} in the recipe, so {key} cannot be set inside it; fix the recipe",
                                path=where, file="--set")
            node = node[part]


def apply_overrides(data: dict, overrides: Iterable[Assignment], root: type = None) -> dict:
    """A copy of `data` with each (key, value) override applied in order."""
    root = root or Recipe
    data = copy.deepcopy(data)
    for key, value in overrides:
        check_dotted_key(root, key)
        set_dotted(data, key, value)
    return data


def recipe_from_data(data: dict, *, file: str | None = None) -> Recipe:
    """Validate plain recipe data, including that its model resolves (so no compute is spent on a bad spec)."""
    try:
        recipe = parse(Recipe, data)
        recipe.spec  # resolved once, here, so a bad spec fails before any compute
    except SpecError as err:
        raise err.located(file) from None
    return recipe


def load_recipe(path: str | os.PathLike, overrides: Iterable[Assignment] = ()) -> Recipe:
    """Read, compose, override and validate a recipe; any problem is one SpecError sentence."""
    data = read_composed(path)
    data = apply_overrides(data, overrides)
    return recipe_from_data(data, file=str(path))
