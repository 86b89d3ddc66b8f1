"""`blockforge search`: run a search file on Ray Tune (a local Ray, or a cluster by address) and report.

The search folder holds search.json (which plan it runs), tune/ (Ray Tune's experiment state, for
--resume), trials/ (one run folder per trial), trials.jsonl (the ledger) and, at the end,
results.csv, best/, summary.md, the plots and the fitted alpha law.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from blockforge.errors import BlockforgeError
from blockforge.io import atomic_write_json, writable_folder
from blockforge.search.config import SearchPlan, load_search
from blockforge.search.ledger import Ledger, TrialRecord
from blockforge.train.events import Status

OBJECT_STORE_BYTES = 256 * 2**20  # trials pass no large objects; the default (30% of RAM) only wastes memory


def ensure_ray(address: str | None, plan: SearchPlan) -> bool:
    """Connect to Ray: join `address`, reuse a running local Ray, or start one on loopback. True if started here."""
    if address is None:
        # Before `import ray`: keep a local Ray on 127.0.0.1 and without token auth.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "5")  # snapshot state often: a killed driver loses less
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    import ray

    if ray.is_initialized():
        return False
    quiet = dict(include_dashboard=False, log_to_driver=False, logging_level="warning", configure_logging=True)
    if address is not None:
        try:
            ray.init(address=address, **quiet)
        except (ConnectionError, RuntimeError, ValueError) as err:
            raise BlockforgeError(f"--address {address}: cannot join the Ray cluster ({str(err).splitlines()[0]}); start it with `ray start --head` or check the address") from None
        return True
    ray.init(num_cpus=os.cpu_count(), object_store_memory=OBJECT_STORE_BYTES, _node_ip_address="127.0.0.1", **quiet)
    return True


class ProgressView:
    """A compact live view: counts by status and the best trial per cell, on every completion (throttled)."""

    def __init__(self, ledger: Ledger, plan: SearchPlan, every_s: float = 10.0):
        self.ledger, self.plan, self.every_s = ledger, plan, every_s  # no stream held: Tune pickles callbacks
        self.started = time.time()
        self.last = 0.0

    def line(self, tune_trials: list | None = None) -> str:
        records = self.ledger.records()
        shown = (Status.RUNNING, Status.COMPLETED, Status.PRUNED, Status.DIVERGED, Status.FAILED, Status.DUPLICATE)
        counts = {str(s): sum(r.status == s for r in records) for s in shown}
        counts["replicates"] = sum(r.stage == "confirm" and r.status in (Status.COMPLETED, Status.DIVERGED) for r in records)
        if tune_trials is not None:  # Tune knows which started trials wait for resources
            counts["running"] = sum(t.status == "RUNNING" for t in tune_trials)
            counts = {"queued": sum(t.status == "PENDING" for t in tune_trials), **counts}
        elapsed = time.time() - self.started
        head = f"[{int(elapsed // 60):02d}:{int(elapsed % 60):02d}] " + " | ".join(f"{n} {s}" for s, n in counts.items())
        from blockforge.search.evidence import describe
        from blockforge.search.report import evidence_by_cell

        parts = []
        for cell, e in evidence_by_cell(self.plan, records).items():
            if e.winner is not None:
                against = f"; vs Pre-LN {e.vs_reference.text()}: {e.verdict}" if e.vs_reference and e.verdict != "Pre-LN" else ""
                parts.append(f"{cell}: {describe(e.winner)}, {self.plan.metric} {e.winner.spread()}{against}")
        return head + ("\n  best  " + "\n        ".join(parts) if parts else "")

    def update(self, force: bool = False, tune_trials: list | None = None) -> None:
        now = time.time()
        if force or now - self.last >= self.every_s:
            self.last = now
            print(self.line(tune_trials), flush=True)


def _tune_callback(view: ProgressView):
    from ray.tune import Callback

    class Live(Callback):
        def on_trial_complete(self, iteration, trials, trial, **info):
            view.update(tune_trials=trials)

        def on_trial_error(self, iteration, trials, trial, **info):
            view.update(tune_trials=trials)

        def on_trial_result(self, iteration, trials, trial, result, **info):
            view.update(tune_trials=trials)

    return Live()


@dataclass
class SearchOutcome:
    search_dir: Path
    records: list[TrialRecord]
    summary: str


def _trainable(plan: SearchPlan, search_dir: Path):
    from ray import tune

    from blockforge.search.trials import run_trial

    resources = {"cpu": plan.resources.cpu, "gpu": plan.resources.gpu}
    return tune.with_resources(tune.with_parameters(run_trial, plan=plan, search_dir=str(search_dir)), resources)


def run_search(
    path: str | os.PathLike, *, out: str | os.PathLike | None = None, address: str | None = None, resume: bool = False,
    max_concurrent: int | None = None, overrides: list[tuple] | None = None, progress_every_s: float = 10.0,
) -> SearchOutcome:
    """Run (or resume) the search in `path`; returns the records and the printed summary."""
    plan = load_search(path, overrides)
    search_dir = Path(out) if out else Path("runs") / f"search-{plan.name}"
    search_dir = search_dir.resolve()
    marker = search_dir / "search.json"
    if marker.exists() and not resume:
        raise BlockforgeError(f"{search_dir}: already holds a search; pass --resume to continue it, or choose another --out")
    if resume and not marker.exists():
        raise BlockforgeError(f"{search_dir}: holds no search to resume; run without --resume (or give --out of the search)")
    if resume and json.loads(marker.read_text())["fingerprint"] != plan.fingerprint():
        raise BlockforgeError(f"{path}: the search file changed since {search_dir} was started; resume with the same file, or choose another --out")
    writable_folder(search_dir, "the search")
    atomic_write_json(marker, {"file": str(Path(path).resolve()), "fingerprint": plan.fingerprint(), "name": plan.name})

    started_here = ensure_ray(address, plan)
    import logging

    # Ray's Optuna wrapper logs every exhausted grid as a warning; the ledger says it better.
    logging.getLogger("ray.tune.search.optuna.optuna_search").setLevel(logging.ERROR)
    from ray import tune

    from blockforge.search.config import OBJECTIVE
    from blockforge.search.searcher import CellScheduler, CellSearcher

    from blockforge.search.evidence import t_quantile

    t_quantile(2)  # load scipy.stats now, not inside Tune's first result callback
    ledger = Ledger(search_dir / "trials.jsonl")
    view = ProgressView(ledger, plan, every_s=progress_every_s)
    trainable = _trainable(plan, search_dir)
    experiment = search_dir / "tune"
    try:
        if resume and tune.Tuner.can_restore(str(experiment)):
            tuner = tune.Tuner.restore(str(experiment), trainable=trainable, resume_unfinished=True, resume_errored=True)
        else:
            scheduler = CellScheduler(plan) if plan.asha is not None else None
            tuner = tune.Tuner(
                trainable,
                tune_config=tune.TuneConfig(
                    search_alg=CellSearcher(plan, str(search_dir)), scheduler=scheduler, num_samples=-1,
                    max_concurrent_trials=max_concurrent or plan.max_concurrent, reuse_actors=True,
                    metric=OBJECTIVE, mode=plan.mode,
                ),
                run_config=tune.RunConfig(
                    name="tune", storage_path=str(search_dir), verbose=0, callbacks=[_tune_callback(view)],
                    failure_config=tune.FailureConfig(max_failures=2),
                ),
            )
        tuner.fit()
    finally:
        if started_here:
            import ray

            ray.shutdown()
    view.update(force=True)
    from blockforge.search.report import write_reports

    summary = write_reports(search_dir, plan, ledger)
    return SearchOutcome(search_dir, ledger.records(), summary)
