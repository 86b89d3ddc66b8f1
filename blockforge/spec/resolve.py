"""Authoring form -> resolved form: apply `default`, then `mix_ln`, then each override in order."""

from __future__ import annotations

import math
import re

from blockforge.errors import SpecError
from blockforge.spec.family import get_family
from blockforge.spec.model import LayerSpec, ModelSpec, ResolvedSpec

_SLICE = re.compile(r"^\s*(-?\d+)?\s*:\s*(-?\d+)?\s*(?::\s*(-?\d+)?\s*)?$")
_INDEX = re.compile(r"^\s*-?\d+\s*$")


def mix_ln_count(alpha: float, depth: int) -> int:
    """floor(alpha * depth), robust to binary rounding (0.29 * 100 is 28.999999999999996 in floats)."""
    return math.floor(alpha * depth + 1e-9)


def select_layers(at: int | str | list[int], depth: int, path: str) -> list[int]:
    """The 0-based layer indices an `at:` value names; negative indices count from the end."""
    if isinstance(at, str) and _SLICE.match(at):
        start, stop, step = (int(g) if g else None for g in _SLICE.match(at).groups())
        if step == 0:
            raise SpecError(f"slice '{at}' has step 0; use a step of 1 or more", path=path)
        chosen = list(range(depth)[slice(start, stop, step)])
        if not chosen:
            raise SpecError(f"slice '{at}' selects no layer of a {depth}-layer model; layers are 0..{depth - 1}", path=path)
        return chosen
    if isinstance(at, str) and _INDEX.match(at):
        at = int(at)
    if isinstance(at, int):
        at = [at]
    if isinstance(at, str):
        raise SpecError(f"'{at}' is neither an index nor slice text; write e.g. 3, [0, 5] or '0:3'", path=path)
    if not at:
        raise SpecError("is an empty list, so it selects no layer; list indices like [0, 1]", path=path)
    chosen = []
    for i, index in enumerate(at):
        if not -depth <= index < depth:
            raise SpecError(f"index {index} is out of range for a {depth}-layer model (use 0..{depth - 1}, or negative from the end)", path=f"{path}[{i}]")
        chosen.append(index % depth)
    return chosen


def resolve(spec: ModelSpec) -> ResolvedSpec:
    """The frozen per-layer form of `spec`; raises SpecError naming the key path of any problem."""
    depth = spec.depth
    base_heads = spec.heads if spec.heads is not None else spec.width // spec.head_dim
    layers = [
        dict(index=i, placement="pre", heads=base_heads, ffn=spec.default_ffn(), init_scale=1.0, lr_mult=1.0)
        for i in range(depth)
    ]
    origin = ["model.heads" if spec.heads is not None else "model.head_dim"] * depth

    def assign(index: int, settings: dict, where: str) -> None:
        layers[index].update(settings)
        if "heads" in settings:
            origin[index] = f"{where}.heads"

    for i in range(depth):
        assign(i, spec.layers.default.assigned(), "model.layers.default")
    if spec.layers.mix_ln is not None:
        rule = spec.layers.mix_ln
        n_early = mix_ln_count(rule.alpha, depth)
        for i in range(depth):
            layers[i]["placement"] = rule.early if i < n_early else rule.late
    for k, override in enumerate(spec.layers.overrides):
        where = f"model.layers.overrides[{k}]"
        for i in select_layers(override.at, depth, f"{where}.at"):
            assign(i, override.assigned(), where)

    family = get_family(spec.family)
    for layer, where in zip(layers, origin):
        if spec.width % layer["heads"]:
            raise SpecError(f"{layer['heads']} heads do not divide width {spec.width}; choose a divisor of {spec.width}", path=where)
        if family.check_layer is not None:
            family.check_layer(spec, layer, where)

    return ResolvedSpec(
        family=spec.family,
        width=spec.width,
        norm=spec.norm or family.default_norm,
        norm_eps=spec.norm_eps,
        final_norm=spec.final_norm,
        tie_embeddings=spec.tie_embeddings,
        attention=spec.attention,
        rope_theta=spec.rope_theta,
        init_std=spec.init_std,
        embed_init_std=spec.embed_init_std,
        vocab=spec.vocab,
        context=spec.context,
        image_size=spec.image_size,
        patch_size=spec.patch_size,
        channels=spec.channels if "channels" in family.required else None,
        classes=spec.classes,
        layers=tuple(LayerSpec(**layer) for layer in layers),
    )
