"""The vit family: an image classifier (patch embedding, class token, learned positions, GELU MLP, LayerNorm).

The registration is declarations only: the backbone, the loss, the converter and the export format are named by
where they live (`lazy`) and imported, with torch, when a model is built, trained or exported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from blockforge.errors import SpecError
from blockforge.lazy import lazy
from blockforge.spec.family import Family, register_family

if TYPE_CHECKING:
    import torch

    from blockforge.nn.flops import OuterCosts


def check(spec, path: str) -> None:
    def at(key: str) -> str:
        return f"{path}.{key}" if path else key

    if spec.image_size % spec.patch_size:
        raise SpecError(f"patch_size {spec.patch_size} does not divide image_size {spec.image_size}", path=at("patch_size"))
    if spec.tie_embeddings:
        raise SpecError("does not apply to family vit (its head is a classifier)", path=at("tie_embeddings"))
    for key, plain in (("embed_scale", 1.0), ("logit_multiplier", 1.0), ("logit_softcap", None)):
        if getattr(spec, key) != plain:
            raise SpecError("does not apply to family vit (a language model's token embedding and logits)", path=at(key))


def dataset(cfg, spec, seed, cache_dir, run_dir):
    from blockforge.data.images import build_image_dataset

    return build_image_dataset(cfg, image_size=spec.image_size, channels=spec.channels, classes=spec.classes, seed=seed)


def example_batch(spec, batch_size: int, device, dtype=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(images, labels)."""
    import torch

    images = torch.zeros(batch_size, spec.channels, spec.image_size, spec.image_size, dtype=dtype or torch.float32, device=device)
    return images, torch.zeros(batch_size, dtype=torch.long, device=device)


def model_inputs(batch, pad_id=None):
    """The images of (images, labels); every token counts."""
    return batch[0], None


def outer_costs(model) -> OuterCosts:
    """Patches and the class token per image; the learned positions and the class token are the input embedding; outside
    the blocks, the patch projection and the classifier, which reads the class token only."""
    from blockforge.nn.flops import OuterCosts

    spec = model.spec
    patches = (spec.image_size // spec.patch_size) ** 2
    return OuterCosts(sequence=patches + 1, embedding=model.pos_embed.numel() + model.cls_token.numel(),
                      forward_flops=2 * model.head.in_features * model.head.out_features + 2 * patches * model.patch_embed.weight.numel())


VIT = register_family(Family(
    name="vit", default_norm="layernorm", default_activation="gelu", data_kind="image", required=("image_size", "patch_size", "classes", "channels"),
    unused=("vocab", "context"), metrics=("val_loss", "val_acc"), sample_unit="img", causal=False, default_bias=True, no_decay=("pos_embed", "cls_token"),
    check=check, build=lazy("blockforge.nn.vit:ViT"), loss=lazy("blockforge.nn.losses:image_loss"), dataset=dataset,
    example_batch=example_batch, model_inputs=model_inputs, outer_costs=outer_costs,
    converters={"from_timm": lazy("blockforge.families.vit_timm:from_timm_vit")}, exports={"timm": lazy("blockforge.families.timm_export:TIMM_FORMAT")},
))
