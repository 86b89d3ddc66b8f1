"""blockforge.open_search: a search as Python objects, local or in a bucket, finished or running, equal to what its
reports say; blockforge.run_search: the command line's search from Python."""

import json
import shutil
from pathlib import Path

import pandas
import pytest

import blockforge
from blockforge.errors import BlockforgeError
from blockforge.io import atomic_write_json
from blockforge.search.config import MARKER, cell_slug, folder_marker, load_search
from blockforge.search.records.ledger import Ledger
from blockforge.search.records.runs import evaluations
from blockforge.search.records.store import SearchStore
from blockforge.search.reports.report import write_reports
from blockforge.search.run.scheduler import CellScheduler
from blockforge.search.run.searcher import CellSearcher
from blockforge.spec.serialize import load_spec
from blockforge.storage import Storage

from .conftest import drive_curves, run_search_stopped_by_sigterm, write_search
from .test_golden import ROOT, synthetic_curves

ALPHA = "model.layers.mix_ln.alpha"


def quickstart(where, node: Path, stop_after=None, each=None, plan=None):
    """The shipped quickstart driven along the golden synthetic curves into `where` (a folder or a URI), its search.json
    and reports written as the driver writes them; `stop_after`: a kill partway, one more trial left running; `each`:
    called after every trial; `plan`: the quickstart's, loaded with overrides that change nothing it decides."""
    plan = plan or load_search(ROOT / "searches" / "quickstart.yaml")
    store = SearchStore(Storage.open(where))
    atomic_write_json(store.local / MARKER, folder_marker(plan, None))
    store.put(MARKER)
    searcher = CellSearcher(plan, store)
    stop = lambda handed: bool((each and each(handed)) or (stop_after and stop_after(handed)))  # noqa: E731
    drive_curves(searcher, CellScheduler(plan, store), synthetic_curves(plan), limit=5000, node=node, stop_after=stop)
    if stop_after is not None:
        assert searcher.suggest("left-running") is not None
    store.pull_runs()
    write_reports(store.local, plan, Ledger(store.local / "trials.jsonl"), location=str(where))
    store.put_reports()
    return plan, store


def assert_equals_its_reports(search: blockforge.Search, folder: Path) -> None:
    """Every view equals the report files the driver wrote from the same ledger."""
    # results(): results.csv, row for row, with typed columns.
    table = search.results()
    written = pandas.read_csv(folder / "results.csv").convert_dtypes()
    assert list(table.columns) == list(written.columns)
    pandas.testing.assert_frame_equal(table, written, check_dtype=False)
    assert str(table["seed"].dtype) == "Int64" and str(table["value"].dtype) == "Float64" and str(table["status"].dtype) == "string"
    assert str(table["post_ln_layers"].dtype) == "Int64" and str(table["depth"].dtype) == "Int64" and str(table["wall_s"].dtype) == "Float64"
    assert str(table["note"].dtype) == "string" and str(table["duplicate_of"].dtype) == "Int64"

    # cells(): each claim is summary.md's sentence, each winner best/<cell>.yaml, each verdict its table's.
    summary = (folder / "summary.md").read_text()
    cells = search.cells()
    assert list(cells) == search.plan.all_names()
    for name, answer in cells.items():
        assert answer.claim in summary
        if answer.winner is None:
            continue
        assert search.best(name) == load_spec(folder / "best" / f"{cell_slug(name)}.yaml")
        assert search.best(name).post_ln_count() == answer.winner.post_ln_layers
        assert f"| {name} |" in summary and answer.verdict in summary
        assert answer.winner in answer.evidence.candidates and answer.winner.n >= 1
        assert all(t in answer.evidence.eligible for t in answer.tied)
        if answer.vs_pre_ln is not None and answer.vs_pre_ln.low is not None:
            assert answer.vs_pre_ln.low <= answer.vs_pre_ln.mean <= answer.vs_pre_ln.high

    # law(): alpha_law.json.
    law, kept = search.law(), json.loads((folder / "alpha_law.json").read_text())
    assert json.loads(json.dumps(law.points)) == kept["points"] and law.fits.verdict == kept["verdict"]
    assert (kept["bootstrap"] is None) == (law.bootstrap is None)
    assert law.verdict in summary
    assert (law.decided is None) == ("annot decide" in law.verdict)  # a law is named (and drawn) only where the summary names one

    # curves(): each trial's metrics.jsonl.
    curves = search.curves()
    for record in search.records:
        if record.run_dir and Path(record.run_dir).exists():
            mine = curves[(curves["cell"] == record.cell) & (curves["trial"] == record.trial)]
            assert [(int(s), float(v)) for s, v in zip(mine["step"], mine["val_loss"])] == [
                (step, m["val_loss"]) for step, m in evaluations(record.run_dir)]


def test_a_finished_search_opens_as_objects_equal_to_its_reports(tmp_path):
    plan, _ = quickstart(tmp_path / "qs", tmp_path / "node")
    search = blockforge.open_search(tmp_path / "qs")
    assert not search.running and len(search.records) == len(Ledger(tmp_path / "qs" / "trials.jsonl").records())
    assert_equals_its_reports(search, tmp_path / "qs")
    # what the confirmation decided is there as objects: each winner with its seeds
    cells = search.cells()
    assert all(answer.winner.n == 1 + plan.confirm.seeds for answer in cells.values() if answer.winner is not None)
    one = search.cell("depth=8")
    assert one is cells["depth=8"] and search.curves(cell="depth=8")["cell"].eq("depth=8").all()
    trial = int(search.results().query("cell == 'depth=8' and status == 'completed'")["trial"].iloc[0])
    assert search.curves(trial, cell="depth=8")["trial"].eq(trial).all()
    with pytest.raises(BlockforgeError, match=r"cell= depth=5: no such cell in .*; choose one of: depth=4; depth=8; depth=12"):
        search.cell("depth=5")
    with pytest.raises(BlockforgeError, match="has 3 cells; choose one"):
        search.best()
    # a cell by its keys as a dict, a cell's curves by its name first; what names no cell or trial is one sentence
    assert search.cell({"depth": 8}) is one and search.curves("depth=8").equals(search.curves(cell="depth=8"))
    with pytest.raises(BlockforgeError, match=r"cell= 8: a cell is named by its keys, as a string such as 'depth=4'"):
        search.cell(8)
    with pytest.raises(BlockforgeError, match=r"trial= 1.5: a trial is its number in its cell"):
        search.curves(1.5, cell="depth=8")


def test_the_how_to_pages_python_runs_as_printed_on_the_quickstart(tmp_path, monkeypatch):
    """Every Python line of the notebooks how-to up to running a search (that one trains), on the quickstart along the
    golden curves, in a folder where the page's paths name it; export() aside (these trials have no weights; it is
    the export command's, tested with it)."""
    from tests.test_docs import fenced_blocks

    monkeypatch.chdir(tmp_path)
    quickstart(tmp_path / "runs" / "search-quickstart", tmp_path / "node")
    page = (ROOT / "docs" / "howto" / "notebooks-and-trackers.md").read_text().split("## Run a search from Python")[0]
    blocks = ["\n".join(line for line in body.splitlines() if ".export(" not in line)
              for lang, body, _ in fenced_blocks(page) if lang == "python"]
    assert len(blocks) >= 4
    namespace = {}
    for body in blocks:
        exec(compile(body, "notebooks-and-trackers.md", "exec"), namespace)
    assert namespace["cell"].name == "depth=8" and namespace["law"].verdict and namespace["spec"].depth == 8


def test_a_running_search_shows_the_records_so_far(tmp_path):
    quickstart(tmp_path / "qs", tmp_path / "node", stop_after=lambda handed: len(handed) >= 12)
    search = blockforge.open_search(tmp_path / "qs")
    assert search.running
    table = search.results()
    assert (table["status"] == "running").sum() == 1 and len(table) == 13
    assert_equals_its_reports(search, tmp_path / "qs")
    assert len(search.refresh().records) == 13


def test_a_search_in_a_bucket_opens_as_the_same_objects(tmp_path, s3):
    uri = s3.direct(s3.bucket(), "qs")
    _, store = quickstart(uri, tmp_path / "node")
    remote = blockforge.open_search(uri)
    assert remote.folder != store.local  # a copy of its own: never the driver's working copy
    rungs = {name: answer.rungs for name, answer in remote.cells().items()}  # before curves(): the runs' curves taken down first
    assert_equals_its_reports(remote, remote.folder)
    assert not list(remote.folder.rglob("*.safetensors"))
    local = quickstart(tmp_path / "qs", tmp_path / "node")[1]
    here = blockforge.open_search(local.local)
    pandas.testing.assert_frame_equal(remote.results().drop(columns="wall_s"), here.results().drop(columns="wall_s"))
    assert {n: a.claim for n, a in remote.cells().items()} == {n: a.claim for n, a in here.cells().items()}
    assert rungs == {name: answer.rungs for name, answer in here.cells().items()} and all(r.checks for r in rungs.values())


def test_what_cannot_be_opened_is_one_sentence(tmp_path, capsys):
    with pytest.raises(BlockforgeError, match=f"{tmp_path}: holds no search .no search.json."):
        blockforge.open_search(tmp_path)
    quickstart(tmp_path / "qs", tmp_path / "node", stop_after=lambda handed: len(handed) >= 6)
    ledger = tmp_path / "qs" / "trials.jsonl"
    lines = ledger.read_text().splitlines()
    lines[2] = lines[2][:40]  # a damaged line: the backup copy still has it
    ledger.write_text("\n".join(lines) + "\n")
    search = blockforge.open_search(tmp_path / "qs")
    assert len(search.results()) == 7
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "line(s) 3 of trials.jsonl are not records" in err and "resuming the search repairs" in err
    (tmp_path / "qs" / MARKER).write_text("{")
    with pytest.raises(BlockforgeError, match="search.json"):
        blockforge.open_search(tmp_path / "qs")


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """The quickstart driven to its end once for the module; tests damage copies of it (copy_of)."""
    where = tmp_path_factory.mktemp("finished")
    quickstart(where / "qs", where / "node")
    return where / "qs"


def copy_of(finished: Path, to: Path) -> Path:
    shutil.copytree(finished, to)
    return to


def opened(folder: Path, capsys) -> tuple[blockforge.Search, str]:
    search = blockforge.open_search(folder)
    return search, capsys.readouterr().err


def test_a_view_never_shows_lost_records_as_an_empty_answer(finished, tmp_path, capsys):
    """A ledger of which nothing can be read, in a search that ran trials, is one sentence; a copy missing or damaged while
    the other holds the records is one warning; runs whose curves are gone are one warning, once per view, and curves()
    of nothing readable one sentence."""
    # both copies of the ledger gone, or every line of both damaged: refused, naming what is there
    for name, damage in (("gone", lambda path: path.unlink()), ("damaged", lambda path: path.write_text("not a record\n{}\n"))):
        folder = copy_of(finished, tmp_path / name)
        for copy in ("trials.jsonl", "trials.backup.jsonl"):
            damage(folder / copy)
        with pytest.raises(BlockforgeError, match=rf"{folder}: no trial record can be read: .*trials.backup.jsonl .*, while trials/ "
                                                  r"and results.csv and summary.md show that it ran trials; restore trials.jsonl"):
            blockforge.open_search(folder)
    # one copy gone: one warning, every trial read from the other
    for gone, says in (("trials.jsonl", "reads those trials from trials.backup.jsonl, and resuming the search repairs"),
                       ("trials.backup.jsonl", "reads the trials from trials.jsonl alone")):
        folder = copy_of(finished, tmp_path / f"no-{gone}")
        (folder / gone).unlink()
        search, err = opened(folder, capsys)
        assert len(search.results()) == 33 and err.count("\n") == 1 and f"{gone} is missing; this view {says}" in err, err
    # a search in a storage: its records since the last fold are segments; both copies lost since is said
    folder = copy_of(finished, tmp_path / "folded")
    (folder / "trials.segments").mkdir()
    for number, line in enumerate((folder / "trials.jsonl").read_text().splitlines()[-4:]):
        (folder / "trials.segments" / f"{number}.jsonl").write_text(line + "\n")
    for copy in ("trials.jsonl", "trials.backup.jsonl"):
        (folder / copy).unlink()
    search, err = opened(folder, capsys)
    assert 0 < len(search.records) <= 4 and err.count("\n") == 1
    assert "trials.jsonl is missing and trials.backup.jsonl is missing: trials recorded only there are missing from this view" in err
    # a search that has not recorded a trial: an empty view, said
    folder = tmp_path / "started"
    folder.mkdir()
    shutil.copyfile(finished / MARKER, folder / MARKER)
    search, err = opened(folder, capsys)
    assert search.results().empty and err.count("\n") == 1 and "no trial is recorded yet" in err

    # runs lost: cells() and curves() warn once for each, curves() of nothing readable is one sentence
    folder = copy_of(finished, tmp_path / "runs")
    lost = sorted((folder / "trials" / "depth=8").iterdir())
    shutil.rmtree(lost[0])
    (lost[1] / "metrics.jsonl").unlink()
    (lost[2] / "metrics.jsonl").write_text("")
    search, _ = opened(folder, capsys)
    cells = search.cells()
    assert capsys.readouterr().err.count("the curves of 2 trained run(s) are gone") == 1
    assert cells["depth=4"].rungs == blockforge.open_search(finished).cells()["depth=4"].rungs
    search.curves()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"the curves of 1 trained run(s) are gone (trials/depth=8/{lost[2].name}/metrics.jsonl holds no evaluation)" in err
    assert len(search.curves("depth=4")) and not capsys.readouterr().err
    shutil.rmtree(folder / "trials")
    with pytest.raises(BlockforgeError, match=r"no curve of the 33 trained run\(s\) asked for can be read \(trials/depth=\d+/\w+/ is gone; .*"
                                              r"and 30 more\); restore the run folders"):
        blockforge.open_search(folder).curves()


def test_a_wrong_type_given_to_the_python_api_is_one_sentence(finished, tmp_path, monkeypatch):
    """Every public call of the view and run_search refuses an argument of the wrong type (or value) in one sentence naming
    the call and the argument, before anything starts."""
    import blockforge.search.run.driver as driver

    monkeypatch.setattr(driver, "run_search", lambda *a, **k: pytest.fail("a search started"))
    search, file = blockforge.open_search(finished), ROOT / "searches" / "quickstart.yaml"
    calls = [
        (lambda: blockforge.open_search(3), r"open_search: where=3 is an int; give a search's folder or URI"),
        (lambda: blockforge.open_search(None), r"open_search: where=None is None"),
        (lambda: search.cell(["depth=8"]), r"cell= \['depth=8'\]: a cell is named by its keys"),
        (lambda: search.best(8), r"cell= 8: a cell is named by its keys"),
        (lambda: search.curves(True), r"trial= True: a trial is its number in its cell"),
        (lambda: search.curves(cell=8.0), r"cell= 8.0: a cell is named"),
        (lambda: search.export("depth=8", tmp_path / "e", foo=1), r"export: foo= is not an option of export; known keys here: dtype"),
        (lambda: search.export("depth=8", None), r"export: out=None is None; give the export's folder"),
        (lambda: search.export({"depth": 8}, tmp_path / "e", format=3), r"export: format=3 is an int; give one of: blockforge, hf"),
        (lambda: search.export("depth=8", tmp_path / "e", format="onnx"), r"export: format='onnx': unknown value 'onnx'"),
        (lambda: search.export("depth=8", tmp_path / "e", format="hf", dtype=16), r"export: dtype=16 is an int; give the weights' precision"),
        (lambda: search.export("depth=8", tmp_path / "e", format="hf", target="vlm"), r"export: target='vlm': unknown value 'vlm' .did you mean 'vllm'"),
        (lambda: search.export("depth=8", tmp_path / "e", pick="0"), r"export: pick='0' is a str; give a front point's number"),
        (lambda: search.export("depth=8", tmp_path / "e", retrain="yes"), r"export: retrain='yes' is a str; give True or False"),
        (lambda: search.export(8, tmp_path / "e"), r"cell= 8: a cell is named by its keys"),
        (lambda: blockforge.run_search(None), r"run_search: file=None is None; give the search file's path"),
        (lambda: blockforge.run_search(file, out=5), r"run_search: out=5 is an int"),
        (lambda: blockforge.run_search(file, overrides="train.lr=0.01"), r"run_search: overrides='train.lr=0.01' is a str; give a dict"),
        (lambda: blockforge.run_search(file, overrides=[("train.lr", 0.01)]), r"run_search: overrides=\[\('train.lr', 0.01\)\] is a list"),
        (lambda: blockforge.run_search(file, overrides={3: 1}), r"run_search: overrides has the key 3; its keys are dotted keys as strings"),
        (lambda: blockforge.run_search(file, max_concurrent="2"), r"run_search: max_concurrent='2' is a str; give a whole number"),
        (lambda: blockforge.run_search(file, max_concurrent=True), r"run_search: max_concurrent=True is a bool"),
        (lambda: blockforge.run_search(file, max_concurrent=0), r"run_search: max_concurrent=0: give at least 1"),
        (lambda: blockforge.run_search(file, resume=1), r"run_search: resume=1 is an int; give True, False or 'auto'"),
        (lambda: blockforge.run_search(file, resume="yes"), r"run_search: resume='yes': give True .* or 'auto'"),
        (lambda: blockforge.run_search(file, address=6379), r"run_search: address=6379 is an int; give a Ray cluster's address as a string"),
    ]
    for call, says in calls:
        with pytest.raises(BlockforgeError, match=says):
            call()


def tiny(tmp_path: Path) -> Path:
    return write_search(tmp_path, scheduler=None, cells={"model.depth": [2]}, trials_per_cell=2, baselines=[],
                        space={ALPHA: {"choice": [0.0, 0.5]}}, sampler={"random": {"seed": 0}}, max_concurrent=1,
                        overrides={"train.steps": 20})


def test_run_search_decides_as_the_command_line_and_exports(tmp_path, ray_session, capsys):
    from blockforge.cli import main

    path = tiny(tmp_path)
    assert main(["search", str(path), "--out", str(tmp_path / "cli")]) == 0
    search = blockforge.run_search(path, out=tmp_path / "api")
    assert isinstance(search, blockforge.Search)
    decided = lambda records: [(r.cell, r.trial, r.stage, r.status, r.seed, r.steps, r.value, r.alpha) for r in records]  # noqa: E731
    assert decided(search.records) == decided(Ledger(tmp_path / "cli" / "trials.jsonl").records())
    assert search.cell().claim == blockforge.open_search(tmp_path / "cli").cell().claim
    out = search.export(None, tmp_path / "model")
    assert blockforge.load(out).spec.depth == 2
    with pytest.raises(BlockforgeError, match="already holds a search; pass --resume"):
        blockforge.run_search(path, out=tmp_path / "api")
    with pytest.raises(BlockforgeError, match="not a YAML value"):
        blockforge.run_search(path, out=tmp_path / "other", overrides={"train.lr": object()})


@pytest.mark.slow  # (tests/search/test_lr_curve.py stops a trained run_search with SIGTERM in the default suite and checks this message)
def test_a_sigterm_inside_run_search_leaves_a_resumable_search(tmp_path, ray_session):
    path = write_search(tmp_path, scheduler=None, cells={"model.depth": [2]}, trials_per_cell=2, baselines=[],
                        space={ALPHA: {"choice": [0.0, 0.5]}}, sampler={"random": {"seed": 0}}, max_concurrent=1,
                        overrides={"train.steps": 120, "train.checkpoint_every": 10, "train.eval_every": 10})
    out = tmp_path / "out"

    run_search_stopped_by_sigterm(path, out, lambda: bool(list(out.glob("trials/*/*/checkpoints/latest.json"))))
    stopped = blockforge.open_search(out)
    assert not stopped.running and "interrupted" in set(stopped.results()["status"])
    search = blockforge.run_search(path, out=out, resume=True)
    assert sorted(search.results()["status"]) == ["completed", "completed"]
    assert all(steps == 120 for steps in search.results()["steps"])


@pytest.mark.slow  # two quickstart searches at 60 steps, trained (about 2 min each on two cores)
def test_run_search_decides_the_quickstart_as_the_command_line(tmp_path, ray_session, monkeypatch):
    """The shipped quickstart, shortened, run from the command line and from Python: the same trials, seeds, stages,
    statuses and values, the same answers."""
    from blockforge.cli import main

    monkeypatch.chdir(tmp_path)
    path = ROOT / "searches" / "quickstart.yaml"
    assert main(["search", str(path), "--set", "steps=60", "--out", "cli"]) == 0
    search = blockforge.run_search(path, out="api", overrides={"steps": 60})
    cli = blockforge.open_search("cli")
    decided = lambda table: table.drop(columns="wall_s").reset_index(drop=True)  # noqa: E731
    pandas.testing.assert_frame_equal(decided(search.results()), decided(cli.results()))
    assert {n: a.claim for n, a in search.cells().items()} == {n: a.claim for n, a in cli.cells().items()}
    assert search.law().verdict == cli.law().verdict
