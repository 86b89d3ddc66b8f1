"""A cell's pipeline, built once from the plan: the one place that reads which stages a search has.

A proxy cell explores, then (with `confirm`) confirms its finalists, or its explored front with a cost axis;
with a scheduler it promotes pruned trials that could have ended ahead; with `confirm.max_seeds` it races its
leaders; with `confirm.length` it continues its pair to longer training; with `confirm.lr_curve` (or `confirm.lr` /
`confirm.stability`) it trains its finalists, baselines and Pre-LN over a learning-rate curve. A transfer target only transfers. When a cell is idle its stages after exploration are asked in this
order for more work (cell.Cell.ready), so promotion comes before each further round of racing.

A new stage is a new file with a Stage subclass and one line in PROXY_STAGES (or TARGET_STAGES).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from blockforge.search.config import SearchPlan
from blockforge.spec.search import lr_curve_of
from blockforge.search.stages.base import Stage
from blockforge.search.stages.confirm import Confirm, Front, Race
from blockforge.search.stages.explore import Explore
from blockforge.search.stages.guidance import GuidedExplore
from blockforge.search.stages.length import Length
from blockforge.search.stages.lr_curve import LrCurve
from blockforge.search.stages.promote import Promote
from blockforge.search.stages.transfer import Transfer

if TYPE_CHECKING:
    from blockforge.search.stages.cell import SearchContext

When = Callable[[SearchPlan, str], bool]

PROXY_STAGES: list[tuple[type[Stage], When]] = [
    (Explore, lambda plan, name: not plan.guided(name)),
    (GuidedExplore, lambda plan, name: plan.guided(name)),
    (Confirm, lambda plan, name: plan.confirm is not None and not plan.costs),
    (Front, lambda plan, name: plan.confirm is not None and bool(plan.costs)),
    (Promote, lambda plan, name: plan.stops_early(name)),
    (Race, lambda plan, name: plan.confirm is not None and plan.confirm.max_seeds is not None),
    (Length, lambda plan, name: plan.confirm is not None and plan.confirm.length is not None),
    (LrCurve, lambda plan, name: lr_curve_of(plan.confirm) is not None),
]
TARGET_STAGES: list[tuple[type[Stage], When]] = [
    (Transfer, lambda plan, name: True),
]


def stage_types(plan: SearchPlan, name: str, as_proxy: bool = False) -> list[type[Stage]]:
    """The stages of cell `name`, in order (`as_proxy`: those of a full search of it, even where it is a transfer target)."""
    table = TARGET_STAGES if name in plan.target_names() and not as_proxy else PROXY_STAGES
    return [stage for stage, when in table if when(plan, name)]


def build_stages(context: "SearchContext", name: str, index: int, records: list, extra: dict | None = None) -> list[Stage]:
    """The stage objects of cell `name` (its `index` seeds its sampler; `records` are what a resumed search found)."""
    plan = context.plan
    stages = []
    for stage in stage_types(plan, name):
        if stage is GuidedExplore:
            stages.append(GuidedExplore(plan, name, index, records, context.guidance))
        elif stage is Explore:
            stages.append(Explore(plan, name, index, records))
        elif stage is Transfer:
            stages.append(Transfer(plan, context.predictions))
        else:
            stages.append(stage(plan))
    return stages


def worst_case(plan: SearchPlan, name: str, as_proxy: bool = False) -> dict[str, int]:
    """Stage -> the most trials it may train in cell `name`: each stage's own count."""
    types = stage_types(plan, name, as_proxy)
    explored = _explored(plan, name, types)
    return {stage.key(): stage.worst_case(plan, name, explored) for stage in types}


def _explored(plan: SearchPlan, name: str, types: list[type[Stage]]) -> int:
    """Exploration's worst case in cell `name`: its exploring stage's own, or a plain exploration's (a transfer target)."""
    lead = types[0] if issubclass(types[0], Explore) else Explore
    return lead.budget(plan, name)


def rounds(plan: SearchPlan, name: str, as_proxy: bool = False) -> int:
    """Stages of cell `name` that wait for the one before, each at least one trial long (racing: one per round)."""
    types = stage_types(plan, name, as_proxy)
    return sum(stage.rounds(plan) for stage in types if stage.worst_case(plan, name, _explored(plan, name, types)))
