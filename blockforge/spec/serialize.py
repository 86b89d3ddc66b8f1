"""Resolved specs as YAML: what is saved beside every checkpoint and export."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from blockforge.errors import SpecError
from blockforge.io import atomic_write_text
from blockforge.spec.model import ResolvedSpec
from blockforge.spec.resolve import check_resolved
from blockforge.spec.recipe import read_yaml
from blockforge.spec.strict import parse, to_plain


def spec_to_yaml(spec: ResolvedSpec) -> str:
    plain = {key: value for key, value in to_plain(spec).items() if value is not None}  # drop the other family's fields
    # One flow-style line per layer keeps a 32-layer spec readable; fields at the value they take when left out are left out.
    layers = []
    for layer, fields in zip(spec.layers, plain.pop("layers")):
        derived = spec.left_out(layer)
        layers.append({key: value for key, value in fields.items() if key not in derived or value != derived[key]})
    text = yaml.safe_dump(plain, sort_keys=False)
    text += "layers:\n" + "".join("- " + yaml.safe_dump(layer, default_flow_style=True, sort_keys=False, width=2**20) for layer in layers)
    return text


def spec_from_yaml(data: dict, *, file: str | None = None) -> ResolvedSpec:
    """A resolved spec from YAML data, checked as strictly as a recipe's model (see resolve.check_resolved)."""
    try:
        spec = parse(ResolvedSpec, data)
        check_resolved(spec)
        return spec
    except SpecError as err:
        raise err.located(file) from None


def save_spec(spec: ResolvedSpec, path: str | os.PathLike) -> None:
    atomic_write_text(path, spec_to_yaml(spec))


def load_spec(path: str | os.PathLike) -> ResolvedSpec:
    return spec_from_yaml(read_yaml(path), file=str(Path(path)))
