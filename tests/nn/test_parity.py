"""Uniform Pre-LN blockforge models give the reference implementations' logits for the same weights."""

import pytest
import torch

from blockforge import from_hf_llama, from_timm_vit, to_hf_llama
from tiny_data import tiny_llama

TOL = 1e-4

LLAMA_CONFIGS = [
    # (depth, heads, width, ffn, tied)
    (1, 1, 32, 64, False),
    (2, 2, 64, 96, True),
    (3, 4, 64, 160, False),
    (4, 8, 128, 200, True),
    (4, 8, 128, 344, False),
]


def _hf_llama(depth, heads, width, ffn, tied, vocab=97):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=width, num_hidden_layers=depth, num_attention_heads=heads, num_key_value_heads=heads,
        intermediate_size=ffn, vocab_size=vocab, max_position_embeddings=64, tie_word_embeddings=tied,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0}, attn_implementation="eager",
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # HF zero-inits nothing we care about, but make norms non-trivial too
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("depth,heads,width,ffn,tied", LLAMA_CONFIGS)
def test_llama_matches_hf_both_ways(depth, heads, width, ffn, tied):
    hf = _hf_llama(depth, heads, width, ffn, tied)
    tokens = torch.randint(0, 97, (3, 29))
    ours = from_hf_llama(hf).eval()
    assert ours.spec.tie_embeddings == tied
    with torch.no_grad():
        expected = hf(tokens).logits
        got = ours(tokens)
        back = to_hf_llama(ours)(tokens).logits
    assert got.shape == (3, 29, 97)
    assert (got - expected).abs().max().item() <= TOL
    assert (back - expected).abs().max().item() <= TOL


def test_to_hf_llama_refuses_mix_ln():
    import blockforge
    from blockforge.errors import BlockforgeError
    from blockforge.spec.model import LayerRules, MixLN

    spec = tiny_llama(vocab=50, context=16, layers=LayerRules(mix_ln=MixLN(alpha=0.25)))
    with pytest.raises(BlockforgeError, match="Pre-LN"):
        to_hf_llama(blockforge.build_model(spec))


VIT_CONFIGS = [
    # (depth, heads, width, mlp_ratio, final_norm)
    (1, 1, 32, 2.0, True),
    (2, 4, 64, 4.0, True),
    (4, 8, 64, 3.0, False),
]


@pytest.mark.parametrize("depth,heads,width,mlp_ratio,final_norm", VIT_CONFIGS)
def test_vit_matches_timm(depth, heads, width, mlp_ratio, final_norm):
    from timm.models.vision_transformer import VisionTransformer

    ref = VisionTransformer(
        img_size=16, patch_size=4, in_chans=3, num_classes=7, embed_dim=width, depth=depth, num_heads=heads,
        mlp_ratio=mlp_ratio, final_norm=final_norm,
    ).eval()
    with torch.no_grad():
        for p in ref.parameters():  # random everything, so no parameter can be silently skipped
            p.normal_(0, 0.2)
    images = torch.randn(5, 3, 16, 16)
    ours = from_timm_vit(ref).eval()
    with torch.no_grad():
        expected = ref(images)
        got = ours(images)
    assert got.shape == (5, 7)
    assert (got - expected).abs().max().item() <= TOL


def _hf(kind, **config):
    import transformers

    config_class, model_class = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "mistral": ("MistralConfig", "MistralForCausalLM"),
                                 "qwen2": ("Qwen2Config", "Qwen2ForCausalLM")}[kind]
    settings = dict(vocab_size=97, max_position_embeddings=64, attn_implementation="eager")
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**{**settings, **config})).eval()
    with torch.no_grad():  # every tensor random, biases and norms included
        for name, p in model.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.2 if "norm" in name else 0.05)
    return model


LLAMA3 = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2, head_dim=24, intermediate_size=160,
              tie_word_embeddings=True, attention_bias=True, mlp_bias=True,
              rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 8})
REAL_CONFIGS = {
    "llama-3 style: GQA, head_dim 24, theta 5e5, llama3 scaling, all biases, tied": ("llama", LLAMA3),
    "tinyllama style: 8 heads, 1 kv head": ("llama", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=1,
                                                          intermediate_size=96)),
    "mistral: one window of 6": ("mistral", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                  intermediate_size=96, sliding_window=6)),
    "qwen2: q/k/v biases, sliding layers after the first": ("qwen2", dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                                                                         num_key_value_heads=2, intermediate_size=96, use_sliding_window=True,
                                                                         sliding_window=5, max_window_layers=1)),
}


@pytest.mark.parametrize("name", list(REAL_CONFIGS))
def test_real_checkpoint_configs_convert_exactly(name):
    kind, config = REAL_CONFIGS[name]
    hf = _hf(kind, **config)
    ours = from_hf_llama(hf)
    tokens = torch.randint(0, 97, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (ours(tokens) - hf(tokens).logits).abs().max().item() <= TOL
    if kind == "qwen2":
        assert [layer.window for layer in ours.spec.layers] == [None, 5, 5] and ours.spec.qkv_bias and not ours.spec.proj_bias
    if kind == "mistral":
        assert {layer.window for layer in ours.spec.layers} == {6}


def test_a_mistral_with_layer_types_windows_every_layer_as_transformers_does():
    """MistralForCausalLM ignores layer_types: every layer uses sliding_window. The conversion reads what the
    model does, and its own check runs past the window (16 tokens would not see a window of 20)."""
    from blockforge.families.conversion import probe_tokens

    hf = _hf("mistral", hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
             sliding_window=20, layer_types=["full_attention", "sliding_attention", "full_attention"], max_position_embeddings=128)
    ours = from_hf_llama(hf)
    assert [layer.window for layer in ours.spec.layers] == [20, 20, 20]
    tokens = torch.randint(0, 97, (2, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (ours(tokens) - hf(tokens).logits).abs().max().item() <= TOL
    assert probe_tokens(ours.spec).shape[1] > 20  # the check itself sees past the window


def test_the_conversion_check_catches_a_window_in_the_wrong_layer(monkeypatch):
    """Were the windows read from layer_types (as before), the check at 16 tokens passed; past the window it refuses."""
    import blockforge.families.llama_hf as llama_hf
    from blockforge.families.conversion import ConversionError

    hf = _hf("mistral", hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
             sliding_window=20, layer_types=["full_attention", "sliding_attention", "full_attention"], max_position_embeddings=128)
    monkeypatch.setattr(llama_hf, "_layer_windows", lambda model: [None, 20, None])
    with pytest.raises(ConversionError, match="differ from the original's"):
        from_hf_llama(hf)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_precision_source_converts_to_float32_and_says_so(dtype, capsys):
    hf = _hf("llama", **LLAMA3)
    ours = from_hf_llama(hf.to(dtype))
    assert f"holds {str(dtype).removeprefix('torch.')} weights" in capsys.readouterr().err
    for name, tensor in ours.state_dict().items():  # every value is the source's, exactly
        assert tensor.dtype == torch.float32
    assert torch.equal(ours.embed.weight, hf.model.embed_tokens.weight.float())


def test_llama3_style_round_trip_and_generate():
    hf = _hf("llama", **LLAMA3)
    ours = from_hf_llama(hf)
    assert (ours.spec.layers[0].kv_heads, ours.spec.layers[0].head_dim, ours.spec.rope_scaling["type"]) == (2, 24, "llama3")
    back = to_hf_llama(ours)
    tokens = torch.randint(0, 97, (2, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (back(tokens).logits - hf(tokens).logits).abs().max().item() <= TOL
    prompt = tokens[:1, :5]
    theirs = hf.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(prompt, 12, temperature=0), theirs)


def test_to_hf_llama_refuses_windows_and_per_layer_differences():
    from blockforge.errors import BlockforgeError

    windowed = from_hf_llama(_hf("mistral", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                 intermediate_size=96, sliding_window=6))
    with pytest.raises(BlockforgeError, match="sliding windows"):
        to_hf_llama(windowed)
    qwen = from_hf_llama(_hf("qwen2", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, intermediate_size=96))
    with pytest.raises(BlockforgeError, match="biases differ"):
        to_hf_llama(qwen)


@pytest.mark.parametrize("changes", [{"qk_norm": True}, {"init_values": 0.1}, {"proj_bias": False}, {"qkv_bias": False},
                                     {"qk_norm": True, "init_values": 1e-5, "final_norm": False}])
def test_vit_knobs_match_timm(changes):
    from timm.models.vision_transformer import VisionTransformer

    ref = VisionTransformer(img_size=16, patch_size=4, in_chans=3, num_classes=7, embed_dim=32, depth=2, num_heads=4, **changes).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0, 0.2)
    ours = from_timm_vit(ref)
    images = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        assert (ours(images) - ref(images)).abs().max().item() <= TOL
    layer = ours.spec.layers[0]
    assert layer.qk_norm == changes.get("qk_norm", False) and (layer.layer_scale is not None) == ("init_values" in changes)
