"""Searches kept in object storage (a local S3-compatible server): the same reports as in a local folder, a driver
killed and resumed elsewhere, exports from the bucket, and every way a storage can be wrong as one sentence."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from blockforge.cli import main
from blockforge.errors import BlockforgeError
from blockforge.search.driver import run_search
from blockforge.storage import Storage, StorageError, fetch_folder
from .conftest import write_search

REPORTS = ("summary.md", "results.csv", "alpha_law.json")


def comparable(folder: Path, location: str) -> dict[str, object]:
    """What a search's reports say, with what differs between two runs of it by nature left out: where the search is,
    seconds (results.csv's wall_s, summary.md's trial-seconds) and throughput (TensorBoard's *_per_s)."""
    out = {}
    summary = (folder / "summary.md").read_text().replace(location, "SEARCH")
    summary = summary.replace(" (Take the journal down first: optuna-dashboard reads a local file.)", "")
    lines = []
    for line in summary.splitlines():
        if line.startswith("| ") and "trial-seconds" not in line and line.count("|") == 8:
            line = line.rsplit("|", 2)[0]  # the trial-seconds column
        lines.append(line)
    out["summary.md"] = lines
    rows = [line.split(",") for line in (folder / "results.csv").read_text().splitlines()]
    wall = rows[0].index("wall_s")
    out["results.csv"] = [row[:wall] + row[wall + 1:] for row in rows]
    out["alpha_law.json"] = json.loads((folder / "alpha_law.json").read_text()) if (folder / "alpha_law.json").exists() else None
    out["best"] = {p.name: p.read_text() for p in sorted((folder / "best").glob("*"))}
    out["tensorboard"] = tensorboard_scalars(folder / "tensorboard")
    return out


def tensorboard_scalars(root: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars = {}
    for run in sorted(p for p in root.glob("*/*") if p.is_dir()):
        events = EventAccumulator(str(run))
        events.Reload()
        for tag in events.Tags()["scalars"]:
            if not tag.endswith("_per_s"):
                scalars[(run.relative_to(root).as_posix(), tag)] = [(e.step, e.value) for e in events.Scalars(tag)]
    return scalars


def _search(tmp_path: Path, alphas: tuple = (0.0, 0.5)) -> Path:
    return write_search(tmp_path, cells={"model.depth": [3]}, trials_per_cell=len(alphas), scheduler=None, baselines=[], max_concurrent=1,
                        space={"model.layers.mix_ln.alpha": {"choice": list(alphas)}}, sampler={"grid": {}},
                        overrides={"train.steps": 30, "train.checkpoint_every": 10, "train.eval_every": 10})


def _wait_for_a_checkpoint(storage: Storage, deadline_s: float) -> tuple[str, int]:
    """Once a trial has finished, a run folder in `storage` with a checkpoint and no result yet (a trial in flight):
    (its folder, the checkpoint's step)."""
    deadline = time.time() + deadline_s
    while time.time() < deadline:
        files = storage.listing("trials")
        for name in files if any(n.endswith("/result.json") for n in files) else ():
            if name.endswith("checkpoints/latest.json"):
                run = name.removesuffix("/checkpoints/latest.json")
                if f"{run}/result.json" not in files:
                    step = json.loads(storage.read_bytes(f"trials/{name}"))["step"]
                    if step >= 10:
                        return run, step
        time.sleep(0.1)
    raise AssertionError("no trial wrote a checkpoint in time")


def _wait_until_gone(mark: str, deadline_s: float) -> None:
    """Until no process has `mark` in its environment."""
    deadline = time.time() + deadline_s
    while time.time() < deadline:
        alive = False
        for environ in Path("/proc").glob("[0-9]*/environ"):
            try:
                alive = alive or mark.encode() in environ.read_bytes().split(b"\0")
            except OSError:
                continue
        if not alive:
            return
        time.sleep(0.2)
    raise AssertionError(f"processes with {mark} outlived their driver")


def test_decisions_and_reports_of_a_search_in_object_storage_equal_a_local_folders(tmp_path, s3):
    """Driven along the golden synthetic curves (no Ray, no training): trials that put their run folders up from a node
    folder of their own, and a driver that reads what it decides and reports from the storage, decide and report
    exactly what a search in a local folder does (exploration with ASHA, promotion, confirmation, transfer targets)."""
    from blockforge.search.config import load_search
    from blockforge.search.ledger import Ledger
    from blockforge.search.report import write_reports
    from blockforge.search.scheduler import CellScheduler
    from blockforge.search.searcher import CellSearcher
    from blockforge.search.store import SearchStore

    from .conftest import drive_curves
    from .test_golden import decisions
    from .test_rungs import toy_curve, toy_search

    plan = toy_search(tmp_path, transfer={"to": [{"model.depth": 8}], "seeds": 2, "neighbours": 1})
    found, reports = {}, {}
    uri = s3.direct(s3.bucket(), "search")
    for where in (tmp_path / "local", uri):
        store = SearchStore(Storage.open(where))
        handed = drive_curves(CellSearcher(plan, store), CellScheduler(plan, store), toy_curve, node=tmp_path / "node")
        store.pull_runs()
        write_reports(store.local, plan, Ledger.opened(store.local / "trials.jsonl"), location=str(where))
        store.put_reports()
        found[str(where)] = decisions(plan, store.local, handed)
        reports[str(where)] = comparable(fetch_folder(store.storage, "compare"), str(where))
    local, remote = found.values()
    assert remote == local
    records = Ledger(tmp_path / "local" / "trials.jsonl").records()  # it prunes, promotes, confirms and transfers
    assert {"pruned", "completed"} <= {r.status for r in records} and any(r.promoted for r in records)
    assert {"explore", "confirm", "transfer"} <= {r.stage for r in records}
    assert list(reports.values())[0] == list(reports.values())[1]
    working = Storage.open(uri).working_copy()
    assert not list(working.rglob("*.safetensors")) and {p.name for p in working.glob("trials/*/*/*")} <= {"metrics.jsonl", "result.json"}
    assert not Storage.open(uri).listing("trials.segments")  # folded into both ledger copies


@pytest.mark.slow
def test_a_search_in_object_storage_reports_and_exports_as_a_local_one(tmp_path, ray_session, s3, monkeypatch):
    path = _search(tmp_path, alphas=(0.5,))
    local = run_search(path, out=tmp_path / "local", progress_every_s=100)
    uri = f"s3://{s3.bucket()}/searches/tiny"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    outcome = run_search(path, out=uri, progress_every_s=100)
    assert sorted(r.status for r in outcome.records) == sorted(r.status for r in local.records)
    assert not any((tmp_path / "elsewhere").iterdir())  # nothing written here, not even a folder named s3:

    # Every report equals the local run's; the driver's working copy holds no weights, the storage every run's.
    storage = Storage.open(uri)
    assert comparable(fetch_folder(storage, "compare"), uri) == comparable(tmp_path / "local", str(tmp_path / "local"))
    working = storage.working_copy()
    assert (working / "summary.md").exists() and (working / "results.csv").exists()
    assert not list(working.rglob("*.safetensors")) and not list(working.rglob("checkpoints"))
    assert sum(name.endswith("/result.json") for name in storage.listing("trials")) == len(local.records)
    assert not storage.listing("trials.segments")  # folded into both ledger copies at the end

    # An export from the bucket computes what the local one does, and one written to a bucket loads from there.
    for source, target in ((uri, tmp_path / "from-bucket"), (str(tmp_path / "local"), tmp_path / "from-folder")):
        assert main(["export", source, "--out", str(target), "--no-progress"]) == 0
    model_uri = f"s3://{s3.bucket()}/model"
    assert main(["export", uri, "--out", model_uri, "--no-progress"]) == 0
    import blockforge

    tokens = torch.randint(0, 300, (2, 8))
    with torch.no_grad():
        reference = blockforge.load(tmp_path / "from-folder")(tokens)
        assert torch.equal(blockforge.load(tmp_path / "from-bucket")(tokens), reference)
        assert torch.equal(blockforge.load(model_uri)(tokens), reference)


@pytest.mark.slow
def test_a_driver_killed_mid_search_resumes_from_another_machine_losing_nothing(tmp_path, ray_session, s3, monkeypatch):
    path = _search(tmp_path)
    local = run_search(path, out=tmp_path / "local", progress_every_s=100)
    uri = f"s3://{s3.bucket()}/searches/tiny"
    storage = Storage.open(uri)

    # A driver (with a local Ray of its own) killed while a trial is in flight, after it wrote a checkpoint.
    first = tmp_path / "first"
    first.mkdir()
    driver = subprocess.Popen([sys.executable, "-m", "blockforge", "search", str(path), "--out", uri], cwd=first,
                              env=dict(os.environ, BLOCKFORGE_CACHE=str(tmp_path / "cache-first")),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        run, _ = _wait_for_a_checkpoint(storage, 240)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    _wait_until_gone(f"BLOCKFORGE_CACHE={tmp_path / 'cache-first'}", 120)  # its trial too (the reaper ends what the driver started)
    written = [name for name in storage.listing(f"trials/{run}/checkpoints") if name.endswith("/state.json")]  # whole ones
    step = max(int(name.split("/")[0].removeprefix("step-")) for name in written)  # the newest it put up before the kill
    finished = {name: storage.read_bytes(name) for name in (f"trials/{n}" for n in storage.listing("trials")) if name.endswith("/result.json")}
    assert finished and not list(first.iterdir())  # nothing written where it ran (not even a folder named s3:)

    # Resumed from a second working directory, with another cache: nothing of the first is here.
    second = tmp_path / "second"
    second.mkdir()
    monkeypatch.chdir(second)
    monkeypatch.setenv("BLOCKFORGE_CACHE", str(tmp_path / "cache-second"))
    outcome = run_search(path, out=uri, resume=True, progress_every_s=100)
    assert sorted(r.status for r in outcome.records) == sorted(r.status for r in local.records)
    for name, data in finished.items():  # finished trials were not trained again
        assert storage.read_bytes(name) == data
    attempts = [json.loads(line) for line in storage.read_bytes(f"trials/{run}/attempts.jsonl").decode().splitlines()]
    assert [a["start_step"] for a in attempts] == [0, step] and step > 0  # the interrupted trial went on from its checkpoint
    assert not any(second.iterdir())
    assert Storage.open(uri).working_copy().is_relative_to(tmp_path / "cache-second")
    assert comparable(fetch_folder(storage, "compare"), uri) == comparable(tmp_path / "local", str(tmp_path / "local"))


@pytest.mark.parametrize("out,needle", [
    ("az://container/x", "no filesystem for az:// is installed"),
    ("nosuchfs://x/y", "no filesystem for nosuchfs:// is available"),
    ("memory://x/y", "lives inside one process"),
])
def test_a_uri_whose_filesystem_is_missing_is_refused_by_name(tmp_path, capsys, monkeypatch, out, needle):
    monkeypatch.chdir(tmp_path)
    path = _search(tmp_path)
    assert main(["search", str(path), "--out", out]) == 2
    err = capsys.readouterr().err
    assert needle in err and out in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not any(p.name.endswith(":") for p in tmp_path.iterdir())  # never a local folder named after the scheme


def test_a_missing_bucket_is_one_sentence_before_anything_is_written(tmp_path, capsys, s3, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = _search(tmp_path)
    assert main(["search", str(path), "--out", "s3://no-such-bucket/x"]) == 2
    err = capsys.readouterr().err
    assert "bucket 'no-such-bucket' does not exist" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not any(p.name.endswith(":") for p in tmp_path.iterdir())  # never a local folder named after the scheme


@pytest.mark.slow  # the storage's client tries three times over ~6 s before it gives up
def test_an_unreachable_endpoint_is_one_sentence_before_anything_is_written(tmp_path, capsys, s3, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = _search(tmp_path)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    assert main(["search", str(path), "--out", f"s3://{s3.bucket()}/x"]) == 2
    err = capsys.readouterr().err
    assert "cannot be reached at http://127.0.0.1:1" in err and "AWS_ENDPOINT_URL" in err and len(err.strip().splitlines()) == 1
    assert not any(p.name.endswith(":") for p in tmp_path.iterdir())  # never a local folder named after the scheme


@pytest.fixture(scope="module")
def guarded():
    """A second server that checks credentials: (port, {"writer": env, "reader": env}) for its bucket `guarded`."""
    from s3_server import authenticated_server

    server, port, users = authenticated_server()
    yield port, users
    server.terminate()
    server.wait(timeout=10)


def test_read_only_credentials_are_one_sentence(tmp_path, capsys, monkeypatch, guarded):
    port, users = guarded
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.chdir(tmp_path)
    for key, value in users["writer"].items():
        monkeypatch.setenv(key, value)
    Storage.open("s3://guarded/ok").check()  # the writer may
    for key, value in users["reader"].items():
        monkeypatch.setenv(key, value)
    with pytest.raises(StorageError, match="cannot write .*access was refused.*may read and write there"):
        Storage.open("s3://guarded/x").check()
    assert main(["search", str(_search(tmp_path)), "--out", "s3://guarded/x"]) == 2
    err = capsys.readouterr().err
    assert "s3://guarded/x: cannot write" in err and "access was refused" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow  # the server answers an unsigned request with an error the storage's client tries three times
def test_missing_credentials_are_one_sentence(tmp_path, capsys, monkeypatch, guarded):
    port, _ = guarded
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.chdir(tmp_path)
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.aws either
    assert main(["search", str(_search(tmp_path)), "--out", "s3://guarded/x"]) == 2
    err = capsys.readouterr().err
    assert "no credentials were found" in err and "AWS_ACCESS_KEY_ID" in err and len(err.strip().splitlines()) == 1


def test_a_local_path_and_file_uri_are_the_same_folder(tmp_path):
    assert Storage.open(tmp_path / "x") == Storage.open(f"file://{tmp_path}/x")
    assert Storage.open(tmp_path / "x").local and not Storage.open("s3://b/x").local
    with pytest.raises(BlockforgeError):
        Storage.open("memory://x")
