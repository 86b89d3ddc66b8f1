"""A search folder where it is kept: a local folder used in place, or a folder of an object store (blockforge.storage).

For an object store the driver works in a local working copy that holds what its decisions and reports read (the
search's records and reports; of each run its curves, result and spec; never weights or checkpoints), brought down
from the storage when a driver starts and before reports, and a run's curve again when the run finishes. What the
driver writes goes up: search.json at once, every ledger record the moment it is appended (a small object of its
own, folded into the two ledger copies now and then), the reports at the end. A trial trains in a scratch folder of
its node (`trial_folder`) and keeps the run folder in the storage up to date before each report.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import os
import shutil
import uuid
from pathlib import Path
from typing import Iterator

from blockforge.errors import BlockforgeError, FolderInUseError
from blockforge.search.config import MARKER, trial_rel
from blockforge.search.records.ledger import SEGMENTS, Ledger, TrialRecord, merged, parse_record, segment_name
from blockforge.storage import Mirror, Storage, cache_root

RUN_RECORDS = ("metrics.jsonl", "result.json", "spec.yaml", "recipe.yaml", "data.json", "attempts.jsonl")  # a run, as reports read it
LEDGER_FILES = ("trials.jsonl", "trials.backup.jsonl")
TENSORBOARD_FOLDER = "tensorboard"  # every trial's curves, one TensorBoard run each (reports.views writes it)
FOLD_EVERY = 100  # record segments in the storage before they are folded into the ledger's two copies
RUN_ORDER = ("checkpoints/latest.json", "result.json")  # put up last: after the checkpoint it names, after everything


def driver_keeps(name: str) -> bool:
    """Whether the driver's working copy holds file `name` (relative to the search folder): not weights, not Tune's own."""
    if name.startswith(("tune/", "tune.damaged/", "retrain/", "data/")):  # data/: the prepared sets, which trials read
        return False
    if name.startswith("trials/"):
        parts = name.split("/")
        return len(parts) == 4 and parts[3] in RUN_RECORDS
    return True


def _report_file(name: str) -> bool:
    """What the driver writes besides the ledger: reports, views, best specs, search.json."""
    return driver_keeps(name) and not name.startswith(("trials/", f"{SEGMENTS}/", "costs/")) and name not in LEDGER_FILES


class SearchStore:
    """Where a search's folder is kept, and the local folder its driver works in (the same folder, when it is local).

    Pickled as its storage's URI (Tune pickles the searcher and the scheduler that hold one): unpickled on another
    machine, its working copy is that machine's."""

    _current: "SearchStore | None" = None  # the store of the search this process drives (see `rebound`)

    def __init__(self, storage: Storage, purpose: str = "searches"):
        self.storage = storage
        self.local = storage.working_copy(purpose)  # purpose: a driver's copy ("searches") apart from an export's ("exports")
        self.remote = not storage.local
        self._pulled: set[str] = set()  # run folders whose records this driver has taken down finished
        self._segments = 0  # records put up as segments since the last fold
        self.lease = None  # storage.Lease: this driver's hold on a remote search, checked before each record goes up

    @classmethod
    def of(cls, where: "SearchStore | Storage | str | os.PathLike") -> "SearchStore":
        if isinstance(where, SearchStore):
            return where
        return cls(where if isinstance(where, Storage) else Storage.open(where))

    def __getstate__(self) -> dict:
        return {"storage": self.storage}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["storage"])

    def __str__(self) -> str:
        return str(self.storage)

    @contextlib.contextmanager
    def driving(self) -> Iterator[None]:
        """While the block runs, a searcher or scheduler this process restores from a saved state (Tune's) works in this
        store, wherever the state was saved from (another machine, the folder before it was moved)."""
        SearchStore._current = self
        try:
            yield
        finally:
            SearchStore._current = None

    def rebound(self) -> "SearchStore":
        """The store of the search this process drives now, if any, else this one."""
        return SearchStore._current or self

    # ---- the driver's working copy --------------------------------------------------------------

    def holds_search(self) -> bool:
        return self.storage.exists(MARKER) if self.remote else (self.local / MARKER).exists()

    def pull(self) -> None:
        """Bring the working copy up to date with the storage (what the driver keeps), removing what the storage lost."""
        if self.remote:
            Mirror(self.storage, "", self.local).pull(driver_keeps)
            self._pulled.clear()

    def start_afresh(self) -> None:
        """A new search in a remote storage: nothing of an older working copy of the same URI is kept."""
        if self.remote and self.local.is_dir():
            for entry in self.local.iterdir():
                if entry.name != "search.lock":
                    shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()

    def pull_records(self) -> None:
        """Bring the search's own files (search.json, the ledger, reports) into the working copy, not its runs."""
        if self.remote:
            Mirror(self.storage, "", self.local).pull(lambda name: driver_keeps(name) and not name.startswith("trials/"))

    def pull_whole_run(self, run_dir: Path) -> None:
        """Take down everything of one run folder (its weights and checkpoints too): what an export reads."""
        if self.remote:
            rel = Path(run_dir).relative_to(self.local).as_posix()
            Mirror(self.storage, rel, Path(run_dir)).pull()

    def pull_run(self, run_dir: str) -> None:
        """Take down the records of a finished trial's run folder (its curve, result and spec), once."""
        if not self.remote or not run_dir or run_dir in self._pulled:
            return
        rel = Path(run_dir).relative_to(self.local).as_posix()
        Mirror(self.storage, rel, Path(run_dir)).pull(lambda name: name in RUN_RECORDS, remove=False)
        self._pulled.add(run_dir)

    def put(self, *names: str) -> None:
        """Put up the working copy's files `names` (relative to the search folder) as they are now."""
        if self.remote:
            for name in names:
                path = self.local / name
                if path.exists():
                    self.storage.upload(path, name)

    def pull_runs(self) -> None:
        """Bring every run's records in the working copy up to date (the ledger, which the driver writes, is left as it is)."""
        if self.remote:
            Mirror(self.storage, "trials", self.local / "trials").pull(lambda name: driver_keeps(f"trials/{name}"))
            self._pulled.clear()

    def set_aside(self, rel: str, to: str) -> None:
        """Move a folder of the search aside (Ray Tune's damaged state), in the storage."""
        self.storage.move(rel, to)

    def put_reports(self) -> None:
        """Put up everything the driver wrote besides the ledger (reports, views, best specs), and fold the ledger. The
        storage's TensorBoard files the working copy no longer holds go: an event file is rewritten whole under a new name
        when its run's curve changed (a trial resumed), and the old one would show every step twice."""
        if self.remote:
            mirror = Mirror(self.storage, "", self.local)
            mirror.pushed = {f"{TENSORBOARD_FOLDER}/{name}": (-1, -1) for name in self.storage.listing(TENSORBOARD_FOLDER)}
            mirror.push(_report_file)
            self.fold()

    # ---- the ledger in the storage -----------------------------------------------------------------

    def attach(self, ledger: Ledger) -> Ledger:
        """Every record appended to `ledger` also goes up at once, as a small object of its own."""
        if self.remote:
            ledger.on_append = self._put_segment
        return ledger

    def _put_segment(self, record: TrialRecord, line: bytes) -> None:
        self._still_ours()
        self.storage.write_bytes(segment_name(record), line)
        self._segments += 1
        if self._segments >= FOLD_EVERY:
            self.fold()

    def _still_ours(self) -> None:
        """Refuse to write for a driver whose lease another driver took (this one was thought gone): a write failure, so
        the search stops as on a full disk."""
        from blockforge.errors import FolderInUseError
        from blockforge.storage import StorageError

        if self.lease is not None:
            try:
                self.lease.check()
            except FolderInUseError as err:
                raise StorageError(str(err).split(";")[0] + "; this driver stopped writing there", reason="another driver holds it",
                                   fix="let that driver finish, or stop it and resume this search") from None

    @staticmethod
    def located(err: BlockforgeError, storage: Storage | None) -> BlockforgeError:
        """`err` naming the storage's objects where it names the driver's working copy of them (a sentence about a file of
        the search read in the copy is about the object); a failed write of the copy itself (its disk) and its lock are left
        as they are."""
        from blockforge.errors import WriteError

        if storage is None or storage.local or isinstance(err, (WriteError, FolderInUseError)):  # the copy's disk, its lock
            return err
        local = str(storage.working_copy())
        text = str(err)
        if local not in text:
            return err
        located = copy.copy(err)
        located.args = (text.replace(local, str(storage)),)
        return located

    def fold(self) -> None:
        """Put up the ledger's two copies whole, then remove the segments they now hold."""
        if self.remote:
            self._still_ours()
            self.put(*LEDGER_FILES)
            self.storage.delete(SEGMENTS)
            for part in (self.local / SEGMENTS).glob("*.jsonl"):
                part.unlink()
            self._segments = 0


def storage_record(storage: Storage, cell: str, trial: int) -> TrialRecord | None:
    """The latest record of trial `trial` of `cell` in the search kept in `storage` (both ledger copies, and the record
    segments of a remote one): what a trial reads of the ledger, on whatever node."""
    if storage.local:
        return Ledger(Path(storage.uri) / LEDGER_FILES[0]).latest(cell, trial)
    copies = []
    for name in [*LEDGER_FILES, *(f"{SEGMENTS}/{name}" for name in sorted(storage.listing(SEGMENTS)))]:
        lines = (storage.read_bytes(name) or b"").decode(errors="replace").splitlines()
        copies.append([record for record in map(parse_record, lines) if record is not None])
    return merged(*copies).get((cell, trial))


# ---- a trial's run folder ----------------------------------------------------------------------------


def node_scratch(storage: Storage) -> Path:
    """This node's scratch folder for the trials of the search kept in `storage`."""
    return cache_root() / "scratch" / hashlib.sha256(storage.uri.encode()).hexdigest()[:16]


SCRATCH_LOCK = "trial.lock"
ATTEMPT = "attempt.lock"  # in a remote run folder: which attempt of the trial may write it now


class Superseded(Exception):
    """A newer attempt of this trial writes its run folder now (this one outlived a driver that was stopped): it ends."""


@contextlib.contextmanager
def trial_folder(storage: Storage, cell: str, identity: str) -> Iterator[tuple[Path, Mirror | None]]:
    """The folder a trial trains in, and (for a remote storage) the Mirror that keeps the storage's run folder up to date.

    A local search folder's run folder is used in place. For a remote one, the trial trains in this node's scratch
    folder: emptied, then filled with what the storage holds of the run (its records and latest checkpoints), so a
    trial continues where any node left it. Scratch folders of ended trials (no live trial holds their lock) go."""
    rel = trial_rel(cell, identity)
    if storage.local:
        yield Path(storage.uri) / rel, None
        return
    from blockforge.lock import RunLock

    root = node_scratch(storage)
    scratch = root / rel
    scratch.mkdir(parents=True, exist_ok=True)
    lock = RunLock(scratch, SCRATCH_LOCK, "running a search trial in it").acquire()
    try:
        _remove_ended(root, scratch)
        for entry in scratch.iterdir():
            if entry.name != SCRATCH_LOCK:
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        mirror = Mirror(storage, rel, scratch, last=RUN_ORDER)
        mirror.pull()
        for folder in (scratch / "checkpoints").glob("step-*"):  # cut short while being put up (state.json goes last): not one
            if not (folder / "state.json").exists():
                shutil.rmtree(folder)
        token = uuid.uuid4().hex.encode()
        storage.write_bytes(f"{rel}/{ATTEMPT}", token)  # from now on, an older attempt still running (a stopped driver's) writes nothing

        def still_mine() -> None:
            held = storage.read_bytes(f"{rel}/{ATTEMPT}")
            if held is None:  # not replaced: gone, with whatever else of the run folder the storage lost
                from blockforge.storage import StorageError

                raise StorageError(f"{storage}/{rel}: the storage lost this trial's files while it trained (its attempt record is gone)",
                                   reason="the storage lost the trial's files",
                                   fix="restore them if a copy exists (a lifecycle rule, a person or another search removed them), "
                                       "or let the resume train the trial again from its start")
            if held != token:
                raise Superseded(f"{storage}/{rel}: a newer attempt of this trial writes it now")

        mirror.before_push = still_mine
        yield scratch, mirror
    finally:
        lock.release()


def _remove_ended(root: Path, keep: Path) -> None:
    """Remove the scratch run folders under `root` that no live trial holds (a trial stopped inside Tune's report leaves its own)."""
    from blockforge.lock import RunLock

    for folder in root.glob("trials/*/*"):
        if folder == keep or not folder.is_dir():
            continue
        lock = RunLock(folder, SCRATCH_LOCK)
        try:
            lock.acquire()
        except (FolderInUseError, OSError):
            continue  # a trial trains there now
        lock.release()
        shutil.rmtree(folder, ignore_errors=True)


def thin_run(storage: Storage, rel: str) -> int:
    """Thin the run folder `rel` of the search in `storage` to its final weights (train.checkpoint.keep_final_weights), in the
    storage itself: the newest whole checkpoint's weights copied up a level, then the checkpoints removed. Bytes freed."""
    if storage.local:
        from blockforge.train.checkpoint import keep_final_weights

        return keep_final_weights(Path(storage.uri) / rel)
    files = storage.listing(f"{rel}/checkpoints")
    whole = sorted(name.split("/")[0] for name in files if name.endswith("/state.json") and f"{name.split('/')[0]}/model.safetensors" in files)
    if not whole:
        return 0
    if not storage.exists(f"{rel}/model.safetensors"):
        storage.copy_file(f"{rel}/checkpoints/{whole[-1]}/model.safetensors", f"{rel}/model.safetensors")
    storage.delete(f"{rel}/checkpoints")
    return sum(size for size, _ in files.values()) - files[f"{whole[-1]}/model.safetensors"][0]
