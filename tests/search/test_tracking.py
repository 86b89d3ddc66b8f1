"""Searches and runs in W&B (offline) and MLflow (a local file store), read back with each library's own reader: every
run's curve equals its metrics.jsonl, its params hold the searched values; a tracker that is missing, has no credentials
or raises mid-search is one sentence and the search goes on; a search that asks for no tracker is untouched."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import blockforge
from blockforge.search.records.ledger import Ledger
from blockforge.search.records.runs import metric_lines
from blockforge.search.reports.findings import Findings
from blockforge.search.reports.tracked import ANSWER_COLUMNS, SearchTracking
from blockforge.spec.tracking import Tracking
from blockforge.tracking import STATE_FILE, metric_rows

from .conftest import write_search
from .test_api import ALPHA, quickstart

pytest.importorskip("wandb")
pytest.importorskip("mlflow")


@pytest.fixture
def trackers(tmp_path, monkeypatch):
    """W&B offline and MLflow in a file store, both under tmp_path; no credentials anywhere."""
    for name in ("WANDB_API_KEY", "WANDB_ENTITY", "WANDB_PROJECT", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file://{tmp_path}/mlruns")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return tmp_path


def wandb_runs(root: Path) -> dict[str, dict]:
    """Every offline W&B run under root/wandb, read with wandb's own reader of its transaction log: run id -> its
    name, group, job type, config, history rows and summary."""
    reader = Path(sys.executable).with_name("wandb")
    runs: dict[str, dict] = {}
    for folder in sorted((root / "wandb").glob("offline-run-*")):
        out = subprocess.run([str(reader), "leet", "inspect", "--json", str(folder)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        run = None
        for line in out.stdout.splitlines():
            record = json.loads(line)
            if record["type"] == "run":
                r = record["run"]
                run = runs.setdefault(r["run_id"], {"history": [], "summary": {}, "config": {}})
                config = {k: v for k, v in r.get("config", {}).get("update", {}).items() if k != "_wandb"}
                run.update(name=r.get("display_name"), group=r.get("run_group"), job_type=r.get("job_type"))
                run["config"].update(config)
            elif record["type"] == "history":
                run["history"].append(record["history"]["item"])
            elif record["type"] == "summary":
                run["summary"].update(record["summary"].get("update", {}))
    return runs


def curve_of(lines: list[dict]) -> list[tuple[int, str, float]]:
    """A run's curve as metrics.jsonl has it: (step, EVENT/KEY, value) of every number, sorted."""
    return sorted((step, name, value) for _, step, values in metric_rows(lines) for name, value in values.items())


def wandb_curve(run: dict) -> list[tuple[int, str, float]]:
    return sorted((int(row["step"]), k, float(v)) for row in run["history"] for k, v in row.items() if not k.startswith("_") and k != "step")


def mlflow_runs(experiment: str) -> tuple[object, list]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    found = client.get_experiment_by_name(experiment)
    return client, client.search_runs([found.experiment_id]) if found else []


def mlflow_curve(client, run) -> list[tuple[int, str, float]]:
    return sorted((m.step, key, m.value) for key in run.data.metrics for m in client.get_metric_history(run.info.run_id, key))


def test_a_search_in_wandb_and_mlflow_equals_its_own_curves_and_answers(trackers, capsys):
    """The quickstart driven along synthetic curves, its trackers updated after every trial as the driver does."""
    from blockforge.search.config import load_search

    from .test_golden import ROOT

    cells = [("cells.model.depth", [4, 8])]  # two of its cells: every run is read back, one reader call each
    plan = load_search(ROOT / "searches" / "quickstart.yaml", [*cells, ("tracking.report_to", ["wandb", "mlflow"])])
    assert plan.tracking.report_to == ["wandb", "mlflow"]
    assert plan.fingerprint() == load_search(ROOT / "searches" / "quickstart.yaml", cells).fingerprint()  # not part of what it is
    holder = {}

    def after_each(handed):
        holder["tracking"].update(Ledger(trackers / "qs" / "trials.jsonl").records())
        return False

    from blockforge.search.records.store import SearchStore
    from blockforge.storage import Storage

    holder["tracking"] = SearchTracking.open(plan, SearchStore(Storage.open(trackers / "qs")))
    _, store = quickstart(trackers / "qs", trackers / "node", stop_after=None, each=after_each, plan=plan)
    records = Ledger(store.local / "trials.jsonl").records()
    holder["tracking"].finish(records, Findings.of(plan, records))
    assert "warning" not in capsys.readouterr().err

    folders = {r.run_dir for r in records if r.run_dir}
    state = json.loads((store.local / STATE_FILE).read_text())
    assert len(state["runs"]) == len(folders)

    # W&B: one run per run folder, grouped by search, job type its cell; its config the searched values; its curve the file's
    runs = wandb_runs(trackers)
    trials = {k: v for k, v in runs.items() if v["job_type"] != "answers"}
    assert len(trials) == len(folders)
    by_identity = {run["config"]["identity"]: run for run in trials.values()}
    for record in records:
        if not record.run_dir:
            continue
        run = by_identity[record.identity]
        assert run["group"] == holder["tracking"].group and run["job_type"] == run["config"]["cell"]
        assert run["name"] == f"{record.cell} trial {record.trial} k={record.post_ln_layers} seed {record.seed}"
        assert run["config"][ALPHA] == record.overrides[ALPHA] and run["config"]["post_ln_layers"] == record.post_ln_layers
        assert run["config"]["seed"] == record.seed and run["config"]["model.depth"] == plan.cell(record.cell)["model.depth"]
        assert wandb_curve(run) == curve_of(metric_lines(record.run_dir)), record.identity
    answers = next(v for v in runs.values() if v["job_type"] == "answers")
    assert answers["summary"]["trials"] == len(records) and "alpha_law" in answers["summary"]

    # MLflow: a parent run for the search, a child per run folder with the same params and curves
    group = holder["tracking"].group
    assert group.startswith("quickstart:qs-")  # the search file's name, its folder's, and a hash of where it is kept
    client, found = mlflow_runs(group)
    parent = next(r for r in found if r.info.run_name == group)
    assert client.get_experiment_by_name(group).tags["mlflow.experimentKind"] == "custom_model_development"
    children = [r for r in found if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == len(folders) and parent.info.status == "FINISHED"
    for child in children:
        record = next(r for r in records if r.identity == child.data.params["identity"])
        assert float(child.data.params[ALPHA]) == pytest.approx(record.overrides[ALPHA], rel=1e-12)
        assert mlflow_curve(client, child) == curve_of(metric_lines(record.run_dir))
        assert child.info.status == "FINISHED" and child.data.tags["blockforge.status"] in ("completed", "pruned", "diverged")
    table = json.loads(Path(client.download_artifacts(parent.info.run_id, "answers.json", str(trackers / "dl"))).read_text())
    assert table["columns"] == ANSWER_COLUMNS and [row[0] for row in table["data"]] == plan.all_names()


def test_a_tracker_missing_without_credentials_or_failing_is_one_sentence_and_the_search_goes_on(trackers, capsys, monkeypatch):
    from blockforge.search.config import load_search
    from blockforge.search.records.store import SearchStore
    from blockforge.storage import Storage
    from blockforge.tracking import _MLflow

    from .test_golden import ROOT

    # wandb without its package, MLflow raising from its third log on: one line each, then nothing more of either
    monkeypatch.setitem(sys.modules, "wandb", None)
    calls = {"n": 0}
    real_log = _MLflow.log

    def flaky(self, key, rows):
        calls["n"] += 1
        if calls["n"] >= 3:
            raise ConnectionError("tracking server went away\nsecond line")
        return real_log(self, key, rows)

    monkeypatch.setattr(_MLflow, "log", flaky)
    plan = load_search(ROOT / "searches" / "quickstart.yaml", [("tracking.report_to", ["wandb", "mlflow"])])
    store = SearchStore(Storage.open(trackers / "qs"))
    tracking = SearchTracking.open(plan, store)
    _, store = quickstart(trackers / "qs", trackers / "node", each=lambda handed: tracking.update(
        Ledger(trackers / "qs" / "trials.jsonl").records()) and False, plan=plan)
    records = Ledger(store.local / "trials.jsonl").records()
    tracking.finish(records, Findings.of(plan, records))
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2, err
    assert err[0] == "blockforge: warning: tracking: wandb needs its package: pip install 'blockforge[wandb]'; the search goes on without it"
    assert re.fullmatch(r"blockforge: warning: tracking: mlflow failed logging depth=\d+ trial \d+ k=\d+ seed \d+ \(ConnectionError: tracking "
                        r"server went away\); the search goes on without it", err[1]), err[1]
    assert calls["n"] == 3 and len(records) == 33  # the search itself went on to its end

    # W&B online without a key never prompts: one sentence
    monkeypatch.delitem(sys.modules, "wandb")
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("HOME", str(trackers))  # no ~/.netrc
    monkeypatch.setenv("NETRC", str(trackers / "no-netrc"))
    from blockforge.tracking import Trackers

    assert not Trackers(Tracking(report_to=["wandb"]), name="x", state_dir=trackers, what="the search")
    assert "no W&B credentials: set WANDB_API_KEY" in capsys.readouterr().err


def test_a_run_logs_its_curves_once_across_a_resume(trackers, capsys):
    from tiny_data import write_recipe

    from blockforge.cli import main
    from blockforge.train.loop import Trainer

    path = write_recipe(trackers, steps=20, eval_every=5, checkpoint_every=5, grad_norm_every=0, log_every=2)
    recipe = blockforge.load_recipe(path, [("tracking.report_to", ["wandb", "mlflow"]), ("tracking.project", "tiny")])
    stop = lambda trainer, step: step.step == 12 and os.kill(os.getpid(), signal.SIGTERM)  # noqa: E731  (a preemption)
    first = Trainer(recipe, trackers / "run", progress=False, callbacks=[stop]).run()
    assert first.status == "interrupted"
    assert main(["train", str(path), "--out", str(trackers / "run"), "--resume", "--no-progress", "--report-to", "wandb,mlflow",
                 "--set", "tracking.project=tiny"]) == 0
    lines = metric_lines(trackers / "run")
    runs = wandb_runs(trackers)
    assert len(runs) == 1  # the resume continued the same W&B run
    run = next(iter(runs.values()))
    assert wandb_curve(run) == curve_of(lines) and run["config"]["model.width"] == 32
    client, found = mlflow_runs("tiny")
    assert len(found) == 1 and mlflow_curve(client, found[0]) == curve_of(lines)
    assert found[0].data.params["train.lr"] == "0.003" and found[0].info.status == "FINISHED"


@pytest.mark.slow  # a second tracked search and a plain one; the default suite's tracked search is the W&B and MLflow one above
def test_a_search_run_from_python_logs_every_trial_and_one_without_tracking_is_untouched(trackers, ray_session):
    path = write_search(trackers, scheduler=None, cells={"model.depth": [2]}, trials_per_cell=2, baselines=[],
                        space={ALPHA: {"choice": [0.0, 0.5]}}, sampler={"random": {"seed": 0}}, max_concurrent=1,
                        overrides={"train.steps": 20, "train.eval_every": 10})
    search = blockforge.run_search(path, out=trackers / "tracked", overrides={"tracking.report_to": ["wandb", "mlflow"]})
    runs = {v["config"]["identity"]: v for v in wandb_runs(trackers).values() if v["job_type"] != "answers"}
    assert sorted(runs) == sorted(r.identity for r in search.records)
    for record in search.records:
        assert wandb_curve(runs[record.identity]) == curve_of(metric_lines(record.run_dir))
    from blockforge.search.reports.tracked import search_group

    client, found = mlflow_runs(search_group(search.plan, str(trackers / "tracked")))
    assert len(found) == 3  # the search's run and its two trials
    plain = blockforge.run_search(path, out=trackers / "plain")
    assert not (plain.folder / STATE_FILE).exists() and len(wandb_runs(trackers)) == len(runs) + 1


def test_tracking_takes_no_credentials_and_names_what_it_refuses(tmp_path, capsys):
    from blockforge.cli import main
    from blockforge.errors import SpecError
    from blockforge.search.config import load_search

    path = write_search(tmp_path, tracking={"report_to": ["wandb"], "api_key": "secret"})
    with pytest.raises(SpecError, match=r"tracking.api_key.*unknown key"):
        load_search(path)
    path = write_search(tmp_path, tracking={"report_to": ["wandb", "comet"]})
    with pytest.raises(SpecError, match=r"tracking.report_to\[1\]: unknown value 'comet'.*choose one of: wandb, mlflow, tensorboard"):
        load_search(path)
    assert main(["train", str(path), "--report-to", "wandb,nope"]) == 2
    assert "argument --report-to: unknown value 'nope'" in capsys.readouterr().err


class _Breaks:
    """An import finder under which importing `name` raises `error` (a package broken by a dependency of another version)."""

    def __init__(self, name: str, error: Exception):
        self.name, self.error = name, error

    def find_spec(self, name, path=None, target=None):
        if name == self.name:
            raise self.error
        return None


class _Flaky:
    """A tracker backend that raises as it `fails` ("init", "start", "log", "finish" or "close")."""

    name = "mlflow"

    def __init__(self, fails: str):
        self.fails, self.runs = fails, {}
        self._maybe("init")

    def _maybe(self, stage: str) -> None:
        if stage == self.fails:
            raise TypeError(f"the tracker broke at {stage}\nits second line")

    def start(self, key, run_id, name, kind, config, parent):
        self._maybe("start")
        self.runs[key] = "id"
        return "id"

    def log(self, key, rows):
        self._maybe("log")

    def finish(self, key, summary, failed):
        self._maybe("finish")
        self.runs.pop(key)

    def close(self):
        self._maybe("close")


@pytest.mark.parametrize("fails", ["import: TypeError", "import: a dependency", "init", "start", "log", "finish", "close"])
def test_a_tracker_failing_anywhere_is_one_warning_and_the_work_goes_on(tmp_path, monkeypatch, capsys, fails):
    """Whatever a tracker raises, as its package imports (protobuf's TypeError; an ImportError of something it imports), as it
    starts, logs, finishes or closes: one warning naming it, what it was doing and the cause's first line; nothing raised."""
    import blockforge.tracking as tracking

    if fails.startswith("import"):
        error = TypeError("Descriptors cannot be created directly.\nmore") if "TypeError" in fails else \
            ImportError("cannot import name 'builder' from 'google.protobuf.internal'", name="google.protobuf.internal")
        monkeypatch.delitem(sys.modules, "mlflow", raising=False)
        monkeypatch.setattr(sys, "meta_path", [_Breaks("mlflow", error), *sys.meta_path])
    monkeypatch.setattr(tracking, "_MLflow", lambda experiment: _Flaky(fails))
    trackers = tracking.Trackers(Tracking(report_to=["mlflow"]), name="x", state_dir=tmp_path, what="the run")
    lines = [{"event": "eval", "step": step, "val_loss": 1.0 / step} for step in (1, 2)]
    trackers.log("run", lines[:1], name="run", kind="train", config={}, start=True)
    trackers.log("run", lines, name="run", kind="train", config={}, ended={"status": "completed"})
    trackers.log("again", lines, name="again", kind="train", config={})
    trackers.close()
    err = capsys.readouterr().err.splitlines()
    doing = {"init": "starting", "start": "starting the run of run", "log": "logging run", "finish": "finishing the run of run",
             "close": "closing"}.get(fails, "importing its package")
    cause = {"import: TypeError": "TypeError: Descriptors cannot be created directly.",
             "import: a dependency": "ImportError: cannot import name 'builder'"}.get(fails, f"TypeError: the tracker broke at {fails}")
    assert len(err) == 1 and err[0].startswith(f"blockforge: warning: tracking: mlflow failed {doing} ({cause}"), err
    assert err[0].endswith("; the run goes on without it") and not trackers


def test_two_searches_of_one_file_are_apart_and_the_answers_follow_every_report(trackers):
    """Two folders of the quickstart (one cell), each its own W&B group and MLflow experiment; the first stopped partway,
    its answers table equal to its summary.md then, and replaced (not appended to) by the next report."""
    from blockforge.search.config import load_search
    from blockforge.search.records.store import SearchStore
    from blockforge.storage import Storage

    from .test_golden import ROOT

    plan = load_search(ROOT / "searches" / "quickstart.yaml", [("cells.model.depth", [4]), ("tracking.report_to", ["wandb", "mlflow"])])
    tables = {}
    for name, stop_after in (("one", lambda handed: len(handed) >= 5), ("two", lambda handed: len(handed) >= 3)):
        store = SearchStore(Storage.open(trackers / name))
        tracking = SearchTracking.open(plan, store)
        quickstart(trackers / name, trackers / "node", stop_after=stop_after, plan=plan)
        records = Ledger(store.local / "trials.jsonl").records()
        tracking.finish(records, Findings.of(plan, records), stopped=stop_after is not None)
        client, found = mlflow_runs(tracking.group)
        parent = next(r for r in found if r.info.run_name == tracking.group)
        tables[name] = (tracking.group, client, parent)
        table = json.loads(Path(client.download_artifacts(parent.info.run_id, "answers.json", str(trackers / f"dl-{name}"))).read_text())
        summary = (store.local / "summary.md").read_text()
        assert [row[0] for row in table["data"]] == ["depth=4"] and table["data"][0][-1] in summary  # the claim summary.md makes now
    (one, _, _), (two, _, _) = tables["one"], tables["two"]
    assert one != two and one.startswith("quickstart:one-") and two.startswith("quickstart:two-")
    groups = {run["group"] for run in wandb_runs(trackers).values()}
    assert groups == {one, two}

    # the stopped search resumed to its end: its table is the new report's, one row per cell
    store = SearchStore(Storage.open(trackers / "one"))
    tracking = SearchTracking.open(plan, store)
    from blockforge.search.run.scheduler import CellScheduler
    from blockforge.search.run.searcher import CellSearcher

    from .conftest import drive_curves
    from .test_golden import synthetic_curves

    drive_curves(CellSearcher(plan, store, from_ledger=True), CellScheduler(plan, store), synthetic_curves(plan), limit=5000)
    records = Ledger(store.local / "trials.jsonl").records()
    found = Findings.of(plan, records)
    tracking.finish(records, found)
    _, client, parent = tables["one"]
    table = json.loads(Path(client.download_artifacts(parent.info.run_id, "answers.json", str(trackers / "dl-again"))).read_text())
    assert len(table["data"]) == 1 and table["data"][0][-1] == found.evidence["depth=4"].claim()


def test_a_run_started_again_from_its_first_step_is_a_new_attempt_in_the_trackers(trackers):
    from blockforge.tracking import Trackers

    tracking = Tracking(report_to=["mlflow"], project="attempts")
    first = [{"step": s, "event": "train", "loss": 9.0 - s, "tok_per_s": 1000.0} for s in (10, 20)]
    again = [{"step": s, "event": "train", "loss": 8.0 - s, "tok_per_s": 2000.0} for s in (10,)]
    trackers_ = Trackers(tracking, name="x", state_dir=trackers, what="the search")
    trackers_.log("trials/a/b", first, name="trial 0", kind="cell", config={}, whole=True)
    trackers_.log("trials/a/b", again, name="trial 0", kind="cell", config={}, whole=True)  # trained anew: its log starts over
    trackers_.close()
    client, found = mlflow_runs("attempts")
    by_name = {run.info.run_name: run for run in found}
    assert set(by_name) == {"trial 0", "trial 0 (attempt 2)"}
    assert mlflow_curve(client, by_name["trial 0 (attempt 2)"]) == [(10, "train/loss", -2.0), (10, "train/tok_per_s", 2000.0)]
    assert mlflow_curve(client, by_name["trial 0"]) == curve_of(first)


def test_a_package_that_fails_as_it_imports_is_absent_inside_the_block_and_restored_after(tmp_path, monkeypatch):
    """What a search does before Ray Tune imports W&B and MLflow itself: a package that raises as it imports (not only
    ImportError) is absent inside the block, so `import` raises ImportError, which Tune takes for "not installed"; one
    that imports, or is simply not installed, is left as it is; after the block the broken one is tried again."""
    from blockforge.tracking import broken_packages_absent

    (tmp_path / "broken_tracker").mkdir()
    (tmp_path / "broken_tracker" / "__init__.py").write_text("raise RuntimeError('this install is broken')\n")
    (tmp_path / "fine_tracker.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with broken_packages_absent(("broken_tracker", "fine_tracker", "no_such_tracker")) as absent:
        assert absent == ("broken_tracker",)
        with pytest.raises(ImportError):
            import broken_tracker  # noqa: F401
        import fine_tracker

        assert fine_tracker.VALUE == 1
    with pytest.raises(RuntimeError, match="this install is broken"):
        import broken_tracker  # noqa: F401,F811
    sys.modules.pop("fine_tracker", None)


def test_a_tracker_the_search_does_not_ask_for_is_not_imported_inside_the_block(tmp_path, monkeypatch):
    """A tracker's package a search does not use is absent in the block, never imported (Ray Tune's import of it would
    cost seconds for nothing), and importable again after; it is not among the broken ones the trials hide."""
    from blockforge.tracking import broken_packages_absent

    (tmp_path / "unused_tracker.py").write_text("raise AssertionError('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with broken_packages_absent(("unused_tracker",), unused=("unused_tracker",)) as absent:
        assert absent == ()
        with pytest.raises(ImportError):
            import unused_tracker  # noqa: F401
    assert "unused_tracker" not in sys.modules
    with pytest.raises(AssertionError, match="imported"):
        import unused_tracker  # noqa: F401,F811
