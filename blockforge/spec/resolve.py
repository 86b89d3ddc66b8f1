"""Authoring form -> resolved form: apply `default`, then `mix_ln`, then each override in order."""

from __future__ import annotations

import math
import re

from blockforge.errors import SpecError
from blockforge.spec.family import get_family
from blockforge.spec.fields import LAYER_FIELDS, rampable
from blockforge.spec.model import LayerSpec, ModelSpec, ResolvedSpec
from blockforge.spec.strict import to_plain

_SLICE = re.compile(r"^\s*(-?\d+)?\s*:\s*(-?\d+)?\s*(?::\s*(-?\d+)?\s*)?$")
_INDEX = re.compile(r"^\s*-?\d+\s*$")


def mix_ln_count(alpha: float, depth: int) -> int:
    """floor(alpha * depth), robust to binary rounding (0.29 * 100 is 28.999999999999996 in floats)."""
    return math.floor(alpha * depth + 1e-9)


def select_layers(at: int | str | list[int], depth: int, path: str) -> list[int]:
    """The 0-based layer indices an `at:` value names; negative indices count from the end.

    A selection that says something odd is refused rather than read one way: '-0' (layer 0, though it looks
    like the last), and a list naming one layer twice (0 and 0, or 0 and -depth).
    """
    if isinstance(at, str) and re.search(r"-0+(?!\d)", at):
        raise SpecError(f"'{at}' holds -0, which means layer 0 (the first), not the last; write 0, or -1 for the last layer", path=path)
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
        if index % depth in chosen:
            first = at[chosen.index(index % depth)]
            both = f" (as {first} and {index})" if first != index else ""
            raise SpecError(f"names layer {index % depth} twice{both}; list each layer once", path=f"{path}[{i}]")
        chosen.append(index % depth)
    return chosen


def resolve(spec: ModelSpec) -> ResolvedSpec:
    """The frozen per-layer form of `spec`; raises SpecError naming the key path of any problem.

    Order: the model-level values, then `layers.default`, `layers.mix_ln`, `layers.ramp`, each pattern, each override.
    """
    family = get_family(spec.family)
    table = _LayerTable(spec, family)
    table.apply_rules()
    for layer, where in zip(table.layers, table.origin):
        _finish_layer(spec, family, layer, where)
    return _resolved(spec, family, table.layers)


class _LayerTable:
    """Every layer's fields as the rules set them, and where each was last set (the key path an error names)."""

    def __init__(self, spec: ModelSpec, family):
        self.spec = spec
        # Every declared field starts from its default, or from the model's value (spec/fields.py)
        start = {"placement": "pre", "mlp_placement": None,
                 **{f.name: f.start(spec, family) if f.start is not None else f.default for f in LAYER_FIELDS}}
        self.layers = [dict(start, index=i) for i in range(spec.depth)]
        model_level = {f.name: f.origin(spec) for f in LAYER_FIELDS if f.origin is not None and f.origin(spec) is not None}
        self.origin = [dict.fromkeys(start, "model") | model_level for _ in range(spec.depth)]

    def assign(self, index: int, settings: dict, where: str, *, per_field: bool = True) -> None:
        self.layers[index].update(settings)
        self.origin[index].update({key: f"{where}.{key}" if per_field else where for key in settings})

    def apply_rules(self) -> None:
        """`layers.default`, `mix_ln`, `ramp`, each pattern, each override, in that order."""
        spec, depth = self.spec, self.spec.depth
        for i in range(depth):
            self.assign(i, spec.layers.default.assigned(), "model.layers.default")
        if spec.layers.mix_ln is not None:
            rule = spec.layers.mix_ln
            n_early = mix_ln_count(rule.alpha, depth)
            for i in range(depth):
                side = "early" if i < n_early else "late"
                self.assign(i, rule.settings(early=i < n_early), f"model.layers.mix_ln.{side}", per_field=not isinstance(getattr(rule, side), str))
        if spec.layers.ramp is not None:
            for i, settings in enumerate(ramp_settings(spec.layers.ramp, self.layers, spec)):
                self.assign(i, settings, "model.layers.ramp")
        for k, pattern in enumerate(spec.layers.pattern):
            where = f"model.layers.pattern[{k}]"
            chosen = range(pattern.offset, depth, pattern.every)
            if not chosen:
                raise SpecError(f"selects no layer of a {depth}-layer model (offset {pattern.offset}, every {pattern.every})", path=f"{where}.offset")
            for i in chosen:
                self.assign(i, pattern.set.assigned(), f"{where}.set")
        for k, override in enumerate(spec.layers.overrides):
            where = f"model.layers.overrides[{k}]"
            for i in select_layers(override.at, depth, f"{where}.at"):
                self.assign(i, override.assigned(), where)


def _finish_layer(spec: ModelSpec, family, layer: dict, where: dict) -> None:
    """A layer the rules have set: values equal to the model's held as inherited, then the layer's checks and the family's."""
    for f in LAYER_FIELDS:
        if f.inherit is not None and layer[f.name] == f.inherit(spec, family):
            layer[f.name] = None  # the model's value: held as "inherited"
    _check_layer(spec, family, layer, where)
    if family.check_layer is not None:
        family.check_layer(spec, layer, where["head_dim"] if where["head_dim"] != "model" else where["heads"])


def _resolved(spec: ModelSpec, family, layers: list[dict]) -> ResolvedSpec:
    """The model-level fields of `spec` with the family's defaults filled in, and the resolved layers."""
    biases = {key: getattr(spec, key) if getattr(spec, key) is not None else family.default_bias for key in ("qkv_bias", "proj_bias", "mlp_bias")}
    return ResolvedSpec(
        family=spec.family,
        width=spec.width,
        norm=spec.norm or family.default_norm,
        norm_eps=spec.norm_eps,
        dyt_alpha=spec.dyt_alpha,
        final_norm=spec.final_norm,
        tie_embeddings=spec.tie_embeddings,
        attention=spec.attention,
        rope_theta=spec.rope_theta,
        rope_scaling=to_plain(spec.rope_scaling) if spec.rope_scaling is not None else None,
        init_std=spec.init_std,
        embed_init_std=spec.embed_init_std,
        vocab=spec.vocab,
        context=spec.context,
        image_size=spec.image_size,
        patch_size=spec.patch_size,
        channels=spec.channels if "channels" in family.required else None,
        classes=spec.classes,
        layers=tuple(LayerSpec(**layer) for layer in layers),
        parametrization=spec.parametrization,
        base_depth=spec.base_depth,
        depth_alpha=spec.depth_alpha,
        base_width=spec.base_width,
        attention_scale=spec.attention_scale,
        norm_weight_offset=spec.norm_weight_offset,
        embed_scale=spec.embed_scale,
        residual_multiplier=spec.residual_multiplier,
        logit_multiplier=spec.logit_multiplier,
        logit_softcap=spec.logit_softcap,
        **biases,
    )


def _check_layer(spec: ModelSpec, family, layer: dict, where: dict) -> None:
    """One resolved layer's fields against each other and the model; errors name where the field was set."""
    heads = layer["heads"]
    if layer["head_dim"] is None:
        if spec.width % heads:
            raise SpecError(f"{heads} heads do not divide width {spec.width}; choose a divisor of {spec.width}, or set head_dim", path=where["heads"])
        layer["head_dim"] = spec.width // heads
    if layer["kv_heads"] is None:
        layer["kv_heads"] = heads
    if heads % layer["kv_heads"]:
        raise SpecError(f"kv_heads {layer['kv_heads']} must divide heads {heads} (each key/value head serves a group of query heads)",
                        path=where["kv_heads"] if where["kv_heads"] != "model" else where["heads"])
    if not family.causal and (layer["rope_theta"] is not None or layer["rope_linear_factor"] is not None or not layer["rope"]):
        key = next(k for k in ("rope_theta", "rope_linear_factor") if layer[k] is not None) if layer["rope"] else "rope"
        raise SpecError(f"a {spec.family} model has learned positions, not RoPE; remove {key}", path=where[key])
    if layer["window"] is not None and not family.causal:
        raise SpecError(f"a sliding window needs causal attention, and a {spec.family} model attends both ways; remove window",
                        path=where["window"])
    if layer["mlp_placement"] == layer["placement"]:
        layer["mlp_placement"] = None  # one name for both sub-layers


def ramp_settings(ramp, layers: list[dict], spec: ModelSpec) -> list[dict]:
    """Per layer, what `ramp` sets: multipliers from linspace(MIN, MAX, depth) (see model.Ramp), each field by its
    declaration's `ramp` (in declaration order: a heads ramp sets the layer's kv_heads before a kv_heads ramp)."""
    depth = len(layers)

    def multipliers(bounds, decimals: int | None) -> list[float]:
        low, high = bounds
        values = [low + (high - low) * i / (depth - 1) if depth > 1 else low for i in range(depth)]
        return [round(v, decimals) for v in values] if decimals is not None else values

    out = [dict() for _ in range(depth)]
    for f in rampable():
        bounds = getattr(ramp, f.name)
        if bounds is None:
            continue
        for i, (layer, m) in enumerate(zip(layers, multipliers(bounds, 2 if f.ramp_rounds else None))):
            out[i].update(f.ramp(m, layer, spec))
    return out


def check_resolved(spec: ResolvedSpec) -> None:
    """A resolved spec read from a file (spec.yaml) gets every check a recipe's model gets: written out as a
    ModelSpec (one override per layer), parsed and resolved again, it must give back this very spec."""
    from blockforge.spec.strict import parse

    if not spec.layers:
        raise SpecError("lists no layers; give one per block", path="layers")
    family = get_family(spec.family, "family")
    for key in family.required:  # a ModelSpec would fill in its default; a resolved spec must say it
        if getattr(spec, key) is None:
            raise SpecError(f"is required for family {spec.family}", path=key)
    plain = {key: value for key, value in to_plain(spec).items() if value is not None and key not in ("format", "layers")}
    first = spec.layers[0]
    plain.update(depth=len(spec.layers), heads=first.heads, ffn=first.ffn)
    fields = [f.name for f in LAYER_FIELDS]

    def authored(i: int, layer: LayerSpec) -> dict:
        attn, mlp = layer.placements
        placement = attn if attn == mlp else {"attn": attn, "mlp": mlp}
        return {"at": i, "placement": placement, **{key: getattr(layer, key) for key in fields}}

    plain["layers"] = {"overrides": [authored(i, layer) for i, layer in enumerate(spec.layers)]}
    try:
        again = resolve(parse(ModelSpec, plain))
    except SpecError as err:  # said in spec.yaml's own terms: layers[3].heads, not model.layers.overrides[3].heads
        raise SpecError(err.message, path=err.path.removeprefix("model.").replace("layers.overrides[", "layers[")) from None
    for i, (layer, resolved) in enumerate(zip(spec.layers, again.layers)):
        if layer.index != i:
            raise SpecError(f"says index {layer.index}, but it is layer {i}", path=f"layers[{i}].index")
        for key, value in to_plain(resolved).items():
            if value != getattr(layer, key):
                raise SpecError(f"is {getattr(layer, key)!r}, but that layer resolves it to {value!r}; write that", path=f"layers[{i}].{key}")
    for key, value in to_plain(again).items():
        if key in ("format", "layers") or value == getattr(spec, key):
            continue
        if value is None:
            raise SpecError(f"does not apply to family {spec.family}; remove it", path=key)
        raise SpecError(f"is {getattr(spec, key)!r}, but a {spec.family} spec resolves it to {value!r}; write that", path=key)
