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

Everything is computed from the search's ledger by search/reports/findings.py, the code the reports are written from, so this
view and summary.md never disagree. A search in a storage is read from a local copy of its records (and, once the
findings or curves are asked for, its runs' curves; never their weights); `refresh()` reads a running search again.
Nothing is written to the search. What is lost is said, never shown as an empty answer: a ledger of which nothing can be
read is refused, a damaged copy of it or a run whose curve is gone is a warning; an argument of the wrong type is one
sentence.
"""

from __future__ import annotations

import contextlib
import json
import os
import reprlib
import signal
import sys
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blockforge.errors import BlockforgeError, SearchInterrupted, unknown_choice_message, unknown_key_message, warn
from blockforge.search.config import MARKER, SearchPlan
from blockforge.search.records.ledger import COLUMNS, Ledger, TrialRecord, read_lines, segment_files
from blockforge.search.reports.findings import CellAnswer
from blockforge.train.events import Status

if TYPE_CHECKING:
    import pandas

    from blockforge.search.checks.stability_law import StabilityLaw
    from blockforge.search.display import Cells
    from blockforge.search.evidence.law import BootstrapReport, LawFit, LawReport
    from blockforge.search.records.store import SearchStore
    from blockforge.search.reports.findings import Findings
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


@dataclass(frozen=True, repr=False)
class LawAnswer:
    """The alpha laws fitted to the cells' winners (k/L), and their bootstrap over seed resamples."""

    points: list[dict]  # per cell: its winner's alpha (k/L), the alphas giving the same model, depth, width, value, n, verdict
    fits: LawReport  # every law fitted to the points: parameters, RMSE, AICc, leave-one-out RMSE
    bootstrap: BootstrapReport | None  # the laws refitted over seed resamples (None: fewer than two cells with replicates)
    verdict: str  # the sentence summary.md writes
    decided: LawFit | None  # the law the verdict names; None where the data cannot decide
    stability: "StabilityLaw | None" = None  # with a learning-rate curve: the edges across cells, per kind, and their predictions

    def __repr__(self) -> str:
        from blockforge.search.display import law_text

        return law_text(self)

    def _repr_html_(self) -> str:
        from blockforge.search.display import law_html

        return law_html(self)


class Search:
    """A search folder, read-only. `where` is what it was opened with (a folder or a URI); `folder` holds its files here
    (a remote search's local copy of its records)."""

    def __init__(self, where: str, folder: Path, plan: SearchPlan, store: "SearchStore"):
        self.where, self.folder, self.plan, self._store = where, folder, plan, store
        self._runs_pulled = False
        self._said: set[str] = set()  # run folders whose lost curves this view has warned of

    def __repr__(self) -> str:
        from blockforge.search.display import search_text

        return search_text(self)

    def _repr_html_(self) -> str:
        from blockforge.search.display import search_html

        return search_html(self)

    # ---- what it holds ---------------------------------------------------------------------------------

    @cached_property
    def records(self) -> list[TrialRecord]:
        """The latest record of every trial, in cell then trial order, read as the reports read them (both copies of the
        ledger and the record segments not yet folded into them). A copy missing or damaged is one warning; a ledger of
        which nothing can be read, in a search that ran trials, is one sentence, never an empty answer."""
        ledger = Ledger(self.folder / "trials.jsonl")
        records = ledger.records()
        problems = _copy_problems(ledger)
        if not records:
            self._nothing_recorded(problems)
        elif problems:
            warn(_ledger_warning(self.where, problems))
        return records

    def _nothing_recorded(self, problems: dict[str, str]) -> None:
        """A ledger with no record: one sentence when the search wrote one or ran trials, else one warning (a search that
        has not recorded a trial yet, or whose every record was removed with its runs and reports)."""
        ran = [name for name in ("results.csv", "summary.md") if (self.folder / name).is_file()]
        if self._store.storage.exists("trials"):
            ran.insert(0, "trials/")
        if problems or ran:
            lost = " and ".join(problems.values()) or "trials.jsonl and trials.backup.jsonl are missing"
            shows = f", while {' and '.join(ran)} show{'s' if len(ran) == 1 else ''} that it ran trials" if ran else ""
            raise BlockforgeError(f"{self.where}: no trial record can be read: {lost}{shows}; restore trials.jsonl from a copy of the "
                                  "search folder (results.csv and summary.md say what it held)")
        warn(f"{self.where}: no trial is recorded yet (there is no trials.jsonl): the search has not recorded a trial, or its "
             "records were removed; refresh() once it has")

    @cached_property
    def findings(self) -> "Findings":
        """Everything the reports say, computed once by the code that writes them (search/reports/findings.py)."""
        from blockforge.search.reports.findings import Findings

        self._take_down_runs()  # the rung checks read the runs' curves
        self._say_lost({r.run_dir: gone for r in self.records if (gone := _lost_curve(r, self.folder))})
        return Findings.of(self.plan, self.records)

    def _take_down_runs(self) -> None:
        """A search in a storage: every run's records (its curve, result and spec) into this view's copy, once."""
        if not self._runs_pulled:
            self._store.pull_runs()
            self._runs_pulled = True

    def _say_lost(self, lost: dict[str, str]) -> None:
        """One warning for the runs of `lost` (run folder -> what of its curve is gone) this view has not named before."""
        new = {run: gone for run, gone in lost.items() if run not in self._said}
        if new:
            self._said.update(new)
            warn(f"{self.where}: the curves of {len(new)} trained run(s) are gone ({_some(list(new.values()))}): the rung checks of "
                 "cells() and curves() leave them out; restore those files from a copy of the search folder")

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

        from blockforge.search.reports.views import key_columns, results_rows

        columns, rows = results_rows(self.plan, self.records)
        rows = [{k: None if v == "" else v for k, v in row.items()} for row in rows]  # an empty field is missing, as read_csv reads it
        table = pandas.DataFrame(rows, columns=columns, dtype=object)
        costs = set(columns) - set(COLUMNS) - set(key_columns(self.plan).values())
        typed = {c: _RECORD_DTYPES.get(c, "Float64" if c in costs else None) for c in columns}
        return table.astype({c: t for c, t in typed.items() if t}).convert_dtypes()

    def cells(self) -> "Cells":
        """Every cell's answer by name, in the search file's order (the transfer targets after the proxy cells): a dict
        whose keys complete in IPython and which a notebook shows as one table."""
        from blockforge.search.display import Cells

        return Cells(self._answers)

    @cached_property
    def _answers(self) -> dict[str, CellAnswer]:
        return {name: CellAnswer.of(self.findings, name) for name in self.plan.all_names()}

    def cell(self, cell: str | None = None) -> CellAnswer:
        """One cell's answer (`cell` in any key order, e.g. "width=64,depth=4"; the only cell's when there is one)."""
        from blockforge.search.run.best import pick_cell

        return self._answers[pick_cell(self.plan.all_names(), cell, self.where, flag="cell=")]

    def law(self) -> LawAnswer | None:
        """The alpha laws fitted to the cells' winners and their bootstrap (None for a search that varies no alpha)."""
        if not self.plan.varies_alpha:
            return None
        found = self.findings
        from blockforge.search.evidence.law import decided_law

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
        from blockforge.export import EXPORT_DTYPES, EXPORT_FORMATS, EXPORT_TARGETS, export_dtype
        from blockforge.search.run.best import export_best

        name = self.cell(cell).name
        _given("export", "out", out, (str, os.PathLike), "the export's folder, e.g. 'models/d8'")
        _chosen("export", "format", format, EXPORT_FORMATS)
        for key, value in options.items():
            if key not in _EXPORT_OPTIONS:
                raise BlockforgeError(f"export: {key}= is not an option of export; {unknown_key_message(key, _EXPORT_OPTIONS).split('; ', 1)[1]}")
            _given("export", key, value, *_EXPORT_OPTIONS[key])
        for key, choices in (("dtype", EXPORT_DTYPES), ("target", tuple(EXPORT_TARGETS))):
            if options.get(key) is not None:
                _chosen("export", key, options[key], choices)
        if options.get("pick") is not None and options.get("under") is not None:
            raise BlockforgeError("export: give pick= or under=, not both")
        export_dtype(options.get("dtype"), format)  # a precision the format keeps
        return export_best(self.where, out, cell=name, format=format, progress=False, **options)

    def curves(self, trial: int | str | None = None, cell: str | None = None) -> "pandas.DataFrame":
        """The evaluations (step, then each metric) of one trial (`trial` of `cell`, or of the only cell), of every trial of
        `cell` (`curves("depth=8")` too), or of the whole search: one row per evaluation, with its cell, trial, seed, stage, model,
        alpha, k (post_ln_layers) and searched values (results()' columns), so curves group by candidate without a join."""
        import pandas

        from blockforge.search.records.runs import evaluations
        from blockforge.search.reports.views import key_columns

        keys = key_columns(self.plan)

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
        self._take_down_runs()
        rows, lost = [], {}
        for record in chosen:
            found = evaluations(record.run_dir)
            values = {**self.plan.cell(record.cell), **record.overrides}
            about = {"cell": record.cell, "trial": record.trial, "seed": record.seed, "stage": record.stage, "model": record.model,
                     "alpha": record.alpha, "post_ln_layers": record.post_ln_layers, **{name: values.get(key) for key, name in keys.items()}}
            rows += [{**about, "step": step, **metrics} for step, metrics in found]
            gone = _lost_curve(record, self.folder, read=bool(found))
            if gone:
                lost[record.run_dir] = gone
        if lost and not rows:
            raise BlockforgeError(f"{self.where}: no curve of the {len(lost)} trained run(s) asked for can be read ({_some(list(lost.values()))}); "
                                  "restore the run folders from a copy of the search folder, or read results() for their final values")
        self._say_lost(lost)
        empty = ["cell", "trial", "seed", "stage", "model", "alpha", "post_ln_layers", *keys.values(), "step"]
        return pandas.DataFrame(rows, columns=None if rows else empty).convert_dtypes()

    PLOTS = ("metric_vs_alpha", "best_alpha_vs_depth", "pareto", "lr_curves", "transfer_curves", "stability_vs_depth")

    def plot(self, which: str = "metric_vs_alpha"):
        """One of the plots the search writes (its PNG's name without .png), as a matplotlib figure: metric_vs_alpha,
        best_alpha_vs_depth, pareto, lr_curves, transfer_curves or stability_vs_depth; a cell's curves: cell(...).plot()."""
        from blockforge.search.reports.report import figures_of

        _chosen("plot", "which", which, self.PLOTS)
        drawn = figures_of(self.findings)
        if which not in drawn:
            raise BlockforgeError(f"plot: this search has no {which} plot (it draws: {', '.join(drawn) or 'none yet'})")
        return drawn[which]()


def _copy_problems(ledger: Ledger) -> dict[str, str]:
    """What is wrong with each copy of the ledger (a phrase by file name): missing, damaged lines, no record. Nothing where
    neither copy was written yet (a search in a storage keeps its records as segments until it folds them into both)."""
    if not any(path.exists() for path in ledger.copies):
        first = min((r.seq for part in segment_files(ledger.folder) for r in read_lines(part)[0]), default=1)
        return {path.name: f"{path.name} is missing" for path in ledger.copies} if first > 1 else {}  # folded: lost since
    problems = {}
    for path, (count, damaged) in ledger.copies.items():
        if not path.exists():
            problems[path.name] = f"{path.name} is missing"
        elif damaged:
            problems[path.name] = f"line(s) {', '.join(map(str, damaged[:5]))} of {path.name} are not records (the file was damaged)"
        elif not count:
            problems[path.name] = f"{path.name} holds no record"
    return problems


def _ledger_warning(where: str, problems: dict[str, str]) -> str:
    """The warning for a ledger with records and problems: what the view reads instead, and the fix."""
    if len(problems) > 1:
        return (f"{where}: {' and '.join(problems.values())}: trials recorded only there are missing from this view, or shown at "
                "an earlier record; restore trials.jsonl from a copy of the search folder")
    (name, problem), = problems.items()
    if name == "trials.jsonl":
        return f"{where}: {problem}; this view reads those trials from trials.backup.jsonl, and resuming the search repairs the file"
    return (f"{where}: {problem}; this view reads the trials from trials.jsonl alone; while no driver runs the search, copy "
            "trials.jsonl to trials.backup.jsonl, so that a damaged line can be read from it again")


def _lost_curve(record: TrialRecord, folder: Path, read: bool | None = None) -> str | None:
    """What is gone of the curve of a run whose record says it evaluated (it holds validation metrics): its folder, its
    metrics.jsonl, or (`read` False: no evaluation was read from it) its evaluations, named in the search folder. None
    when it is there, or the record says of no evaluation (a run just started, a failure before its first)."""
    if not record.run_dir or not any(key.startswith("val_") for key in record.metrics):
        return None
    run = Path(record.run_dir)
    name = run.relative_to(folder).as_posix() if run.is_relative_to(folder) else str(run)
    if not run.is_dir():
        return f"{name}/ is gone"
    if not (run / "metrics.jsonl").is_file():
        return f"{name}/metrics.jsonl is missing"
    return f"{name}/metrics.jsonl holds no evaluation" if read is False else None


def _some(items: list[str], shown: int = 3) -> str:
    """The first `shown` of `items` and how many more."""
    return "; ".join(items[:shown]) + (f"; and {len(items) - shown} more" if len(items) > shown else "")


def open_search(where: str | os.PathLike) -> Search:
    """The search kept in `where` (a folder, or a URI such as s3://bucket/prefix), read-only, finished or running."""
    from blockforge.search.config import stored_plan
    from blockforge.search.records.store import SearchStore
    from blockforge.storage import Storage

    _given("open_search", "where", where, (str, os.PathLike), "a search's folder or URI (its --out), e.g. 'runs/search-quickstart'")
    storage = Storage.open(where)
    store = SearchStore(storage, purpose="views")
    try:
        if not store.holds_search():
            raise BlockforgeError(f"{where}: holds no search (no {MARKER}); give the folder or URI a search was started in (its --out)")
        store.pull_records()  # a remote search: its records and reports; its runs when the findings or curves are asked for
        search = Search(str(where), store.local, stored_plan(store.local), store)
        search.records  # noqa: B018 (read now: a ledger of which nothing can be read is refused at once)
    except BlockforgeError as err:
        raise SearchStore.located(err, storage) from None
    return search


def run_search(file: str | os.PathLike, *, out: str | os.PathLike | None = None, overrides: dict[str, Any] | None = None,
               address: str | None = None, resume: bool | str = False, max_concurrent: int | None = None) -> Search:
    """Run (or resume) the search in `file` exactly as `blockforge search` does: the same plan, checks, signals and resume.
    `overrides`: dotted keys of the search file or of its base recipe and their values, as --set takes them
    ({"trials_per_cell": 4, "train.lr": 3e-3}). Returns the finished search's view. A problem raises BlockforgeError with
    the command line's sentence; a SIGTERM or Ctrl-C stops the trials cleanly and raises SearchInterrupted, whose `.search` is
    the view so far and whose sentence gives the resume line (`resume=True` here does the same)."""
    from blockforge.search.run.driver import nothing_finished
    from blockforge.search.run.driver import run_search as drive

    _given("run_search", "file", file, (str, os.PathLike), "the search file's path, e.g. 'searches/quickstart.yaml'")
    _given("run_search", "out", out, (str, os.PathLike, type(None)), "the search's folder or URI, or None (runs/search-NAME)")
    _given("run_search", "address", address, (str, type(None)), "a Ray cluster's address as a string, e.g. '10.0.0.1:6379', or None")
    if _given("run_search", "resume", resume, (bool, str), "True, False or 'auto'") not in (True, False, "auto"):
        raise BlockforgeError(f"run_search: resume={resume!r}: give True (continue the search in out), False or 'auto' (continue it "
                              "if out holds one, else start it)")
    if _given("run_search", "max_concurrent", max_concurrent, (int, type(None)), "a whole number of trials at once, or None") is not None \
            and max_concurrent < 1:
        raise BlockforgeError(f"run_search: max_concurrent={max_concurrent}: give at least 1 (None: the search file's max_concurrent)")
    with _quiet_ray_in_notebook() as progress:
        outcome = drive(file, out=out, address=address, resume=resume, max_concurrent=max_concurrent, overrides=_assignments(overrides),
                        progress=progress)
    print(outcome.summary)
    if outcome.interrupted is not None:
        name = signal.Signals(outcome.interrupted).name
        where = outcome.location or str(outcome.search_dir)
        again = f"blockforge.run_search({str(file)!r}, out={where!r}" + (f", overrides={overrides!r}" if overrides else "") + ", resume=True)"
        raise SearchInterrupted(f"stopped by {name}; the reports cover the trials so far; resume with: {again} (from a shell: "
                                f"{outcome.resume_command})", search=open_search(where), signal=outcome.interrupted)
    unfinished = nothing_finished(outcome)
    if unfinished is not None:
        raise BlockforgeError(unfinished)
    return open_search(outcome.location or outcome.search_dir)


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (an IPython shell that shows HTML)."""
    shell = sys.modules.get("IPython") and sys.modules["IPython"].get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


@contextlib.contextmanager
def _quiet_ray_in_notebook():
    """In a notebook: the search's progress as a bar (`bar`, for the driver's live view) and Ray's own log lines kept out of
    the cell (they stay in Ray's logs); elsewhere the command line's status lines (`lines`)."""
    if not in_notebook():
        yield "lines"
        return
    import logging

    ray_log = logging.getLogger("ray")
    level = ray_log.level
    ray_log.setLevel(logging.ERROR)
    try:
        yield "bar"
    finally:
        ray_log.setLevel(level)


def _assignments(overrides: Mapping[str, Any] | None) -> list:
    """run_search's `overrides` as the --set assignments they stand for; anything else is one sentence."""
    from blockforge.spec.recipe import Assignment

    _given("run_search", "overrides", overrides, (Mapping, type(None)), "a dict of dotted keys and values, e.g. {'train.lr': 0.003}")
    assignments = []
    for key, value in (overrides or {}).items():
        if not isinstance(key, str):
            raise BlockforgeError(f"run_search: overrides has the key {key!r}; its keys are dotted keys as strings, e.g. 'train.lr'")
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            raise BlockforgeError(f"overrides: {key}={value!r} is not a YAML value; give a number, string, bool, None, list or dict") from None
        assignments.append(Assignment(key, value))
    return assignments


_EXPORT_OPTIONS = {  # Search.export's options: the types each takes, and what to give
    "dtype": ((str, type(None)), "the weights' precision: 'fp32', 'bf16' or 'fp16'"),
    "target": ((str, type(None)), "a serving engine whose limits the export is checked against: 'vllm'"),
    "pick": ((int, type(None)), "a front point's number, as summary.md numbers them"),
    "under": ((str, type(None)), "a budget on the front, as 'COST=X', e.g. 'kv_cache_bytes=65536'"),
    "retrain": ((bool,), "True or False"),
}


def _given(call: str, name: str, value, kinds: tuple, wanted: str):
    """`value` when it is one of `kinds` (True and False only where bool is one of them, not as numbers); else one
    sentence naming the call, the argument, what it was given and what it takes."""
    if isinstance(value, kinds) and (bool in kinds or not isinstance(value, bool)):
        return value
    kind = "None" if value is None else f"{'an' if type(value).__name__[0] in 'aeiou' else 'a'} {type(value).__name__}"
    raise BlockforgeError(f"{call}: {name}={reprlib.repr(value)} is {kind}; give {wanted}")


def _chosen(call: str, name: str, value, choices: tuple[str, ...]) -> str:
    """`value` when it is one of `choices`; else one sentence listing them."""
    _given(call, name, value, (str,), f"one of: {', '.join(choices)}")
    if value not in choices:
        raise BlockforgeError(f"{call}: {name}={value!r}: {unknown_choice_message(value, choices)}")
    return value
