"""Model families: one registered object per family holds everything that differs between them.

A family (llama, vit, ...) says which ModelSpec fields it needs, its default norm, what data it
trains on and what it reports, and carries the code hooks the rest of blockforge calls: the backbone
builder, the loss, the dataset builder, an example batch, and its converters to other libraries.
Nothing outside a family's own registration asks which family a model is. The registrations live in
`blockforge.families`, which `import blockforge` imports; they are declarations (names, fields, defaults) and name the
hooks that need torch with `blockforge.lazy.lazy`, imported when first used, so a spec is checked without torch.

Adding a family is one `register_family(Family(...))` call: see docs/design.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from blockforge.errors import SpecError, unknown_choice_message


@dataclass(frozen=True, kw_only=True)
class Family:
    name: str
    default_norm: str  # the norm of a spec that names none
    default_activation: str = "silu"  # the MLP's activation of a spec that names none (llama: gated SiLU; vit: GELU)
    data_kind: str  # which data sources fit: "text" or "image" (blockforge.spec.data.SOURCES)
    required: tuple[str, ...]  # ModelSpec fields the family needs
    unused: tuple[str, ...] = ()  # ModelSpec fields that do not apply to it
    metrics: tuple[str, ...]  # what an evaluation reports, besides train_loss
    sample_unit: str  # throughput unit: "tok" (each sample is `context` tokens) or "img"
    causal: bool = True  # attention sees only earlier positions (sliding windows and generation need it)
    default_bias: bool = False  # biases on q, k, v, the attention output and the MLP unless the spec says otherwise
    no_decay: tuple[str, ...] = ()  # parameter names (besides norms and biases) that get no weight decay
    check: Callable[[Any, str], None] | None = None  # extra checks of a ModelSpec: check(spec, path)
    check_layer: Callable[[Any, dict, str], None] | None = None  # check(model spec, resolved layer fields, key path)
    # Code hooks (set by the registration in blockforge.families; those that import torch as lazy("module:name")):
    build: Callable[..., Any] | None = None  # build(resolved spec) -> nn.Module with .layers, .spec, .init_weights(seed)
    loss: Callable[..., Any] | None = None  # loss(model, batch, pad_id) -> (mean loss, samples counted, correct or None)
    dataset: Callable[..., Any] | None = None  # dataset(data config, resolved spec, seed, cache_dir, run_dir) -> dataset
    example_batch: Callable[..., Any] | None = None  # example_batch(resolved spec, batch size, device, dtype) -> batch
    model_inputs: Callable[..., Any] | None = None  # model_inputs(batch, pad_id) -> (what forward takes, mask of real tokens or None)
    # outer_costs(model) -> nn.flops.OuterCosts: positions per sample, input-embedding parameters, forward FLOPs outside the blocks
    outer_costs: Callable[..., Any] | None = None
    converters: dict[str, Callable[..., Any]] = field(default_factory=dict)  # e.g. {"from_hf": ..., "to_hf": ...}
    exports: dict[str, Any] = field(default_factory=dict)  # other libraries' folder formats: {"hf": ExportFormat} (families/formats.py)

    def samples_to_items(self, spec: Any) -> int:
        """Tokens (or images) per training sample, for throughput."""
        return spec.context if self.sample_unit == "tok" else 1


FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> Family:
    if family.name in FAMILIES:
        raise ValueError(f"family '{family.name}' is already registered")
    FAMILIES[family.name] = family
    return family


def family_names() -> tuple[str, ...]:
    """The registered families' names: the values `model.family` may take (its field's choices)."""
    return tuple(FAMILIES)


def get_family(name: str, path: str = "model.family") -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise SpecError(unknown_choice_message(name, FAMILIES), path=path) from None
