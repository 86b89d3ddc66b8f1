"""Any per-layer field is a searchable dotted key, list items included."""

from blockforge.search.config import load_search

from .conftest import write_search


def test_per_layer_fields_are_searchable_keys(tmp_path):
    path = write_search(tmp_path, cells={"model.depth": [4]}, baselines=[], sampler={"grid": {}},
                        space={"model.layers.overrides[0].window": {"grid": [4, 8]}, "model.layers.default.kv_heads": {"grid": [1, 2]}},
                        overrides={"model.layers.overrides": [{"at": "::2", "window": 16}]})
    plan = load_search(path)
    assert len(plan.enumeration("depth=4")) == 4
    recipe = plan.recipe(plan.seed_overrides("depth=4", {"model.layers.overrides[0].window": 8, "model.layers.default.kv_heads": 1}, 0))
    assert [layer.window for layer in recipe.spec.layers] == [8, None, 8, None]
    assert {layer.kv_heads for layer in recipe.spec.layers} == {1}
