"""Generation: the KV cache gives what recomputing the whole sequence gives, for every placement."""

import pytest
import torch

import blockforge
from blockforge.errors import BlockforgeError
from blockforge.nn.attention import KVCache
from blockforge.nn.generate import filter_logits, generate
from blockforge.spec.model import LayerRules, LayerSettings, MixLN
from blockforge.spec.placements import PLACEMENTS
from tiny_data import tiny_llama


def llama(placement=None, mix=None, knobs=None, **kw):
    layers = LayerRules(default=LayerSettings(placement=placement or "pre", **(knobs or {})), mix_ln=MixLN(alpha=mix) if mix else None)
    spec = tiny_llama(depth=3, heads=4, vocab=50, context=40, layers=layers, **kw)
    return blockforge.build_model(spec, seed=0).eval()


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
def test_cached_steps_equal_full_recomputation(placement):
    model = llama(placement).double()
    tokens = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(1))
    cache = KVCache(len(model.layers))
    with torch.no_grad():
        prefill = model(tokens[:, :4], cache=cache)
        steps = [model(tokens[:, t : t + 1], cache=cache) for t in range(4, 7)]
        chunk = model(tokens, cache=KVCache(len(model.layers)))  # prefill of everything at once
        full = model(tokens)
    torch.testing.assert_close(prefill, full[:, :4], rtol=0, atol=1e-10)
    torch.testing.assert_close(torch.cat(steps, 1), full[:, 4:], rtol=0, atol=1e-10)
    torch.testing.assert_close(chunk, full, rtol=0, atol=1e-10)


KNOBS = {"gqa": {"kv_heads": 2}, "window": {"window": 3}, "gqa+window+qk_norm": {"kv_heads": 1, "window": 2, "qk_norm": True},
         "layer scale + dyt": {"layer_scale": 0.5, "norm": "dyt"}}


@pytest.mark.parametrize("name", list(KNOBS))
def test_cached_steps_equal_full_recomputation_with_per_layer_knobs(name):
    model = llama(knobs=KNOBS[name]).double()
    tokens = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(1))
    cache = KVCache(len(model.layers))
    with torch.no_grad():
        prefill = model(tokens[:, :5], cache=cache)
        steps = [model(tokens[:, t : t + 1], cache=cache) for t in range(5, 9)]
        full = model(tokens)
    torch.testing.assert_close(torch.cat([prefill] + steps, 1), full, rtol=0, atol=1e-10)
    assert torch.equal(generate(model, tokens[:, :4], 8, temperature=0), generate(model, tokens[:, :4], 8, temperature=0, use_cache=False))


@pytest.mark.parametrize("placement,mix", [("pre", None), ("post", None), ("pre", 0.34), ("deepnorm", None)])
def test_generate_with_and_without_cache_agree(placement, mix):
    model = llama(placement, mix)
    prompt = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(2))
    greedy = generate(model, prompt, 12, temperature=0)
    assert greedy.shape == (2, 17) and torch.equal(greedy[:, :5], prompt)
    assert torch.equal(greedy, generate(model, prompt, 12, temperature=0, use_cache=False))
    sampled = generate(model, prompt, 12, temperature=0.9, top_k=10, seed=3)
    assert torch.equal(sampled, generate(model, prompt, 12, temperature=0.9, top_k=10, seed=3, use_cache=False))
    assert torch.equal(sampled, model.generate(prompt, 12, temperature=0.9, top_k=10, seed=3))
    assert torch.equal(generate(model, prompt, 12, temperature=1.0, top_k=1, seed=5), greedy)  # top-1 is greedy


def test_filter_logits_keeps_the_top_k_and_the_top_p_mass():
    logits = torch.log(torch.tensor([[0.5, 0.05, 0.3, 0.15]]))
    assert torch.isinf(filter_logits(logits, top_k=2)).tolist() == [[False, True, False, True]]
    # 0.5 + 0.3 = 0.8 reaches top_p 0.75: the 0.15 and 0.05 tokens go.
    assert torch.isinf(filter_logits(logits, top_p=0.75)).tolist() == [[False, True, False, True]]
    assert torch.isinf(filter_logits(logits, top_p=0.9)).tolist() == [[False, True, False, False]]
    assert not torch.isinf(filter_logits(logits, top_p=0.01)[0, 0])  # the most likely token always stays


def test_eos_stops_generation_and_the_context_is_respected():
    model = llama()
    prompt = torch.randint(0, 50, (1, 5), generator=torch.Generator().manual_seed(4))
    first = generate(model, prompt, 1, temperature=0)[0, -1].item()
    assert generate(model, prompt, 10, temperature=0, eos_id=first).shape == (1, 6)
    with pytest.raises(BlockforgeError, match="context of 40"):
        generate(model, prompt, 37)  # 5 + 37 tokens, of which the model runs all but the last: 41 positions


def test_a_windowed_layer_holds_only_its_window_and_computes_what_the_full_sequence_does():
    """Past the window, a windowed layer keeps its last w - 1 keys; chunks longer than the window, single steps and
    chunks after the drop still give what the whole sequence gives."""
    from blockforge.spec.model import LayerOverride

    layers = LayerRules(default=LayerSettings(placement="pre", kv_heads=2), overrides=[LayerOverride(at=[0, 2], window=4)])
    model = blockforge.build_model(tiny_llama(depth=3, heads=4, vocab=50, context=40, layers=layers), seed=0).eval().double()
    tokens = torch.randint(0, 50, (2, 20), generator=torch.Generator().manual_seed(1))
    cache = KVCache(len(model.layers))
    with torch.no_grad():
        pieces = [model(tokens[:, :7], cache=cache)]  # longer than the window
        pieces += [model(tokens[:, t : t + 1], cache=cache) for t in range(7, 12)]
        pieces.append(model(tokens[:, 12:17], cache=cache))  # a chunk after keys were dropped
        pieces += [model(tokens[:, t : t + 1], cache=cache) for t in range(17, 20)]
        full = model(tokens)
    torch.testing.assert_close(torch.cat(pieces, 1), full, rtol=0, atol=1e-10)
    assert [layer.keys.shape[2] for layer in cache.layers] == [3, 20, 3]
    assert [layer.seen for layer in cache.layers] == [20, 20, 20]


def test_the_cache_generate_holds_is_the_kv_cache_bytes_a_search_counts():
    from blockforge.search.costs import computed_costs
    from blockforge.spec.model import LayerOverride
    from blockforge.spec.recipe import Recipe

    layers = LayerRules(default=LayerSettings(placement="pre", kv_heads=1), mix_ln=MixLN(alpha=0.34),
                        overrides=[LayerOverride(at=[0, 1], window=8)])
    spec = tiny_llama(depth=3, heads=4, vocab=50, context=32, layers=layers)
    model = blockforge.build_model(spec, seed=0).eval().to(torch.bfloat16)  # the search counts bf16 keys and values
    counted = computed_costs(Recipe(model=spec), ("kv_cache_bytes",))["kv_cache_bytes"]
    cache = KVCache(len(model.layers))
    prompt = torch.randint(0, 50, (1, 20), generator=torch.Generator().manual_seed(2))
    out = generate(model, prompt, 13, temperature=0, cache=cache)  # 20 + 12 positions run through the model: the context
    assert out.shape == (1, 33) and cache.layers[2].seen == 32
    head_dim = spec.width // 4
    assert cache.nbytes == counted == 2 * 1 * head_dim * (7 + 7 + 32) * 2  # keys and values, one kv head, bf16
