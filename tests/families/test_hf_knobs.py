"""`--format hf` with every per-layer knob: the modeling file computes blockforge.load's logits and greedy tokens.

Each case exports a tiny random model (norm weights, layer scales, DyT alphas and biases away from their
init: see conftest.py) and checks that transformers loads every tensor, that the logits agree within
1e-5, that greedy `generate` is token-identical to blockforge's, and, with windows or grouped-query
attention, that padded batches give the logits and tokens of their unpadded rows.
"""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

import blockforge
from blockforge.export import export_run
from blockforge.families import hf_export
from blockforge.families.conversion import ConversionError
from blockforge.nn.mlp import GeluMLP
from blockforge.nn.norms import DyT
from blockforge.spec import ModelSpec
from blockforge.spec.model import LayerOverride, LayerRules, LayerSettings, MixLN, Pattern, RopeScaling, SubLayerPlacements
from blockforge.spec.serialize import save_spec
from blockforge.train.checkpoint import save_weights

from .conftest import assert_padding_changes_nothing, perturb

TOL = 1e-5
VOCAB = 300  # the BPE of conftest.py
TEXTS = ["Section 3. The model", "Each layer norm weight is read"]
LLAMA3 = RopeScaling(type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_context=16)  # some wavelengths kept, some stretched


def llama(placement="pre", *, mix=None, overrides=(), pattern=(), **kw):
    """A tiny llama; the per-layer fields among the keyword arguments go to every layer (layers.default)."""
    per_layer = {key: kw.pop(key) for key in ("window", "qk_norm", "v_norm", "layer_scale", "qk_norm_over", "mlp_act", "query_scale", "rope",
                                              "attn_logit_softcap")
                 if key in kw}
    layers = LayerRules(default=LayerSettings(placement=placement, **per_layer), mix_ln=MixLN(alpha=mix) if mix else None,
                        overrides=list(overrides), pattern=list(pattern))
    settings = dict(family="llama", width=32, depth=3, heads=2, ffn=64, vocab=VOCAB, context=48, layers=layers)
    settings.update(kw)
    return ModelSpec(**settings)


CASES = {
    # one knob each (with Mix-LN where the knob alone would make a plain LlamaForCausalLM)
    "gqa": llama(mix=0.34, heads=4, kv_heads=2),
    "head_dim": llama(mix=0.34, heads=2, head_dim=24),
    "per-layer kv_heads and head_dim": llama(heads=4, overrides=[LayerOverride(at=1, kv_heads=1), LayerOverride(at=2, heads=2, head_dim=12)]),
    "window": llama(window=4),
    "dyt": llama(norm="dyt"),
    "per-layer norm": llama(overrides=[LayerOverride(at=1, norm="layernorm"), LayerOverride(at=2, norm="dyt")]),
    "qk_norm": llama(qk_norm=True),
    "qk_norm and v_norm, layernorm": llama(norm="layernorm", qk_norm=True, v_norm=True),
    "layer scale": llama(layer_scale=0.1),
    "none placement with layer scale": llama("none", layer_scale=0.5),
    "attn and mlp placements differ": llama(SubLayerPlacements(attn="sandwich", mlp="post")),
    "completep branch multiplier": llama(parametrization="completep", base_depth=1),
    "mup readout and inverse attention scale": llama(parametrization="mup", base_width=8, attention_scale="inverse"),
    "completep + mup, gqa": llama(parametrization="completep", base_depth=1, base_width=16, attention_scale="inverse", heads=4, kv_heads=2),
    "q/k/v biases only": llama(qkv_bias=True),
    "output and mlp biases": llama(mix=0.34, proj_bias=True, mlp_bias=True),
    "llama3 rope scaling": llama(mix=0.34, rope_scaling=LLAMA3),
    # combinations
    "gqa + window + qk_norm + layer scale + dyt": llama(heads=4, kv_heads=2, window=5, qk_norm=True, layer_scale=0.5, norm="dyt"),
    "hybridnorm + qk/v norm": llama(SubLayerPlacements(attn="none", mlp="post"), qk_norm=True, v_norm=True),
    "llama-3 style gqa + head_dim + biases + llama3 + tied": llama(
        mix=0.34, heads=4, kv_heads=1, head_dim=16, qkv_bias=True, proj_bias=True, mlp_bias=True, rope_scaling=LLAMA3, tie_embeddings=True),
    "completep + layer scale + per-layer heads": llama(parametrization="completep", base_depth=2, depth_alpha=0.5, layer_scale=1.0,
                                                       overrides=[LayerOverride(at=0, heads=4, kv_heads=2)]),
    "gemma-style local/global windows": llama(
        "sandwich", depth=4, heads=4, kv_heads=2, qk_norm=True, window=4, overrides=[LayerOverride(at=3, window=None)]),
    "windows by pattern + gqa": llama(depth=4, heads=4, kv_heads=1, pattern=[Pattern(every=2, offset=1, set=LayerSettings(window=3))]),
    # other open decoders' knobs
    "gemma-style: 1 + w norms, scaled embeddings, GeGLU, query scale, soft-capped logits, local RoPE base": llama(
        "sandwich", depth=4, heads=4, kv_heads=2, qk_norm=True, window=5, norm_weight_offset=1.0, embed_scale=5.657, mlp_act="gelu_tanh",
        query_scale=0.3, logit_softcap=30.0, attn_logit_softcap=5.0, tie_embeddings=True, rope_theta=1e6,
        pattern=[Pattern(every=2, offset=0, set=LayerSettings(rope_theta=1e4))], overrides=[LayerOverride(at=3, window=None)]),
    "olmo2-style: norms after each branch, q/k norms over the projection": llama("respost", heads=4, kv_heads=2, qk_norm=True,
                                                                                 qk_norm_over="projection"),
    "smollm3-style: no RoPE in every fourth layer": llama(depth=4, pattern=[Pattern(every=4, offset=3, set=LayerSettings(rope=False))]),
    "granite-style multipliers": llama(embed_scale=12.0, residual_multiplier=0.22, logit_multiplier=0.125, query_scale=0.015625 * 4),
}
PADDED = [name for name, spec in CASES.items() if "window" in name or "gqa" in name]


def loaded(out, **kwargs):
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True, **kwargs)
    assert not any(info.values()), info  # no weight missing, unexpected or reshaped: none newly initialized
    return model.eval()


def largest_difference(hf_model, ours) -> float:
    tokens = torch.randint(0, VOCAB, (3, 29), generator=torch.Generator().manual_seed(7))
    tokens[0, :2] = torch.tensor([0, 1])  # end-of-text and pad are ordinary rows of the embedding too
    with torch.no_grad():
        return (hf_model(tokens).logits - ours(tokens)).abs().max().item()


def assert_same_greedy_tokens(model, ours, tokenizer):
    for text in TEXTS:
        ids = tokenizer(text, return_tensors="pt").input_ids
        theirs = model.generate(ids, max_new_tokens=14, do_sample=False)
        assert theirs.shape[1] > ids.shape[1]
        assert torch.equal(theirs, ours.generate(ids, 14, temperature=0, eos_id=tokenizer.eos_token_id))


@pytest.fixture(scope="module")
def exports(tmp_path_factory, bpe):
    """case -> (native folder, hf folder), each exported once for the module."""
    made = {}

    def get(case):
        if case not in made:
            root = tmp_path_factory.mktemp("knobs")
            src = root / "model"
            src.mkdir()
            model = blockforge.build_model(CASES[case], seed=0)
            perturb(model)
            save_weights(model, src / "model.safetensors")
            save_spec(model.spec, src / "spec.yaml")
            bpe.save(src / "tokenizer")
            made[case] = src, export_run(src, root / "hf", format="hf")
        return made[case]

    return get


# What a transformers class of its own computes leaves as that class (families/hf_native.py); the rest ships the modeling file.
NATIVE = {"window": "MistralForCausalLM", "qk_norm": "Qwen3ForCausalLM", "q/k/v biases only": "Qwen2ForCausalLM",
          "olmo2-style: norms after each branch, q/k norms over the projection": "Olmo2ForCausalLM",
          "smollm3-style: no RoPE in every fourth layer": "SmolLM3ForCausalLM", "granite-style multipliers": "GraniteForCausalLM",
          "windows by pattern + gqa": "SmolLM3ForCausalLM"}


@pytest.mark.parametrize("case", list(CASES))
def test_every_knob_loads_and_computes_blockforges_logits_and_tokens(exports, case):
    src, out = exports(case)
    model = loaded(out, trust_remote_code=True)
    assert type(model).__name__ == NATIVE.get(case, "BlockforgeForCausalLM")
    ours = blockforge.load(src).eval()
    if case not in NATIVE:
        # blockforge's own names (the head: lm_head, where serving engines look for it)
        assert set(model.state_dict()) == set(ours.state_dict()) - {"head.weight"} | {"lm_head.weight"}
    assert largest_difference(model, ours) <= TOL
    tokenizer = AutoTokenizer.from_pretrained(out, trust_remote_code=True)
    assert_same_greedy_tokens(model, ours, tokenizer)


@pytest.mark.parametrize("case", [case for case in CASES if case not in NATIVE])
def test_the_config_holds_each_layers_knobs_as_built(exports, case):
    src, out = exports(case)
    config = json.loads((out / "config.json").read_text())
    spec = blockforge.load(src).spec
    for entry, layer in zip(config["layers"], spec.layers, strict=True):
        assert {key: entry[key] for key in ("heads", "kv_heads", "head_dim", "ffn", "window", "norm", "qk_norm", "v_norm")} == {
            key: getattr(layer, key) for key in ("heads", "kv_heads", "head_dim", "ffn", "window", "norm", "qk_norm", "v_norm")}
        assert (entry["qkv_bias"], entry["proj_bias"], entry["mlp_bias"]) == (spec.qkv_bias, spec.proj_bias, spec.mlp_bias)
        for sub in ("attn", "mlp"):
            assert entry[sub]["layer_scale"] == (layer.layer_scale is not None)
            assert entry[sub]["branch_multiplier"] == pytest.approx(spec.branch_multiplier)
    scaling = config.get("rope_frequency_scaling")
    assert (scaling is None) == (spec.rope_scaling is None)
    if scaling is not None:
        assert scaling == {**spec.rope_scaling, "type": "llama3"}


@pytest.mark.parametrize("case", PADDED)
def test_padded_batches_give_what_their_rows_give_alone(exports, case):
    _, out = exports(case)
    model = loaded(out, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(out, trust_remote_code=True)
    assert_padding_changes_nothing(model, tokenizer, TEXTS, TOL)
    tokenizer.padding_side = "left"  # generation: the windows, the padding and the cache together
    batch = tokenizer(TEXTS, return_tensors="pt", padding=True)
    together = model.generate(**batch, max_new_tokens=14, do_sample=False)[:, batch.input_ids.shape[1]:]
    for row, text in zip(together, TEXTS):
        ids = tokenizer(text, return_tensors="pt").input_ids
        single = model.generate(ids, max_new_tokens=14, do_sample=False)[0, ids.shape[1]:]
        assert torch.equal(row[: len(single)], single)


@pytest.mark.parametrize("case", ["gqa + window + qk_norm + layer scale + dyt", "gemma-style local/global windows"])
def test_the_kv_cache_gives_the_logits_of_the_whole_sequence(exports, case):
    """A sliding layer's cache keeps only the last window - 1 keys and values (all the next position sees besides its
    own), a global layer's every one; the logits are the whole sequence's."""
    _, out = exports(case)
    model = loaded(out, trust_remote_code=True)
    tokens = torch.randint(0, VOCAB, (2, 14), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(tokens).logits
        prefill = model(tokens[:, :6], use_cache=True)
        cache = prefill.cache
        steps = [model(tokens[:, t : t + 1], cache=cache).logits for t in range(6, 14)]
    for held, layer in zip(cache.layers, model.config.layers):
        kept = 14 if layer["window"] is None else min(layer["window"] - 1, 14)
        assert held.keys.shape[1:] == (layer["kv_heads"], kept, layer["head_dim"])
    assert any(layer["window"] is not None and layer["window"] - 1 < 14 for layer in model.config.layers)
    torch.testing.assert_close(prefill.logits, full[:, :6], rtol=0, atol=TOL)
    torch.testing.assert_close(torch.cat(steps, 1), full[:, 6:], rtol=0, atol=TOL)


def test_a_uniform_pre_ln_llama_with_gqa_head_dim_biases_and_llama3_is_a_plain_llama(model_folder, tmp_path, bpe):
    spec = llama(heads=4, kv_heads=2, head_dim=16, qkv_bias=True, proj_bias=True, mlp_bias=True, rope_scaling=LLAMA3)
    src = model_folder(spec)
    out = export_run(src, tmp_path / "hf", format="hf")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "auto_map" not in config
    model = loaded(out)  # no trust_remote_code
    assert type(model) is LlamaForCausalLM
    assert (model.config.num_key_value_heads, model.config.head_dim, model.config.attention_bias, model.config.mlp_bias) == (2, 16, True, True)
    ours = blockforge.load(src).eval()
    assert largest_difference(model, ours) <= TOL
    assert_same_greedy_tokens(model, ours, AutoTokenizer.from_pretrained(out))


def test_a_uniform_pre_ln_completep_llama_ships_the_modeling_file(model_folder):
    spec = blockforge.load(model_folder(llama(parametrization="completep", base_depth=1))).spec
    assert not hf_export.plain(spec)  # LlamaForCausalLM has no branch multiplier


# Refusals: what the modeling file cannot hold is named.


def refused(model, pattern):
    with pytest.raises(ConversionError, match=pattern):
        hf_export.remote_config(model)


def test_a_query_norm_without_a_key_norm_is_refused_by_name(model_folder):
    model = blockforge.load(model_folder(llama(qk_norm=True)))
    model.layers[2].attn.branch.k_norm = None
    refused(model, r"layers\.2\.attn\.branch normalizes queries but not keys")


def test_attention_that_is_not_causal_is_refused_by_name(model_folder):
    model = blockforge.load(model_folder(llama(mix=0.34)))
    model.layers[0].attn.branch.causal = False
    refused(model, r"layers\.0\.attn\.branch is not blockforge's causal rotary attention")


def test_another_mlp_is_refused_by_name(model_folder):
    model = blockforge.load(model_folder(llama(mix=0.34)))
    model.layers[1].mlp.branch = GeluMLP(32, 64)
    refused(model, r"layers\.1\.mlp\.branch is a GeluMLP where the transformers modeling file holds a SwiGLU")


def test_a_norm_of_another_type_than_its_layers_is_refused_by_name(model_folder):
    model = blockforge.load(model_folder(llama(qk_norm=True)))
    model.layers[0].attn.branch.v_norm = DyT(16)
    refused(model, r"layers\.0\.attn\.branch\.v_norm is a DyT where the transformers modeling file holds rmsnorm \(eps 1e-06\) or nothing")


def test_a_layer_scale_of_another_shape_is_refused_by_name(model_folder):
    model = blockforge.load(model_folder(llama(layer_scale=0.1)))
    model.layers[1].mlp.layer_scale = torch.nn.Parameter(torch.ones(1))
    refused(model, r"layers\.1\.mlp\.layer_scale has shape \(1,\)")
