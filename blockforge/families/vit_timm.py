"""Weights from a timm `VisionTransformer` (class token, no register tokens, no layer scale)."""

from __future__ import annotations

from torch import nn

from blockforge.errors import BlockforgeError
from blockforge.nn.build import build_model, copy_weight
from blockforge.spec.model import LayerRules, LayerSettings, ModelSpec
from blockforge.spec.resolve import resolve


def from_timm_vit(timm_model: nn.Module) -> nn.Module:
    """A blockforge vit with the weights of a timm `VisionTransformer` (every layer Pre-LN)."""
    blocks = list(timm_model.blocks)
    first = blocks[0]
    embed = timm_model.patch_embed
    refusals = {
        "no class token": not getattr(timm_model, "has_class_token", True),
        "register tokens": getattr(timm_model, "num_reg_tokens", 0) > 0,
        f"global_pool '{timm_model.global_pool}' (only 'token' is modelled)": timm_model.global_pool != "token",
        "layer scale": not isinstance(first.ls1, nn.Identity),
        "q/k norm": not isinstance(first.attn.q_norm, nn.Identity),
        "a norm before the blocks": not isinstance(timm_model.norm_pre, nn.Identity),
        "a norm after pooling": not isinstance(timm_model.fc_norm, nn.Identity),
        "non-square patches or images": embed.patch_size[0] != embed.patch_size[1] or embed.img_size[0] != embed.img_size[1],
        "qkv without bias": first.attn.qkv.bias is None,
        "position embeddings that skip the class token": getattr(timm_model, "no_embed_class", False),
    }
    for feature, present in refusals.items():
        if present:
            raise BlockforgeError(f"this timm VisionTransformer has {feature}, which blockforge's vit does not model")
    width = timm_model.embed_dim
    spec = resolve(
        ModelSpec(
            family="vit",
            width=width,
            depth=len(blocks),
            heads=first.attn.num_heads,
            ffn=first.mlp.fc1.out_features,
            image_size=embed.img_size[0],
            patch_size=embed.patch_size[0],
            channels=embed.proj.in_channels,
            classes=timm_model.num_classes,
            norm="layernorm",
            norm_eps=first.norm1.eps,
            final_norm=not isinstance(timm_model.norm, nn.Identity),
            layers=LayerRules(default=LayerSettings(placement="pre")),
        )
    )
    model = build_model(spec)
    copy_weight(model.patch_embed.weight, embed.proj.weight)
    copy_weight(model.patch_embed.bias, embed.proj.bias)
    copy_weight(model.cls_token, timm_model.cls_token)
    copy_weight(model.pos_embed, timm_model.pos_embed)
    pairs = [
        ("attn.in_norm", "norm1"), ("attn.branch.qkv", "attn.qkv"), ("attn.branch.proj", "attn.proj"),
        ("mlp.in_norm", "norm2"), ("mlp.branch.fc1", "mlp.fc1"), ("mlp.branch.fc2", "mlp.fc2"),
    ]
    for block, source in zip(model.layers, blocks, strict=True):
        for ours, theirs in pairs:
            dst, src = block.get_submodule(ours), source.get_submodule(theirs)
            copy_weight(dst.weight, src.weight)
            copy_weight(dst.bias, src.bias)
    if spec.final_norm:
        copy_weight(model.final_norm.weight, timm_model.norm.weight)
        copy_weight(model.final_norm.bias, timm_model.norm.bias)
    copy_weight(model.head.weight, timm_model.head.weight)
    copy_weight(model.head.bias, timm_model.head.bias)
    return model
