"""Experiment trackers: a run's curves, or every trial of a search, in Weights & Biases and MLflow.

`Trackers` logs the lines of metrics.jsonl (each numeric value as EVENT/KEY, e.g. eval/val_loss, against the line's step)
to one tracker run per training run, started when the run has something to log and finished, with its outcome as the
summary, when it ends; a run continued later (a resumed run, a pruned trial promoted) continues the same tracker run.
What went where (each tracker run's id, the last step logged per event) is kept in tracking.json beside the records, so
nothing is logged twice across resumes and a resumed search continues its tracker runs.

Trackers never stop the work they watch. A tracker whose package is missing or fails as it imports, whose credentials
are absent, or that raises (offline, a server gone) is one warning, once, naming it and the cause; the work goes on
without it. Credentials come only from each tool's own environment (WANDB_API_KEY, WANDB_MODE, MLFLOW_TRACKING_URI, ...).
Both trackers are driven through their own client APIs, with no process-global state: a search's driver holds many runs
at once.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from blockforge.errors import warn
from blockforge.io import atomic_write_text

STATE_FILE = "tracking.json"
EXTRA = {"wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow")}  # tracker -> (its module, blockforge's extra)
PARENT = "(search)"  # the key of a search's own MLflow run
STEP = "step"  # W&B's x-axis for every logged metric (its own _step counts log calls)
KIND_TAG = "mlflow.experimentKind"  # MLflow 3: what the UI shows of an experiment first
LOGGED_ARTIFACTS = "mlflow.loggedArtifacts"  # MLflow: the run's artifacts its UI shows as tables
ANSWERS = "(answers)"  # the key of a search's answers run (W&B)


@contextlib.contextmanager
def broken_packages_absent(modules: tuple[str, ...] = tuple(module for module, _ in EXTRA.values()),
                           unused: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Inside the block, each of `modules` (the trackers' packages) that fails as it imports (a broken install, which raises
    whatever it raises) is absent: `import` raises ImportError, which Ray Tune takes for "not installed" where it imports
    W&B and MLflow for its own integrations, whatever a search asks for. So a broken install of a tracker a search does not
    use stops nothing, and one it asks for is left out with the warning `Trackers` gave. Yields the modules made absent
    for a broken install (the trials make them absent too: `absent`). Each of `unused` (the trackers a search does not
    ask for) is absent in the block without being imported: Ray Tune's import of them (seconds) would serve nothing."""
    hidden = [module for module in unused if module not in sys.modules]
    broken = []
    for module in modules:
        if module in sys.modules or module in hidden:
            continue  # imported already (or absent already), or not used
        try:
            importlib.import_module(module)
        except ImportError as err:
            if err.name != module:  # installed, but something it imports is not: absent too
                broken.append(module)
        except Exception:  # noqa: BLE001 (whatever a broken package raises as it imports)
            broken.append(module)
    hidden += broken
    absent(hidden)
    try:
        yield tuple(broken)
    finally:
        for module in hidden:
            if module in sys.modules and sys.modules[module] is None:
                del sys.modules[module]  # as it was: the next import tries the package again


def absent(modules) -> None:
    """Make each of `modules` not imported yet absent from this process (`import` raises ImportError)."""
    for module in modules:
        sys.modules.setdefault(module, None)


def metric_rows(lines: list[dict]) -> list[tuple[str, int, dict[str, float]]]:
    """(event, step, {EVENT/KEY: value}) of each metrics.jsonl line that has numbers."""
    rows = []
    for line in lines:
        event = str(line.get("event", "train"))
        values = {f"{event}/{key}": float(value) for key, value in line.items()
                  if key not in ("step", "event") and isinstance(value, (int, float)) and not isinstance(value, bool)}
        if values and isinstance(line.get("step"), int):
            rows.append((event, line["step"], values))
    return rows


def flat(data: dict, prefix: str = "") -> dict:
    """Nested plain data as dotted keys (model.width, train.lr), lists kept whole: what a tracker's config holds."""
    out = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flat(value, f"{name}."))
        elif value is not None and value != {}:
            out[name] = value
    return out


def _run_id() -> str:
    """A new W&B run id: eight lowercase letters and digits, as W&B makes them."""
    import secrets
    import string

    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


class _WandB:
    """W&B runs through wandb.init(reinit="create_new"): several open at once in one process, console and system metrics
    left out (the process is a driver, not the trial)."""

    name = "wandb"

    def __init__(self, project: str, entity: str | None, group: str | None):
        import wandb

        self.wandb, self.project, self.entity, self.group = wandb, project, entity, group
        mode = os.environ.get("WANDB_MODE", "online")
        if mode not in ("offline", "disabled", "dryrun") and not wandb.login(prompt=False, verify=False):
            raise RuntimeError("no W&B credentials: set WANDB_API_KEY (or run `wandb login`), or WANDB_MODE=offline")
        # read now, not once per process by wandb's own set-up: a notebook's second search may be logged elsewhere
        self.where = {"mode": os.environ.get("WANDB_MODE"), "dir": os.environ.get("WANDB_DIR")}
        self.runs: dict[str, Any] = {}

    def _init(self, **kwargs) -> Any:
        wandb = self.wandb
        return wandb.init(project=self.project, entity=self.entity, group=self.group, reinit="create_new", **self.where,
                          settings=wandb.Settings(console="off", x_disable_stats=True, silent=True), **kwargs)

    def start(self, key: str, run_id: str | None, name: str, kind: str, config: dict, parent: str | None) -> str:
        run = self._init(job_type=kind, name=name, config=config, id=run_id or _run_id(), resume="allow")
        run.define_metric(STEP)
        run.define_metric("*", step_metric=STEP)
        self.runs[key] = run
        return run.id

    def log(self, key: str, rows: list[tuple[str, int, dict[str, float]]]) -> None:
        run = self.runs[key]
        for _, step, values in rows:
            run.log({**values, STEP: step})

    def finish(self, key: str, summary: dict, failed: bool) -> None:
        run = self.runs.pop(key)
        run.summary.update(summary)
        run.finish(exit_code=1 if failed else 0)

    def table(self, name: str, title: str, columns: list[str], rows: list[list], summary: dict, parent: str | None = None,
              run_id: str | None = None) -> str:
        """The table in the search's answers run (one per search, continued on each report: its table is the newest)."""
        run = self._init(job_type="answers", name=title, id=run_id or _run_id(), resume="allow")
        run.log({name: self.wandb.Table(columns=columns, data=rows)})
        run.summary.update(summary)
        run.finish()
        return run.id

    def close(self) -> None:
        for key in list(self.runs):
            self.runs.pop(key).finish()


class _MLflow:
    """MLflow runs through MlflowClient (no active-run state): a parent run for a search, a child run per trial."""

    name = "mlflow"

    def __init__(self, experiment: str):
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient()  # MLFLOW_TRACKING_URI (and its credentials) from the environment
        found = self.client.get_experiment_by_name(experiment)
        self.experiment = found.experiment_id if found is not None else self.client.create_experiment(experiment)
        if found is None or KIND_TAG not in found.tags:  # MLflow 3's UI then opens it on its runs ("Model training"), not GenAI
            self.client.set_experiment_tag(self.experiment, KIND_TAG, "custom_model_development")
        self.runs: dict[str, str] = {}

    def start(self, key: str, run_id: str | None, name: str, kind: str, config: dict, parent: str | None) -> str:
        from mlflow.entities import Param

        if run_id is not None:
            self.client.update_run(run_id, status="RUNNING")
        else:
            tags = {"blockforge.kind": kind, **({"mlflow.parentRunId": parent} if parent else {})}
            run_id = self.client.create_run(self.experiment, run_name=name, tags=tags).info.run_id
            params = [Param(str(k)[:250], json.dumps(v) if not isinstance(v, str) else v) for k, v in config.items()]
            for i in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
                self.client.log_batch(run_id, params=params[i:i + 100])
        self.runs[key] = run_id
        return run_id

    def log(self, key: str, rows: list[tuple[str, int, dict[str, float]]]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(name, value, now, step) for _, step, values in rows for name, value in values.items()]
        for i in range(0, len(metrics), 1000):  # MLflow takes at most 1000 metrics a batch
            self.client.log_batch(self.runs[key], metrics=metrics[i:i + 1000])

    def finish(self, key: str, summary: dict, failed: bool) -> None:
        run_id = self.runs.pop(key)
        for name, value in summary.items():
            self.client.set_tag(run_id, f"blockforge.{name}", str(value))
        self.client.set_terminated(run_id, status="FAILED" if failed else "FINISHED")

    def table(self, name: str, title: str, columns: list[str], rows: list[list], summary: dict, parent: str | None = None,
              run_id: str | None = None) -> None:
        """The table as `name`.json on the search's run, replaced whole each time (log_table would append the rows to the
        last report's), in log_table's layout and with its tag, so MLflow's UI shows it as a table."""
        if parent is None:
            return
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / f"{name}.json"
            path.write_text(json.dumps({"columns": columns, "data": rows}, default=str))
            self.client.log_artifact(parent, str(path))
        logged = json.loads(self.client.get_run(parent).data.tags.get(LOGGED_ARTIFACTS, "[]"))
        if {"path": f"{name}.json", "type": "table"} not in logged:
            self.client.set_tag(parent, LOGGED_ARTIFACTS, json.dumps([*logged, {"path": f"{name}.json", "type": "table"}]))
        for key, value in summary.items():
            self.client.set_tag(parent, f"blockforge.{key}", str(value)[:5000])

    def close(self) -> None:
        for key in list(self.runs):
            self.client.set_terminated(self.runs.pop(key), status="KILLED")


class Trackers:
    """The trackers of one run or one search, named by `tracking` (spec/tracking.py); tensorboard is left to the callers
    (a run writes its own event files, a search its tensorboard/ folder). `state_dir` keeps tracking.json; `what` names
    the work in warnings ("the search"); `group` groups a search's runs (W&B group, MLflow parent run)."""

    def __init__(self, tracking, *, name: str, state_dir: Path, what: str, group: str | None = None,
                 on_save: Callable[[Path], None] | None = None, about: dict | None = None):
        """`about`: what the search's own run records of it (where it is kept)."""
        self.what, self.group, self.on_save, self.about = what, group, on_save, dict(about or {})
        self.path = Path(state_dir) / STATE_FILE
        self.state = self._read()
        self.backends: dict[str, Any] = {}
        project = tracking.project or name
        experiment = tracking.project or group or name  # MLflow: a search's own experiment, unless a project is named
        for tracker in tracking.report_to:
            if tracker == "tensorboard" or not self._imports(tracker):
                continue
            backend = self._guarded(tracker, "starting", lambda t=tracker: _WandB(project, tracking.entity, group) if t == "wandb"
                                    else _MLflow(experiment))
            if backend is not None:
                self.backends[tracker] = backend
        if group is not None and "mlflow" in self.backends:  # the search's parent run, continued on resume
            parent = self.state.get("parent")
            mlflow = self.backends["mlflow"]
            self.state["parent"] = self._guarded("mlflow", "starting the search's run", lambda: mlflow.start(
                PARENT, parent, group, "search", {"search": group, **self.about}, None)) or parent
            mlflow.runs.pop(PARENT, None)  # closed by close(), not with the trials'

    def __bool__(self) -> bool:
        return bool(self.backends)

    def _read(self) -> dict:
        try:
            state = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {"runs": {}}
        return state if isinstance(state, dict) and isinstance(state.get("runs"), dict) else {"runs": {}}

    def _imports(self, tracker: str) -> bool:
        """Whether the tracker's package imports. Its package missing, or failing as it imports (a dependency of another
        version: protobuf's raises TypeError), is one warning, and the work goes on without it."""
        module, extra = EXTRA[tracker]
        try:
            __import__(module)
        except ImportError as err:
            if err.name == module:
                warn(f"tracking: {tracker} needs its package: pip install 'blockforge[{extra}]'; {self.what} goes on without it")
            else:  # installed, but something it imports is not
                self._failed(tracker, "importing its package", err)
            return False
        except Exception as err:  # noqa: BLE001 (whatever a package raises as it imports: the work goes on)
            self._failed(tracker, "importing its package", err)
            return False
        return True

    def _guarded(self, tracker: str, doing: str, call: Callable[[], Any]) -> Any:
        """call(); a failure leaves `tracker` out from now on, said once."""
        try:
            return call()
        except Exception as err:  # any tracker error: the work goes on (its cause is in the sentence)
            return self._failed(tracker, doing, err)

    def _failed(self, tracker: str, doing: str, err: Exception) -> None:
        """`tracker` left out from now on, with one warning giving the first line of its error."""
        cause = (str(err).strip().splitlines() or [""])[0][:300]
        warn(f"tracking: {tracker} failed {doing} ({type(err).__name__}: {cause}); {self.what} goes on without it")
        self.backends.pop(tracker, None)
        return None

    def log(self, key: str, lines: list[dict], *, name: str, kind: str, config: dict, ended: dict | None = None,
            failed: bool = False, start: bool = False, whole: bool = False) -> None:
        """Log the lines of run `key` not logged before (per tracker and event, by step), starting its tracker runs as
        needed (`start`: now, with nothing to log yet); `ended`: the run has ended (its summary), so its tracker runs are
        finished until it has more to log. `whole`: `lines` is the run's whole log, so a run started again from its first
        step is seen, and logged as a new attempt."""
        entry = self._attempt(key, lines) if whole else self.state["runs"].setdefault(key, {"ids": {}, "logged": {}})
        name = name if entry.get("attempt", 1) == 1 else f"{name} (attempt {entry['attempt']})"
        rows = metric_rows(lines)
        for tracker, backend in list(self.backends.items()):
            logged = entry["logged"].setdefault(tracker, {})
            new = [row for row in rows if row[1] > logged.get(row[0], -1)]
            is_open = key in backend.runs
            if (new or start) and not is_open:
                started = self._guarded(tracker, f"starting the run of {name}", lambda: backend.start(
                    key, entry["ids"].get(tracker), name, kind, config, self.state.get("parent")))
                if started is None:
                    continue
                entry["ids"][tracker], is_open = started, True
            if new and self._guarded(tracker, f"logging {name}", lambda: backend.log(key, new) or True):
                for event, step, _ in new:
                    logged[event] = max(step, logged.get(event, -1))
            if ended is not None and is_open and tracker in self.backends:
                self._guarded(tracker, f"finishing the run of {name}", lambda: backend.finish(key, ended, failed))

    def _attempt(self, key: str, lines: list[dict]) -> dict:
        """Run `key`'s entry in the state. A run that started again from its first step (its log's first line is not the one
        logged before: a trial trained anew, its checkpoints lost) is a new attempt: its tracker runs are new ones, so no
        value of the first attempt stands beside the second's."""
        entry = self.state["runs"].setdefault(key, {"ids": {}, "logged": {}})
        first = json.dumps(lines[0], sort_keys=True) if lines else None
        if first is not None and entry.get("first") not in (None, first):
            for tracker, backend in list(self.backends.items()):
                if key in backend.runs:
                    self._guarded(tracker, "finishing an earlier attempt", lambda: backend.finish(key, {"status": "restarted"}, True))
            entry = self.state["runs"][key] = {"ids": {}, "logged": {}, "attempt": entry.get("attempt", 1) + 1}
        if first is not None:
            entry["first"] = first
        return entry

    def answers(self, name: str, title: str, columns: list[str], rows: list[list], summary: dict) -> None:
        """A table of answers (a search's, per cell) with a summary, in each tracker: replacing the last one (W&B: in the
        same run, continued; MLflow: the same artifact on the search's run)."""
        for tracker, backend in list(self.backends.items()):
            answered = self._guarded(tracker, "logging the answers", lambda: backend.table(
                name, title, columns, rows, summary, parent=self.state.get("parent"), run_id=self.state.get("answers")))
            self.state["answers"] = answered or self.state.get("answers")  # W&B's answers run, continued next time

    def save(self) -> None:
        """Keep what was logged where (tracking.json), for a resume."""
        if self.backends or self.path.exists():
            atomic_write_text(self.path, json.dumps(self.state, separators=(",", ":")))
            if self.on_save is not None:
                self.on_save(self.path)

    def close(self, finished: bool = True) -> None:
        """Finish every tracker run still open (the work stopped), the search's parent run too."""
        parent = self.state.get("parent")
        for tracker, backend in list(self.backends.items()):
            self._guarded(tracker, "closing", backend.close)
            if tracker == "mlflow" and parent and tracker in self.backends:
                self._guarded(tracker, "closing", lambda: backend.client.set_terminated(parent, status="FINISHED" if finished else "KILLED"))
        self.save()
