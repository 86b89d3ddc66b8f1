"""Weights from a timm `VisionTransformer`: class token, learned positions, GELU MLP, LayerNorm, a class head.

q/k norms, layer scales and bias-free projections convert; options blockforge's vit does not model
(register or distillation tokens, extra norms, other activations or MLPs, pooling other than the class
token, position embeddings without the class token) are refused by name, never
dropped: every tensor of the source is mapped or refused, and the result is checked against the
source on random images (families/conversion.py).
"""

from __future__ import annotations

import torch
from torch import nn

from blockforge.families.conversion import ConversionError, TensorSource, check_same_outputs, evaluating
from blockforge.nn.build import build_model
from blockforge.spec.model import LayerRules, LayerSettings, ModelSpec
from blockforge.spec.resolve import resolve


BLOCK_NAMES = {"attn.in_norm": "norm1", "attn.branch.qkv": "attn.qkv", "attn.branch.proj": "attn.proj",
               "mlp.in_norm": "norm2", "mlp.branch.fc1": "mlp.fc1", "mlp.branch.fc2": "mlp.fc2"}


def timm_names(spec) -> dict[str, str]:
    """Every tensor name of a uniform Pre-LN blockforge vit -> its name in timm's VisionTransformer
    (q/k norms, layer scales and biases as the spec has them)."""
    names = {"patch_embed.weight": "patch_embed.proj.weight", "patch_embed.bias": "patch_embed.proj.bias",
             "cls_token": "cls_token", "pos_embed": "pos_embed", "head.weight": "head.weight", "head.bias": "head.bias"}
    if spec.final_norm:
        names.update({"final_norm.weight": "norm.weight", "final_norm.bias": "norm.bias"})
    has_bias = {"attn.branch.qkv": spec.qkv_bias, "attn.branch.proj": spec.proj_bias, "mlp.branch.fc1": spec.mlp_bias, "mlp.branch.fc2": spec.mlp_bias}
    for i, layer in enumerate(spec.layers):
        block = dict(BLOCK_NAMES)
        if layer.qk_norm:
            block.update({"attn.branch.q_norm": "attn.q_norm", "attn.branch.k_norm": "attn.k_norm"})
        for ours, theirs in block.items():
            kinds = ("weight", "bias") if has_bias.get(ours, True) else ("weight",)
            names.update({f"layers.{i}.{ours}.{kind}": f"blocks.{i}.{theirs}.{kind}" for kind in kinds})
        if layer.layer_scale is not None:
            names.update({f"layers.{i}.attn.layer_scale": f"blocks.{i}.ls1.gamma", f"layers.{i}.mlp.layer_scale": f"blocks.{i}.ls2.gamma"})
    return names


def _structure_problems(timm_model: nn.Module) -> list[str]:
    """What the model has that blockforge's vit does not, read from the modules themselves."""
    blocks = list(getattr(timm_model, "blocks", []))
    embed = getattr(timm_model, "patch_embed", None)
    problems = {
        "no transformer blocks": not blocks,
        "no class token": getattr(timm_model, "cls_token", None) is None,
        "no position embeddings": getattr(timm_model, "pos_embed", None) is None,
        "register tokens": getattr(timm_model, "num_reg_tokens", 0) > 0,
        "a distillation token": getattr(timm_model, "dist_token", None) is not None,
        "position embeddings that skip the class token": getattr(timm_model, "no_embed_class", False),
        f"global_pool '{getattr(timm_model, 'global_pool', None)}' (only 'token' is modelled)": getattr(timm_model, "global_pool", "token") != "token",
        "no classification head (num_classes=0)": getattr(timm_model, "num_classes", 0) == 0,
        "a norm before the blocks": not isinstance(getattr(timm_model, "norm_pre", nn.Identity()), nn.Identity),
        "a norm after pooling": not isinstance(getattr(timm_model, "fc_norm", nn.Identity()), nn.Identity),
        "no patch embedding of fixed size": embed is None or getattr(embed, "img_size", None) is None,
        "dynamic_img_size (position embeddings resampled for other image sizes; blockforge's vit has one image size)":
            getattr(timm_model, "dynamic_img_size", False),
        "dynamic_img_pad (images padded to a multiple of the patch)": getattr(embed, "dynamic_img_pad", False),
    }
    if embed is not None and getattr(embed, "img_size", None) is not None:
        problems["non-square patches or images"] = embed.patch_size[0] != embed.patch_size[1] or embed.img_size[0] != embed.img_size[1]
    for i, block in enumerate(blocks):
        act = getattr(getattr(block, "mlp", None), "act", None)
        if not (type(act) is nn.GELU and act.approximate == "none"):
            problems[f"activation {type(act).__name__} in block {i} (only exact GELU is modelled)"] = True
    return [problem for problem, present in problems.items() if present]


def from_timm_vit(timm_model: nn.Module) -> nn.Module:
    """A blockforge vit with the weights of a timm `VisionTransformer` (every layer Pre-LN)."""
    what = f"this timm {type(timm_model).__name__}"
    problems = _structure_problems(timm_model)
    if problems:
        raise ConversionError(f"{what} has {'; '.join(problems)}, which blockforge's vit does not model")
    source = TensorSource(timm_model, what)
    blocks = list(timm_model.blocks)
    embed = timm_model.patch_embed
    fc1 = source.tensors.get("blocks.0.mlp.fc1.weight")
    if fc1 is None or not hasattr(blocks[0].attn, "num_heads") or not hasattr(blocks[0], "norm1"):
        raise ConversionError(f"{what} has blocks built differently from timm's standard Block (attention, norm1, mlp.fc1)")
    first = blocks[0]
    has_layer_scale = not isinstance(getattr(first, "ls1", nn.Identity()), nn.Identity)
    has_qk_norm = not isinstance(getattr(first.attn, "q_norm", nn.Identity()), nn.Identity)
    spec = resolve(
        ModelSpec(
            family="vit",
            qkv_bias="blocks.0.attn.qkv.bias" in source.tensors,
            proj_bias="blocks.0.attn.proj.bias" in source.tensors,
            mlp_bias="blocks.0.mlp.fc1.bias" in source.tensors,
            width=timm_model.embed_dim,
            depth=len(blocks),
            heads=blocks[0].attn.num_heads,
            ffn=fc1.shape[0],
            image_size=embed.img_size[0],
            patch_size=embed.patch_size[0],
            channels=embed.proj.in_channels,
            classes=timm_model.num_classes,
            norm="layernorm",
            norm_eps=blocks[0].norm1.eps,
            final_norm="norm.weight" in source.tensors,
            layers=LayerRules(default=LayerSettings(placement="pre", qk_norm=has_qk_norm, layer_scale=1.0 if has_layer_scale else None)),
        )
    )
    model = build_model(spec)
    for ours, theirs in timm_names(spec).items():
        source.copy_into(model.get_parameter(ours), theirs)
    source.finish()
    model.eval()
    images = torch.randn(2, spec.channels, spec.image_size, spec.image_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), evaluating(timm_model) as reference:
        check_same_outputs(model(images), reference(images.to(next(timm_model.parameters()).device)).float().cpu(), what)
    return model
