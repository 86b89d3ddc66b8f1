"""A search in the experiment trackers its `tracking:` names (blockforge/tracking.py).

The driver logs every trained run folder as one tracker run (W&B: grouped by search, job type the cell; MLflow: a
child of the search's run), from the run's metrics.jsonl, as the search goes; the trials log nothing themselves, so a
tracker costs a trial nothing and needs its credentials on the driver's machine only. A run's config holds the cell,
the searched values, k, seed, stage and the trial's identity; its summary, the trial's outcome. At the end the answer of
each cell goes in as a table (W&B: a run of the group; MLflow: the search's run).
"""

from __future__ import annotations

from pathlib import Path

from blockforge.search.config import SearchPlan
from blockforge.search.records.ledger import TrialRecord
from blockforge.search.records.runs import metric_lines
from blockforge.search.reports.views import searched_label
from blockforge.tracking import STATE_FILE, Trackers
from blockforge.train.events import Status

ANSWER_COLUMNS = ["cell", "winner", "post_ln_layers", "mean", "sd", "n", "vs_pre_ln", "low", "high", "verdict", "tied_with", "claim"]
# with a learning-rate curve: the winner's best lr, its verdict there against Pre-LN at its own, its edge and its ratio to Pre-LN's,
# its LR sensitivity minus Pre-LN's, and the cell's answer
CURVE_COLUMNS = ["best_lr", "verdict_at_best", "edge", "edge_vs_pre_ln", "edge_verdict", "lr_sensitivity_vs_pre_ln", "curve_answer"]


def search_group(plan: SearchPlan, location: str) -> str:
    """A search's name in the trackers (W&B group, MLflow experiment and parent run): its file's name and its folder's, and
    a short hash of where it is kept, so two searches of one file kept apart are apart there too ('quickstart:search-
    quickstart-3fa2c1'); the whole location is in the search run's config."""
    import hashlib

    tail = location.rstrip("/").rsplit("/", 1)[-1] or location
    return f"{plan.name}:{tail}-{hashlib.sha256(location.encode()).hexdigest()[:6]}"


def trial_config(plan: SearchPlan, record: TrialRecord) -> dict:
    """What a tracker run's config (params) holds: the search, the cell and its keys, the searched values, k, seed,
    stage and the trial's identity."""
    return {"search": plan.name, "cell": record.cell, **plan.cell(record.cell), **record.overrides, "post_ln_layers": record.post_ln_layers,
            "alpha": record.alpha, "seed": record.seed, "trial": record.trial, "stage": record.stage, "model": record.model,
            "identity": record.identity}


class SearchTracking:
    def __init__(self, plan: SearchPlan, store):
        self.plan, self.store = plan, store
        self.group = search_group(plan, str(store))
        self.trackers = Trackers(plan.tracking, name=plan.name, state_dir=store.local, what="the search", group=self.group,
                                 on_save=lambda path: store.put(STATE_FILE), about={"location": str(store), "file": plan.file})

    @classmethod
    def open(cls, plan: SearchPlan, store) -> "SearchTracking | None":
        """The search's trackers, if its tracking: names any besides tensorboard (whose view the search always writes)."""
        if not [t for t in plan.tracking.report_to if t != "tensorboard"]:
            return None
        return cls(plan, store)

    def update(self, records: list[TrialRecord]) -> None:
        """Log what every run folder has added since the last update; finish the tracker runs of runs that ended."""
        if not self.trackers:
            return
        runs: dict[str, list[TrialRecord]] = {}
        for record in records:
            if record.run_dir and record.status != Status.DUPLICATE:
                runs.setdefault(record.run_dir, []).append(record)
        state = self.trackers.state["runs"]
        for run_dir, mine in runs.items():
            first, latest = mine[0], max(mine, key=lambda r: r.seq)
            key = Path(run_dir).relative_to(self.store.local).as_posix() if Path(run_dir).is_relative_to(self.store.local) else run_dir
            if state.get(key, {}).get("ended") == latest.seq:
                continue  # nothing happened to it since its tracker runs were finished
            if self.store.remote:  # the curve as the trial last put it up
                from blockforge.storage import Mirror

                Mirror(self.store.storage, key, Path(run_dir)).pull(lambda name: name == "metrics.jsonl", remove=False)
            ended = None if latest.status == Status.RUNNING else {"status": str(latest.status), "value": latest.value,
                                                                  "steps": latest.steps, "trial": latest.trial, "stage": latest.stage}
            label = searched_label(self.plan, first)
            self.trackers.log(key, metric_lines(run_dir), name=f"{first.cell} trial {first.trial}{' ' + label if label else ''} seed {first.seed}", kind=first.cell,
                              config=trial_config(self.plan, first), ended=ended,
                              failed=latest.status in (Status.FAILED, Status.INTERRUPTED), whole=True)
            if ended is not None:
                state.setdefault(key, {})["ended"] = latest.seq
        self.trackers.save()

    def finish(self, records: list[TrialRecord], found, stopped: bool = False) -> None:
        """The last update, the answers per cell as a table, then every tracker run closed."""
        from blockforge.search.evidence.evidence import describe
        from blockforge.search.reports.findings import CellAnswer

        self.update(records)
        if not self.trackers:
            return
        curved = bool(found.curves)
        rows = []
        for a in (CellAnswer.of(found, cell) for cell in self.plan.all_names()):
            w, vs = a.winner, a.vs_pre_ln
            rows.append([a.name, describe(w) if w else None, w.post_ln_layers if w else None, w.mean if w else None, w.sd if w else None,
                         w.n if w else 0, vs.mean if vs else None, vs.low if vs else None, vs.high if vs else None, a.verdict,
                         "; ".join(describe(c) for c in a.tied), a.claim, *(_curve_cells(a) if curved else [])])
        law = found.law_verdict if self.plan.varies_alpha and found.law else ""
        summary = {"trials": len(records), **({"alpha_law": law} if law else {}), **({"stopped": True} if stopped else {})}
        self.trackers.answers("answers", f"{self.group} answers", ANSWER_COLUMNS + (CURVE_COLUMNS if curved else []), rows, summary)
        self.trackers.close(finished=not stopped)


def _curve_cells(answer) -> list:
    """CURVE_COLUMNS of a cell: the winner's, as the curves say them (summary.md and the notebook view say the same)."""
    curves = answer.curves
    mine = curves.of(answer.winner.model) if curves is not None and answer.winner is not None else None
    if mine is None:
        return [None] * (len(CURVE_COLUMNS) - 1) + [curves.answer if curves is not None else None]
    ratio, sens = mine.edge_vs_pre, mine.sensitivity_vs_pre
    return [mine.best, curves.best_verdict, mine.edge, ratio.mean if ratio else None, mine.edge_verdict, sens.mean if sens else None,
            curves.answer]
