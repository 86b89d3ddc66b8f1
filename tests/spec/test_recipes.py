"""The shipped recipes load, resolve and have the sizes they are named for."""

from pathlib import Path

import pytest

import blockforge
from blockforge.nn.build import parameter_count
from blockforge.spec import load_recipe, resolve

RECIPES = sorted(p for p in Path("recipes").glob("*.yaml"))

# Nominal size -> parameters with untied embeddings (docs/design.md, "Backbones"), within 1%.
SIZES = {"71m": 70.6e6, "130m": 134e6, "250m": 247e6, "1b": 1.34e9, "7b": 6.74e9}


def test_recipes_exist():
    names = {p.stem for p in RECIPES}
    for size in SIZES:
        assert {f"llama-{size}-pre", f"llama-{size}-post", f"llama-{size}-mix"} <= names
    assert {"llama-7b-mix-0.0625", "vit-tiny-pre", "vit-tiny-mix", "vit-small-pre", "vit-small-mix"} <= names


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_recipe_loads(path):
    recipe = load_recipe(path)
    spec = resolve(recipe.model)
    model = blockforge.build_model(spec, device="meta")
    size = next((s for s in SIZES if f"-{s}-" in path.name), None)
    if size and path.stem.endswith("-gqa"):  # k and v lose (heads - kv_heads) heads in every layer
        pre = blockforge.build_model(load_recipe(path.with_name(path.name.replace("-gqa", "-pre"))).spec, device="meta")
        lost = sum(2 * (layer.heads - layer.kv_heads) * layer.head_dim * spec.width for layer in spec.layers)
        assert parameter_count(model) == parameter_count(pre) - lost > 0
    elif size and "-as-" in path.stem:  # another decoder's design at this size: fewer key/value heads, tied embeddings
        pre = blockforge.build_model(load_recipe(path.with_name(f"llama-{size}-pre.yaml")).spec, device="meta")
        lost = sum(2 * (layer.heads - layer.kv_heads) * layer.head_dim * spec.width for layer in spec.layers)
        tied = spec.vocab * spec.width if spec.tie_embeddings else 0
        norms = sum(p.numel() for name, p in model.named_parameters() if "norm" in name) - sum(
            p.numel() for name, p in pre.named_parameters() if "norm" in name)
        assert parameter_count(model) == parameter_count(pre) - lost - tied + norms
    elif size and path.stem.endswith("-openelm"):  # layer-wise scaling: narrow first layers, wide last ones
        assert len({layer.ffn for layer in spec.layers}) > 1 and spec.layers[0].heads < spec.layers[-1].heads
    elif size:
        assert parameter_count(model) == pytest.approx(SIZES[size], rel=0.01)
    if "-mix" in path.stem:
        assert 0 < spec.post_ln_count() < spec.depth
    if path.stem == "llama-7b-mix-0.0625":
        assert spec.post_ln_count() == 2
