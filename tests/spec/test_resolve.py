"""Resolution of the authoring form: Mix-LN counts, overrides in order, slices, YAML round trip, hashing."""

import dataclasses
import re

import pytest
import yaml

from blockforge.errors import SpecError
from blockforge.spec import ModelSpec, mix_ln_count, resolve, select_layers, spec_from_yaml, spec_to_yaml
from blockforge.spec.model import LayerOverride, LayerRules, LayerSettings, MixLN


def spec(depth=12, **kw):
    return ModelSpec(family="llama", width=64, depth=depth, heads=4, ffn=128, vocab=50, context=16, **kw)


@pytest.mark.parametrize("depth,alpha,expected", [(32, 0.0625, 2), (12, 0.25, 3), (24, 0.167, 4), (24, 0.25, 6), (100, 0.29, 29), (10, 0.7, 7)])
def test_mix_ln_count(depth, alpha, expected):
    assert mix_ln_count(alpha, depth) == expected
    placements = [layer.placement for layer in resolve(spec(depth, layers=LayerRules(mix_ln=MixLN(alpha=alpha)))).layers]
    assert placements == ["post"] * expected + ["pre"] * (depth - expected)


@pytest.mark.parametrize("alpha,placement", [(0.0, "pre"), (1.0, "post")])
def test_alpha_extremes_give_uniform_stacks(alpha, placement):
    resolved = resolve(spec(layers=LayerRules(mix_ln=MixLN(alpha=alpha))))
    assert {layer.placement for layer in resolved.layers} == {placement}


def test_mix_ln_early_and_late_are_configurable():
    resolved = resolve(spec(8, layers=LayerRules(mix_ln=MixLN(alpha=0.5, early="deepnorm", late="lns"))))
    assert [layer.placement for layer in resolved.layers] == ["deepnorm"] * 4 + ["lns"] * 4


def test_overrides_apply_in_order_last_wins():
    rules = LayerRules(
        default=LayerSettings(lr_mult=0.5),
        mix_ln=MixLN(alpha=0.25),
        overrides=[
            LayerOverride(at="0:3", placement="sandwich"),
            LayerOverride(at=[2, -1], placement="respost", ffn=256),
            LayerOverride(at="::4", lr_mult=2.0),
        ],
    )
    layers = resolve(spec(layers=rules)).layers
    assert [layer.placement for layer in layers[:4]] == ["sandwich", "sandwich", "respost", "pre"]
    assert layers[11].placement == "respost" and layers[11].ffn == 256 and layers[2].ffn == 256
    assert [layer.lr_mult for layer in layers] == [2.0, 0.5, 0.5, 0.5] * 3
    assert layers[5].ffn == 128


@pytest.mark.parametrize("at,expected", [("0:3", [0, 1, 2]), ("-2:", [10, 11]), ("::5", [0, 5, 10]), ("7", [7]), (-1, [11]), ([0, -1], [0, 11])])
def test_select_layers(at, expected):
    assert select_layers(at, 12, "x") == expected


@pytest.mark.parametrize("at,says", [("-0", "holds -0, which means layer 0"), ("-0:", "holds -0"), ([0, 0], "names layer 0 twice"),
                                     ([0, -12], "names layer 0 twice (as 0 and -12)")])
def test_odd_layer_selections_are_refused_not_read_one_way(at, says):
    with pytest.raises(SpecError, match=re.escape(says)):
        select_layers(at, 12, "model.layers.overrides[0].at")


@pytest.mark.parametrize("at", ["20:", "5:2", [12], [-13], [], "first", "1:2:0"])
def test_select_layers_rejects(at):
    with pytest.raises(SpecError):
        select_layers(at, 12, "model.layers.overrides[0].at")


def test_head_dim_and_ffn_mult():
    s = ModelSpec(family="llama", width=512, depth=2, head_dim=64, ffn_mult=8 / 3, ffn_multiple_of=8, vocab=10, context=4)
    layers = resolve(s).layers
    assert layers[0].heads == 8 and layers[0].ffn == 1368


def test_yaml_round_trip_and_hash():
    rules = LayerRules(mix_ln=MixLN(alpha=0.25), overrides=[LayerOverride(at=5, heads=8, init_scale=0.5)])
    resolved = resolve(spec(layers=rules))
    text = spec_to_yaml(resolved)
    again = spec_from_yaml(yaml.safe_load(text))
    assert again == resolved
    assert again.arch_hash() == resolved.arch_hash()


def test_hash_names_the_architecture_not_the_alpha():
    a = resolve(spec(layers=LayerRules(mix_ln=MixLN(alpha=0.25))))
    b = resolve(spec(layers=LayerRules(mix_ln=MixLN(alpha=0.30))))
    c = resolve(spec(layers=LayerRules(mix_ln=MixLN(alpha=0.34))))
    assert a.arch_hash() == b.arch_hash() != c.arch_hash()
    assert dataclasses.replace(a, attention="eager").arch_hash() == a.arch_hash()


def test_hash_is_stable_across_processes():
    import subprocess
    import sys

    code = (
        "from blockforge.spec import ModelSpec, resolve\n"
        "from blockforge.spec.model import LayerRules, MixLN\n"
        "print(resolve(ModelSpec(family='llama', width=64, depth=12, heads=4, ffn=128, vocab=50, context=16,"
        " layers=LayerRules(mix_ln=MixLN(alpha=0.25)))).arch_hash())"
    )
    here = resolve(spec(layers=LayerRules(mix_ln=MixLN(alpha=0.25)))).arch_hash()
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert here == there


def test_newer_spec_format_is_refused():
    resolved = resolve(spec())
    data = yaml.safe_load(spec_to_yaml(resolved))
    data["format"] = 99
    with pytest.raises(SpecError, match="newer"):
        spec_from_yaml(data, file="spec.yaml")


# ---- the architecture hash names what a spec computes, and is stable across versions ------------------

PINNED = {  # a change to one of these renames every trial of every search folder: make it a decision, not an accident
    "recipes/llama-tiny-mix.yaml": "2f29adc8f3fb937b",
    "recipes/vit-digits-pre.yaml": "c9b2f96bcba7c58a",
    "recipes/llama-130m-openelm.yaml": "2708b3c72091c59e",
    "recipes/llama-7b-mix-0.0625.yaml": "53c48efd4c721e42",
}
ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("recipe", sorted(PINNED))
def test_shipped_recipes_keep_their_pinned_hashes(recipe):
    from blockforge.spec import load_recipe

    assert load_recipe(ROOT / recipe).spec.arch_hash() == PINNED[recipe]


def test_a_trial_identity_is_pinned_too():
    from blockforge.search.config import trial_identity
    from blockforge.spec import load_recipe

    recipe = load_recipe(ROOT / "recipes/llama-tiny-mix.yaml")
    assert (trial_identity(recipe), trial_identity(recipe, with_seed=False)) == ("d2789d67420d", "7528d2226f61")


def test_a_format_bump_or_a_new_defaulted_field_renames_nothing():
    from blockforge.spec.model import SPEC_FORMAT, LayerSpec, ResolvedSpec

    resolved = resolve(spec(layers=LayerRules(mix_ln=MixLN(alpha=0.25))))
    assert dataclasses.replace(resolved, format=SPEC_FORMAT + 1).arch_hash() == resolved.arch_hash()

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class NewerLayer(LayerSpec):
        future_layer_knob: float | None = None

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class NewerSpec(ResolvedSpec):
        future_knob: float = 1.0

    def newer(layer_cap=None, future_knob=1.0):
        layers = tuple(NewerLayer(**{f.name: getattr(layer, f.name) for f in dataclasses.fields(layer)}, future_layer_knob=layer_cap)
                       for layer in resolved.layers)
        plain = {f.name: getattr(resolved, f.name) for f in dataclasses.fields(resolved) if f.name != "layers"}
        return NewerSpec(**plain, layers=layers, future_knob=future_knob)

    assert newer().arch_hash() == resolved.arch_hash()
    assert newer(layer_cap=50.0).arch_hash() != resolved.arch_hash()
    assert newer(future_knob=8.0).arch_hash() != resolved.arch_hash()


def test_settings_a_spec_ignores_do_not_rename_it():
    standard = resolve(spec())
    assert resolve(spec(base_depth=4, depth_alpha=0.5)).arch_hash() == standard.arch_hash()
    assert resolve(spec(dyt_alpha=0.9)).arch_hash() == standard.arch_hash()  # no DyT norm anywhere
    completep = resolve(spec(parametrization="completep", base_depth=4))
    assert completep.arch_hash() != standard.arch_hash()
    assert resolve(spec(parametrization="completep", base_depth=4, depth_alpha=0.5)).arch_hash() != completep.arch_hash()
    assert resolve(spec(norm="dyt", dyt_alpha=0.9)).arch_hash() != resolve(spec(norm="dyt")).arch_hash()


def test_a_spec_file_that_leaves_defaults_out_has_the_hash_of_one_that_spells_them():
    resolved = resolve(spec(layers=LayerRules(overrides=[LayerOverride(at=1, heads=2)])))
    written = yaml.safe_load(spec_to_yaml(resolved))
    spelled = dict(written, layers=[{"kv_heads": layer.kv_heads, "head_dim": layer.head_dim, "norm": layer.norm, "window": None, "qk_norm": False,
                                     "v_norm": False, "layer_scale": None, **row} for layer, row in zip(resolved.layers, written["layers"])])
    old = dict(written, format=1)  # a format-1 file: the newer per-layer fields left out
    for data in (written, spelled, old):
        assert spec_from_yaml(data).arch_hash() == resolved.arch_hash()
