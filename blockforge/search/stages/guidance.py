"""Law-guided exploration: a cell after the guiding ones explores the Post-LN counts the alpha laws predict for it.

`Guidance` (one per search) waits until the guiding cells (plan.guide_cells(): the first `guide.after` cells in the
plan's order) are answered, then, in a background job (a law bootstrap never runs inside Tune's `suggest`), gives each
guided cell its window: the middle 95% of the k that the alpha laws predict for it, refitted on seed resamples of the
guiding cells' confirmed candidates (law.law_window). Every guided cell gets its window from the same guiding cells,
so what a cell explores does not depend on which cell finished first.

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
from blockforge.search.ledger import StageName, TrialRecord
from blockforge.search.stages.explore import Explore
from blockforge.train.events import Status

if TYPE_CHECKING:
    from blockforge.search.cell import Cell, SearchContext
    from blockforge.search.law import LawWindow


def guide_windows(plan: SearchPlan, records: list) -> dict[str, "LawWindow | None"]:
    """Each guided cell's window, from the guiding cells' records (the same computation for the search and its reports)."""
    from blockforge.search.evidence import evidence_by_cell
    from blockforge.search.law import bootstrap_cells, law_points, law_window

    evidence = evidence_by_cell(plan, records)
    guides = plan.guide_cells()
    points = [p for p in law_points(plan, evidence) if p["cell"] in guides]
    cells = bootstrap_cells(plan, evidence, points)
    out = {}
    for name in plan.cell_names():
        if plan.guided(name):
            recipe = plan.recipe(plan.trial_overrides(plan.cell(name), {}))
            out[name] = law_window(cells, recipe.model.depth, recipe.model.width)
    return out


class Guidance:
    """The guided cells' windows, computed once in the background when the guiding cells are answered."""

    def __init__(self, context: "SearchContext"):
        self.context = context
        self.windows: dict | None = None
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def __getstate__(self) -> dict:  # Tune pickles the searcher: a running job is started again after a restore
        return {"context": self.context, "windows": self.windows, "error": None, "_thread": None}

    def ready(self) -> bool:
        """Whether the windows are there; starts their job once the guiding cells are answered (a failure is raised here)."""
        if self.windows is None and self._thread is None:
            cells = self.context.cells
            if not all(cells[name].answered for name in self.context.plan.guide_cells()):
                return False
            records = [r for name in self.context.plan.guide_cells() for r in cells[name].records()]
            self._thread = threading.Thread(target=self._compute, args=(records,), name="guidance", daemon=True)
            self._thread.start()
        if self.windows is None and self._thread is not None:
            self._thread.join(timeout=0)
        if self.error is not None:
            raise self.error
        return self.windows is not None

    def _compute(self, records: list) -> None:
        try:
            self.windows = guide_windows(self.context.plan, records)
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
        self.tried = [plan.sampler_params(name, r.overrides) for r in records if r.cell == name and r.stage == StageName.EXPLORE]
        first = [plan.sampler_params(name, b) for b in plan.baselines]
        pre_ln = self._points(self.lowest)[:1] if self.lowest == 0 else []
        self.pending = [p for i, p in enumerate(first + pre_ln) if p not in (first + pre_ln)[:i] and p not in self.tried]
        self.window: list[int] | None = None  # the k it explores: the law's range and its margins, then what growth added
        self.predicted: tuple[int, int] | None = None  # the law's range of k
        self.grew: list[int] = []

    def _first_points(self, name: str, records: list[TrialRecord]) -> list[dict]:
        return []  # its points come from the window, not from the sampler's queue

    @property
    def full_budget(self) -> bool:
        return True

    def _points(self, k: int) -> list[dict]:
        """Every point with `k` Post-LN layers: k with each combination of the other searched (discrete) keys' values."""
        return [{MIX_LN_COUNT: k, **dict(zip((d.name for d in self.others), combo))}
                for combo in itertools.product(*(d.values() for d in self.others))]

    def _queue(self, ks: list[int]) -> None:
        for k in ks:
            self.pending += [p for p in self._points(k) if p not in self.tried and p not in self.pending]

    def _open_window(self, cell: "Cell") -> None:
        window = self.guidance.windows.get(cell.name)
        margin = self.plan.guide.margin
        low, high = (window.low, window.high) if window is not None else (self.lowest, self.highest)  # no law: the whole range
        self.predicted = (low, high)
        ks = list(range(max(self.lowest, low - margin), min(self.highest, high + margin) + 1))
        middle = (low + high) / 2
        self.window = sorted(ks)
        self._queue(sorted(ks, key=lambda k: (abs(k - middle), k)))

    def _best_k(self, cell: "Cell") -> int | None:
        sign = 1.0 if self.plan.mode == "min" else -1.0
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
            if not self.guidance.ready():
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

    @classmethod
    def worst_case(cls, plan: SearchPlan, name: str, explored: int) -> int:
        return explored

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
