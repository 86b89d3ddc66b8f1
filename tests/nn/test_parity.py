"""Uniform Pre-LN blockforge models give the reference implementations' logits for the same weights."""

import pytest
import torch

from blockforge import from_hf_llama, from_timm_vit, to_hf_llama

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
    from blockforge.spec import ModelSpec
    from blockforge.spec.model import LayerRules, MixLN

    spec = ModelSpec(family="llama", width=32, depth=4, heads=2, ffn=64, vocab=50, context=16, layers=LayerRules(mix_ln=MixLN(alpha=0.25)))
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
