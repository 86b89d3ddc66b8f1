"""A search seen through the tools its users know: results.csv (pandas), an Optuna storage (optuna-dashboard)
and every trial's curves in one TensorBoard folder.

All three are views of the ledger (trials.jsonl), rebuilt from it whenever the reports are written and
while the search runs, so they never disagree with it and a resumed search rebuilds them as they were.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import socket
import time
import warnings
from dataclasses import asdict
from pathlib import Path

from blockforge.io import atomic_write_text
from blockforge.search.config import MIX_LN_ALPHA, Dimension, SearchPlan, cell_slug
from blockforge.search.records.ledger import APART, COLUMNS, TrialRecord
from blockforge.search.records.runs import metric_lines, numbers
from blockforge.search.records.store import TENSORBOARD_FOLDER
from blockforge.train.events import Status

OPTUNA_FILE = "optuna.journal"


def short_names(keys: list[str]) -> dict[str, str]:
    """Column names for dotted keys: the last part with its index ('model.depth' -> 'depth', 'model.layers.ramp.heads[0]' ->
    'heads[0]'), the whole key where two would clash."""
    last = [key.rsplit(".", 1)[-1] for key in keys]
    return {key: name if last.count(name) == 1 else key for key, name in zip(keys, last)}


def key_columns(plan: SearchPlan) -> dict[str, str]:
    """Every cell key and searched key (Mix-LN's alpha has its own column) -> its results.csv column."""
    keys = list(dict.fromkeys([*(key for cell in plan.cells for key in cell), *(d.key for d in plan.dimensions if d.key != MIX_LN_ALPHA)]))
    names = short_names(keys)
    return {key: name if name not in COLUMNS else key for key, name in names.items()}


def results_rows(plan: SearchPlan, records: list[TrialRecord]) -> tuple[list[str], list[dict]]:
    """results.csv's columns and rows, one per trial, cells in the search file's order: the ledger's columns, then one
    column per cell key and per searched key (ints stay ints), then one per cost."""
    columns = key_columns(plan)
    costs = list(dict.fromkeys([*(c for c, _ in plan.costs), *plan.constraints]))  # a column per cost
    ledger = COLUMNS if plan.varies_alpha else [c for c in COLUMNS if c not in ("alpha", "post_ln_layers")]  # no alpha where none varies
    fieldnames = ledger[:2] + list(columns.values()) + ledger[2:] + costs
    order = {name: i for i, name in enumerate(plan.all_names())}  # the search file's order of cells (depth=4 before depth=12)
    rows = []
    for record in sorted(records, key=lambda r: (order.get(r.cell, len(order)), r.cell, r.trial)):
        row = asdict(record)
        row["overrides"] = json.dumps(record.overrides, sort_keys=True)
        values = {**plan.cell(record.cell), **record.overrides}
        row.update({name: values.get(key) for key, name in columns.items()})
        row.update({cost: record.costs.get(cost) for cost in costs})
        rows.append({name: row.get(name) for name in fieldnames})
    return fieldnames, rows


def write_results_csv(plan: SearchPlan, records: list[TrialRecord], path: Path) -> None:
    """results.csv: `results_rows` as CSV."""
    fieldnames, rows = results_rows(plan, records)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fieldnames)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buffer.getvalue())


def _dimension(plan: SearchPlan, key: str) -> Dimension | None:
    """The searched key's dimension, whose recipe values a record holds (alpha: all of [0, 1], since k/L may sit below a
    range's low end); None for a key this search does not search."""
    if key == MIX_LN_ALPHA:
        return Dimension(MIX_LN_ALPHA, "uniform", (0.0, 1.0))
    return next((dim for dim in plan.dimensions if dim.key == key), None)


def _frozen_trial(plan: SearchPlan, record: TrialRecord):
    """The record as a finished Optuna trial, or None for records that are not one (running, duplicate, or the
    learning-rate check's: a point outside the sampler's space)."""
    import optuna

    if record.stage in APART:
        return None
    state = {Status.COMPLETED: optuna.trial.TrialState.COMPLETE, Status.DIVERGED: optuna.trial.TrialState.COMPLETE,
             Status.PRUNED: optuna.trial.TrialState.PRUNED, Status.FAILED: optuna.trial.TrialState.FAIL}.get(record.status)
    if state is None:
        return None
    params, distributions = {}, {}
    for key, value in record.overrides.items():
        dimension = _dimension(plan, key)
        if dimension is not None and dimension.contains(value):
            params[key], distributions[key] = value, dimension.optuna()
    value = plan.penalty if record.status == Status.DIVERGED else record.value
    if state == optuna.trial.TrialState.COMPLETE and value is None:
        return None
    values = None
    if plan.costs and state == optuna.trial.TrialState.COMPLETE:  # a multi-objective study: the quality, then each cost
        if any(cost not in record.costs for cost, _ in plan.costs):
            return None
        values = [value, *(record.costs[cost] for cost, _ in plan.costs)]
    attrs = {"trial": record.trial, "stage": record.stage, "seed": record.seed, "status": str(record.status), "steps": record.steps,
             "post_ln_layers": record.post_ln_layers, "model": record.model, "run_dir": record.run_dir}
    single = value if state == optuna.trial.TrialState.COMPLETE and values is None else None
    return optuna.trial.create_trial(
        state=state, value=single, values=values, params=params, distributions=distributions,
        intermediate_values=({record.steps: record.value} if state == optuna.trial.TrialState.PRUNED and record.value is not None and not plan.costs
                             else None),
        user_attrs={k: v for k, v in attrs.items() if v is not None},
    )


def optuna_storage(path: Path):
    """The Optuna journal storage in `path` (what `optuna.load_study(..., storage=...)` takes)."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(str(path)))


def _journal_lines(logs: list[dict]) -> bytes:
    """Logs as JournalFileBackend writes them: one compact JSON object per line."""
    return "".join(json.dumps(log, separators=(",", ":")) + "\n" for log in logs).encode()


class _MemoryJournal:
    """A journal backend that holds its logs in memory: studies are built here, then written to the file in one go
    (Optuna's file backend writes and fsyncs every operation, which at ten thousand trials takes longer than the
    reports may)."""

    def __init__(self):
        self.logs: list[dict] = []

    def read_logs(self, log_number_from: int):
        return self.logs[log_number_from:]

    def append_logs(self, logs: list[dict]) -> None:
        self.logs.extend(logs)


def _journal(plan: SearchPlan, records: list[TrialRecord]):
    """An in-memory journal storage holding one study per cell (named by the cell) with every trained trial."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import BaseJournalBackend

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    backend = type("MemoryJournal", (_MemoryJournal, BaseJournalBackend), {})()
    storage = JournalStorage(backend)
    by_cell: dict[str, list] = {}
    for record in records:
        by_cell.setdefault(record.cell, []).append(record)
    for cell in plan.cell_names():
        directions = ["minimize" if m == "min" else "maximize" for m in (plan.mode, *(m for _, m in plan.costs))]
        study = optuna.create_study(study_name=cell, storage=storage, directions=directions)
        study.set_user_attr("metric", plan.metric)
        with warnings.catch_warnings():  # the names optuna-dashboard shows on its axes (an experimental API: its warning is noise)
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([plan.metric, *(c for c, _ in plan.costs)])
        study.set_user_attr("cell", plan.cell(cell))
        trials = [t for t in (_frozen_trial(plan, r) for r in by_cell.get(cell, [])) if t is not None]
        if trials:
            study.add_trials(trials)
    return storage, backend


def write_optuna_storage(search_dir: Path, plan: SearchPlan, records: list[TrialRecord]) -> Path:
    """optuna.journal: one study per cell (named by the cell) holding every trained trial, rebuilt from the ledger
    and swapped in whole. `optuna-dashboard optuna.journal` opens it; in Python, optuna.load_study(study_name=CELL,
    storage=blockforge.search.reports.views.optuna_storage(PATH))."""
    from blockforge.io import atomic_write

    _, backend = _journal(plan, records)
    data = _journal_lines(backend.logs)
    target = search_dir / OPTUNA_FILE
    atomic_write(target, lambda tmp: Path(tmp).write_bytes(data))
    return target


def searched_label(plan: SearchPlan, record: TrialRecord, sep: str = " ") -> str:
    """What a reader compares a trial by, in a few characters: 'k=2' (its Post-LN layers) where alpha varies, then its
    other searched values by their short names ('k=2 lr=0.003'); `sep` joins them."""
    parts = [f"k={record.post_ln_layers}"] if plan.varies_alpha and record.post_ln_layers is not None else []
    names = key_columns(plan)
    for key, value in record.overrides.items():
        if key != MIX_LN_ALPHA and key in names:
            parts.append(f"{names[key]}={value:.3g}" if isinstance(value, float) else f"{names[key]}={value}")
    return sep.join(parts)


def write_tensorboard(search_dir: Path, records: list[TrialRecord], plan: SearchPlan) -> bool:
    """Every trained run's curves (loss, lr, evaluations) under tensorboard/<cell>/trial<N>-<k and searched values>-seed<S>
    (N: the first trial that trained it), from its metrics.jsonl, with the trial's searched values, k, seed, stage and
    status as hparams and its objective as their metric (TensorBoard's HParams tab); rewritten only when the log or the
    outcome changed. False without the tensorboard package. Each run's event file is written at once, without a writer
    thread (ten thousand runs take seconds)."""
    try:
        from tensorboard.compat.proto import event_pb2
        from tensorboard.summary.writer.record_writer import RecordWriter
    except ImportError:
        return False
    root = search_dir / TENSORBOARD_FOLDER
    first, last = {}, {}  # run folder -> the first record that trained in it (a pruned run continued by a replicate is one run), its latest
    for record in records:
        if record.status not in (Status.DUPLICATE, Status.RUNNING) and record.run_dir:
            first.setdefault(record.run_dir, record)
            if record.seq >= last.get(record.run_dir, record).seq:
                last[record.run_dir] = record
    host = socket.gethostname()
    for run_dir, record in first.items():
        log = Path(run_dir) / "metrics.jsonl"
        try:
            stat = log.stat()
        except OSError:
            continue
        label = searched_label(plan, record, "-")
        folder = root / cell_slug(record.cell) / (f"trial{record.trial:03d}-" + (f"{cell_slug(label)}-" if label else "") + f"seed{record.seed}")
        stamp = f"{stat.st_size}:{stat.st_mtime_ns}:{last[run_dir].status}:{last[run_dir].value}"
        if (folder / ".source").exists() and (folder / ".source").read_text() == stamp:
            continue
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        now = time.time()
        events = [event_pb2.Event(wall_time=now, file_version="brain.Event:2"), *_curve_events(run_dir, now),
                  *_hparams_events(plan, first[run_dir], last[run_dir], now)]
        with open(folder / f"events.out.tfevents.{int(now):010d}.{host}.{os.getpid()}.0", "wb") as f:
            writer = RecordWriter(f)
            for event in events:
                writer.write(event.SerializeToString())
        (folder / ".source").write_text(stamp)
    return True


def _curve_events(run_dir: str, now: float) -> list:
    """Every number of the run's metrics.jsonl as a TensorBoard scalar EVENT/KEY at its step."""
    from tensorboard.compat.proto import event_pb2, summary_pb2

    events = []
    for entry in metric_lines(run_dir):
        values = [summary_pb2.Summary.Value(tag=f"{entry.get('event', 'train')}/{key}", simple_value=float(value))
                  for key, value in numbers(entry).items()]
        if values:
            events.append(event_pb2.Event(wall_time=now, step=int(entry["step"]), summary=summary_pb2.Summary(value=values)))
    return events


def _hparams_events(plan: SearchPlan, first: TrialRecord, last: TrialRecord, now: float) -> list:
    """The trial as an HParams session: its cell's keys, searched values, k, alpha, seed, stage and status, and its
    objective (`hparams/<metric>`, the penalty where it diverged) as the session's metric."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from torch.utils.tensorboard.summary import hparams

    values = {**plan.cell(first.cell), **first.overrides, "post_ln_layers": first.post_ln_layers, "alpha": first.alpha, "seed": first.seed,
              "stage": first.stage, "status": str(last.status)}
    kept = {short_names([k])[k]: v for k, v in values.items() if isinstance(v, (bool, int, float, str)) and v is not None}
    objective = plan.penalty if last.status == Status.DIVERGED else last.value
    metric = f"hparams/{plan.metric}"
    experiment, start, end = hparams(kept, {metric: objective} if objective is not None else {})
    events = [event_pb2.Event(wall_time=now, summary=summary) for summary in (experiment, start, end)]
    if objective is not None:
        events.append(event_pb2.Event(wall_time=now, step=last.steps,
                                      summary=summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=metric, simple_value=float(objective))])))
    return events


class LiveJournal:
    """optuna.journal while the search runs: written whole once, then each update appends the newly finished trials'
    operations in one write, so keeping optuna-dashboard current costs what the new trials cost, not the ledger again."""

    def __init__(self, search_dir: Path, plan: SearchPlan):
        self.search_dir, self.plan = Path(search_dir), plan
        self.storage = self.backend = None
        self.added: set[tuple[str, int]] = set()
        self.seen = 0  # records the ledger had appended when last looked at
        self.written = 0  # logs in the file

    def update(self, ledger) -> None:
        import optuna

        if self.storage is None:
            records = ledger.records()
            self.storage, self.backend = _journal(self.plan, records)
            write_optuna_storage_logs(self.search_dir, self.backend.logs)
            self.written = len(self.backend.logs)
            self.added = {(r.cell, r.trial) for r in records if _frozen_trial(self.plan, r) is not None}
            self.seen = ledger.appended
            return
        for record in ledger.since(self.seen):
            key = (record.cell, record.trial)
            if key in self.added or record.cell not in self.plan.cell_names():
                continue
            trial = _frozen_trial(self.plan, record)
            if trial is not None:
                optuna.load_study(study_name=record.cell, storage=self.storage).add_trial(trial)
                self.added.add(key)
        self.seen = ledger.appended
        new = self.backend.logs[self.written:]
        if new:
            with open(self.search_dir / OPTUNA_FILE, "ab") as f:
                f.write(_journal_lines(new))
            self.written = len(self.backend.logs)


def write_optuna_storage_logs(search_dir: Path, logs: list[dict]) -> None:
    from blockforge.io import atomic_write

    data = _journal_lines(logs)
    atomic_write(Path(search_dir) / OPTUNA_FILE, lambda tmp: Path(tmp).write_bytes(data))
