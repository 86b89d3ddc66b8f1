"""Every open decoder from_hf_llama converts, exactly, at two lengths (one past its longest window), and out
again through --format hf equal to blockforge; what the spec cannot express is refused by name."""

import pytest
import torch
import transformers
from transformers import AutoModelForCausalLM

import blockforge
from blockforge import from_hf_llama
from blockforge.export import export_run
from blockforge.families.conversion import ConversionError
from blockforge.spec.serialize import save_spec
from blockforge.train.checkpoint import save_weights

TOL = 1e-4
BASE = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96, vocab_size=97,
            max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)
GEMMA3_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}, "full_attention": {"rope_type": "default", "rope_theta": 1e6}}
DECODERS = {  # a name: (config class, model class, settings beside BASE, what the converted spec must say)
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16, use_sliding_window=True, sliding_window=6, max_window_layers=2),
              lambda s: all(l.qk_norm and l.qk_norm_over == "head" for l in s.layers) and [l.window for l in s.layers] == [None, None, 6, 6]),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {},
              lambda s: all(l.placement == "respost" and l.qk_norm_over == "projection" for l in s.layers)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(head_dim=16),
              lambda s: s.norm_weight_offset == 1.0 and s.embed_scale == 8.0 and s.layers[0].mlp_act == "gelu_tanh"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(head_dim=16, sliding_window=6, query_pre_attn_scalar=20),
               lambda s: s.layers[0].placement == "sandwich" and s.layers[0].attn_logit_softcap == 50.0 and s.logit_softcap == 30.0
               and [l.window for l in s.layers] == [6, None, 6, None] and s.layers[0].query_scale == pytest.approx(20 ** -0.5)),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(head_dim=16, sliding_window=6, query_pre_attn_scalar=20, num_hidden_layers=6,
                                                                   rope_parameters=GEMMA3_ROPE),
                    lambda s: [l.window for l in s.layers] == [6] * 5 + [None] and s.value(s.layers[5], "rope_theta") == 1e6
                    and s.value(s.layers[0], "rope_theta") == 1e4 and s.layers[0].qk_norm),
    "gemma3_text with linear RoPE scaling": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        head_dim=16, sliding_window=6, query_pre_attn_scalar=20, num_hidden_layers=6,
        rope_parameters={**GEMMA3_ROPE, "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}),
        lambda s: [l.rope_linear_factor for l in s.layers] == [None] * 5 + [8.0] and s.value(s.layers[5], "rope_theta") == 1e6),
    "llama with linear RoPE scaling": ("LlamaConfig", "LlamaForCausalLM", dict(rope_scaling={"rope_type": "linear", "factor": 4.0}),
                                       lambda s: {l.rope_linear_factor for l in s.layers} == {4.0} and s.layers[0].rope_linear_factor == 4.0),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(sliding_window=10), lambda s: {l.window for l in s.layers} == {10}),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", dict(no_rope_layers=[1, 1, 1, 0]), lambda s: [l.rope for l in s.layers] == [True] * 3 + [False]),
    "granite": ("GraniteConfig", "GraniteForCausalLM", dict(embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0625,
                                                             logits_scaling=8.0),
                lambda s: (s.embed_scale, s.residual_multiplier, s.logit_multiplier, s.layers[0].query_scale) == (12.0, 0.22, 0.125, 0.0625)),
}


def hf_decoder(kind: str, **changes):
    config_class, model_class, settings, _ = DECODERS[kind]
    config = getattr(transformers, config_class)(**{**BASE, **settings, **changes})
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():  # every weight away from its init (Gemma's zero norm gains too), so a missing one shows
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def difference(ours, hf, length: int) -> float:
    tokens = torch.randint(0, 97, (2, length), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return (ours(tokens) - hf(tokens).logits).abs().max().item()


@pytest.mark.parametrize("kind", list(DECODERS))
def test_each_open_decoder_converts_exactly_at_two_lengths_and_says_what_it_is(kind):
    hf = hf_decoder(kind)
    ours = from_hf_llama(hf)
    assert DECODERS[kind][3](ours.spec), ours.spec.layers
    longest = max([layer.window or 0 for layer in ours.spec.layers])
    for length in (5, longest + 24):  # one inside every window, one past the longest
        assert difference(ours, hf, length) <= TOL


@pytest.mark.parametrize("kind", list(DECODERS))
def test_each_converted_decoder_leaves_through_format_hf_equal_to_blockforge(kind, tmp_path, bpe):
    ours = from_hf_llama(hf_decoder(kind))
    src = tmp_path / "model"
    src.mkdir()
    save_weights(ours, src / "model.safetensors")
    save_spec(ours.spec, src / "spec.yaml")
    bpe.save(src / "tokenizer")
    out = export_run(src, tmp_path / "hf", format="hf")
    exported = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    native = blockforge.load(src).eval()
    tokens = torch.randint(0, 97, (2, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert (exported(tokens).logits - native(tokens)).abs().max().item() <= TOL


@pytest.mark.parametrize("kind,changes,needle", [
    ("gemma3_text", {"rope_parameters": {**GEMMA3_ROPE, "full_attention": {"rope_type": "dynamic", "factor": 8.0, "rope_theta": 1e6}}},
     "rope type \\['dynamic'\\]"),
    ("gemma3_text", {"use_bidirectional_attention": True}, "bidirectional attention"),
    ("phi3", {"partial_rotary_factor": 0.5}, "partial rotary embeddings"),
    ("gemma", {"hidden_activation": "relu"}, "activation 'relu'"),
    ("qwen3", {"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 10000.0}}, "rope type \\['yarn'\\]"),
])
def test_what_the_spec_cannot_express_is_refused_by_name(kind, changes, needle):
    with pytest.raises(ConversionError, match=needle):
        from_hf_llama(hf_decoder(kind, **changes))


def test_a_model_type_it_does_not_convert_is_refused_by_name():
    config = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=97)
    with pytest.raises(ConversionError, match="model_type 'gpt2'; from_hf_llama converts llama, mistral"):
        from_hf_llama(transformers.GPT2LMHeadModel(config))
