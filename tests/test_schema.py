"""The JSON Schemas editors check recipes and search files with (`blockforge schema`): every shipped file passes, the
schema and the parser name the same keys, and what the parser refuses by key, type, choice or range the schema flags."""

import dataclasses
import glob
import json
import types
import typing
from pathlib import Path

import jsonschema
import pytest
import yaml

from blockforge.errors import SpecError
from blockforge.schema import json_schema, recipe_key_schema, schema_text
from blockforge.spec.recipe import Recipe, check_dotted_key
from blockforge.spec.search import SearchFile

ROOT = Path(__file__).resolve().parent.parent
RECIPES = sorted(glob.glob(str(ROOT / "recipes" / "**" / "*.yaml"), recursive=True))
SEARCHES = sorted(glob.glob(str(ROOT / "searches" / "*.yaml")))


def validator(kind: str) -> jsonschema.Draft7Validator:
    schema = json_schema(kind)
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def problems(kind: str, text: str) -> list[tuple[str, str]]:
    """(where, what) for each part of a YAML text the schema flags."""
    data = yaml.safe_load(text)
    return [(".".join(map(str, e.absolute_path)), e.message) for e in validator(kind).iter_errors(data)]


def test_every_shipped_recipe_and_search_file_validates_as_written():
    assert len(RECIPES) > 50 and len(SEARCHES) > 5
    assert any("base" in yaml.safe_load(Path(path).read_text()) for path in RECIPES)  # `base:` composition, as written
    for kind, paths in (("recipe", RECIPES), ("search", SEARCHES)):
        check = validator(kind)
        for path in paths:
            errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in check.iter_errors(yaml.safe_load(Path(path).read_text()))]
            assert not errors, f"{path}:\n" + "\n".join(errors)


# ---- the schema and the parser name the same keys ------------------------------------------------------------------


def _alternatives(tp) -> list:
    return [a for a in typing.get_args(tp) if a is not type(None)] if typing.get_origin(tp) in (typing.Union, types.UnionType) else [tp]


def parser_keys(cls: type, key: str = "") -> set[str]:
    """Every key the parser reads into dataclass `cls` (strict.parse), walked from the annotations themselves."""
    found = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        here = f"{key}.{f.name}" if key else f.name
        found.add(here)
        for tp in _alternatives(hints[f.name]):
            args = typing.get_args(tp)
            if dataclasses.is_dataclass(tp):
                found |= parser_keys(tp, here)
            elif typing.get_origin(tp) is list and dataclasses.is_dataclass(args[0]):
                found |= parser_keys(args[0], f"{here}[N]")
            elif typing.get_origin(tp) is dict and dataclasses.is_dataclass(args[1]):
                found |= parser_keys(args[1], f"{here}.NAME")
    return found


def schema_keys(schema: dict, key: str = "") -> set[str]:
    """Every key the JSON Schema names: properties, through anyOf, array items and the values of free-named mappings."""
    found = set()
    for part in [schema, *schema.get("anyOf", [])]:
        for name, sub in part.get("properties", {}).items():
            here = f"{key}.{name}" if key else name
            found |= {here} | schema_keys(sub, here)
        if isinstance(part.get("items"), dict):
            found |= schema_keys(part["items"], f"{key}[N]")
        if isinstance(part.get("additionalProperties"), dict):
            found |= schema_keys(part["additionalProperties"], f"{key}.NAME")
    return found


def test_the_schema_and_the_parser_name_the_same_keys():
    from blockforge.search.config import DISTRIBUTIONS

    assert schema_keys(json_schema("recipe")) == parser_keys(Recipe) | {"base"}  # base: read before parsing (read_composed)
    assert schema_keys(json_schema("search")) == parser_keys(SearchFile) | {f"space.NAME.{kind}" for kind in DISTRIBUTIONS}


def test_every_section_the_parser_reads_strictly_refuses_other_keys():
    def sections(schema):
        for part in [schema, *schema.get("anyOf", [])]:
            if "properties" in part:
                yield part
            for sub in [*part.get("properties", {}).values(), part.get("items"), part.get("additionalProperties")]:
                if isinstance(sub, dict):
                    yield from sections(sub)

    for kind in ("recipe", "search"):
        assert all(part["additionalProperties"] is False for part in sections(json_schema(kind)))


def test_a_dotted_recipe_key_matches_the_pattern_exactly_when_the_parser_takes_it():
    pattern = jsonschema.Draft7Validator(recipe_key_schema())
    keys = {key.replace("[N]", "[0]") for key in parser_keys(Recipe)}
    assert len(keys) > 150
    keys |= {"model.layers.overrides.0.window", "model.layers.pattern[-1].set.rope_theta", "train.betas[1]", "tracking.report_to[0]",
             "model.layers.mix_ln.early.placement.attn", "model.layers.ramp.ffn[0]"}
    wrong = {"model.layers.mix_ln.alfa", "model.dpeth", "model..width", "model.width.", "train.lr[0]", "model.layers.default[0]",
             "base", "steps", "model.layers.overrides[x].window", "model.layers.default.placement.ffn", "data.tokenizer.bpe.size"}
    for key in keys:
        check_dotted_key(Recipe, key)  # the parser takes it
        assert pattern.is_valid(key), key
    for key in wrong:
        with pytest.raises(SpecError):
            check_dotted_key(Recipe, key)
        assert not pattern.is_valid(key), key


# ---- what the parser refuses, the schema flags ----------------------------------------------------------------------


@pytest.mark.parametrize("kind,text,where", [
    ("recipe", "base: base/llama-tiny.yaml\nmodel:\n  layers:\n    default: {placment: pre}\n", "model.layers.default"),
    ("recipe", "model: {family: lama}\n", "model.family"),
    ("recipe", "model:\n  layers:\n    mix_ln: {alpha: 1.5}\n", "model.layers.mix_ln.alpha"),
    ("recipe", "model:\n  layers:\n    mix_ln: {alpha: 0.25, early: postt}\n", "model.layers.mix_ln.early"),
    ("recipe", "train: {warmup: 1.0}\n", "train.warmup"),
    ("recipe", "train: {lr: fast}\n", "train.lr"),
    ("recipe", "train: {steps: 10.5}\n", "train.steps"),
    ("recipe", "model:\n  layers:\n    pattern:\n      - {every: 6, offset: 5}\n", "model.layers.pattern.0"),
    ("recipe", "tracking: {report_to: [comet]}\n", "tracking.report_to.0"),
    ("search", "base: x.yaml\ntrials_per_cel: 4\n", ""),
    ("search", "base: x.yaml\nspace:\n  model.layers.mix_ln.alfa: {uniform: [0.0, 0.5]}\n", "space"),
    ("search", "base: x.yaml\nspace:\n  model.layers.mix_ln.alpha: {uniformm: [0.0, 0.5]}\n", "space.model.layers.mix_ln.alpha"),
    ("search", "base: x.yaml\ncells:\n  model.dpeth: [4, 8]\n", "cells"),
    ("search", "base: x.yaml\nconfirm: {top: 2, seeds: 0}\n", "confirm.seeds"),
    ("search", "base: x.yaml\nconstraints: {kv_cache: {max: 1.0e+6}}\n", "constraints"),
    ("search", "name: no-base\n", ""),
])
def test_a_typo_or_a_value_the_parser_refuses_fails_validation_where_it_is(kind, text, where):
    found = problems(kind, text)
    assert found and all(at == where for at, _ in found), found


def test_null_lists_and_values_beside_sections_are_what_the_parser_takes():
    assert not problems("recipe", "model:\n  heads: null\n  layers:\n    default: {window: null, placement: {attn: none, mlp: post}}\n"
                                  "    mix_ln: {alpha: 0.25, early: {placement: post, qk_norm: true}, late: pre}\n"
                                  "    overrides:\n      - {at: '0:3', window: 128}\n      - {at: [4, 5], layer_scale: null}\n"
                                  "train: {lr: 1e-3, activation_checkpointing: [0, 1]}\ndata: {path: [a.txt, b.txt], source: text}\n")
    assert not problems("search", "base: x.yaml\nspace:\n  model.layers.overrides[0].window: {choice: [64, null]}\n"
                                  "  train.lr: {loguniform: [1.0e-4, 1.0e-2]}\nbaselines:\n  - {model.layers.mix_ln: {alpha: 0.0}}\n"
                                  "transfer: {to: [{model.width: 256, model.depth: 24}]}\n")


def test_the_command_prints_the_schema(tmp_path, capsys):
    from blockforge.cli import main

    assert main(["schema", "search"]) == 0
    assert json.loads(capsys.readouterr().out) == json_schema("search")
    assert main(["schema", "recipe", "--out", str(tmp_path / "recipe.schema.json")]) == 0
    assert (tmp_path / "recipe.schema.json").read_text() == schema_text("recipe")
    schema = json_schema("recipe")
    alpha = schema["properties"]["model"]["properties"]["layers"]["properties"]["mix_ln"]["properties"]["alpha"]
    assert alpha["minimum"] == 0 and alpha["maximum"] == 1 and alpha["description"] == "the fraction of early layers, in [0, 1]"
