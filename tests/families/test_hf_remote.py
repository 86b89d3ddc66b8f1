"""The remote-code export on transformers' attention interface and caches: eager and sdpa compute the same logits,
a static cache generates what a dynamic one does, sliding layers hold only their window (the bytes a search counts),
and attention weights come back when asked for."""

import pytest
import torch
from transformers import AutoModelForCausalLM

import blockforge
from blockforge.export import export_run
from blockforge.nn.attention import KVCache
from blockforge.search.costs import computed_costs
from blockforge.spec import ModelSpec
from blockforge.spec.model import LayerOverride, LayerRules, LayerSettings, MixLN, Pattern
from blockforge.spec.recipe import Recipe

TOL = 1e-5
VOCAB = 300  # the BPE of conftest.py


def windowed_mix_ln(windows=(8, None, 8, None), context=64) -> ModelSpec:
    """Mix-LN (one Post-LN layer of four) with a local:global window pattern and grouped-query attention."""
    overrides = [LayerOverride(at=[i], window=w) for i, w in enumerate(windows) if w is not None]
    layers = LayerRules(default=LayerSettings(placement="pre"), mix_ln=MixLN(alpha=0.25), overrides=overrides)
    return ModelSpec(family="llama", width=32, depth=len(windows), heads=4, kv_heads=2, ffn=64, vocab=VOCAB, context=context, layers=layers)


@pytest.fixture
def export(model_folder, tmp_path):
    def make(spec, name="model"):
        src = model_folder(spec, name=name)
        return src, export_run(src, tmp_path / f"{name}-hf", format="hf")

    return make


def remote(out, **kwargs):
    model, info = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True, output_loading_info=True, **kwargs)
    assert not any(info.values()), info
    assert type(model).__name__ == "BlockforgeForCausalLM"
    return model.eval()


def test_eager_and_sdpa_give_the_same_logits_past_the_windows(export):
    src, out = export(windowed_mix_ln())
    tokens = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(tokens)
    mask[0, :7] = 0  # a left-padded row
    eager, sdpa = remote(out, attn_implementation="eager"), remote(out, attn_implementation="sdpa")
    assert (eager.config._attn_implementation, sdpa.config._attn_implementation) == ("eager", "sdpa")
    with torch.no_grad():
        ours = blockforge.load(src)(tokens)
        for model in (eager, sdpa):
            torch.testing.assert_close(model(tokens).logits, ours, rtol=0, atol=TOL)
        padded = [model(tokens, attention_mask=mask).logits[mask.bool()] for model in (eager, sdpa)]  # real positions only
        torch.testing.assert_close(padded[0], padded[1], rtol=0, atol=TOL)


@pytest.mark.parametrize("windows", [(8, None, 8, None), (8, None, 5, None)], ids=["one window", "two windows"])
def test_a_static_cache_generates_what_a_dynamic_one_does(export, windows):
    src, out = export(windowed_mix_ln(windows))
    model = remote(out)
    prompt = torch.randint(2, VOCAB, (2, 12), generator=torch.Generator().manual_seed(2))
    dynamic = model.generate(prompt, max_new_tokens=20, do_sample=False)
    static = model.generate(prompt, max_new_tokens=20, do_sample=False, cache_implementation="static")
    assert torch.equal(dynamic, static) and dynamic.shape == (2, 32)
    assert torch.equal(dynamic, blockforge.load(src).generate(prompt, 20, temperature=0))


def test_after_64_tokens_both_caches_hold_the_kv_cache_bytes_the_search_counts(export):
    spec = windowed_mix_ln(context=64)
    src, out = export(spec)
    counted = computed_costs(Recipe(model=spec), ("kv_cache_bytes",))["kv_cache_bytes"]
    prompt = torch.randint(2, VOCAB, (1, 40), generator=torch.Generator().manual_seed(3))
    # 40 + 24 positions run through each model (the 25th new token is chosen, never run): 64 tokens, the context
    theirs = remote(out, dtype=torch.bfloat16).generate(prompt, max_new_tokens=25, min_new_tokens=25, do_sample=False,
                                                      return_dict_in_generate=True).cache
    assert theirs.get_seq_length() == 64
    held = sum(layer.keys.nbytes + layer.values.nbytes for layer in theirs.layers)
    ours = KVCache(spec.depth)
    blockforge.load(src).to(torch.bfloat16).generate(prompt, 25, temperature=0, cache=ours)
    assert abs(held - counted) <= 0.01 * counted and abs(ours.nbytes - counted) <= 0.01 * counted
    assert held == ours.nbytes == 2 * 2 * 8 * (7 + 64 + 7 + 64) * 2  # k and v, 2 kv heads of 8, two layers at 8 - 1: bf16


def test_attention_weights_come_back_and_respect_the_windows(export):
    _, out = export(windowed_mix_ln())
    model = remote(out)  # sdpa by default: the weights are computed the eager way
    tokens = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        output = model(tokens, output_attentions=True)
        plain = model(tokens).logits
    torch.testing.assert_close(output.logits, plain, rtol=0, atol=TOL)
    assert len(output.attentions) == 4 and all(a.shape == (1, 4, 20, 20) for a in output.attentions)
    for weights, layer in zip(output.attentions, model.config.layers):
        torch.testing.assert_close(weights.sum(-1), torch.ones(1, 4, 20))
        i, j = torch.meshgrid(torch.arange(20), torch.arange(20), indexing="ij")
        outside = j > i if layer["window"] is None else (j > i) | (j <= i - layer["window"])
        assert weights[..., outside].abs().max() == 0


def test_soft_capped_attention_runs_under_sdpa_as_eager(export):
    layers = LayerRules(default=LayerSettings(placement="sandwich", attn_logit_softcap=2.0, window=6))
    spec = ModelSpec(family="llama", width=32, depth=2, heads=2, ffn=64, vocab=VOCAB, context=32, layers=layers)
    src, out = export(spec)
    tokens = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ours = blockforge.load(src)(tokens)
        for implementation in ("eager", "sdpa"):
            torch.testing.assert_close(remote(out, attn_implementation=implementation)(tokens).logits, ours, rtol=0, atol=TOL)


def test_layers_with_different_heads_and_windows_shape_the_static_cache_per_layer(export):
    layers = LayerRules(default=LayerSettings(placement="pre"), pattern=[Pattern(every=2, set=LayerSettings(window=4))],
                        overrides=[LayerOverride(at=[1], heads=2, kv_heads=1), LayerOverride(at=[2], window=6)])
    spec = ModelSpec(family="llama", width=32, depth=3, heads=4, ffn=64, vocab=VOCAB, context=48, layers=layers)
    src, out = export(spec)
    model = remote(out)
    assert model.config.is_heterogeneous and [c.sliding_window for c in model.config.per_layer_config] == [4, 4, 6]
    prompt = torch.randint(2, VOCAB, (1, 10), generator=torch.Generator().manual_seed(6))
    static = model.generate(prompt, max_new_tokens=12, do_sample=False, cache_implementation="static")
    assert torch.equal(static, blockforge.load(src).generate(prompt, 12, temperature=0))


def test_the_remote_files_hold_every_norm_the_spec_names():
    """The shipped files cannot import blockforge, so they keep their own list of norms: it is spec.fields.NORMS."""
    from blockforge.families.hf_remote import configuration_blockforge, modeling_blockforge
    from blockforge.spec.fields import NORMS

    assert configuration_blockforge.NORMS == NORMS
    assert tuple(modeling_blockforge.NORMS) == NORMS
