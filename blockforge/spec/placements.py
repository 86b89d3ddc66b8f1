"""Normalization placements: which norm slots of a residual sub-layer are filled, and its constants.

Every sub-layer (attention, MLP) of every block computes

    h = out_norm( a * x  +  branch_norm( F( s * in_norm(x) ) ) )

with unfilled slots being the identity. A placement fills slots and chooses a (residual scale), s
(input scale) and an init gain for the value/output/MLP weights; all three may depend on the 0-based
layer index l and the model depth L (the total number of blocks, also in a Mix-LN stack). The Block
code has no branch per placement: it reads these values once, when it is built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from blockforge.errors import SpecError, unknown_choice_message

ScaleFn = Callable[[int, int], float]


def _one(index: int, depth: int) -> float:
    return 1.0


@dataclass(frozen=True)
class Placement:
    name: str
    formula: str
    in_norm: bool = False
    branch_norm: bool = False
    out_norm: bool = False
    residual_scale: ScaleFn = field(default=_one, repr=False)  # a(l, L)
    input_scale: ScaleFn = field(default=_one, repr=False)  # s(l, L)
    branch_init_gain: ScaleFn = field(default=_one, repr=False)  # multiplies v, out and MLP init std


PLACEMENTS: dict[str, Placement] = {}


def register_placement(placement: Placement) -> Placement:
    if placement.name in PLACEMENTS:
        raise ValueError(f"placement '{placement.name}' is already registered")
    PLACEMENTS[placement.name] = placement
    return placement


def placement_names() -> tuple[str, ...]:
    """The registered placements' names: the values a layer's `placement` may take (its field's choices)."""
    return tuple(PLACEMENTS)


def get_placement(name: str) -> Placement:
    try:
        return PLACEMENTS[name]
    except KeyError:
        raise SpecError(unknown_choice_message(name, PLACEMENTS)) from None


register_placement(Placement("pre", "x + F(N(x))", in_norm=True))
register_placement(Placement("post", "N(x + F(x))", out_norm=True))
# DeepNorm (Wang et al. 2022), decoder-only constants: a = (2L)^(1/4), init gain (8L)^(-1/4).
register_placement(
    Placement(
        "deepnorm",
        "N(a*x + F(x)), a = (2L)^(1/4)",
        out_norm=True,
        residual_scale=lambda index, depth: (2.0 * depth) ** 0.25,
        branch_init_gain=lambda index, depth: (8.0 * depth) ** -0.25,
    )
)
# Sandwich-LN (CogView) / Peri-LN: normalize both the branch input and the branch output.
register_placement(Placement("sandwich", "x + N2(F(N1(x)))", in_norm=True, branch_norm=True))
# Res-post-norm (Swin-v2) / OLMo-2's reordered norm.
register_placement(Placement("respost", "x + N(F(x))", branch_norm=True))
# LayerNorm Scaling (Curse of Depth): Pre-LN with the normalized input scaled by 1/sqrt(l+1).
register_placement(
    Placement(
        "lns",
        "x + F(N(x) / sqrt(l+1))",
        in_norm=True,
        input_scale=lambda index, depth: 1.0 / math.sqrt(index + 1),
    )
)
# No norm on the sub-layer (HybridNorm's attention with QKV-norm; ReZero-style stacks with a zero layer scale).
register_placement(Placement("none", "x + F(x)"))
