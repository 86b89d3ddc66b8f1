"""The model spec: the authoring form users write (ModelSpec) and the resolved form models are built from.

ModelSpec says how layers are chosen (a default, a Mix-LN rule, ordered overrides); ResolvedSpec is a
frozen list with one LayerSpec per layer, saved beside every checkpoint and hashed to name an
architecture.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field

from blockforge.errors import SpecError, unknown_choice_message
from blockforge.spec.family import get_family
from blockforge.spec.placements import PLACEMENTS
from blockforge.spec.strict import choice, to_plain

SPEC_FORMAT = 1
MAX_DEPTH = 4096  # a guard against typos that would resolve billions of layers


def _check_placement(name: str | None, path: str) -> None:
    if name is not None and name not in PLACEMENTS:
        raise SpecError(unknown_choice_message(name, PLACEMENTS), path=path)


def _check_positive(value: float | int | None, path: str, *, allow_zero: bool = False) -> None:
    if value is None:
        return
    if value < 0 or (value == 0 and not allow_zero):
        bound = "zero or more" if allow_zero else "greater than zero"
        raise SpecError(f"must be {bound}, not {value}", path=path)


@dataclass(kw_only=True)
class LayerSettings:
    """Per-layer fields; unset fields keep what earlier rules gave the layer."""

    placement: str | None = None
    heads: int | None = None
    ffn: int | None = None
    init_scale: float | None = None  # multiplies the init std of the layer's linear weights
    lr_mult: float | None = None  # multiplies the learning rate of the layer's parameters

    def check(self, path: str) -> None:
        _check_placement(self.placement, f"{path}.placement")
        _check_positive(self.heads, f"{path}.heads")
        _check_positive(self.ffn, f"{path}.ffn")
        _check_positive(self.init_scale, f"{path}.init_scale")
        _check_positive(self.lr_mult, f"{path}.lr_mult", allow_zero=True)

    def assigned(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(LayerSettings) if getattr(self, f.name) is not None}


@dataclass(kw_only=True)
class LayerOverride(LayerSettings):
    at: int | str | list[int] = field(metadata={"help": "the layers it applies to: an index, a list, or slice text like '0:3'"})

    def check(self, path: str) -> None:
        super().check(path)
        if not self.assigned():
            raise SpecError("sets nothing; give at least one of placement, heads, ffn, init_scale, lr_mult", path=path)


@dataclass(kw_only=True)
class MixLN:
    """Post-LN (`early`) on the first floor(alpha * depth) layers, Pre-LN (`late`) on the rest."""

    alpha: float = field(metadata={"help": "the fraction of early layers, in [0, 1]"})
    early: str = "post"
    late: str = "pre"

    def check(self, path: str) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise SpecError(f"must lie in [0, 1], not {self.alpha}", path=f"{path}.alpha")
        _check_placement(self.early, f"{path}.early")
        _check_placement(self.late, f"{path}.late")


@dataclass(kw_only=True)
class LayerRules:
    default: LayerSettings = field(default_factory=LayerSettings)
    mix_ln: MixLN | None = None
    overrides: list[LayerOverride] = field(default_factory=list)


@dataclass(kw_only=True)
class ModelSpec:
    family: str = field(metadata={"help": "the model family, e.g. llama or vit"})
    width: int = field(metadata={"help": "the model dimension"})
    depth: int = field(metadata={"help": "the number of blocks"})
    heads: int | None = None
    head_dim: int | None = None
    ffn: int | None = None
    ffn_mult: float | None = None
    ffn_multiple_of: int = 1
    norm: str | None = choice("rmsnorm", "layernorm", default=None)  # None: the family's default norm
    norm_eps: float = 1e-6
    final_norm: bool = True
    tie_embeddings: bool = False
    attention: str = choice("sdpa", "eager", "xformers", default="sdpa")
    rope_theta: float = 10000.0
    init_std: float = 0.02
    embed_init_std: float = 0.02
    # llama
    vocab: int | None = None
    context: int | None = None
    # vit
    image_size: int | None = None
    patch_size: int | None = None
    channels: int = 3
    classes: int | None = None
    layers: LayerRules = field(default_factory=LayerRules)

    def check(self, path: str) -> None:
        def at(key: str) -> str:
            return f"{path}.{key}" if path else key

        for key in ("width", "depth", "heads", "head_dim", "ffn", "ffn_mult", "ffn_multiple_of", "norm_eps", "rope_theta", "vocab", "context", "image_size", "patch_size", "channels", "classes"):
            _check_positive(getattr(self, key), at(key))
        _check_positive(self.init_std, at("init_std"), allow_zero=True)
        _check_positive(self.embed_init_std, at("embed_init_std"), allow_zero=True)
        if self.depth > MAX_DEPTH:
            raise SpecError(f"must be at most {MAX_DEPTH}, not {self.depth}", path=at("depth"))
        if (self.heads is None) == (self.head_dim is None):
            raise SpecError("give exactly one of heads and head_dim", path=at("heads"))
        if self.head_dim is not None and self.width % self.head_dim:
            raise SpecError(f"head_dim {self.head_dim} does not divide width {self.width}", path=at("head_dim"))
        if self.ffn is not None and self.ffn_mult is not None:
            raise SpecError("give ffn or ffn_mult, not both", path=at("ffn_mult"))
        if self.ffn is None and self.ffn_mult is None:
            raise SpecError("is required: give ffn (hidden width) or ffn_mult (times width)", path=at("ffn"))
        family = get_family(self.family, at("family"))
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


@dataclass(frozen=True, kw_only=True)
class LayerSpec:
    index: int
    placement: str
    heads: int
    ffn: int
    init_scale: float = 1.0
    lr_mult: float = 1.0


@dataclass(frozen=True, kw_only=True)
class ResolvedSpec:
    """Everything a model is built from; `layers[i]` describes block i."""

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

    def check(self, path: str = "") -> None:
        if self.format > SPEC_FORMAT:
            raise SpecError(
                f"was written in spec format {self.format}, newer than this blockforge reads ({SPEC_FORMAT}); upgrade blockforge",
                path="format",
            )
        self._check_as_authored()

    def _check_as_authored(self) -> None:
        """A spec.yaml gets every check a recipe's model gets: written out as a ModelSpec (one override per
        layer), parsed and resolved again, it must give back this very spec."""
        from blockforge.spec.resolve import resolve
        from blockforge.spec.strict import parse

        if not self.layers:
            raise SpecError("lists no layers; give one per block", path="layers")
        family = get_family(self.family, "family")
        for key in family.required:  # a ModelSpec would fill in its default; a resolved spec must say it
            if getattr(self, key) is None:
                raise SpecError(f"is required for family {self.family}", path=key)
        plain = {key: value for key, value in to_plain(self).items() if value is not None and key not in ("format", "layers")}
        plain["depth"] = len(self.layers)
        first = self.layers[0]
        plain.update(heads=first.heads, ffn=first.ffn)
        fields = ("placement", "heads", "ffn", "init_scale", "lr_mult")
        plain["layers"] = {"overrides": [dict({key: getattr(layer, key) for key in fields}, at=i) for i, layer in enumerate(self.layers)]}
        try:
            again = resolve(parse(ModelSpec, plain))
        except SpecError as err:  # said in spec.yaml's own terms: layers[3].heads, not model.layers.overrides[3].heads
            raise SpecError(err.message, path=err.path.removeprefix("model.").replace("layers.overrides[", "layers[")) from None
        for i, (layer, resolved) in enumerate(zip(self.layers, again.layers)):
            if layer != resolved:
                raise SpecError(f"says index {layer.index}, but it is layer {i}", path=f"layers[{i}].index")
        for key, value in to_plain(again).items():
            if key in ("format", "layers") or value == getattr(self, key):
                continue
            if value is None:
                raise SpecError(f"does not apply to family {self.family}; remove it", path=key)
            raise SpecError(f"is {getattr(self, key)!r}, but a {self.family} spec resolves it to {value!r}; write that", path=key)

    def post_ln_count(self) -> int:
        return sum(layer.placement == "post" for layer in self.layers)

    def arch_hash(self) -> str:
        """A stable name for the function this spec computes (the attention backend does not change it)."""
        plain = to_plain(self)
        plain.pop("attention")
        text = json.dumps(plain, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]
