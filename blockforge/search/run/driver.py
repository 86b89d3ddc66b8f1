"""`blockforge search`: run a search file on Ray Tune (a local Ray, or a cluster by address) and report.

The search folder holds search.json (which plan it runs), tune/ (Ray Tune's experiment state, for
--resume), trials/ (one run folder per trial), trials.jsonl (the ledger) and, at the end,
results.csv, best/, summary.md, the plots and the fitted alpha law.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import shutil
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from blockforge.cluster import RayStart, TrialFailures, probe_address, ray_failure, stop_ray, stop_ray_behind
from blockforge.errors import BlockforgeError, WriteError, warn
from blockforge.io import FolderInTheWay, atomic_write_json, remove_leftover_temporaries, writable_folder, write_failure
from blockforge.lock import RunLock
from blockforge.search.config import MARKER, SearchPlan, folder_marker, load_search, read_marker
from blockforge.search.records.ledger import Ledger, TrialRecord
from blockforge.search.records.store import SearchStore
from blockforge.search.reports.live import ProgressView
from blockforge.search.run.slots import started_workers, warm_slots
from blockforge.spec import Assignment
from blockforge.storage import Lease, Storage, StorageError
from blockforge.train.events import Status

SEARCH_LOCK = "search.lock"  # held by the driver that runs the search in a folder
SEARCH_LEASE = "search.lease"  # in a storage: held by the one driver of the search, whatever machine it runs on


def _tune_callback(view: ProgressView):
    from ray.tune import Callback

    from blockforge.search.run.trials import WRITE_ERROR, WRITE_FIX

    def live() -> ProgressView:
        """This driver's view: a restored Tuner calls the copy of the view it unpickled, which holds no trackers."""
        current = ProgressView.current
        if current is None or current is view:
            return view
        current.scheduler = current.scheduler or view.scheduler  # the rung tables came back with the unpickled copy
        return current

    class Live(Callback):
        def setup(self, **info):
            _tune_listening()

        def on_trial_complete(self, iteration, trials, trial, **info):
            live().update(tune_trials=trials)

        def on_trial_error(self, iteration, trials, trial, **info):
            live().update(tune_trials=trials)

        def on_trial_result(self, iteration, trials, trial, result, **info):
            _trials_report()
            if WRITE_ERROR in result:
                _write_failed(result[WRITE_ERROR], result.get(WRITE_FIX) or "free space")
            live().update(tune_trials=trials)

    return Live()


@dataclass
class SearchOutcome:
    search_dir: Path  # where its files are on this machine (a remote search's working copy)
    records: list[TrialRecord]
    summary: str
    interrupted: int | None = None  # the signal that stopped the search early (it resumes with --resume)
    resume_command: str = ""
    location: str = ""  # where the search is kept: the folder, or the storage's URI


def nothing_finished(outcome) -> str | None:
    """A sentence when trials failed and none finished (the search answered nothing), else None."""
    failed = [r for r in outcome.records if r.status == Status.FAILED]
    if not failed or any(r.status in (Status.COMPLETED, Status.DIVERGED) for r in outcome.records):
        return None
    again = [r for r in failed if r.retry]
    fix = (f"resume with: {outcome.resume_command} (it trains the {len(again)} failed for a cause outside them again)" if again
           else "fix the search file or its data, then start it in another --out")
    return (f"no trial of the search finished: {len(failed)} failed (trial {failed[0].trial} of {failed[0].cell}: {failed[0].note}); "
            f"{fix}")


class SearchStopped(BlockforgeError):
    """A signal arrived before the first trial started: nothing to resume, nothing left behind."""

    def __init__(self, signum: int):
        self.exit_code = 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name} before the search started; run it again")


class Interrupts:
    """SIGTERM and a first SIGINT stop a search the way Ray Tune stops on Ctrl-C: no new trials, the
    experiment state saved, running trials stopped where their checkpoints let them resume. A second
    signal ends the driver at once (blockforge/reaper.py ends a local Ray).

    A signal is only noted where it arrives, never raised into Ray's code: before Tune runs, the start
    stops at its next `check`; once Tune runs, the signal goes to Tune's own graceful stop (its SIGUSR1
    handler) as soon as Tune listens, which the search's Tune callback reports from its setup. While
    the reports are written a signal changes nothing but the exit status.

    Handlers are installed only from the main thread (Python allows no other), and again after Ray
    starts, over any crash handler Ray's core put in for SIGTERM.
    """

    def __init__(self, resume_command: str):
        self.resume_command = resume_command
        self.signal: int | None = None
        self.write_failure: str | None = None  # a trial could not write: the search stops as for a signal
        self.write_fix = "free space"  # ...and what to do before resuming
        self.phase = "start"  # start -> fit -> end
        self.tune_listens = False
        self._saved: dict = {}

    def __enter__(self) -> "Interrupts":
        global _ACTIVE
        _ACTIVE = self
        self.arm()
        return self

    def arm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous = signal.signal(sig, self._handle)
            self._saved.setdefault(sig, previous)
        # SIGINT comes here first; Tune hears of it through its SIGUSR1 handler (see _forward).
        self._saved.setdefault("env", os.environ.get("TUNE_DISABLE_SIGINT_HANDLER"))
        os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"

    def __exit__(self, *exc) -> None:
        global _ACTIVE
        _ACTIVE = None
        env = self._saved.pop("env", None)
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
        if env is None:
            os.environ.pop("TUNE_DISABLE_SIGINT_HANDLER", None)
        else:
            os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = env

    def check(self) -> None:
        """Before Tune runs: stop here if a signal came."""
        if self.signal is not None:
            raise SearchStopped(self.signal)

    def listening(self) -> None:
        """Tune's loop is about to run, with its graceful stop installed."""
        self.tune_listens = True
        self._forward()

    @property
    def stopping(self) -> bool:
        return self.signal is not None or self.write_failure is not None

    def write_failed(self, sentence: str, fix: str = "free space") -> None:
        """A trial could not write (a full disk, a storage gone): stop the search the way a signal does, at its first such trial."""
        if self.write_failure is None:
            self.write_failure, self.write_fix = sentence, fix  # said once, when the search has stopped
        self._forward()

    def _forward(self) -> None:
        tune_stop = signal.getsignal(signal.SIGUSR1)  # Ray Tune's graceful stop, installed for its run
        if self.stopping and self.tune_listens and callable(tune_stop):
            tune_stop(signal.SIGUSR1, None)

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.signal is not None:
            print(f"blockforge: {name} again: stopped at once; resume with: {self.resume_command}", file=sys.stderr, flush=True)
            os._exit(128 + signum)
        self.signal = signum
        if self.phase == "end":
            return
        what = "the running trials" if self.phase == "fit" else "before the first trial"
        print(f"blockforge: {name}: stopping {what}; send it again to stop at once", file=sys.stderr, flush=True)
        self._forward()


_ACTIVE: Interrupts | None = None  # the running search's, which the Tune callback tells when Tune listens


def _tune_listening() -> None:
    if _ACTIVE is not None:
        _ACTIVE.listening()


_TRAINING = threading.Event()  # set at the search's first result: its trials train, and the driver has time to spare


def _trials_report() -> None:
    _TRAINING.set()


def _load_ahead() -> None:
    """What the driver will need, loaded off the path to an answer: scipy.stats (the first result's evidence) while Tune
    starts the first trials, and the reports' drawing once trials train, when the driver has nothing else to do."""
    from blockforge.search.evidence.evidence import t_quantile

    with contextlib.suppress(Exception):  # only ahead of time: where it fails, the reports meet it and say so
        t_quantile(2)
        _TRAINING.wait()
        _load_reports()


def _write_failed(sentence: str, fix: str = "free space") -> None:
    if _ACTIVE is not None:
        _ACTIVE.write_failed(sentence, fix)


QUIET_WHEN_INTERRUPTED = ("ray.tune.tune",)
# Where Ray logs a failed write of its state, with a traceback: its experiment state, and its storage layer's folders.
STATE_LOGS = ("ray.tune.execution.experiment_state", "ray.train._internal.storage")


def _write_failure_in(err: BaseException | None) -> str | None:
    """Why `err` (or an exception it was raised from) means a file could not be written, if it does."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        reason = write_failure(err)
        if reason is not None:
            return reason
        err = err.__cause__ or err.__context__
    return None


TUNE_TEMPORARY = "-tmp-"  # in the name of a file Tune writes before renaming it into place (its searcher's and scheduler's state)


class _StateWriteFailure:
    """Tune logs a failed save of its experiment state (a full disk) with a traceback and runs on; here it
    stops the search in one sentence instead, like a trial that cannot write."""

    def __init__(self, interrupts: "Interrupts", store: SearchStore):
        self.interrupts, self.store = interrupts, store

    def filter(self, record) -> bool:
        err = record.exc_info[1] if record.exc_info else None
        if isinstance(err, FileNotFoundError) and TUNE_TEMPORARY in str(err):
            return False  # its copy to the storage met a file Tune was replacing (its write's temporary): the next save copies it
        if err is not None and self.store.remote and isinstance(err, OSError) and not isinstance(err, BlockforgeError):
            from blockforge.storage import storage_failure

            reason, fix = storage_failure(err, self.store.storage)
            self.interrupts.write_failed(f"{self.store}/tune: cannot write Ray Tune's experiment state ({reason})", fix)
            return False
        reason = _write_failure_in(err) if err is not None else None
        if reason is None:
            return True
        self.interrupts.write_failed(f"{self.store.local / 'tune'}: cannot write Ray Tune's experiment state ({reason})")
        return False


class _QuietWhenInterrupted:
    """Drops Ray Tune's own lines about an interrupted run: they name Tuner.restore (--resume is the way here)."""

    def __init__(self, interrupts: Interrupts):
        self.interrupts = interrupts

    def filter(self, record) -> bool:
        return not self.interrupts.stopping


def resume_command(path: str | os.PathLike, search_dir: Path, overrides: list[tuple] | None, address: str | None = None,
                   max_concurrent: int | None = None) -> str:
    """The command line that continues this search: the same file and --set flags, where and how it ran (--address,
    --max-concurrent), with --resume."""
    sets = [part for assignment in overrides or [] for part in ("--set", str(Assignment(*assignment)))]
    where = [*(["--address", address] if address is not None else []), *(["--max-concurrent", str(max_concurrent)] if max_concurrent else [])]
    return shlex.join(["blockforge", "search", str(path), *sets, "--out", str(search_dir), *where, "--resume"])


def _trainable(plan: SearchPlan, store: SearchStore, absent: tuple[str, ...] = ()):
    from ray import tune

    from blockforge.search.run.trials import run_trial

    trainable = tune.with_parameters(run_trial, plan=plan, search=str(store.storage), absent=absent)
    if plan.transfer is None or plan.transfer.resources is None:
        return tune.with_resources(trainable, {"cpu": plan.resources.cpu, "gpu": plan.resources.gpu})
    from ray.tune import PlacementGroupFactory

    def resources(config: dict) -> PlacementGroupFactory:  # target trials take the transfer's own resources
        res = plan.resources_of(config["cell"])
        return PlacementGroupFactory([{"CPU": res.cpu, "GPU": res.gpu}])

    return tune.with_resources(trainable, resources)


def open_store(out: str | os.PathLike | None, default: str) -> SearchStore:
    """The store of `--out` (default: runs/search-NAME): a URI's storage checked by writing to it, before anything else is."""
    store = SearchStore(Storage.open(out if out is not None else default))
    if store.remote:
        store.storage.check()
    return store


def run_search(
    path: str | os.PathLike, *, out: str | os.PathLike | None = None, address: str | None = None, resume: bool | str = False,
    max_concurrent: int | None = None, overrides: list[tuple] | None = None, progress_every_s: float = 10.0, progress: str = "lines",
) -> SearchOutcome:
    """Run (or resume) the search in `path`; returns the records and the printed summary.

    `out`: the search folder, a local path or a URI (s3://bucket/prefix; blockforge.storage). `resume`: True continues the
    search there, "auto" continues it if there is one and starts it otherwise. Everything that can be checked before a
    trial starts is: the search file, the flags, the storage and the sets the recipes name (before Ray starts), each
    cell's memory plan (while a local Ray starts, which a refusal stops), and the trial's resources and memory against the
    cluster's nodes, and that every node sees a local search folder (once connected). A start that fails leaves no
    search.json behind, so the next plain run works.
    """
    if max_concurrent is not None and max_concurrent < 1:
        raise BlockforgeError(f"--max-concurrent must be at least 1, not {max_concurrent}")
    if resume not in (True, False, "auto"):
        raise BlockforgeError(f"--resume {resume}: give --resume (continue the search in --out) or --resume=auto (continue it if --out "
                              "holds one, else start it)")
    storage = Storage.open(out) if out is not None else None  # a URI no filesystem here can open is refused by name now
    try:
        return _run_search(path, storage, address=address, resume=resume, max_concurrent=max_concurrent, overrides=overrides,
                           progress_every_s=progress_every_s, progress=progress)
    except BlockforgeError as err:
        raise SearchStore.located(err, storage) from None


def _run_search(path, storage: Storage | None, *, address: str | None, resume: bool | str, max_concurrent: int | None,
                overrides: list[tuple] | None, progress_every_s: float, progress: str = "lines") -> SearchOutcome:
    if resume == "auto":  # a job that may run again (a Slurm requeue, a restarted pod) continues what it started
        storage = storage or Storage.open(Path("runs") / f"search-{load_search(path, overrides).name}")
        if not storage.local:
            storage.check()
        resume = SearchStore(storage).holds_search()
    # A resumed search reads its data where it was started (without --out, runs/ is relative to here anyway).
    started = stored_marker(SearchStore(storage)) if resume and storage is not None else None
    plan = load_search(path, overrides, workdir=started.get("workdir") if started else None)
    store = open_store(storage, str(Path("runs") / f"search-{plan.name}"))
    search_dir = store.local
    if resume and not store.holds_search():
        raise BlockforgeError(f"{store}: holds no search to resume; run without --resume (or give --out of the search)")
    if address is not None:
        probe_address(address)  # seconds, not the minutes of a Ray start that waits on it
    from blockforge.search.preflight import memory_needs
    from blockforge.search.run.datasets import check_named_sets

    check_named_sets(plan)  # before Ray starts: a set a recipe names that is missing, cut short or does not fit it is one sentence
    ray_start = RayStart(address)  # a local Ray starts while the memory plan is made and the folder taken: a refusal stops it
    try:
        needs = plan.memory_needs = memory_needs(plan)  # a model too large even to plan: one sentence too; trials take this plan
        from blockforge.search.reports.plan import format_plan, search_plan

        print(format_plan(plan, search_plan(plan)), flush=True)
        from blockforge.search.run.datasets import describe_sets

        for line in describe_sets(plan):
            print(line, flush=True)
        for adjustment in plan.adjustments:  # what loading changed in the recipes: said, never silent
            print(adjustment, flush=True)
        writable_folder(search_dir, "the search" if not store.remote else f"the working copy of {store}")
        # One driver per search folder, from before anything is written to the end of the reports (--resume too): an flock on
        # the folder this machine works in, and for a storage a lease in the storage itself (drivers on other machines).
        lock = RunLock(search_dir, SEARCH_LOCK, "running a search in it").acquire()
        lease, reachable = None, True
        try:
            if store.remote:
                lease = store.lease = Lease(store.storage, SEARCH_LEASE, "running this search").take()
            remove_leftover_temporaries(search_dir)
            return _run_owned(path, plan, store, needs, ray_start, resume=resume, max_concurrent=max_concurrent, overrides=overrides,
                              progress_every_s=progress_every_s, progress=progress)
        except StorageError:
            reachable = False  # the storage just failed: asking it again only waits for its retries
            raise
        finally:
            if lease is not None:
                lease.release(reachable=reachable)
            store.lease = None
            lock.release()
    finally:
        ray_start.abandon()  # nothing of it was taken (a refusal): the Ray started for it stops


def _report(plan: SearchPlan, store: SearchStore, ledger: Ledger, tracking, stopped: bool) -> str:
    """Write the reports (and put them up), give the trackers the answers and close them; the summary the CLI prints."""
    from blockforge.search.reports.findings import Findings
    from blockforge.search.reports.report import write_reports

    store.pull_runs()  # every run's curves and results, as the trials put them up
    records = ledger.records()
    found = Findings.of(plan, records)  # one computation for the reports and the trackers' answers
    summary = write_reports(store.local, plan, ledger, location=str(store), found=found)
    store.put_reports()
    if tracking is not None:
        tracking.finish(records, found, stopped=stopped)
    return summary


def _take_up(path, plan: SearchPlan, store: SearchStore, command: str) -> list:
    """Ready a search folder for --resume: brought up to the storage, checked against the plan, its ledger repaired, the
    trials that failed for a cause outside them marked to train again (returned)."""
    search_dir = store.local
    store.pull()  # the storage is the truth: the working copy is brought up to it (a local folder is it)
    started = read_marker(search_dir)
    if started["fingerprint"] != plan.fingerprint():
        raise BlockforgeError(f"{path}: the search file (or a --set) changed since {store} was started; resume with "
                              f"the same ones ({resume_command(started['file'], store.storage, started.get('overrides'))}), or choose another --out")
    from blockforge.search.records.repair import (
        repair_ledger,  # a damaged ledger is repaired from its copies and the run folders, or refused
    )

    repaired = repair_ledger(search_dir, plan.metric, command, plan)
    if repaired:
        print(repaired, flush=True)
    retried = store.attach(Ledger(search_dir / "trials.jsonl")).retry_failed()
    if retried:  # Tune's saved state holds them as errored: the searcher is rebuilt from the ledger, which trains them again
        print(f"{len(retried)} trial(s) that failed for a cause outside them (a process, a node or the storage) are trained "
              "again", flush=True)
    store.fold()  # the storage's ledger is the working copy's, whole
    return retried


def stored_marker(store: SearchStore) -> dict | None:
    """The search.json of the search in `store`, if it holds one (taken down into the working copy first)."""
    if store.remote:
        if not store.storage.exists(MARKER):
            return None
        store.storage.download(MARKER, store.local / MARKER)
    return read_marker(store.local) if (store.local / MARKER).exists() else None


def _fit_noting_write_failures(plan: SearchPlan, store: SearchStore, resume: bool, max_concurrent: int | None, view, interrupts,
                               rebuild: bool, command: str) -> None:
    """_fit; where the driver's own writes (the ledger) fail on a full disk or a storage gone, the failure is noted on
    `interrupts` as a trial's is (the search then stops with its sentence); a Ray failure is raised as its sentence."""
    from blockforge.tracking import EXTRA, broken_packages_absent

    unused = tuple(module for tracker, (module, _) in EXTRA.items() if tracker not in plan.tracking.report_to)
    try:
        with broken_packages_absent(unused=unused) as absent:  # before Tune imports W&B and MLflow itself
            _fit(plan, store, resume, max_concurrent, view, interrupts, rebuild=rebuild, absent=absent)
    except Exception as err:
        if interrupts.phase != "fit":
            raise
        if isinstance(err, FolderInTheWay):  # a report's file (the live view's) is a folder: the search stops, resumable
            raise FolderInTheWay(f"{err}, then resume with: {command}") from None
        if interrupts.write_failure is None:  # else Tune ending after a trial's failed write (e.g. its state lost too)
            reason = _write_failure_in(err)
            if reason is None:
                _raise_ray_failure(err, command)
                raise
            interrupts.write_failure, interrupts.write_fix = _failure_sentence(err, f"{store}: cannot write the search's records ({reason})")


def _claim(path, plan: SearchPlan, store: SearchStore, resume: bool, command: str) -> list:
    """The search folder made this search's: a resumed one taken up (the trials it retries), a new one started afresh."""
    if store.holds_search() and not resume:
        raise BlockforgeError(f"{store}: already holds a search; pass --resume to continue it, or choose another --out")
    if resume:
        return _take_up(path, plan, store, command)
    store.start_afresh()
    return []


def _run_owned(path, plan: SearchPlan, store: SearchStore, needs: dict, ray_start: RayStart, *, resume: bool,
               max_concurrent: int | None, overrides: list[tuple] | None, progress_every_s: float, progress: str = "lines") -> SearchOutcome:
    """run_search in a search folder this driver holds the lock of."""
    from blockforge.search.preflight import check_cluster

    search_dir = store.local
    marker = search_dir / MARKER
    command = resume_command(path, store.storage, overrides, ray_start.address, max_concurrent)
    retried = _claim(path, plan, store, resume, command)
    ledger = store.attach(Ledger(search_dir / "trials.jsonl"))  # the searcher opens it again when it starts
    from blockforge.search.reports.tracked import SearchTracking

    tracking = SearchTracking.open(plan, store)  # W&B, MLflow: their failures are warnings, before anything trains
    ray_stopped = None  # the wait for a Ray that stops while the reports are written (stop_ray_behind)
    try:
        fitted = False
        with Interrupts(command) as interrupts, store.driving():
            try:
                started_here = ray_start.wait()
            except BlockforgeError as err:  # Ray did not start (or join): nothing of the search ran yet
                raise BlockforgeError(f"{err}; then " + (f"resume with: {command}" if resume else "run the same command again")) from None
            try:
                interrupts.arm()
                check_cluster(plan, needs, ray_start.address, store)
                interrupts.check()
                from blockforge.search.run.datasets import prepare_search_sets

                plan.prepared = prepare_search_sets(plan, store, should_stop=interrupts.check)  # before the first trial
                interrupts.check()
                if not resume:
                    atomic_write_json(marker, folder_marker(plan, overrides))
                    store.put(MARKER)
                view = ProgressView(ledger, plan, every_s=progress_every_s, tracking=tracking, mode=progress)
                ProgressView.current = view
                _fit_noting_write_failures(plan, store, resume, max_concurrent, view, interrupts, bool(retried), command)
                fitted = interrupts.signal is None and interrupts.write_failure is None  # every trial ended: no process writes more
            except BaseException:
                if interrupts.phase == "start" and not resume:
                    marker.unlink(missing_ok=True)  # nothing started: the next plain run starts afresh
                    if store.remote:
                        with contextlib.suppress(BlockforgeError):
                            store.storage.delete(MARKER)
                raise
            finally:
                try:
                    ledger = store.attach(Ledger(search_dir / "trials.jsonl"))  # read again: what the searcher appended is in it
                    if interrupts.phase != "start":
                        ledger.mark_interrupted("stopped with the search; resumes from its checkpoint with --resume")
                except OSError:
                    if interrupts.write_failure is None:
                        raise  # on a full disk the trial's running record stands, and --resume continues it all the same
                finally:
                    if started_here:  # every trial ended: Ray's seconds of stopping pass while the reports are written
                        ray_stopped = stop_ray_behind() if fitted else stop_ray()
            interrupts.phase = "end"
            if interrupts.write_failure is not None:
                raise WriteError(f"{interrupts.write_failure}; the search stopped there: {interrupts.write_fix}, then resume with: "
                                 f"{interrupts.resume_command}")
            view.update(force=True, journal=False)  # the reports below rebuild every view
            view.close()
            try:
                summary = _report(plan, store, ledger, tracking, stopped=interrupts.signal is not None)
            except FolderInTheWay as err:  # every trial is kept: the reports follow on resume
                raise FolderInTheWay(f"{err}, then resume with: {command}; every trial is kept, and the resume writes the reports") from None
            tracking = None
            said = outside_failures(ledger.records(), command)
            if said is not None and interrupts.signal is None and any(r.status in (Status.COMPLETED, Status.DIVERGED) for r in ledger.records()):
                warn(said)  # (a search that finished nothing says it in its error, with the same resume line)
    finally:
        ProgressView.current = None
        if tracking is not None:  # the search stopped on an error: its tracker runs end as killed
            tracking.trackers.close(finished=False)
        if ray_stopped is not None:
            ray_stopped()
    return SearchOutcome(search_dir, ledger.records(), summary, interrupted=interrupts.signal, resume_command=interrupts.resume_command,
                         location=str(store))


def _raise_ray_failure(err: BaseException, command: str) -> None:
    """A failure of Ray's own that ended Tune's run in the driver (a memory kill of the driver's own work, a lost node):
    one sentence and the resume line instead of Ray's traceback. Returns for anything else."""
    failure = ray_failure(err)
    if failure is None:
        return
    said = failure.sentence() if failure.kind == "memory" else f"Ray failed under the search ({failure.said})"
    raise BlockforgeError(f"the search stopped: {said}; resume with: {command}") from None


def outside_failures(records: list[TrialRecord], command: str) -> str | None:
    """One sentence when trials failed for a cause outside them (Ray's memory monitor, a lost node): how many, the first one's
    reason, and the resume line that trains them again."""
    failed = [r for r in records if r.status == Status.FAILED and r.retry]
    if not failed:
        return None
    first = failed[0]
    return (f"{len(failed)} trial(s) failed for a cause outside them (trial {first.trial} of {first.cell}: {first.note}); "
            f"resume with: {command} to train them again")


def _failure_sentence(err: BaseException, default: str) -> tuple[str, str]:
    """(sentence, fix) for a failed write of the driver: a storage's own words, or `default` and 'free space'."""
    from blockforge.storage import StorageError

    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, StorageError) and err.fix:
            return str(err).removesuffix(f"; {err.fix}"), err.fix
        err = err.__cause__ or err.__context__
    return default, "free space"


def _damaged_tune_state(store: SearchStore) -> str | None:
    """Why the search's Tune state cannot be restored (damaged_tune_state), wherever the storage keeps it (a URI's: taken down
    to look at), or None."""
    if not store.remote:
        damaged = damaged_tune_state(store.local / "tune")
        return None if damaged is None else f"{damaged[0]}: {damaged[1]}"
    local = store.local / "tune"
    shutil.rmtree(local, ignore_errors=True)
    for name in store.storage.child("tune").listing():
        if "/" not in name:  # the state files (trial folders below are Tune's own)
            store.storage.download(f"tune/{name}", local / name)
    damaged = damaged_tune_state(local)
    shutil.rmtree(local, ignore_errors=True)
    return None if damaged is None else f"{store}/tune/{damaged[0].name}: {damaged[1]}"


def damaged_tune_state(experiment: Path) -> tuple[Path, str] | None:
    """The first file of Ray Tune's newest saved state in `experiment` that cannot be restored, and why, if any.

    Tune copies its state into the search folder without renaming it into place, so a full disk or a kill during the copy
    can leave it cut short; restoring from it would lose the search's progress. Its pickles hold the searcher, the scheduler
    and the cells by module path: a state saved by a blockforge whose modules were laid out otherwise names classes this one
    does not have, and restoring it would fail inside Tune.
    """
    newest = sorted(experiment.glob("experiment_state-*.json"))
    if not newest:
        return None
    stamp = newest[-1].name.removeprefix("experiment_state-").removesuffix(".json")
    for path in (newest[-1], *experiment.glob(f"search_gen_state-{stamp}.json"), *experiment.glob(f"searcher-state-{stamp}.pkl"),
                 experiment / "tuner.pkl"):
        try:
            with open(path, "rb") as f:
                if f.read(1) == b"\x80":  # a pickle (Tune names some of its pickles .json): read through, nothing of it run
                    f.seek(0)
                    missing = [name for name in sorted(_pickle_names(f)) if name.startswith("blockforge.") and not _importable(name)]
                    if missing:
                        return path, f"saved by another version of blockforge ({missing[0]} is not in this one)"
                else:
                    f.seek(0)
                    json.load(f)
        except FileNotFoundError:
            continue
        except Exception:  # cut short or garbled: any error of reading it back
            return path, "Ray Tune's saved state is damaged"
    return None


def _pickle_names(file) -> set[str]:
    """Every class or function a pickle names (module.qualname), read from its opcodes: nothing of it is run or imported.
    Raises on a pickle cut short or garbled."""
    import pickletools

    names, memo, pushed = set(), {}, []  # pushed: the values of the latest pushes (a string, or None for anything else)
    for opcode, arg, _ in pickletools.genops(file):
        if opcode.name == "GLOBAL":
            names.add(arg.replace(" ", "."))
        elif opcode.name == "STACK_GLOBAL":
            if len(pushed) >= 2 and isinstance(pushed[-2], str) and isinstance(pushed[-1], str):
                names.add(f"{pushed[-2]}.{pushed[-1]}")
        elif opcode.name == "MEMOIZE":
            memo[len(memo)] = pushed[-1] if pushed else None
        elif opcode.name in ("PUT", "BINPUT", "LONG_BINPUT"):
            memo[arg] = pushed[-1] if pushed else None
        elif opcode.name in ("GET", "BINGET", "LONG_BINGET"):
            pushed.append(memo.get(arg))
        elif opcode.stack_after:
            pushed.append(arg if isinstance(arg, str) and "UNICODE" in opcode.name else None)
        del pushed[:-2]
    return names


def _importable(qualified: str) -> bool:
    """Whether `module.qualname` names something this blockforge has (its module imported to look)."""
    import importlib

    parts = qualified.split(".")
    for cut in range(len(parts) - 1, 0, -1):  # the longest prefix that is a module; the rest is the qualname
        module = ".".join(parts[:cut])
        try:
            target = importlib.import_module(module)
        except ModuleNotFoundError:
            continue
        except Exception:
            return False
        for attribute in parts[cut:]:
            target = getattr(target, attribute, _MISSING)
            if target is _MISSING:
                return False
        return True
    return False


_MISSING = object()


class _Silent:
    """A Ray Tune progress reporter that reports nothing (Tune calls these three): the live view is the search's own, and
    in a notebook Tune's default reporter shows an HTML table of its own in the cell. A module-level class, so the Tuner's
    saved state that holds it unpickles on resume."""

    def setup(self, *args, **kwargs) -> None:
        pass

    def should_report(self, trials, done: bool = False) -> bool:
        return False

    def report(self, trials, done, *sys_info) -> None:
        pass


def _slots(plan: SearchPlan, limit: int | None) -> int:
    """How many trials run at once: at most `limit` (--max-concurrent, else the search file's), and as many as the
    cluster's CPUs (or GPUs) hold."""
    import ray

    resources = plan.resources
    available = ray.cluster_resources()
    held = int(available.get("GPU", 0) // resources.gpu) if resources.gpu else int(available.get("CPU", 1) // resources.cpu)
    return max(1, min(limit, held) if limit else held)


def _load_reports() -> None:
    """Import what the reports draw and write with (matplotlib, TensorBoard's event records): a second's work otherwise
    done after the last trial, between its end and the answer."""
    import matplotlib.backends.backend_agg  # noqa: F401
    import matplotlib.figure  # noqa: F401
    from tensorboard.summary.writer import record_writer  # noqa: F401

    from blockforge.search.reports import report  # noqa: F401


def _fit(plan: SearchPlan, store: SearchStore, resume: bool, max_concurrent: int | None, view: ProgressView, interrupts: Interrupts,
         rebuild: bool = False, absent: tuple[str, ...] = ()) -> None:
    """Build (or restore) the Tuner and run it until the search ends or a signal stops it. `rebuild`: start Tune afresh from
    the ledger, its saved state set aside (it holds trials as errored that the search trains again). `absent`: packages that
    fail as they import, absent in the trials' processes too."""

    # Ray's Optuna wrapper logs every exhausted grid as a warning; the ledger says it better.
    logging.getLogger("ray.tune.search.optuna.optuna_search").setLevel(logging.ERROR)
    # Tune's result table misses trials that reported nothing to it (restored ones); the ledger has them all.
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    quiet = _QuietWhenInterrupted(interrupts)
    for name in QUIET_WHEN_INTERRUPTED:
        logging.getLogger(name).addFilter(quiet)
    state_failure = _StateWriteFailure(interrupts, store)
    for name in STATE_LOGS:
        logging.getLogger(name).addFilter(state_failure)
    from ray import tune

    from blockforge.search.config import OBJECTIVE
    from blockforge.search.run.scheduler import CellScheduler
    from blockforge.search.run.searcher import CellSearcher

    _TRAINING.clear()
    threading.Thread(target=_load_ahead, name="load-ahead", daemon=True).start()
    limit = max_concurrent or plan.max_concurrent  # trials at once: --max-concurrent, else the search file's (None: the cluster's)
    trainable = _trainable(plan, store, absent)
    experiment = store.storage.child("tune")  # Tune keeps its state in the storage itself (a URI: through pyarrow)
    interrupts.check()
    damaged = _damaged_tune_state(store) if resume else None
    if damaged is not None:  # e.g. written while the disk filled up, or by another version: the ledger has the search, Tune starts anew
        store.set_aside("tune", "tune.damaged")
        warn(f"{damaged}; moved to tune.damaged/, the search continues from its ledger")
    elif resume and rebuild:
        store.set_aside("tune", "tune.before-retry")
    if resume and damaged is None and not rebuild and tune.Tuner.can_restore(str(experiment)):
        # Errored trials stay failed, as the ledger records them; trials still running when the driver
        # stopped resume from their checkpoints (trials.run_trial reports ledger-pruned ones at once).
        tuner = tune.Tuner.restore(str(experiment), trainable=trainable, resume_unfinished=True, resume_errored=False)
    else:
        scheduler = CellScheduler(plan, store) if plan.asha is not None else None
        view.scheduler = scheduler  # the live line quotes its rungs (a restored Tuner unpickles the two together)
        tuner = tune.Tuner(
            trainable,
            tune_config=tune.TuneConfig(
                search_alg=CellSearcher(plan, store, from_ledger=resume), scheduler=scheduler, num_samples=-1,
                max_concurrent_trials=limit, reuse_actors=True,
                metric=OBJECTIVE, mode=plan.mode,
            ),
            run_config=tune.RunConfig(
                name="tune", storage_path=str(store.storage), verbose=0, callbacks=[_tune_callback(view)], progress_reporter=_Silent(),
                failure_config=tune.FailureConfig(max_failures=2),
            ),
        )
    interrupts.phase = "fit"  # a signal from here on reaches Tune once it listens
    try:
        with TrialFailures(), warm_slots(_slots(plan, limit)), started_workers():  # Ray's tracebacks of failed trials are
            tuner.fit()  # kept for the ledger's sentence, not shown; each slot's trial process is kept across the stages' barriers,
            # and the first ones are the workers a local Ray started with it
    finally:
        for name in QUIET_WHEN_INTERRUPTED:
            logging.getLogger(name).removeFilter(quiet)
        for name in STATE_LOGS:
            logging.getLogger(name).removeFilter(state_failure)
