"""Per-layer fields, each declared once: what it is, its default or derivation, its checks, what rules do
with it, its inspect column and what exports need of it. spec/model.py builds the authoring form
(LayerSettings, with every field optional), the resolved form (LayerSpec) and Ramp from this table;
resolution, spec.yaml, inspect, the search's dotted keys and the exports read it. Adding a per-layer field
is a declaration here plus the code where it acts (docs/design.md walks through one).

The placement (a name, or one per sub-layer) is the one per-layer setting not declared here: it fills the
norm slots of both sub-layers and has rules of its own (Mix-LN's early/late).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from blockforge.spec.strict import Range



@dataclass(frozen=True)
class LayerField:
    name: str
    kind: type  # the authored value's type: int, float, bool or str
    help: str
    default: Any = None  # the resolved value when no rule sets it (see `start` for one taken from the model)
    start: Callable | None = None  # (ModelSpec, family) -> the value every layer starts from, when it comes from the model
    origin: Callable | None = None  # (ModelSpec) -> the model-level key path that gave the start value (for error messages), if any
    # (model spec, family) -> the model's value, which a layer takes when it sets none: the resolved form then holds
    # None, and a layer set to the model's value resolves to None too (one model, one name). ResolvedSpec.value reads it.
    inherit: Callable | None = None
    nullable: bool = False  # null is a value of its own ("off"); in the authoring form "not given" is then UNSET
    minimum: float | None = None  # values must be above this (>= with `zero`)
    zero: bool = False
    choices: tuple[str, ...] = ()
    required: bool = False  # a resolved spec (spec.yaml) must give it
    resolved_default: Any = "default"  # a resolved spec's value when a file leaves it out ("default": `default`; None: derived on load)
    left_out: Callable | None = None  # (LayerSpec, ResolvedSpec) -> the value spec.yaml and inspect may leave out (default: `default`)
    column: str = "when set"  # inspect: "always" a column, "when set" (some layer away from its left-out value), or "never"
    ramp: Callable | None = None  # (multiplier, layer dict, ModelSpec) -> the fields a ramp entry sets; None: not rampable
    ramp_rounds: bool = True  # ramp multipliers rounded to 2 decimals (OpenELM) before use
    hashed: bool = True  # in the architecture hash whatever its value (False: only when set away from its default)
    # What a plain transformers or timm model (one layer class repeated) needs of it: "uniform" (one value for
    # every layer), "default" (every layer at the default: the plain model has no such knob) or "free" (it does
    # not change the function computed). Each export adds what its library holds of a uniform value.
    plain: str = "uniform"
    plain_says: str = ""  # what a layer away from the default has, for refusals: "sliding windows"
    # The module that acts on it: "attn" or "mlp" get it as a keyword argument of that name when a block is built
    # (nn/block.build_block), hold it as an attribute of that name, and the transformers remote code reads it from
    # there into the layer's config (families/hf_export.layer_config). None: used elsewhere (named in its help).
    module: str | None = None

    @property
    def range(self) -> Range | None:
        """The values it may take, as the authoring form declares them (checked on parsing, shown to editors)."""
        if self.minimum is None:
            return None
        return Range(low=self.minimum, low_open=not self.zero, or_null=self.nullable)


def make_divisible(value: float, divisor: int) -> int:
    """OpenELM's rounding: the nearest multiple of `divisor` (at least `divisor`), one step up if that fell below 90% of `value`."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def _ramp_heads(m: float, layer: dict, spec) -> dict:
    head_dim = layer["head_dim"] or spec.width // layer["heads"]
    group = layer["heads"] // (layer["kv_heads"] or layer["heads"])  # query heads per key/value head
    heads = make_divisible(spec.width * m, head_dim * group) // head_dim
    return {"heads": heads, "kv_heads": heads // group, "head_dim": head_dim}


def _ramp_kv_heads(m: float, layer: dict, spec) -> dict:
    head_dim = layer["head_dim"] or spec.width // layer["heads"]
    return {"kv_heads": make_divisible(spec.width * m, head_dim) // head_dim, "head_dim": head_dim}


def _ramp_ffn(m: float, layer: dict, spec) -> dict:
    return {"ffn": make_divisible(spec.width * m, spec.ffn_multiple_of)}


def _value_ramp(name: str) -> Callable:
    return lambda m, layer, spec: {name: m}


# The norm types a layer (and a model) may name. Every other list of them is this one: nn/norms.py's classes, and the
# remote-code files shipped into exports (which cannot import blockforge) are checked against it by tests/families/test_hf_remote.py.
NORMS = ("rmsnorm", "layernorm", "dyt")


def _width_over_heads(layer, spec):
    return spec.width // layer.heads if layer.heads and spec.width % layer.heads == 0 else None


LAYER_FIELDS: list[LayerField] = [
    LayerField("heads", int, "query heads", minimum=0, column="always", ramp=_ramp_heads, required=True,
               start=lambda spec, family: spec.heads if spec.heads is not None else spec.width // spec.head_dim,
               origin=lambda spec: "model.heads" if spec.heads is not None else "model.head_dim"),
    LayerField("kv_heads", int, "key/value heads (grouped-query attention); must divide heads", minimum=0, ramp=_ramp_kv_heads,
               start=lambda spec, family: spec.kv_heads, origin=lambda spec: "model.kv_heads" if spec.kv_heads is not None else None,
               resolved_default=None,
               left_out=lambda layer, spec: layer.heads),
    LayerField("head_dim", int, "per-head width (default width / heads)", minimum=0, column="always",
               start=lambda spec, family: spec.head_dim if spec.heads is not None else None,
               origin=lambda spec: "model.head_dim" if spec.heads is not None and spec.head_dim is not None else None, resolved_default=None,
               left_out=_width_over_heads),
    LayerField("ffn", int, "MLP hidden width", minimum=0, column="always", ramp=_ramp_ffn, start=lambda spec, family: spec.default_ffn(),
               required=True),
    LayerField("window", int, "a causal sliding window of this many positions (itself included); null: global", nullable=True, minimum=0,
               plain="default", plain_says="sliding windows", module="attn"),
    LayerField("norm", str, "this layer's norms (default: the model's)", choices=NORMS,
               start=lambda spec, family: spec.norm or family.default_norm, left_out=lambda layer, spec: spec.norm, resolved_default=None),
    LayerField("qk_norm", bool, "normalize queries and keys per head, before RoPE", default=False, plain_says="query and key norms"),
    LayerField("v_norm", bool, "normalize values per head (HybridNorm's QKV-norm, with qk_norm)", default=False, plain="default",
               plain_says="value norms"),
    LayerField("layer_scale", float, "a per-channel gain on each branch's output, initialized to this; null: none", nullable=True,
               minimum=0, zero=True, plain_says="layer scales"),
    LayerField("mlp_act", str, "the MLP's activation (llama: of the gate; default: the family's)", choices=("silu", "gelu_tanh", "gelu"),
               inherit=lambda spec, family: family.default_activation, hashed=False, plain_says="MLP activations of their own", module="mlp"),
    LayerField("rope", bool, "rotary position embeddings on queries and keys; false: none (NoPE)", default=True, hashed=False,
               plain="default", plain_says="layers without RoPE"),
    LayerField("rope_theta", float, "this layer's RoPE base (default: the model's)", minimum=0, hashed=False,
               inherit=lambda spec, family: spec.rope_theta, plain_says="RoPE bases of their own"),
    LayerField("rope_linear_factor", float, "linear RoPE scaling: this layer's positions divided by it (Gemma 3's global layers); "
               "null: none", nullable=True, minimum=0, hashed=False, plain="default", plain_says="linear RoPE scaling", module="attn"),
    LayerField("query_scale", float, "attention scores times this instead of 1/sqrt(head_dim); null: 1/sqrt(head_dim)", nullable=True,
               minimum=0, hashed=False, plain="default", plain_says="a query scale of their own"),
    LayerField("qk_norm_over", str, "what qk_norm normalizes: each head, or the whole query (key) projection (OLMo 2)", default="head",
               choices=("head", "projection"), hashed=False, plain="default", plain_says="q/k norms over the whole projection", module="attn"),
    LayerField("attn_logit_softcap", float, "attention scores c * tanh(scores / c) before the softmax (Gemma 2); null: none",
               nullable=True, minimum=0, hashed=False, plain="default", plain_says="soft-capped attention scores", module="attn"),
    LayerField("init_scale", float, "multiplies the init std of the layer's linear weights", default=1.0, minimum=0, column="always",
               ramp=_value_ramp("init_scale"), ramp_rounds=False, plain="free"),
    LayerField("lr_mult", float, "multiplies the learning rate of the layer's parameters", default=1.0, minimum=0, zero=True,
               column="always", ramp=_value_ramp("lr_mult"), ramp_rounds=False, plain="free"),
]


def layer_field(name: str) -> LayerField:
    return next(f for f in LAYER_FIELDS if f.name == name)


def rampable() -> list[LayerField]:
    return [f for f in LAYER_FIELDS if f.ramp is not None]


def plain_problems(spec, keep_default: tuple[str, ...] = (), presence: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """What keeps `spec`'s layers from being one plain layer class repeated (a transformers or timm model):
    (the fields that differ between layers, what some layer has that such a model has not, e.g. "sliding
    windows"). `keep_default`: fields the export needs at their default although their declaration allows
    any uniform value (a plain LlamaForCausalLM has no q/k norms, which timm's ViT has); `presence`: fields whose
    value only needs to be set in all layers or none (an initial value the weights have long replaced)."""
    differ, extra = [], []
    for f in LAYER_FIELDS:
        values = [getattr(layer, f.name) for layer in spec.layers]
        if f.name in presence:
            values = [v is not None for v in values]
        if f.plain == "free":
            continue
        if f.plain == "default" or f.name in keep_default:
            if any(getattr(layer, f.name) != f.default for layer in spec.layers):
                extra.append(f.plain_says or f"{f.name} {sorted(set(map(str, values)))}")
        elif len(set(values)) > 1:
            differ.append(f.name)
    return differ, extra


def module_fields(module: str) -> list[LayerField]:
    """The fields the `module` ("attn" or "mlp") of a block takes by name."""
    return [f for f in LAYER_FIELDS if f.module == module]
