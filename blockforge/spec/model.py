"""The model spec: the authoring form users write (ModelSpec) and the resolved form models are built from.

ModelSpec says how layers are chosen (a default, a Mix-LN rule, ordered overrides); ResolvedSpec is a
frozen list with one LayerSpec per layer, saved beside every checkpoint and hashed to name an
architecture.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from blockforge.errors import SpecError, unknown_choice_message
from blockforge.spec.family import family_names, get_family
from blockforge.spec.fields import LAYER_FIELDS, NORMS, LayerField, layer_field, rampable
from blockforge.spec.placements import PLACEMENTS, placement_names
from blockforge.spec.strict import UNSET, bounded, canonical, check_ranges, choice, stable_hash

SPEC_FORMAT = 2  # 2: per-layer kv_heads, head_dim, window, norm, qk/v norm, layer scale, sub-layer placements, biases
MAX_DEPTH = 4096  # a guard against typos that would resolve billions of layers


def _check_placement(name: str | None, path: str) -> None:
    if name is not None and name not in PLACEMENTS:
        raise SpecError(unknown_choice_message(name, PLACEMENTS), path=path)


@dataclass(kw_only=True)
class SubLayerPlacements:
    """Different placements for the two sub-layers of a block (HybridNorm: {attn: none, mlp: post})."""

    attn: str = field(metadata={"help": "the attention sub-layer's placement", "choices": placement_names})
    mlp: str = field(metadata={"help": "the MLP sub-layer's placement", "choices": placement_names})

    def check(self, path: str) -> None:
        _check_placement(self.attn, f"{path}.attn")
        _check_placement(self.mlp, f"{path}.mlp")


def _settings_check(self, path: str) -> None:  # each field's range is its declaration's (LayerField.range), checked on parsing
    if isinstance(self.placement, str):
        _check_placement(self.placement, f"{path}.placement")


def _settings_assigned(self) -> dict:
    """The fields this entry sets, as resolved values (a placement pair becomes placement + mlp_placement)."""
    out = {f.name: getattr(self, f.name) for f in LAYER_FIELDS if getattr(self, f.name) is not (UNSET if f.nullable else None)}
    if isinstance(self.placement, SubLayerPlacements):
        out.update(placement=self.placement.attn, mlp_placement=self.placement.mlp)
    elif self.placement is not None:
        out.update(placement=self.placement, mlp_placement=None)
    return out


def _authored_field(f: LayerField) -> tuple:
    """A declared field in the authoring form: optional; unset is None, or UNSET where null is a value of its own."""
    default = UNSET if f.nullable else None
    metadata = {"help": f.help, **({"choices": f.choices} if f.choices else {}), **({"range": f.range} if f.range else {})}
    return f.name, f.kind | None, field(default=default, metadata=metadata)


# Per-layer fields (spec/fields.py declares them); unset fields keep what earlier rules gave the layer.
LayerSettings = dataclasses.make_dataclass(
    "LayerSettings", [("placement", str | SubLayerPlacements | None, field(default=None, metadata={"choices": placement_names})),
                      *map(_authored_field, LAYER_FIELDS)],
    namespace={"check": _settings_check, "assigned": _settings_assigned, "__module__": __name__,
               "__doc__": "Per-layer fields (spec/fields.py); unset fields keep what earlier rules gave the layer."},
    kw_only=True,
)


@dataclass(kw_only=True)
class LayerOverride(LayerSettings):
    at: int | str | list[int] = field(metadata={"help": "the layers it applies to: an index, a list, or slice text like '0:3'"})

    def check(self, path: str) -> None:
        super().check(path)
        if not self.assigned():
            fields = ", ".join(f.name for f in dataclasses.fields(LayerSettings))
            raise SpecError(f"sets nothing; give at least one of {fields}", path=path)


@dataclass(kw_only=True)
class MixLN:
    """`early` on the first floor(alpha * depth) layers, `late` on the rest: a placement name (Post-LN and
    Pre-LN by default) or any per-layer settings."""

    alpha: float = bounded(at_least=0, at_most=1, help="the fraction of early layers, in [0, 1]")
    early: str | LayerSettings = field(default="post", metadata={"choices": placement_names})
    late: str | LayerSettings = field(default="pre", metadata={"choices": placement_names})

    def check(self, path: str) -> None:
        check_ranges(self, path)  # also for a rule built in code (a search checks its alpha values so)
        for key in ("early", "late"):
            value = getattr(self, key)
            if isinstance(value, str):
                _check_placement(value, f"{path}.{key}")
            elif not value.assigned():
                raise SpecError("sets nothing; give a placement name or per-layer settings", path=f"{path}.{key}")

    def settings(self, early: bool) -> dict:
        """The resolved fields the rule gives an early (or late) layer."""
        value = self.early if early else self.late
        return {"placement": value, "mlp_placement": None} if isinstance(value, str) else value.assigned()


def _ramp_check(self, path: str) -> None:
    given = [f.name for f in rampable() if getattr(self, f.name) is not None]
    if not given:
        raise SpecError("ramps nothing; give e.g. ffn: [0.5, 4.0] (multipliers of the width, first layer to last)", path=path)
    for key in given:
        bounds = getattr(self, key)
        if len(bounds) != 2:
            raise SpecError(f"takes [MIN, MAX], two numbers, not {len(bounds)}", path=f"{path}.{key}")
        low, high = bounds
        if not 0 < low or not 0 < high:
            raise SpecError(f"multipliers must be greater than zero, not {bounds}", path=f"{path}.{key}")
        if low > high:
            raise SpecError(f"MIN {low:g} is above MAX {high:g}; a ramp runs from MIN at the first layer to MAX at the last, "
                            "so give MIN <= MAX", path=f"{path}.{key}")


Ramp = dataclasses.make_dataclass(
    "Ramp", [(f.name, list[float] | None, field(default=None, metadata={"help": f"[MIN, MAX] for {f.name}"})) for f in rampable()],
    namespace={"check": _ramp_check, "__module__": __name__, "__doc__": """Layer-wise scaling (OpenELM): per-layer multipliers from linspace(MIN, MAX, depth), first layer to last.

    heads / kv_heads / ffn multiply the width and are rounded as OpenELM does (multipliers to 2 decimals,
    dims with its make_divisible: query dims to head_dim x the layer's query/key-value group size, FFN dims
    to model.ffn_multiple_of); init_scale and lr_mult ramp the value itself (each field's `ramp` in spec/fields.py)."""},
    kw_only=True,
)


@dataclass(kw_only=True)
class Pattern:
    """Settings for every `every`-th layer from `offset` (0-based): layers i with i % every == offset."""

    every: int = bounded(at_least=1, help="the period in layers, e.g. 6")
    offset: int = 0
    set: LayerSettings = field(metadata={"help": "the per-layer settings the chosen layers get"})

    def check(self, path: str) -> None:
        if not 0 <= self.offset < self.every:
            raise SpecError(f"must lie in [0, every) = [0, {self.every}), not {self.offset}", path=f"{path}.offset")
        if not self.set.assigned():
            raise SpecError("sets nothing; give per-layer settings, e.g. {window: null}", path=f"{path}.set")


@dataclass(kw_only=True)
class LayerRules:
    """Applied in this order: default, mix_ln, ramp, each pattern, each override (later ones win)."""

    default: LayerSettings = field(default_factory=LayerSettings)
    mix_ln: MixLN | None = None
    ramp: Ramp | None = None
    pattern: list[Pattern] = field(default_factory=list)
    overrides: list[LayerOverride] = field(default_factory=list)


@dataclass(kw_only=True)
class ModelSpec:
    family: str = field(metadata={"help": "the model family, e.g. llama or vit", "choices": family_names})
    width: int = bounded(above=0, help="the model dimension")
    depth: int = bounded(above=0, help="the number of blocks")
    heads: int | None = bounded(None, above=0)
    head_dim: int | None = bounded(None, above=0)  # alone: heads = width / head_dim; with heads: the per-head width (may differ from width / heads)
    kv_heads: int | None = bounded(None, above=0)  # key/value heads of every layer (grouped-query attention); default: heads
    ffn: int | None = bounded(None, above=0)
    ffn_mult: float | None = bounded(None, above=0)
    ffn_multiple_of: int = bounded(1, above=0)
    norm: str | None = choice(*NORMS, default=None)  # None: the family's default norm
    norm_eps: float = bounded(1e-6, above=0)
    dyt_alpha: float = bounded(0.5, above=0)  # the initial alpha of DyT norms (tanh(alpha x))
    final_norm: bool = True
    tie_embeddings: bool = False
    qkv_bias: bool | None = None  # biases on q, k, v (default: the family's: llama none, vit all)
    proj_bias: bool | None = None  # a bias on the attention output projection
    mlp_bias: bool | None = None  # biases in the MLP
    attention: str = choice("sdpa", "eager", "xformers", default="sdpa")
    rope_theta: float = bounded(10000.0, above=0)
    rope_scaling: RopeScaling | None = None
    init_std: float = bounded(0.02, at_least=0)
    embed_init_std: float = bounded(0.02, at_least=0)
    # standard | mup (width: needs base_width) | completep (depth: needs base_depth; and width too with base_width)
    parametrization: str = choice("standard", "mup", "completep", default="standard")
    base_depth: int | None = bounded(None, above=0)  # completep: the depth whose hyperparameters transfer
    depth_alpha: float = bounded(1.0, at_least=0.5, at_most=1)  # completep: branches scaled by (depth / base_depth)^-depth_alpha, in [0.5, 1]
    base_width: int | None = bounded(None, above=0)  # mup, completep: the width whose hyperparameters transfer (ignored under standard)
    attention_scale: str = choice("sqrt", "inverse", default="sqrt")  # scores / sqrt(head_dim), or muP's 1/head_dim (see ResolvedSpec)
    # multipliers and caps of other open decoders (Gemma, Granite)
    norm_weight_offset: float = 0.0  # RMSNorm gains used as offset + weight (Gemma: 1, its weights stored as w in (1 + w))
    embed_scale: float = bounded(1.0, above=0)  # token embeddings times this (Gemma: sqrt(width); Granite: embedding_multiplier)
    residual_multiplier: float = bounded(1.0, above=0)  # every branch's output times this (Granite)
    logit_multiplier: float = bounded(1.0, above=0)  # the logits times this (Granite: 1 / logits_scaling)
    logit_softcap: float | None = bounded(None, above=0)  # logits c * tanh(logits / c) (Gemma 2's final_logit_softcapping)
    # llama
    vocab: int | None = bounded(None, above=0)
    context: int | None = bounded(None, above=0)
    # vit
    image_size: int | None = bounded(None, above=0)
    patch_size: int | None = bounded(None, above=0)
    channels: int = bounded(3, above=0)
    classes: int | None = bounded(None, above=0)
    layers: LayerRules = field(default_factory=LayerRules)

    def check(self, path: str) -> None:
        def at(key: str) -> str:
            return f"{path}.{key}" if path else key

        if self.depth > MAX_DEPTH:
            raise SpecError(f"must be at most {MAX_DEPTH}, not {self.depth}", path=at("depth"))
        if self.heads is None and self.head_dim is None:
            raise SpecError("give heads, or head_dim (heads = width / head_dim), or both", path=at("heads"))
        if self.heads is None and self.width % self.head_dim:
            raise SpecError(f"head_dim {self.head_dim} does not divide width {self.width}; give heads too for a head_dim of its own", path=at("head_dim"))
        if self.parametrization == "completep" and self.base_depth is None:
            raise SpecError("is required with parametrization completep (the depth whose hyperparameters transfer)", path=at("base_depth"))
        if self.parametrization == "mup" and self.base_width is None:
            raise SpecError("is required with parametrization mup (the width whose hyperparameters transfer)", path=at("base_width"))
        if self.attention_scale == "inverse" and (self.base_width is None or self.parametrization == "standard"):
            raise SpecError("inverse (muP's 1/head_dim) is relative to a base width: set parametrization mup or completep with base_width",
                            path=at("attention_scale"))
        if self.norm_weight_offset != 0.0 and self.norm not in (None, "rmsnorm"):
            raise SpecError(f"offsets RMSNorm gains only, and this model's norm is {self.norm}; set it to 0 or use rmsnorm", path=at("norm_weight_offset"))
        if self.ffn is not None and self.ffn_mult is not None:
            raise SpecError("give ffn or ffn_mult, not both", path=at("ffn_mult"))
        if self.ffn is None and self.ffn_mult is None:
            raise SpecError("is required: give ffn (hidden width) or ffn_mult (times width)", path=at("ffn"))
        family = get_family(self.family, at("family"))  # a family registered after parsing, or a spec built in code
        for key in family.required:
            if getattr(self, key) is None:
                raise SpecError(f"is required for family {self.family}", path=at(key))
        for key in family.unused:
            if getattr(self, key) is not None:
                raise SpecError(f"does not apply to family {self.family}; remove it", path=at(key))
        if family.check is not None:
            family.check(self, path)

    def default_ffn(self) -> int:
        if self.ffn is not None:
            return self.ffn
        hidden = int(self.ffn_mult * self.width)
        return -(-hidden // self.ffn_multiple_of) * self.ffn_multiple_of


@dataclass(kw_only=True)
class RopeScaling:
    """Llama-3's RoPE frequency scaling ("llama3"): long wavelengths stretched by `factor`, short ones kept."""

    type: str = choice("llama3")
    factor: float = bounded(8.0, above=0)
    low_freq_factor: float = bounded(1.0, above=0)
    high_freq_factor: float = bounded(4.0, above=0)
    original_context: int = bounded(8192, above=0)

    def check(self, path: str) -> None:
        if self.high_freq_factor <= self.low_freq_factor:
            raise SpecError(f"must be above low_freq_factor {self.low_freq_factor}, not {self.high_freq_factor}", path=f"{path}.high_freq_factor")


def _resolved_field(f: LayerField) -> tuple:
    if f.required:
        return f.name, f.kind, field()
    default = f.default if f.resolved_default == "default" else f.resolved_default
    return f.name, f.kind | None if default is None else f.kind, field(default=default)


def _placements(self) -> tuple[str, str]:
    """(attention sub-layer's, MLP sub-layer's)."""
    return self.placement, self.mlp_placement or self.placement


def _placement_name(self) -> str:
    """'pre', or 'none/post' when the sub-layers differ."""
    attn, mlp = self.placements
    return attn if attn == mlp else f"{attn}/{mlp}"


# One resolved layer: its placement (the attention sub-layer's, and the MLP's unless mlp_placement says
# otherwise) and every declared field. kv_heads, head_dim and norm are None only in files written before
# spec format 2 (ResolvedSpec fills them in). The fields whose values always enter the architecture hash
# form `hash_baseline`; a field declared later enters only when set away from its default
# (strict.canonical), so it renames no existing architecture.
_REQUIRED = [f for f in LAYER_FIELDS if f.required]
LayerSpec = dataclasses.make_dataclass(
    "LayerSpec",
    [("index", int), ("placement", str), *map(_resolved_field, _REQUIRED), ("mlp_placement", str | None, field(default=None)),
     *map(_resolved_field, [f for f in LAYER_FIELDS if not f.required])],
    namespace={"placements": property(_placements), "placement_name": property(_placement_name), "__module__": __name__,
               "hash_baseline": frozenset({"index", "placement", "mlp_placement", *(f.name for f in LAYER_FIELDS if f.hashed)}),
               "__doc__": "One resolved layer: its placement and every per-layer field declared in spec/fields.py."},
    frozen=True, kw_only=True,
)


@dataclass(frozen=True, kw_only=True)
class ResolvedSpec:
    """Everything a model is built from; `layers[i]` describes block i."""

    hash_baseline = frozenset({"family", "width", "norm", "norm_eps", "final_norm", "tie_embeddings", "rope_theta", "init_std", "embed_init_std",
                               "qkv_bias", "proj_bias", "mlp_bias", "dyt_alpha", "rope_scaling", "parametrization", "base_depth", "depth_alpha",
                               "vocab", "context", "image_size", "patch_size", "channels", "classes", "layers"})
    hash_excluded = frozenset({"format", "attention"})  # how the file was written, which kernel computes it: not what it computes

    format: int = SPEC_FORMAT
    family: str
    width: int
    norm: str
    norm_eps: float
    final_norm: bool
    tie_embeddings: bool
    attention: str
    rope_theta: float
    init_std: float
    embed_init_std: float
    qkv_bias: bool = False
    proj_bias: bool = False
    mlp_bias: bool = False
    dyt_alpha: float = 0.5
    rope_scaling: dict[str, Any] | None = None  # RopeScaling's fields
    parametrization: str = "standard"
    base_depth: int | None = None
    depth_alpha: float = 1.0
    base_width: int | None = None
    attention_scale: str = "sqrt"
    norm_weight_offset: float = 0.0
    embed_scale: float = 1.0
    residual_multiplier: float = 1.0
    logit_multiplier: float = 1.0
    logit_softcap: float | None = None
    vocab: int | None = None
    context: int | None = None
    image_size: int | None = None
    patch_size: int | None = None
    channels: int | None = None
    classes: int | None = None
    layers: tuple[LayerSpec, ...]

    @property
    def depth(self) -> int:
        return len(self.layers)

    def __post_init__(self) -> None:
        # Files from before format 2 leave the newer per-layer fields out: fill in what they meant.
        filled = tuple(
            dataclasses.replace(
                layer, kv_heads=layer.kv_heads or layer.heads, norm=layer.norm or self.norm,
                head_dim=layer.head_dim or (self.width // layer.heads if layer.heads and self.width % layer.heads == 0 else None),
            ) for layer in self.layers
        )
        object.__setattr__(self, "layers", filled)

    def check(self, path: str = "") -> None:
        if self.format > SPEC_FORMAT:
            raise SpecError(
                f"was written in spec format {self.format}, newer than this blockforge reads ({SPEC_FORMAT}); upgrade blockforge",
                path="format",
            )

    def left_out(self, layer: LayerSpec) -> dict:
        """The per-layer fields a file may leave out, each with the value it then takes (derived from the layer
        and the model): what spec.yaml omits, and what the layer table shows only when some layer differs."""
        out = {f.name: f.left_out(layer, self) if f.left_out is not None else f.default for f in LAYER_FIELDS if not f.required}
        return {**out, "mlp_placement": None}

    def layer_table(self) -> tuple[list[str], list[list]]:
        """Headers and one row per layer: placement, the fields whose column is always shown, and every other
        per-layer field that some layer sets away from its left-out value (kv_heads, window, norm, ...)."""
        always = [f.name for f in LAYER_FIELDS if f.column == "always"]
        shown = lambda key, v: f"{v:g}" if isinstance(v, float) else v  # noqa: E731
        headers = ["layer", "placement", *always]
        rows = [[layer.index, layer.placement_name, *(shown(k, getattr(layer, k)) for k in always)] for layer in self.layers]
        for f in LAYER_FIELDS:
            if f.column != "when set" or not any(getattr(layer, f.name) != self.left_out(layer)[f.name] for layer in self.layers):
                continue
            headers.append(f.name)
            for row, layer in zip(rows, self.layers):
                value = getattr(layer, f.name)
                row.append("global" if f.name == "window" and value is None else "-" if value is None else value)
        return headers, rows

    def value(self, layer: LayerSpec, name: str) -> Any:
        """Layer `layer`'s `name`, with what it inherits from the model filled in (rope_theta, mlp_act)."""
        value = getattr(layer, name)
        f = layer_field(name)
        return f.inherit(self, get_family(self.family)) if value is None and f.inherit is not None else value

    def post_ln_count(self) -> int:
        """Layers whose both sub-layers are Post-LN."""
        return sum(layer.placements == ("post", "post") for layer in self.layers)

    @property
    def depth_ratio(self) -> float:
        """depth / base_depth under completep (1 otherwise)."""
        return self.depth / self.base_depth if self.parametrization == "completep" else 1.0

    @property
    def width_ratio(self) -> float:
        """m = width / base_width under mup, and under completep with a base width (1 otherwise)."""
        return self.width / self.base_width if self.parametrization in ("mup", "completep") and self.base_width else 1.0

    # muP's width rules (Yang et al. 2022, for Adam; CompleteP, Dey et al. 2025, Table 1), for m = width_ratio.
    # Hidden weights are the blocks' matrices (q/k/v, attention output, MLP); the embedding (and vit's patch
    # projection, class token and positions), biases, norm and layer-scale gains are vector-like and keep
    # the base values; the readout (LM or class head) keeps its init and learning rate, and its output is
    # multiplied by 1/m. Every factor is 1 at the base width.
    @property
    def hidden_init_scale(self) -> float:
        """Init std of hidden weights times m^-1/2 (variance times base_width / width)."""
        return self.width_ratio ** -0.5

    @property
    def hidden_lr_scale(self) -> float:
        """Adam learning rate of hidden weights times 1/m."""
        return 1.0 / self.width_ratio

    @property
    def hidden_eps_scale(self) -> float:
        """Adam epsilon of hidden weights times 1/m (their gradients shrink as 1/m)."""
        return 1.0 / self.width_ratio

    @property
    def hidden_wd_scale(self) -> float:
        """AdamW weight decay of hidden weights times m, so that learning rate times decay stays as at the base."""
        return self.width_ratio

    @property
    def readout_multiplier(self) -> float:
        """The head's output times 1/m."""
        return 1.0 / self.width_ratio

    def attention_multiplier(self, layer: "LayerSpec") -> float:
        """Attention scores of `layer` times this, beyond 1/sqrt(head_dim): with attention_scale inverse, muP's
        1/head_dim written as sqrt(d0)/head_dim, d0 = head_dim * base_width / width (the head width at the base
        width, heads kept as width grows); so the factor is m^-1/2, and 1 at the base width. With sqrt, 1."""
        return self.width_ratio ** -0.5 if self.attention_scale == "inverse" else 1.0

    @property
    def branch_multiplier(self) -> float:
        """Every residual branch's output times this: CompleteP's (depth / base_depth)^-depth_alpha, times residual_multiplier."""
        multiplier = self.depth_ratio ** -self.depth_alpha
        return multiplier * self.residual_multiplier if self.residual_multiplier != 1.0 else multiplier

    @property
    def block_lr_scale(self) -> float:
        """CompleteP: the learning rate of the blocks' parameters times (depth / base_depth)^(depth_alpha - 1)."""
        return self.depth_ratio ** (self.depth_alpha - 1.0)

    @property
    def block_eps_scale(self) -> float:
        """CompleteP: Adam's epsilon for the blocks' parameters times (depth / base_depth)^-depth_alpha."""
        return self.depth_ratio ** -self.depth_alpha

    def transfer_factors(self) -> list[list[str]]:
        """Rows (parameter group, init std, learning rate, Adam eps, weight decay, forward multiplier): what the
        parametrization multiplies each group's base setting by (per-layer init_scale and lr_mult come on top)."""
        x = lambda v: f"x{v:.4g}"  # noqa: E731
        return [
            ["embedding (vit: patch projection, positions, class token)", x(1), x(1), x(1), x(1), x(1)],
            ["hidden weights (the blocks' matrices)", x(self.hidden_init_scale), x(self.hidden_lr_scale * self.block_lr_scale),
             x(self.hidden_eps_scale * self.block_eps_scale), x(self.hidden_wd_scale), f"branch x{self.branch_multiplier:.4g}"],
            ["block vectors (norm gains, biases, layer scales)", x(1), x(self.block_lr_scale), x(self.block_eps_scale), "none", "-"],
            ["attention scores (beyond 1/sqrt(head_dim))", "-", "-", "-", "-", x(self.attention_multiplier(self.layers[0]))],
            ["readout (head)", x(1), x(1), x(1), x(1), x(self.readout_multiplier)],
        ]

    def uniform_pre(self) -> bool:
        """Every sub-layer Pre-LN: the reference a search's verdicts compare with."""
        return all(layer.placements == ("pre", "pre") for layer in self.layers)

    def canonical(self) -> dict:
        """What decides the function this spec computes and how it trains, as plain data (see strict.canonical):
        no file format, no attention kernel, and no setting the spec ignores (CompleteP's base depth and
        exponent under the standard parametrization, DyT's initial alpha without DyT norms)."""
        plain = canonical(self)
        if self.parametrization != "completep":  # the base depth applies to completep only, the base width to mup and completep
            plain.pop("base_depth", None)
            plain.pop("depth_alpha", None)
        if self.parametrization == "standard":
            plain.pop("base_width", None)
        if "dyt" not in {self.norm, *(layer.norm for layer in self.layers)}:
            plain.pop("dyt_alpha", None)
        return plain

    def arch_hash(self) -> str:
        """A stable name for the function this spec computes: a hash of `canonical()`, pinned for shipped recipes in tests."""
        return stable_hash(self.canonical())
