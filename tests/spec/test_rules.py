"""Layer rules beyond Mix-LN: OpenELM's layer-wise scaling (ramp), periodic patterns, the order rules apply in."""

import numpy as np
import pytest

from blockforge.spec import ModelSpec, resolve
from blockforge.spec.model import LayerOverride, LayerRules, LayerSettings, MixLN, Pattern, Ramp
from tiny_data import tiny_llama


def openelm_make_divisible(v, divisor):
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


def test_openelm_270m_layer_wise_scaling_matches_its_formula():
    # OpenELM-270M: model_dim 1280, 16 layers, head_dim 64, 4 query heads per kv head, qkv multipliers (0.5, 1.0),
    # FFN multipliers (0.5, 4.0), FFN divisor 256. Expected values computed here from the published formula.
    width, depth, head_dim, groups = 1280, 16, 64, 4
    qkv = [round(float(v), 2) for v in np.linspace(0.5, 1.0, depth)]
    ffn = [round(float(v), 2) for v in np.linspace(0.5, 4.0, depth)]
    q_heads = [int(openelm_make_divisible(width * m, head_dim * groups)) // head_dim for m in qkv]
    expected = [(h, h // groups, int(openelm_make_divisible(m * width, 256))) for h, m in zip(q_heads, ffn)]
    spec = resolve(ModelSpec(family="llama", width=width, depth=depth, heads=width // head_dim, kv_heads=width // head_dim // groups,
                             head_dim=head_dim, ffn_mult=4.0, ffn_multiple_of=256, vocab=32000, context=2048,
                             layers=LayerRules(default=LayerSettings(qk_norm=True), ramp=Ramp(heads=[0.5, 1.0], ffn=[0.5, 4.0]))))
    assert [(layer.heads, layer.kv_heads, layer.ffn) for layer in spec.layers] == expected
    assert expected[0] == (12, 3, 768) and expected[-1] == (20, 5, 5120)
    assert {layer.head_dim for layer in spec.layers} == {64}


def test_ramps_of_init_scale_and_lr_mult_are_linear():
    spec = resolve(tiny_llama(depth=5, vocab=10, context=8,
                             layers=LayerRules(ramp=Ramp(init_scale=[0.5, 1.5], lr_mult=[1.0, 2.0]))))
    assert [layer.init_scale for layer in spec.layers] == pytest.approx([0.5, 0.75, 1.0, 1.25, 1.5])
    assert [layer.lr_mult for layer in spec.layers] == pytest.approx([1.0, 1.25, 1.5, 1.75, 2.0])


def test_gemma3_pattern_every_sixth_layer_global():
    spec = resolve(tiny_llama(depth=14, vocab=10, context=1024,
                             layers=LayerRules(default=LayerSettings(window=512), pattern=[Pattern(every=6, offset=5, set=LayerSettings(window=None))])))
    assert [i for i, layer in enumerate(spec.layers) if layer.window is None] == [5, 11]
    assert {layer.window for i, layer in enumerate(spec.layers) if i not in (5, 11)} == {512}


def test_rules_apply_in_order_default_mix_ln_ramp_pattern_overrides():
    rules = LayerRules(
        default=LayerSettings(ffn=48, lr_mult=0.5),
        mix_ln=MixLN(alpha=0.5, early=LayerSettings(placement="post", ffn=40)),  # after default: layers 0-1 get ffn 40
        ramp=Ramp(lr_mult=[1.0, 4.0]),  # after mix_ln: every layer's lr_mult replaced
        pattern=[Pattern(every=2, offset=1, set=LayerSettings(ffn=24))],  # after ramp: odd layers
        overrides=[LayerOverride(at=3, ffn=16)],  # last word
    )
    spec = resolve(tiny_llama(vocab=10, context=8, layers=rules))
    assert [layer.placement for layer in spec.layers] == ["post", "post", "pre", "pre"]
    assert [layer.ffn for layer in spec.layers] == [40, 24, 48, 16]
    assert [layer.lr_mult for layer in spec.layers] == pytest.approx([1.0, 2.0, 3.0, 4.0])


def test_rule_settings_that_build_the_same_model_are_duplicates():
    def spec(rules):
        return resolve(ModelSpec(family="llama", width=64, depth=4, heads=4, ffn=128, ffn_multiple_of=16, vocab=10, context=8, layers=rules))

    flat = spec(LayerRules())
    assert spec(LayerRules(ramp=Ramp(ffn=[2.0, 2.0]))).arch_hash() == flat.arch_hash()  # 2.0 x 64 = 128 everywhere
    assert spec(LayerRules(ramp=Ramp(ffn=[1.99, 2.01]))).arch_hash() == flat.arch_hash()  # rounds to the same dims
    assert spec(LayerRules(pattern=[Pattern(every=2, set=LayerSettings(ffn=128))])).arch_hash() == flat.arch_hash()
    assert spec(LayerRules(ramp=Ramp(ffn=[1.0, 2.0]))).arch_hash() != flat.arch_hash()
