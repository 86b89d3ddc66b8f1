"""Law-guided exploration: a cell after the guiding ones explores the Post-LN counts the alpha laws predict for it.

Cells run in the plan's order (plan.order: cheapest trial first). The first `guide.after` are searched in full and
at once; each later cell waits until every cell before it is answered, and `Guidance` then gives it, in a background
job (a law bootstrap never runs inside Tune's `suggest`), its window: the middle 95% of the k that the alpha laws,
refitted on seed resamples of the confirmed candidates of every cell before it, predict for it (law.law_window). A cell
learns from all the cells that finished before it, and which cells those are depends only on the order.

`GuidedExplore` trains a guided cell's baselines and Pre-LN at once, waits for the window, then trains every k in it
(nearest its middle first) with every value of the other searched keys, `guide.margin` more on each side; then, while
the cell's best explored k sits on an edge of what it explored that is not the end of its range, one more k beyond
it, so a cell that breaks the law is found out rather than steered. Each point is trained once to the full budget.
The prior limits and orders exploration, never the answer: confirmation works on what the cell itself trained.
"""

from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING

from blockforge.search.config import MIX_LN_COUNT, SearchPlan
from blockforge.search.records.ledger import StageName, TrialRecord
from blockforge.search.stages.explore import Explore
from blockforge.spec.search import mode_sign
from blockforge.train.events import Status

if TYPE_CHECKING:
    from blockforge.search.evidence.law import LawWindow
    from blockforge.search.stages.cell import Cell, SearchContext


def guide_window(plan: SearchPlan, name: str, records: list) -> "LawWindow | None":
    """Guided cell `name`'s window, from the records of every cell before it in the plan's order (the same computation for
    the search and its reports)."""
    from blockforge.search.evidence.evidence import evidence_by_cell
    from blockforge.search.evidence.law import bootstrap_cells, law_points, law_window

    before = set(plan.before(name))
    evidence = evidence_by_cell(plan, [r for r in records if r.cell in before])
    points = [p for p in law_points(plan, evidence) if p["cell"] in before]
    recipe = plan.recipe(plan.trial_overrides(plan.cell(name), {}))
    return law_window(bootstrap_cells(plan, evidence, points), recipe.model.depth, recipe.model.width)


class Guidance:
    """Each guided cell's window, computed in the background once every cell before it in the order is answered."""

    def __init__(self, context: "SearchContext"):
        self.context = context
        self.windows: dict[str, object] = {}
        self.error: BaseException | None = None
        self._threads: dict[str, threading.Thread] = {}

    def __getstate__(self) -> dict:  # Tune pickles the searcher: a running job is started again after a restore
        return {"context": self.context, "windows": dict(self.windows), "error": None, "_threads": {}}

    def ready(self, name: str) -> bool:
        """Whether cell `name`'s window is there; starts its job once the cells before it are answered (a failure is raised here)."""
        if name not in self.windows and name not in self._threads:
            cells, plan = self.context.cells, self.context.plan
            if not all(cells[before].answered for before in plan.before(name)):
                return False
            records = [r for before in plan.before(name) for r in cells[before].records()]
            self._threads[name] = threading.Thread(target=self._compute, args=(name, records), name=f"guidance-{name}", daemon=True)
            self._threads[name].start()
        if name not in self.windows and name in self._threads:
            self._threads[name].join(timeout=0)
        if self.error is not None:
            raise self.error
        return name in self.windows

    def _compute(self, name: str, records: list) -> None:
        try:
            self.windows[name] = guide_window(self.context.plan, name, records)
        except BaseException as err:  # handed to the searcher's thread by ready()
            self.error = err


class GuidedExplore(Explore):
    """Exploration of a guided cell (see the module's docstring)."""

    def __init__(self, plan: SearchPlan, name: str, index: int, records: list[TrialRecord], guidance: Guidance):
        self.guidance = guidance
        super().__init__(plan, name, index, records)
        dims = plan.dimensions_in(name)
        layers = next(d for d in dims if d.name == MIX_LN_COUNT)
        self.lowest, self.highest = layers.args
        self.others = [d for d in dims if d.name != MIX_LN_COUNT]
        explored = [r for r in records if r.cell == name and r.stage == StageName.EXPLORE]
        stopped = [plan.sampler_params(name, r.overrides) for r in explored if r.status in (Status.RUNNING, Status.INTERRUPTED)]
        self.tried = [plan.sampler_params(name, r.overrides) for r in explored if r.status not in (Status.RUNNING, Status.INTERRUPTED)]
        first = [plan.sampler_params(name, b) for b in plan.baselines]
        pre_ln = self._points(self.lowest)[:1] if self.lowest == 0 else []
        # the trials a stop interrupted continue first, under their own numbers; then the baselines and Pre-LN not yet tried
        self.pending = [p for i, p in enumerate(stopped + first + pre_ln) if p not in (stopped + first + pre_ln)[:i] and p not in self.tried]
        self.window: list[int] | None = None  # the k it explores: the law's range and its margins, then what growth added
        self.predicted: tuple[int, int] | None = None  # the law's range of k
        self.grew: list[int] = []

    def _first_points(self, name: str, records: list[TrialRecord]) -> list[dict]:
        return []  # its points come from the window, not from the sampler's queue

    def _points(self, k: int) -> list[dict]:
        """Every point with `k` Post-LN layers: k with each combination of the other searched (discrete) keys' values."""
        return [{MIX_LN_COUNT: k, **dict(zip((d.name for d in self.others), combo))}
                for combo in itertools.product(*(d.values() for d in self.others))]

    def _queue(self, ks: list[int]) -> None:
        for k in ks:
            self.pending += [p for p in self._points(k) if p not in self.tried and p not in self.pending]

    def _open_window(self, cell: "Cell") -> None:
        window = self.guidance.windows[cell.name]
        margin = self.plan.guide.margin
        low, high = (window.low, window.high) if window is not None else (self.lowest, self.highest)  # no law: the whole range
        self.predicted = (low, high)
        ks = list(range(max(self.lowest, low - margin), min(self.highest, high + margin) + 1))
        middle = (low + high) / 2
        self.window = sorted(ks)
        self._queue(sorted(ks, key=lambda k: (abs(k - middle), k)))

    def _best_k(self, cell: "Cell") -> int | None:
        sign = mode_sign(self.plan.mode)
        explored = [o for o in cell.done.values() if o.trial.stage == StageName.EXPLORE and o.status in (Status.COMPLETED, Status.DIVERGED)
                    and o.value is not None and o.trial.post_ln_layers is not None]
        if not explored:
            return None
        return min(explored, key=lambda o: (sign * o.value, o.trial.post_ln_layers)).trial.post_ln_layers

    def _grow(self, cell: "Cell") -> bool:
        """One more k beyond the edge of the window that the cell's best explored k sits on, or beyond (a baseline outside
        the window doing best), unless that is the end of the cell's range."""
        best = self._best_k(cell)
        while best is not None and not self.pending:
            beyond = min(self.window) - 1 if best <= min(self.window) else max(self.window) + 1 if best >= max(self.window) else None
            if beyond is None or not self.lowest <= beyond <= self.highest:
                return False
            self.window = sorted([*self.window, beyond])
            self.grew.append(beyond)
            self._queue([beyond])  # nothing new when a baseline trained it already: then look one further
        return bool(self.pending)

    def active(self, cell: "Cell") -> bool:
        if self.pending:
            return True
        if self.window is None:
            if not self.guidance.ready(cell.name):
                return False
            self._open_window(cell)
            return bool(self.pending) or self.active(cell)
        return not cell.busy() and self._grow(cell)

    def open(self, cell: "Cell") -> bool | None:
        return None if self.window is None else False  # the cell waits for its window

    def propose(self, cell: "Cell", trial_id: str) -> dict | None:
        self.asks += 1
        params = self.pending.pop(0)
        self.tried.append(params)
        config = self._run_point(cell, trial_id, params)
        if config is not None:
            self.runs += 1
        return config

    @staticmethod
    def budget(plan: SearchPlan, name: str) -> int:
        """The guided worst case: the baselines and Pre-LN, and a window one k wide with its margins, with every value of the
        other searched keys (a window the laws predict wider, or one that grows, trains more; see `unguided`)."""
        return len(plan.baselines) + 1 + (1 + 2 * plan.guide.margin) * _combinations(plan, name, but=MIX_LN_COUNT)

    @staticmethod
    def unguided(plan: SearchPlan, name: str) -> int:
        """The cell's worst case if its window grows to its whole range: every distinct point, and the baselines."""
        return _combinations(plan, name) + len(plan.baselines)


def _combinations(plan: SearchPlan, name: str, but: str | None = None) -> int:
    """How many points cell `name`'s searched keys (all discrete here), less `but`, make together."""
    count = 1
    for d in plan.dimensions_in(name):
        if d.name != but:
            count *= len(d.values())
    return count
