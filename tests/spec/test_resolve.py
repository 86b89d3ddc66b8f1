"""Resolution of the authoring form: Mix-LN counts, overrides in order, slices, YAML round trip, hashing."""

import dataclasses

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


@pytest.mark.parametrize("at,expected", [("0:3", [0, 1, 2]), ("-2:", [10, 11]), ("::5", [0, 5, 10]), ("7", [7]), (-1, [11]), ([0, -12], [0, 0])])
def test_select_layers(at, expected):
    assert select_layers(at, 12, "x") == expected


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
