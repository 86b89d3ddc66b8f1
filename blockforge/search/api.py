"""A search as Python objects: open any search folder (a local folder or a storage's URI, running or finished) read-only,
or run one from Python as the command line does.

    import blockforge
    search = blockforge.open_search("s3://my-bucket/alpha-law")
    search.results()                 # one row per trial, as results.csv holds them
    cell = search.cells()["depth=8"] # the winner, its verdict and interval against Pre-LN, the tied set, what each stage decided
    search.law()                     # the alpha laws fitted to the winners, with their bootstrap
    search.best("depth=8")           # the winner's resolved spec
    search.export("depth=8", "models/d8", format="hf")
    search.curves(cell="depth=8")    # every trial's evaluations

Everything is computed from the search's ledger by search/findings.py, the code the reports are written from, so this
view and summary.md never disagree. A search in a storage is read from a local copy of its records (and, once curves are
asked for, its runs' curves; never their weights); `refresh()` reads a running search again. Nothing is written to the
search.
"""

from __future__ import annotations

import json
import os
import signal
import typing
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blockforge.errors import BlockforgeError, SearchInterrupted, warn
from blockforge.search.config import MARKER, SearchPlan
from blockforge.search.findings import CellAnswer
from blockforge.search.ledger import COLUMNS, Ledger, TrialRecord
from blockforge.train.events import Status

if TYPE_CHECKING:
    import pandas

    from blockforge.search.findings import Findings
    from blockforge.search.law import BootstrapReport, LawFit, LawReport
    from blockforge.search.stability_law import StabilityLaw
    from blockforge.search.store import SearchStore
    from blockforge.spec.model import ResolvedSpec


def _dtype(hint) -> str:
    """The pandas dtype of a ledger field (missing values allowed)."""
    kinds = set(typing.get_args(hint)) - {type(None)} or {hint}
    for kind, dtype in ((bool, "boolean"), (int, "Int64"), (float, "Float64")):
        if kinds == {kind}:
            return dtype
    return "string"


_RECORD_DTYPES = {name: _dtype(hint) for name, hint in typing.get_type_hints(TrialRecord).items() if name in COLUMNS and name != "overrides"}
_RECORD_DTYPES["overrides"] = "string"  # as results.csv writes it: JSON


@dataclass(frozen=True)
class LawAnswer:
    """The alpha laws fitted to the cells' winners (k/L), and their bootstrap over seed resamples."""

    points: list[dict]  # per cell: its winner's alpha (k/L), the alphas giving the same model, depth, width, value, n, verdict
    fits: LawReport  # every law fitted to the points: parameters, RMSE, AICc, leave-one-out RMSE
    bootstrap: BootstrapReport | None  # the laws refitted over seed resamples (None: fewer than two cells with replicates)
    verdict: str  # the sentence summary.md writes
    decided: LawFit | None  # the law the verdict names; None where the data cannot decide
    stability: "StabilityLaw | None" = None  # confirm.stability: the largest stable lr across cells, per kind, and its predictions


class Search:
    """A search folder, read-only. `where` is what it was opened with (a folder or a URI); `folder` holds its files here
    (a remote search's local copy of its records)."""

    def __init__(self, where: str, folder: Path, plan: SearchPlan, store: "SearchStore"):
        self.where, self.folder, self.plan, self._store = where, folder, plan, store
        self._runs_pulled = False

    def __repr__(self) -> str:
        return f"<blockforge search {self.plan.name!r} at {self.where}: {len(self.records)} trials>"

    # ---- what it holds ---------------------------------------------------------------------------------

    @cached_property
    def records(self) -> list[TrialRecord]:
        """The latest record of every trial, in cell then trial order, read as the reports read them (both copies of the
        ledger and the record segments not yet folded into them)."""
        ledger = Ledger(self.folder / "trials.jsonl")
        records = ledger.records()
        if ledger.damage:
            warn(f"{self.where}: line(s) {', '.join(map(str, ledger.damage[:5]))} of trials.jsonl are not records (the file was damaged); "
                 "this view reads those trials from trials.backup.jsonl, and resuming the search repairs the file")
        return records

    @cached_property
    def findings(self) -> "Findings":
        """Everything the reports say, computed once by the code that writes them (search/findings.py)."""
        from blockforge.search.findings import Findings

        return Findings.of(self.plan, self.records)

    @property
    def running(self) -> bool:
        """Whether some trial is recorded as running: the search is under way, or was killed (--resume continues it)."""
        return any(r.status == Status.RUNNING for r in self.records)

    def refresh(self) -> "Search":
        """The search read again (a running one has written more since)."""
        return open_search(self.where)

    def results(self) -> "pandas.DataFrame":
        """One row per trial with results.csv's columns: the cell and its keys, the searched values, alpha and k
        (post_ln_layers), seed, stage, status, steps, the objective's value, the trial's seconds (wall_s), its costs."""
        import pandas

        from blockforge.search.views import key_columns, results_rows

        columns, rows = results_rows(self.plan, self.records)
        rows = [{k: None if v == "" else v for k, v in row.items()} for row in rows]  # an empty field is missing, as read_csv reads it
        table = pandas.DataFrame(rows, columns=columns, dtype=object)
        costs = set(columns) - set(COLUMNS) - set(key_columns(self.plan).values())
        typed = {c: _RECORD_DTYPES.get(c, "Float64" if c in costs else None) for c in columns}
        return table.astype({c: t for c, t in typed.items() if t}).convert_dtypes()

    def cells(self) -> dict[str, CellAnswer]:
        """Every cell's answer by name: the proxy cells, then the transfer targets."""
        return dict(self._answers)

    @cached_property
    def _answers(self) -> dict[str, CellAnswer]:
        return {name: CellAnswer.of(self.findings, name) for name in self.plan.all_names()}

    def cell(self, cell: str | None = None) -> CellAnswer:
        """One cell's answer (`cell` in any key order, e.g. "width=64,depth=4"; the only cell's when there is one)."""
        from blockforge.search.best import pick_cell

        return self._answers[pick_cell(self.plan.all_names(), cell, self.where, flag="cell=")]

    def law(self) -> LawAnswer | None:
        """The alpha laws fitted to the cells' winners and their bootstrap (None for a search that varies no alpha)."""
        if not self.plan.varies_alpha:
            return None
        found = self.findings
        from blockforge.search.law import decided_law

        return LawAnswer(found.points, found.law, found.boot, found.law_verdict, decided_law(found.law, found.boot), found.stability_law)

    def best(self, cell: str | None = None) -> "ResolvedSpec":
        """The resolved spec of a cell's winner, as best/<cell>.yaml holds it."""
        answer = self.cell(cell)
        if answer.winner is None:
            raise BlockforgeError(f"{self.where}: cell {answer.name} has no model that finished the full budget yet; see results() for "
                                  "its trials, or resume the search")
        return self.plan.recipe(self.plan.trial_overrides(self.plan.cell(answer.name), answer.winner.overrides)).spec

    def export(self, cell: str | None, out: str | os.PathLike, *, format: str = "blockforge", **options) -> Path:
        """Export a cell's winner as `blockforge export SEARCH --cell CELL --out OUT --format FORMAT` does; options:
        dtype, target, pick, under, retrain. Returns the export's folder."""
        from blockforge.search.best import export_best

        return export_best(self.where, out, cell=cell, format=format, progress=False, **options)

    def curves(self, trial: int | str | None = None, cell: str | None = None) -> "pandas.DataFrame":
        """The evaluations (step, then each metric) of one trial (`trial` of `cell`, or of the only cell), of every trial of
        `cell` (`curves("depth=8")` too), or of the whole search: one row per evaluation, with its cell, trial, seed and stage."""
        import pandas

        from blockforge.search.runs import evaluations

        if isinstance(trial, str) and cell is None:  # a cell's name in the first place
            trial, cell = None, trial
        if trial is not None and (isinstance(trial, bool) or not isinstance(trial, int)):
            raise BlockforgeError(f"trial= {trial!r}: a trial is its number in its cell (results()' trial column), e.g. curves(3, "
                                  f"cell={self.plan.all_names()[0]!r})")
        if trial is not None or cell is not None:
            cell = self.cell(cell).name
        chosen = [r for r in self.records if r.run_dir and (cell is None or r.cell == cell) and (trial is None or r.trial == trial)]
        if trial is not None and not chosen:
            raise BlockforgeError(f"{self.where}: cell {cell} has no trial {trial} that trained; see results() for its trials")
        if chosen and not self._runs_pulled:  # a remote search: every run's records, in one pass over the storage
            self._store.pull_runs()
            self._runs_pulled = True
        rows = []
        for record in chosen:
            rows += [{"cell": record.cell, "trial": record.trial, "seed": record.seed, "stage": record.stage, "step": step, **metrics}
                     for step, metrics in evaluations(record.run_dir)]
        return pandas.DataFrame(rows, columns=None if rows else ["cell", "trial", "seed", "stage", "step"]).convert_dtypes()


def open_search(where: str | os.PathLike) -> Search:
    """The search kept in `where` (a folder, or a URI such as s3://bucket/prefix), read-only, finished or running."""
    from blockforge.search.config import stored_plan
    from blockforge.search.store import SearchStore
    from blockforge.storage import Storage

    storage = Storage.open(where)
    store = SearchStore(storage, purpose="views")
    try:
        if not store.holds_search():
            raise BlockforgeError(f"{where}: holds no search (no {MARKER}); give the folder or URI a search was started in (its --out)")
        store.pull_records()  # a remote search: its records and reports, not its runs (curves() takes those down as it needs them)
        plan = stored_plan(store.local)
    except BlockforgeError as err:
        raise SearchStore.located(err, storage) from None
    return Search(str(where), store.local, plan, store)


def run_search(file: str | os.PathLike, *, out: str | os.PathLike | None = None, overrides: dict[str, Any] | None = None,
               address: str | None = None, resume: bool | str = False, max_concurrent: int | None = None) -> Search:
    """Run (or resume) the search in `file` exactly as `blockforge search` does: the same plan, checks, signals and resume.
    `overrides`: dotted keys of the search file or of its base recipe and their values, as --set takes them
    ({"trials_per_cell": 4, "train.lr": 3e-3}). Returns the finished search's view. A problem raises BlockforgeError with
    the command line's sentence; a SIGTERM or Ctrl-C stops the trials cleanly and raises SearchInterrupted, whose `.search` is
    the view so far and whose sentence gives the resume line (`resume=True` here does the same)."""
    from blockforge.search.driver import nothing_finished, run_search as drive
    from blockforge.spec.recipe import Assignment

    assignments = []
    for key, value in (overrides or {}).items():
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            raise BlockforgeError(f"overrides: {key}={value!r} is not a YAML value; give a number, string, bool, None, list or dict") from None
        assignments.append(Assignment(str(key), value))
    outcome = drive(file, out=out, address=address, resume=resume, max_concurrent=max_concurrent, overrides=assignments)
    print(outcome.summary)
    if outcome.interrupted is not None:
        name = signal.Signals(outcome.interrupted).name
        raise SearchInterrupted(f"stopped by {name}; the reports cover the trials so far; resume with: {outcome.resume_command}",
                            search=open_search(outcome.location or outcome.search_dir), signal=outcome.interrupted)
    unfinished = nothing_finished(outcome)
    if unfinished is not None:
        raise BlockforgeError(unfinished)
    return open_search(outcome.location or outcome.search_dir)
