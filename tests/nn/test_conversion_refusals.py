"""Converters refuse what they cannot reproduce exactly, naming it; they never return a silently different model."""

import pytest
import torch
from torch import nn

from blockforge import from_hf_llama, from_timm_vit
from blockforge.families.conversion import ConversionError

SMALL = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, intermediate_size=64,
             vocab_size=97, max_position_embeddings=64)


def hf_model(kind: str, **changes):
    import transformers

    config_class, model_class = {
        "llama": ("LlamaConfig", "LlamaForCausalLM"), "mistral": ("MistralConfig", "MistralForCausalLM"),
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"), "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
        "gemma": ("GemmaConfig", "GemmaForCausalLM"),
    }[kind]
    config = getattr(transformers, config_class)(**{**SMALL, **changes})
    torch.manual_seed(0)
    return getattr(transformers, model_class)(config).eval()


@pytest.mark.parametrize("kind,changes,needle", [
    ("llama", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}}, "rope type \\['dynamic'\\]"),
    ("llama", {"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 10000.0}}, "rope type \\['yarn'\\]"),
    ("llama", {"hidden_act": "relu"}, "activation 'relu'"),
])
def test_hf_models_blockforge_cannot_hold_are_refused_by_name(kind, changes, needle):
    with pytest.raises(ConversionError, match=needle):
        from_hf_llama(hf_model(kind, **changes))


def test_mistral_without_a_window_converts_exactly():
    ours = from_hf_llama(hf_model("mistral", sliding_window=None))
    tokens = torch.randint(0, 97, (2, 20))
    with torch.no_grad():
        assert (ours(tokens) - hf_model("mistral", sliding_window=None)(tokens).logits).abs().max() <= 1e-4


def test_a_tensor_the_config_does_not_announce_is_refused_by_name():
    hf = hf_model("llama")
    hf.model.layers[0].self_attn.q_proj.bias = nn.Parameter(torch.randn(32))  # present in the modules, not in the config
    with pytest.raises(ConversionError, match=r"model.layers.0.self_attn.q_proj.bias"):
        from_hf_llama(hf)


def test_a_changed_computation_is_caught_by_the_output_check():
    hf = hf_model("llama")
    hf.model.layers[0].mlp.act_fn = nn.GELU()  # same tensors, config still says silu
    with pytest.raises(ConversionError, match=r"differ from the original's by \d"):
        from_hf_llama(hf)


def timm_vit(**changes):
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    settings = dict(img_size=16, patch_size=4, in_chans=3, num_classes=5, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0)
    model = VisionTransformer(**{**settings, **changes}).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    return model


@pytest.mark.parametrize("changes,needle", [
    ({"act_layer": "quick_gelu"}, "QuickGELU"),
    ({"scale_attn_norm": True}, "attn.norm"),
    ({"scale_mlp_norm": True}, "mlp.norm"),
    ({"embed_norm_layer": nn.LayerNorm}, "patch_embed.norm"),
    ({"pos_embed": "none"}, "no position embeddings"),
    ({"num_classes": 0}, "num_classes=0"),
    ({"class_token": False, "global_pool": "avg"}, "no class token"),
    ({"reg_tokens": 2}, "register tokens"),
    ({"no_embed_class": True}, "skip the class token"),
    ({"dynamic_img_size": True}, "dynamic_img_size"),
    ({"dynamic_img_pad": True}, "dynamic_img_pad"),
])
def test_timm_options_blockforge_cannot_hold_are_refused_by_name(changes, needle):
    with pytest.raises(ConversionError, match=needle):
        from_timm_vit(timm_vit(**changes))


def test_timm_swiglu_mlp_and_distilled_deit_are_refused():
    import timm
    from timm.layers import SwiGLUPacked

    with pytest.raises(ConversionError, match="SiLU|fc1|activation"):
        from_timm_vit(timm_vit(mlp_layer=SwiGLUPacked, act_layer=nn.SiLU))
    deit = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False, img_size=32, num_classes=4, depth=1)
    with pytest.raises(ConversionError, match="distillation token"):
        from_timm_vit(deit)


def test_a_converted_vit_fed_another_image_size_says_so():
    ours = from_timm_vit(timm_vit())
    with pytest.raises(ValueError, match=r"takes images of shape \(B, 3, 16, 16\), not \(1, 3, 20, 20\)"):
        ours(torch.zeros(1, 3, 20, 20))
