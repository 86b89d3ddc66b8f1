"""The search's own record of trials: one JSON line per event, the last line per trial wins.

Ray Tune keeps its experiment state for resuming; this ledger is what results.csv, the summary, the
plots and `blockforge export` read. It is append-only, so a killed driver loses nothing it wrote. A
driver reads it once (at start or resume), holds the latest record of every trial, and appends: no
event re-reads the file.

Records name their run folders relative to the search folder (trials/CELL/IDENTITY), so a search folder can be
copied, moved, or kept in an object store; in memory they name them where the ledger's folder is now. A search in
an object store also gets each record as a small object of its own (trials.segments/, `Segments`) the moment it is
appended, because a whole file cannot be appended to there; the segments are folded into the two copies now and then.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from enum import Enum
from pathlib import Path
from typing import Any

from blockforge.train.events import Status

COLUMNS = ["cell", "trial", "stage", "status", "seed", "alpha", "post_ln_layers", "steps", "metric", "value", "wall_s", "overrides",
           "model", "identity", "duplicate_of", "note", "unstable"]


class StageName(str, Enum):
    """The one stage vocabulary: ledger records, the searcher's stages, compute plans and reports. A trial record's
    stage is explore, confirm (a finalist's replicate, racing's and promotion's included), lr, length or transfer (stability:
    a probe recorded by a search from before the learning-rate curve, still read)."""

    EXPLORE = "explore"
    CONFIRM = "confirm"
    RACING = "racing"
    PROMOTION = "promotion"
    TRANSFER = "transfer"
    LR = "lr"  # a probe of a candidate's learning-rate curve (confirm.lr_curve, or confirm.lr / confirm.stability)
    LENGTH = "length"  # the cell's pair continued to a longer training (confirm.length)
    STABILITY = "stability"  # a probe of a candidate's largest stable learning rate, as searches before the curve recorded it

    def __str__(self) -> str:
        return self.value

    @classmethod
    def of_config(cls, config: dict) -> "StageName":
        """The stage a trial's Tune config names (exploration where it names none)."""
        return cls(config.get("stage", cls.EXPLORE.value))


# Stages whose trials check an answer at other settings (another learning rate, a longer training): their records stay out
# of the cell's main evidence, its rung tables and curves, and the samplers' studies.
APART = frozenset({StageName.LR, StageName.LENGTH, StageName.STABILITY})


@dataclass
class TrialRecord:
    cell: str
    trial: int  # the trial's number within its cell (exploration: the Optuna trial number)
    status: str  # a blockforge.train.events.Status value
    stage: str = StageName.EXPLORE.value  # a StageName value: explore | confirm | transfer
    seed: int = 0  # train.seed
    model: str = ""  # the model's identity, the seed aside: replicates of one model share it
    uniform_pre: bool = False  # every layer Pre-LN: the reference the verdicts compare with
    identity: str = ""
    overrides: dict[str, Any] = field(default_factory=dict)  # the cell's searched values (and baselines')
    alpha: float | None = None
    post_ln_layers: int | None = None
    steps: int = 0
    metric: str = ""
    value: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    costs: dict[str, float] = field(default_factory=dict)  # a search with a cost axis: the candidate's costs (search/costs.py)
    wall_s: float = 0.0
    duplicate_of: int | None = None
    run_dir: str = ""
    note: str = ""
    promoted: str = ""  # why a pruned model was brought back to the full budget (empty: it was not); a finalist from then on
    retry: bool = False  # failed for a cause outside the trial (its process, node or storage): a resume trains it again
    unstable: str = ""  # a finished run: why it is unstable by train/stability.py's rule ('' when stable, or not judged)
    seq: int = 0  # the ledger's line number when written (0: a ledger from before it), so two copies merge in order


FIELDS = {f.name for f in fields(TrialRecord)}
LEGACY_PROMOTED = "promoted:"  # ledgers written before `promoted` was a field kept the reason as the note's start


# What a record's fields must hold to be one (a line of any other JSON, or a field of another type, is not a record).
_KINDS = {"cell": str, "trial": int, "status": str, "stage": str, "seed": int, "model": str, "identity": str, "overrides": dict,
          "steps": int, "metric": str, "metrics": dict, "costs": dict, "run_dir": str, "note": str, "promoted": str, "seq": int,
          "value": (int, float, type(None)), "wall_s": (int, float), "duplicate_of": (int, type(None)), "retry": bool, "unstable": str,
          "uniform_pre": bool, "alpha": (int, float, type(None)), "post_ln_layers": (int, type(None))}


def parse_record(line: str) -> TrialRecord | None:
    """A ledger line as a record; None for a blank line, one cut short by a kill, or one that is not a record (another JSON
    value, a field of the wrong type or out of its range, a status or stage no search writes)."""
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if not isinstance(data, dict) or not {"cell", "trial", "status"} <= set(data):
        return None
    for key, kind in _KINDS.items():
        if key in data and (not isinstance(data[key], kind) or (isinstance(data[key], bool) and kind is not bool)):
            return None
    if data["status"] not in {str(s) for s in Status} or data.get("stage", StageName.EXPLORE.value) not in {s.value for s in StageName}:
        return None
    if not _in_range(data):
        return None
    record = TrialRecord(**{k: v for k, v in data.items() if k in FIELDS})
    if "promoted" not in data and isinstance(record.note, str) and record.note.startswith(LEGACY_PROMOTED):
        record.promoted = record.note  # an old ledger: its promotion, as the field says it now
    return record


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _in_range(data: dict) -> bool:
    """Whether the fields of a line of the right types hold values a search writes: Mix-LN's alpha a finite fraction, a count
    of layers or spikes a whole number of at least 0, metrics and costs numbers, and a model every layer of which is Pre-LN
    with no Post-LN layer (the reports and the verdicts read these as they are)."""
    alpha, layers, metrics = data.get("alpha"), data.get("post_ln_layers"), data.get("metrics", {})
    if alpha is not None and not (math.isfinite(alpha) and 0 <= alpha <= 1):
        return False
    if layers is not None and layers < 0:
        return False
    if not all(_number(v) for v in (*metrics.values(), *data.get("costs", {}).values())):
        return False
    spikes = metrics.get("train_spikes")
    if spikes is not None and not (math.isfinite(spikes) and spikes >= 0 and float(spikes).is_integer()):
        return False
    return not (data.get("uniform_pre") and layers)


class Ledger:
    """trials.jsonl: read once when first asked, then held (the latest record of every trial) and appended to.

    The searcher holds the one that writes; the scheduler reads the file once for its rungs, and the live view
    follows it (LedgerFollower), so nothing in a process shares an instance.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.folder = self.path.parent.resolve()  # what the records' run folders are relative to
        self.on_append: Callable[[TrialRecord, bytes], None] | None = None  # also given each new line (a search in an object store)
        self._latest: dict[tuple[str, int], TrialRecord] | None = None
        self._sorted: list[TrialRecord] | None = None
        self._appended: list[TrialRecord] = []  # what this instance appended, in order
        self._seq = 0
        self.damage: list[int] = []  # line numbers (1-based) of the file that are not records, but for a cut last line
        self.copies: dict[Path, tuple[int, list[int]]] = {}  # each copy as read: how many records it holds, its damaged lines

    @property
    def appended(self) -> int:
        """How many records this instance has appended (a position for `since`)."""
        return len(self._appended)

    def since(self, position: int) -> list[TrialRecord]:
        """The records appended after `position` (an earlier `appended`), in order."""
        return self._appended[position:]

    def __getstate__(self) -> dict:  # Tune pickles what holds a ledger: the path, not the records
        return {"path": self.path}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"])

    @property
    def backup(self) -> Path:
        """The second copy every record is also appended to (trials.backup.jsonl): what repairs a damaged ledger."""
        return self.path.with_name(self.path.stem + ".backup" + self.path.suffix)

    def _held(self) -> dict[tuple[str, int], TrialRecord]:
        if self._latest is None:  # every copy, merged: a record damaged or lost in one is read from another
            main, self.damage = read_lines(self.path)
            copy, copy_damage = read_lines(self.backup)
            self.copies = {self.path: (len(main), self.damage), self.backup: (len(copy), copy_damage)}
            latest = merged(main, copy, *(read_lines(p)[0] for p in segment_files(self.folder)))
            self._latest = {key: located(record, self.folder) for key, record in latest.items()}
            self._seq = max((r.seq for r in self._latest.values()), default=0)
        return self._latest

    def append(self, record: TrialRecord) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._held()
        self._seq += 1
        record = replace(record, seq=self._seq)
        line = record_line(record, self.folder)
        for path in (self.path, self.backup):
            _append_line(path, line)
        if self.on_append is not None:
            self.on_append(record, line)
        record = located(record, self.folder)
        self._held()[(record.cell, record.trial)] = record
        self._appended.append(record)
        self._sorted = None

    def records(self) -> list[TrialRecord]:
        """The latest record of every trial, in cell then trial order."""
        if self._sorted is None:
            self._sorted = sorted(self._held().values(), key=lambda r: (r.cell, r.trial))
        return list(self._sorted)

    def latest(self, cell: str, trial: int) -> TrialRecord | None:
        """The latest record of trial `trial` of `cell`, if any."""
        return self._held().get((cell, trial))

    def retry_failed(self) -> list[TrialRecord]:
        """Every trial whose latest record is a failure for a cause outside it ends as interrupted: the resumed search trains
        it again (a failure is never an answer when its node, process or storage was at fault)."""
        again = [replace(r, status=Status.INTERRUPTED, retry=False,
                         note=f"failed for a cause outside the trial ({r.note}); trained again on resume") for r in self.records()
                 if r.status == Status.FAILED and r.retry]
        for record in again:
            self.append(record)
        return again

    def mark_interrupted(self, note: str) -> list[TrialRecord]:
        """Every trial still recorded as running ends as interrupted (a resumed search takes it up again)."""
        stopped = [replace(r, status=Status.INTERRUPTED, note=note) for r in self.records() if r.status == Status.RUNNING]
        for record in stopped:
            self.append(record)
        return stopped


def record_line(record: TrialRecord, folder: Path) -> bytes:
    """A record as the ledger writes it: one JSON line, its run folder relative to the search folder `folder`."""
    run_dir = record.run_dir
    if run_dir and Path(run_dir).is_absolute() and Path(run_dir).is_relative_to(folder):
        run_dir = Path(run_dir).relative_to(folder).as_posix()
    return (json.dumps(asdict(replace(record, run_dir=run_dir)), default=str) + "\n").encode()


def located(record: TrialRecord, folder: Path) -> TrialRecord:
    """`record` with its run folder named where the search folder `folder` is now. A ledger written before records named
    them relatively names where the search was then: a path that ends in trials/CELL/IDENTITY is taken from there."""
    run_dir = record.run_dir
    if not run_dir:
        return record
    path = Path(run_dir)
    if not path.is_absolute():
        return replace(record, run_dir=str(folder / path))
    if path.is_relative_to(folder):
        return record
    parts = path.parts
    if len(parts) >= 3 and parts[-3] == "trials" and parts[-1] == record.identity:
        return replace(record, run_dir=str(folder / Path(*parts[-3:])))
    return record


def absolute_run_dirs(records: list[TrialRecord]) -> int:
    """How many of `records` (as read from a file) name their run folder by an absolute path (ledgers before relative ones)."""
    return sum(bool(r.run_dir) and Path(r.run_dir).is_absolute() for r in records)


SEGMENTS = "trials.segments"  # in a search folder kept in an object store: one small file per record, until folded in


def segment_files(folder: Path) -> list[Path]:
    """The record segments in search folder `folder`, in order."""
    root = Path(folder) / SEGMENTS
    return sorted(root.glob("*.jsonl")) if root.is_dir() else []


def segment_name(record: TrialRecord) -> str:
    return f"{SEGMENTS}/{record.seq:010d}.jsonl"


def _append_line(path: Path, line: bytes) -> None:
    with open(path, "ab+") as f:
        end = f.seek(0, os.SEEK_END)
        if end:
            f.seek(end - 1)
            if f.read(1) != b"\n":
                line = b"\n" + line  # a line cut short by a kill stays on its own, not glued to this one
        f.write(line)


class LedgerFollower:
    """A reader that keeps up with a ledger someone else appends to (the live view's): the file once, then only the
    whole lines added since it last looked, so following a search costs what its new records cost."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.folder = self.path.parent.resolve()
        self.offset = 0  # bytes read
        self.read: list[TrialRecord] = []  # every record read, in order
        self.latest: dict[tuple[str, int], TrialRecord] = {}
        self._sorted: list[TrialRecord] | None = None

    def __getstate__(self) -> dict:  # Tune pickles what holds it: the path, not the records
        return {"path": self.path}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"])

    def _catch_up(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1  # whole lines only: one being written is read next time
        for line in data[:end].decode(errors="replace").splitlines():
            record = parse_record(line)
            if record is None:
                continue
            record = located(record, self.folder)
            keep_latest(self.latest, record)
            self.read.append(record)
            self._sorted = None
        self.offset += end

    def records(self) -> list[TrialRecord]:
        """The latest record of every trial so far, in cell then trial order."""
        self._catch_up()
        if self._sorted is None:
            self._sorted = sorted(self.latest.values(), key=lambda r: (r.cell, r.trial))
        return list(self._sorted)

    @property
    def appended(self) -> int:
        """How many records it has read (a position for `since`)."""
        return len(self.read)

    def since(self, position: int) -> list[TrialRecord]:
        """The records written after `position` (an earlier `appended`), in order."""
        self._catch_up()
        return self.read[position:]


def read_lines(path: Path) -> tuple[list[TrialRecord], list[int]]:
    """The records of a ledger file in order, and the numbers of its lines that are not records: a last line cut short
    by a kill is expected (its trial's previous record stands) and is not counted; any other is damage."""
    if not path.exists():
        return [], []
    if not path.is_file():
        from blockforge.errors import CorruptFolderError

        raise CorruptFolderError(f"{path}: is not a file, and the search's records are kept there; move it aside, then resume")
    lines = path.read_text(errors="replace").splitlines()
    records, damaged = [], []
    for number, line in enumerate(lines, start=1):
        record = parse_record(line)
        if record is not None:
            records.append(record)
        elif line.strip() and number != len(lines):
            damaged.append(number)
    return records, damaged


def merged(*copies: list[TrialRecord]) -> dict[tuple[str, int], TrialRecord]:
    """The latest record of every trial over copies of a ledger: by `seq` where written, else by line order."""
    latest: dict[tuple[str, int], TrialRecord] = {}
    for records in copies:
        for record in records:
            keep_latest(latest, record)
    return latest


def keep_latest(latest: dict[tuple[str, int], TrialRecord], record: TrialRecord) -> None:
    """`record` replaces its trial's record in `latest` unless that one is later (by `seq`; a tie: the one read last)."""
    key = (record.cell, record.trial)
    if key not in latest or record.seq >= latest[key].seq:
        latest[key] = record
