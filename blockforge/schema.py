"""JSON Schemas (draft-07) of recipes and search files, for editors that check YAML as it is typed.

`blockforge schema recipe` and `blockforge schema search` print them; the documentation site carries them
(docs/gen_reference.py writes schemas/recipe.json and schemas/search.json at build time). Both are read from the key tree
the reference pages are (blockforge/spec/keys.py): each key's type, its choices (the registered families and placements
among them), its declared range as minimum and maximum, its default and its meaning as the description; a section the
parser reads strictly refuses other keys (`additionalProperties: false`). A search file's dotted recipe keys (`cells`,
`space`, `overrides`, `baselines`, `transfer.to`) must match the pattern of every key a recipe holds, and a `space` value
is one distribution.

A schema is advice to an editor; the parser stays the judge. What only the parser can say is left out: which keys must be
given, in a recipe (any recipe file may be a `base:` that another completes, so only the entries of a list, which a file
always writes whole, name their required keys), and every check across keys (ffn or ffn_mult, heads dividing width, ...).
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from typing import Any

from blockforge.spec.keys import Node, recipe_keys, search_keys
from blockforge.spec.strict import UNSET, Range, to_plain

DRAFT = "http://json-schema.org/draft-07/schema#"
KINDS = ("recipe", "search")
INDEX = r"(?:\[-?\d+\]|\.-?\d+)"  # a list index in a dotted key: [0] or .0 (spec/recipe.py key_parts)
# A number the parser reads from text too: PyYAML (YAML 1.1) reads 1e-3 as a string, and the parser takes it as 0.001.
NUMBER_TEXT = r"^\s*[-+]?(\d[\d_]*\.?[\d_]*|\.\d[\d_]*)([eE][-+]?\d+)?\s*$"


def json_schema(kind: str) -> dict:
    """The JSON Schema of a recipe (`kind` "recipe") or of a search file ("search")."""
    if kind not in KINDS:
        raise ValueError(f"schema kind {kind!r}: choose one of {', '.join(KINDS)}")
    if kind == "recipe":
        body = _section(recipe_keys(), whole=False)
        title = "blockforge recipe"
        about = ("A blockforge recipe: model, train, data and tracking sections; base: names recipe files merged underneath "
                 "this one. Generated from the code (blockforge schema recipe); `blockforge inspect` is the judge.")
    else:
        body = _section(search_keys(), whole=True)
        title = "blockforge search file"
        about = ("A blockforge search file: a base recipe, what varies per cell, the searched keys and the search's "
                 "stages. Generated from the code (blockforge schema search); `blockforge search FILE --plan` is the judge.")
    schema = {"$schema": DRAFT, "title": title, "description": about, **body}
    if kind == "search":
        schema["definitions"] = {"recipe_key": recipe_key_schema()}
    return schema


def schema_text(kind: str) -> str:
    """The schema as the command prints it and the site carries it: indented JSON, keys in the files' order."""
    return json.dumps(json_schema(kind), indent=2) + "\n"


# ---- sections and values --------------------------------------------------------------------------------------------


def _section(node: Node, whole: bool) -> dict:
    """A mapping of keys the parser reads strictly. `whole`: a file gives it whole (a search file; a list's entry), so the
    keys without a default are required; in a recipe, a `base:` may give them."""
    properties = {name: _key(child, whole) for name, child in node.children.items()}
    out: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    required = [name for name, child in node.children.items() if child.required]
    if whole and required:
        out["required"] = required
    return out


def _key(node: Node, whole: bool) -> dict:
    """One key: a section (maybe beside a plain value), a list of sections, a mapping of free names, or a value."""
    if node.names is not None or (node.item is not None and node.item.names is not None):
        schema = _free_names(node)
    elif node.item is not None:
        schema = {"type": "array", "items": _section(node.item, whole=True)}
    else:
        schema = _value(node.annotation, node, whole)
        default = _default(node) if node.cls is None else None
        if default is not None:
            schema["default"] = default
    if node.help:
        schema["description"] = node.help
    return schema


def _value(tp: Any, node: Node, whole: bool) -> dict:
    """What a value of annotation `tp` may be, with the key's choices and range."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        schema = _one_of([_value(a, node, whole) for a in options])
        return _or_null(schema) if type(None) in typing.get_args(tp) else schema
    if dataclasses.is_dataclass(tp):  # the key's section: the tree walked it as this node's children
        return _section(node, whole)
    if origin in (list, tuple):
        return {"type": "array", "items": _value(typing.get_args(tp)[0], node, whole)}
    if origin is dict:
        return {"type": "object", "additionalProperties": _value(typing.get_args(tp)[1], Node(""), whole)}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer", **_bounds(node.range)}
    if tp is float:
        return {"type": ["number", "string"], "pattern": NUMBER_TEXT, **_bounds(node.range)}
    if tp is str:
        return {"type": "string", **({"enum": list(node.choices)} if node.choices else {})}
    return {}  # Any


def _one_of(schemas: list[dict]) -> dict:
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def _or_null(schema: dict) -> dict:
    """`schema`, or null (a key whose null is a value: `window: null`, `heads: null` for the default)."""
    if "enum" in schema:
        return {**schema, "type": [schema["type"], "null"], "enum": [*schema["enum"], None]}
    if isinstance(schema.get("type"), str):
        return {**schema, "type": [schema["type"], "null"]}
    if isinstance(schema.get("type"), list):
        return {**schema, "type": [*schema["type"], "null"]}
    return {"anyOf": [*schema.get("anyOf", [schema]), {"type": "null"}]}


def _bounds(rng: Range | None) -> dict:
    """A declared Range as draft-07 keywords (they apply to numbers only: a number written as text is the parser's)."""
    if rng is None:
        return {}
    out = {}
    if rng.low is not None:
        out["exclusiveMinimum" if rng.low_open else "minimum"] = rng.low
    if rng.high is not None:
        out["exclusiveMaximum" if rng.high_open else "maximum"] = rng.high
    return out


def _default(node: Node) -> Any:
    """A value's default as plain data (an editor offers it), or None where it is computed or unset."""
    if node.required or node.default is None or node.default is UNSET:
        return None
    plain = to_plain(node.default)
    return plain if plain not in ([], {}) else None


# ---- what a search file names: recipe keys, costs ------------------------------------------------------------------


def _free_names(node: Node) -> dict:
    """A mapping whose names are dotted recipe keys (`cells`, `space`, ...), costs (`constraints`) or free (`sampler.grid`);
    a list of such mappings (`baselines`, `transfer.to`)."""
    if node.item is not None:
        return {"type": "array", "items": _free_names(node.item)}
    if node.names == "costs":
        from blockforge.spec.search import COSTS

        return {"type": "object", "propertyNames": {"enum": list(COSTS)}, "additionalProperties": _section(node.values, whole=True)}
    if node.names == "recipe":
        return {"type": "object", "propertyNames": {"$ref": "#/definitions/recipe_key"}, "additionalProperties": _names_value(node)}
    return {"type": "object"}


def _names_value(node: Node) -> dict:
    """What a recipe key is given where a search file names one: a distribution in `space`, the cells' values in `cells`,
    a value elsewhere (the recipe's own check judges it)."""
    key = node.key.rsplit(".", 1)[-1].split("[", 1)[0]
    if key == "space":
        return distribution_schema()
    if key == "cells":
        return {"type": "array", "minItems": 1, "description": "the key's value in each cell (one cell per combination of every key)"}
    return {}


def distribution_schema() -> dict:
    """One distribution of a searched key, as search/config.py reads it: {KIND: [...]} with one KIND."""
    from blockforge.search.config import COUNTED, LISTED, RANGES

    kinds = {}
    for kind in RANGES:
        number = {"type": "integer"} if kind in COUNTED else {"type": "number"}
        kinds[kind] = {"type": "array", "items": number, "minItems": 2, "maxItems": 2, "description": f"{kind}: [LOW, HIGH]"}
    for kind in LISTED:
        kinds[kind] = {"type": "array", "minItems": 1, "description": f"{kind}: the values, each once"}
    return {"type": "object", "properties": kinds, "additionalProperties": False, "minProperties": 1, "maxProperties": 1,
            "description": f"one distribution: {', '.join(f'{{{k}: [...]}}' for k in kinds)}"}


def recipe_key_schema() -> dict:
    """A dotted recipe key (`model.layers.mix_ln.alpha`, `model.layers.overrides[0].window`): its pattern is every key a
    recipe holds, sections and list items by index included, as spec/recipe.py check_dotted_key takes them."""
    return {"type": "string", "pattern": f"^{_key_pattern(recipe_keys())}$",
            "description": "a dotted recipe key, e.g. model.layers.mix_ln.alpha or model.layers.overrides[0].window",
            "patternErrorMessage": "not a recipe key: give a dotted key of a recipe, e.g. model.depth or model.layers.mix_ln.alpha"}


def _key_pattern(node: Node) -> str:
    """The dotted keys below a section, as a regular expression (each key's own prefix is a key too)."""
    names = []
    for name, child in node.children.items():
        if name == "base":
            continue
        if child.item is not None and child.item.children:
            below = f"(?:{INDEX}(?:\\.{_key_pattern(child.item)})?)?"
        elif child.children:
            below = f"(?:\\.{_key_pattern(child)})?"
        else:
            below = f"{INDEX}?" if child.list_value else ""
        names.append(re.escape(name) + below)
    return f"(?:{'|'.join(names)})"
