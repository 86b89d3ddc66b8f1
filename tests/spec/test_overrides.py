"""Dotted overrides: the same function serves `--set` and search trials; values take the field's type."""

import pytest

from blockforge.errors import SpecError
from blockforge.spec import apply_overrides, load_recipe, parse_assignment, resolve

RECIPES = "recipes"


@pytest.mark.parametrize("text,expected", [
    ("model.layers.mix_ln.alpha=0.125", ("model.layers.mix_ln.alpha", 0.125)),
    ("train.lr=1e-3", ("train.lr", "1e-3")),  # YAML reads 1e-3 as text; the float field accepts it
    ("model.depth=24", ("model.depth", 24)),
    ("model.final_norm=false", ("model.final_norm", False)),
    ("train.betas=[0.9, 0.95]", ("train.betas", [0.9, 0.95])),
    ("data.path=a=b.txt", ("data.path", "a=b.txt")),
])
def test_parse_assignment(text, expected):
    assert parse_assignment(text) == expected


def test_set_changes_the_resolved_model():
    recipe = load_recipe(f"{RECIPES}/llama-tiny-mix.yaml", map(parse_assignment, ["model.layers.mix_ln.alpha=0.5", "train.lr=1e-3", "model.depth=6"]))
    assert recipe.train.lr == 1e-3 and isinstance(recipe.train.lr, float)
    assert [layer.placement for layer in resolve(recipe.model).layers] == ["post"] * 3 + ["pre"] * 3


def test_pairs_and_list_items():
    data = {"model": {"layers": {"overrides": [{"at": 0, "ffn": 3}]}}}
    out = apply_overrides(data, [("model.layers.overrides.0.ffn", 7), ("model.layers.mix_ln.alpha", 0.25)])
    assert out["model"]["layers"]["overrides"][0]["ffn"] == 7
    assert out["model"]["layers"]["mix_ln"] == {"alpha": 0.25}
    assert data["model"]["layers"]["overrides"][0]["ffn"] == 3  # the input is not modified


def test_unknown_key_is_refused_before_anything_runs():
    with pytest.raises(SpecError, match="did you mean 'alpha'"):
        apply_overrides({}, [parse_assignment("model.layers.mix_ln.alpah=0.3")])


def test_wrong_type_names_the_key():
    with pytest.raises(SpecError, match="model.depth: must be an integer"):
        load_recipe(f"{RECIPES}/llama-tiny-mix.yaml", [parse_assignment("model.depth=1.5")])


def test_list_items_by_bracket_index_reach_new_per_layer_fields():
    recipe = load_recipe(f"{RECIPES}/llama-tiny-local-global.yaml", [parse_assignment("model.layers.overrides[0].window=64"),
                                                                      parse_assignment("model.layers.default.window=16")])
    windows = [layer.window for layer in recipe.spec.layers]
    assert windows == [16] * 5 + [64] + [16] * 2
    with pytest.raises(SpecError, match=r"model.layers.overrides\[0\].windoww|did you mean 'window'"):
        load_recipe(f"{RECIPES}/llama-tiny-local-global.yaml", [parse_assignment("model.layers.overrides[0].windoww=4")])
