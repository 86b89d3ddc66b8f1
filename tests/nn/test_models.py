"""Backbones built from resolved specs: shapes, per-layer variation, attention backends, tying, meta builds."""

import dataclasses

import pytest
import torch

import blockforge
from blockforge.errors import BlockforgeError
from blockforge.spec import ModelSpec, resolve
from blockforge.spec.model import LayerOverride, LayerRules, LayerSettings, MixLN


def llama_spec(**kw):
    base = dict(family="llama", width=48, depth=4, heads=4, ffn=96, vocab=37, context=16)
    base.update(kw)
    return ModelSpec(**base)


def vit_spec(**kw):
    base = dict(family="vit", width=32, depth=3, heads=2, ffn_mult=2.0, image_size=8, patch_size=4, channels=3, classes=5)
    base.update(kw)
    return ModelSpec(**base)


def test_llama_and_vit_output_shapes():
    llama = blockforge.build_model(llama_spec())
    assert llama(torch.randint(0, 37, (2, 9))).shape == (2, 9, 37)
    vit = blockforge.build_model(vit_spec())
    assert vit(torch.randn(3, 3, 8, 8)).shape == (3, 5)


def test_per_layer_heads_and_ffn_are_built_and_run():
    overrides = [LayerOverride(at=[0], heads=2, ffn=200), LayerOverride(at="-1:", heads=6, ffn=40)]
    spec = resolve(llama_spec(layers=LayerRules(overrides=overrides)))
    model = blockforge.build_model(spec)
    assert [b.attn.branch.heads for b in model.layers] == [2, 4, 4, 6]
    assert [b.mlp.branch.down.in_features for b in model.layers] == [200, 96, 96, 40]
    logits = model(torch.randint(0, 37, (2, 7)))
    assert logits.shape == (2, 7, 37) and torch.isfinite(logits).all()
    vit = blockforge.build_model(vit_spec(layers=LayerRules(overrides=[LayerOverride(at=1, heads=4, ffn=8)])))
    assert vit(torch.randn(1, 3, 8, 8)).shape == (1, 5)


@pytest.mark.parametrize("make", [llama_spec, vit_spec])
@pytest.mark.parametrize("placement", ["pre", "post", "sandwich"])
def test_eager_and_sdpa_agree(make, placement):
    spec = resolve(make(layers=LayerRules(default=LayerSettings(placement=placement))))
    sdpa = blockforge.build_model(spec)
    eager = blockforge.build_model(dataclasses.replace(spec, attention="eager"))
    eager.load_state_dict(sdpa.state_dict())
    x = torch.randint(0, 37, (2, 11)) if spec.family == "llama" else torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(sdpa(x), eager(x), atol=1e-5, rtol=1e-5)


def test_xformers_on_cpu_is_a_clear_error():
    model = blockforge.build_model(resolve(llama_spec(attention="xformers")))
    with pytest.raises(BlockforgeError, match="CUDA only"):
        model(torch.randint(0, 37, (1, 4)))


def test_tied_head_shares_the_embedding():
    model = blockforge.build_model(llama_spec(tie_embeddings=True))
    assert model.head.weight is model.embed.weight
    untied = blockforge.build_model(llama_spec())
    assert untied.head.weight is not untied.embed.weight


def test_mix_ln_model_has_post_then_pre_slots():
    model = blockforge.build_model(llama_spec(depth=8, layers=LayerRules(mix_ln=MixLN(alpha=0.25))))
    filled = [(not isinstance(b.attn.out_norm, torch.nn.Identity), not isinstance(b.attn.in_norm, torch.nn.Identity)) for b in model.layers]
    assert filled == [(True, False)] * 2 + [(False, True)] * 6


def test_init_scale_multiplies_layer_std():
    spec = llama_spec(width=256, ffn=512, heads=4, depth=2, layers=LayerRules(overrides=[LayerOverride(at=1, init_scale=3.0)]))
    model = blockforge.build_model(spec)
    s0 = model.layers[0].mlp.branch.down.weight.std().item()
    s1 = model.layers[1].mlp.branch.down.weight.std().item()
    assert s1 / s0 == pytest.approx(3.0, rel=0.05)


def test_meta_build_allocates_nothing():
    model = blockforge.build_model(llama_spec(width=4096, depth=2, heads=32, ffn=11008, vocab=32000), device="meta")
    assert all(p.is_meta for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) > 400_000_000


def test_build_is_seeded():
    torch.manual_seed(3)
    a = blockforge.build_model(llama_spec()).state_dict()
    torch.manual_seed(3)
    b = blockforge.build_model(llama_spec()).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("make", [llama_spec, vit_spec])
def test_one_seed_gives_the_same_initial_weights_across_placements(make):
    """Common random numbers: specs that differ only in placement (and in one layer's width) start equal
    in every parameter they share by name and shape, so candidates of a search are paired by seed."""
    pre = blockforge.build_model(make(), seed=7).state_dict()
    mixed = blockforge.build_model(make(layers=LayerRules(mix_ln=MixLN(alpha=0.5))), seed=7).state_dict()
    wider = blockforge.build_model(make(layers=LayerRules(overrides=[LayerOverride(at=0, ffn=40)])), seed=7).state_dict()
    other_seed = blockforge.build_model(make(), seed=8).state_dict()
    shared = [k for k in pre if k in mixed and pre[k].shape == mixed[k].shape]
    assert len(shared) > 10 and all(torch.equal(pre[k], mixed[k]) for k in shared)
    # A different FFN width in layer 0 changes layer 0's MLP only; every later layer starts as before.
    later = [k for k in pre if k.startswith(("layers.1.", "layers.2."))]
    assert later and all(torch.equal(pre[k], wider[k]) for k in later)
    assert any(pre[k].shape != wider[k].shape for k in pre if k.startswith("layers.0.mlp."))
    weights = [k for k in pre if k.endswith("weight") and pre[k].dim() > 1]
    assert all(not torch.equal(pre[k], other_seed[k]) for k in weights)


def test_every_norm_the_spec_names_has_its_class():
    from blockforge.nn.norms import NORMS as classes
    from blockforge.spec.fields import NORMS

    assert tuple(classes) == NORMS
