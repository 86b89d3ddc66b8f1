"""The live view of a running search: a status line (a terminal, a log) or a progress bar (a notebook) on Tune's events,
with the best model of each cell so far, its verdict and whether its answer is final; it also keeps the Optuna journal and
the trackers following the ledger."""

from __future__ import annotations

import time

from blockforge.search.config import SearchPlan
from blockforge.search.records.ledger import Ledger, LedgerFollower, StageName, TrialRecord
from blockforge.spec.search import lr_curve_of
from blockforge.train.events import Status


class ProgressView:
    """A compact live view: counts by status and the best trial per cell, on every completion (throttled)."""

    current: "ProgressView | None" = None  # the view of the search this process drives now

    def __init__(self, ledger: Ledger, plan: SearchPlan, every_s: float = 10.0, scheduler=None, tracking=None, mode: str = "lines"):
        """scheduler: the search's CellScheduler, whose rung tables the line quotes (Tune pickles both together);
        tracking: the search's trackers (search/reports/tracked.py), given what the trials added at each update; mode: "lines"
        prints a status line per update (a terminal, a log), "bar" keeps one progress bar (a notebook)."""
        self.path, self.plan, self.every_s, self.scheduler = ledger.path, plan, every_s, scheduler  # no stream held: Tune pickles callbacks
        self.mode, self.bar = mode, None
        self.planned: dict[str, int] | None = None  # each cell's worst case in trials, computed at the first update that needs it
        self.started = time.time()
        self.last = 0.0
        self.journal = None  # views.LiveJournal, opened at the first update
        self.ledger = LedgerFollower(self.path)  # follows what the searcher appends: each update reads only the new lines
        self.evidence: dict[str, tuple[int, object]] = {}  # cell -> (its finished trials when computed, its evidence)
        self.tracking = tracking

    def __getstate__(self) -> dict:
        return {**self.__dict__, "journal": None, "evidence": {}, "tracking": None, "bar": None}

    def line(self, tune_trials: list | None = None, records: list[TrialRecord] | None = None) -> str:
        records = self.ledger.records() if records is None else records
        counts = self.counts(records, tune_trials)
        elapsed = time.time() - self.started
        head = f"[{int(elapsed // 60):02d}:{int(elapsed % 60):02d}] " + " | ".join(f"{n} {s}" for s, n in counts.items())
        return head + self._best(records)

    def counts(self, records: list[TrialRecord], tune_trials: list | None = None) -> dict[str, int]:
        """Trials by status (queued and running as Tune knows them, when it is asked), replicates and learning-rate probes."""
        shown = (Status.RUNNING, Status.COMPLETED, Status.PRUNED, Status.DIVERGED, Status.FAILED, Status.DUPLICATE,
                 *((Status.INFEASIBLE,) if self.plan.constraints else ()))
        counts = {str(s): sum(r.status == s for r in records) for s in shown}
        counts["replicates"] = sum(r.stage == StageName.CONFIRM and r.status in (Status.COMPLETED, Status.DIVERGED) for r in records)
        if lr_curve_of(self.plan.confirm) is not None:
            counts["lr probes"] = sum(r.stage == StageName.LR and r.status in (Status.COMPLETED, Status.DIVERGED) for r in records)
        if tune_trials is not None:  # Tune knows which started trials wait for resources
            counts["running"] = sum(t.status == "RUNNING" for t in tune_trials)
            counts = {"queued": sum(t.status == "PENDING" for t in tune_trials), **counts}
        return counts

    def _best(self, records: list[TrialRecord]) -> str:
        """The best model of each cell so far, its verdict, its first rung's agreement and whether the answer is final."""
        from blockforge.search.evidence.evidence import describe
        from blockforge.search.reports.progress import quick_progress

        parts = []
        for cell, e in self._evidence(records).items():
            if e.winner is not None:
                against = f"; vs Pre-LN {e.vs_reference.text()}: {e.verdict}" if e.against_pre_ln and e.vs_reference and e.verdict != "Pre-LN" else ""
                rung = self._rung_line(cell, records)
                said = quick_progress(self.plan, records, cell, e, self._planned().get(cell, 0))
                status = f" ({said.text()})" if not said.final else ""
                parts.append(f"{cell}: {describe(e.winner)}, {self.plan.metric} {e.winner.spread()}{against}" + (f"; {rung}" if rung else "") + status)
        return "\n  best  " + "\n        ".join(parts) if parts else ""

    def _planned(self) -> dict[str, int]:
        """Each cell's worst case in trials (the compute plan's), computed once."""
        if self.planned is None:
            from blockforge.search.reports.plan import search_plan

            self.planned = {c.cell: c.total_trials for c in search_plan(self.plan)}
        return self.planned

    def _rung_line(self, name: str, records: list[TrialRecord]) -> str:
        """'rung 50: tau +0.33, 2 of 12 pairs cross (up to 0.021), 1 promoted': the cell's first rung against its
        full-budget curves, from the rung table the scheduler keeps."""
        tables = getattr(self.scheduler, "tables", None)
        table = tables.get(name) if tables else None
        if table is None or not table.rungs:
            return ""
        tau, pairs, crossed, largest = table.agreement(table.rungs[0])
        if tau is None:
            return ""
        text = f"rung {table.rungs[0]}: tau {tau:+.2f}, " + (f"{crossed} of {pairs} pairs cross (up to {largest:.3g})" if crossed
                                                             else f"no pair of {pairs} crosses")
        promoted = {r.model for r in records if r.cell == name and r.promoted}
        return text + (f", {len(promoted)} promoted" if promoted else "")

    def _evidence(self, records: list[TrialRecord]) -> dict:
        """Each cell's evidence, recomputed only for the cells with a trial finished since the last update."""
        from blockforge.search.evidence.evidence import cell_evidence, min_seeds

        finished = dict.fromkeys(self.plan.cell_names(), 0)
        for r in records:
            if r.cell in finished and r.status in (Status.COMPLETED, Status.DIVERGED):
                finished[r.cell] += 1
        for name, count in finished.items():
            if self.evidence.get(name, (None,))[0] != count:
                self.evidence[name] = (count, cell_evidence(records, name, mode=self.plan.mode, penalty=self.plan.penalty,
                                                            min_seeds=min_seeds(self.plan), against_pre_ln=self.plan.against_pre_ln))
        return {name: evidence for name, (_, evidence) in self.evidence.items()}

    def update(self, force: bool = False, tune_trials: list | None = None, journal: bool = True) -> None:
        now = time.time()
        if force or now - self.last >= self.every_s:
            self.last = now
            records = self.ledger.records()
            self._show(records, tune_trials)
            if journal:
                from blockforge.search.reports.views import LiveJournal

                if self.journal is None:
                    self.journal = LiveJournal(self.path.parent, self.plan)
                self.journal.update(self.ledger)  # optuna-dashboard follows the search: new trials appended
            if self.tracking is not None:
                self.tracking.update(records)  # W&B, MLflow: the curves trained since the last update

    def _show(self, records: list[TrialRecord], tune_trials: list | None) -> None:
        """A status line, or (mode "bar") the progress bar moved: trials done against the plan's worst case, counts beside it."""
        if self.mode != "bar":
            print(self.line(tune_trials, records), flush=True)
            return
        if self.bar is None:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=sum(self._planned().values()), unit="trial", desc=f"search {self.plan.name}", dynamic_ncols=True)
        counts = self.counts(records, tune_trials)
        self.bar.n = sum(r.status not in (Status.RUNNING, Status.INTERRUPTED) for r in records)
        self.bar.set_postfix_str(", ".join(f"{n} {s}" for s, n in counts.items() if n), refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        """The search's end: the bar, if one shows, stays as it is."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
