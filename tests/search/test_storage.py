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
from report_compare import comparable

from blockforge.cli import main
from blockforge.errors import BlockforgeError
from blockforge.search.run.driver import run_search
from blockforge.storage import Storage, StorageError, fetch_folder

from .conftest import write_search


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
    from blockforge.search.records.ledger import Ledger
    from blockforge.search.records.store import SearchStore
    from blockforge.search.reports.report import write_reports
    from blockforge.search.run.scheduler import CellScheduler
    from blockforge.search.run.searcher import CellSearcher

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
        write_reports(store.local, plan, Ledger(store.local / "trials.jsonl"), location=str(where))
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


class _CutShort:
    """A filesystem whose reads break off `times` times, as a service's response cut short, before they succeed."""

    def __init__(self, fs, times: int, error: str):
        self.fs, self.times, self.error, self.tries = fs, times, error, 0

    def open_input_stream(self, path):
        self.tries += 1
        if self.tries <= self.times:
            raise OSError(self.error)
        return self.fs.open_input_stream(path)


@pytest.mark.parametrize("times,error,read", [
    (2, "AWS Error INTERNAL_FAILURE during GetObject operation: Failed to flush response stream (eof: 0, bad: 1)", True),
    (1, "When reading information for key 'x': AWS Error SLOW_DOWN during HeadObject operation: Please reduce your request rate", True),
    (3, "AWS Error INTERNAL_FAILURE during GetObject operation: We encountered an internal error", False),  # a fourth try: no
    (1, "AWS Error ACCESS_DENIED during GetObject operation: Access Denied", False),  # not passing: said at once
])
def test_a_read_cut_short_is_read_again_and_a_lasting_failure_is_one_sentence(tmp_path, monkeypatch, times, error, read):
    import blockforge.storage as storage_module

    monkeypatch.setattr(storage_module.time, "sleep", lambda s: None)
    storage = Storage.open(tmp_path / "s")
    storage.write_bytes("a.json", b"{}")
    fs, root = storage._resolved
    for how in ("read_bytes", "download"):
        cut = _CutShort(fs, times, error)
        storage.__dict__["_resolved"] = (cut, root)
        try:
            if read:
                got = storage.read_bytes("a.json") if how == "read_bytes" else storage.download("a.json", tmp_path / "a.json")
                assert got == b"{}" if how == "read_bytes" else (tmp_path / "a.json").read_bytes() == b"{}"
                assert cut.tries == times + 1
            else:
                with pytest.raises(StorageError, match=r"cannot read a.json \((AWS Error INTERNAL_FAILURE|access was refused)"):
                    getattr(storage, how)(*(["a.json"] if how == "read_bytes" else ["a.json", tmp_path / "b.json"]))
                assert cut.tries == min(times, 3) and not (tmp_path / "b.json").exists()
        finally:
            storage.__dict__["_resolved"] = (fs, root)


def test_a_local_path_and_file_uri_are_the_same_folder(tmp_path):
    assert Storage.open(tmp_path / "x") == Storage.open(f"file://{tmp_path}/x")
    assert Storage.open(tmp_path / "x").local and not Storage.open("s3://b/x").local
    with pytest.raises(BlockforgeError):
        Storage.open("memory://x")


@pytest.mark.slow
def test_storage_that_disappears_mid_search_stops_it_as_a_full_disk_does_and_it_resumes(tmp_path, ray_session, s3, monkeypatch):
    import threading

    from blockforge.errors import WriteError

    path = _search(tmp_path, alphas=(0.0, 0.5, 1.0))
    uri = f"s3://{s3.bucket()}/search"
    storage = Storage.open(uri)
    cut = {}

    def cut_mid_search():
        try:
            cut["at"] = _wait_for_a_checkpoint(storage, 240)
        finally:
            s3.proxy.cut()

    watcher = threading.Thread(target=cut_mid_search)
    watcher.start()
    try:
        with pytest.raises(WriteError) as stopped:
            run_search(path, out=uri, progress_every_s=100)
    finally:
        watcher.join()
        s3.proxy.restore()
    said = str(stopped.value)
    assert said.startswith(f"{uri}") and "cannot be reached" in said and "resume with: blockforge search" in said and "--resume" in said
    assert "free space" not in said and "\n" not in said
    finished = {n: storage.read_bytes(f"trials/{n}") for n in storage.listing("trials") if n.endswith("/result.json")}
    assert finished  # the first trial had finished

    outcome = run_search(path, out=uri, resume=True, progress_every_s=100)
    assert sorted(r.status for r in outcome.records) == ["completed"] * 3
    for name, data in finished.items():  # nothing finished is trained again
        assert storage.read_bytes(f"trials/{name}") == data
    run = cut["at"][0]
    starts = [json.loads(line)["start_step"] for line in storage.read_bytes(f"trials/{run}/attempts.jsonl").decode().splitlines()]
    assert starts[0] == 0 and starts[-1] > 0  # the trial in flight went on from a checkpoint it had put up


def test_a_mirror_puts_pointers_after_what_they_name_removes_what_is_gone_and_leaves_temporaries_alone(tmp_path, s3, monkeypatch):
    from blockforge.storage import Mirror

    storage = Storage.open(s3.direct(s3.bucket(), "run"))
    local = tmp_path / "run"
    for name in ("result.json", "checkpoints/latest.json", "checkpoints/step-00000010/model.safetensors", "metrics.jsonl",
                 "run.lock", ".metrics.jsonl.x1.tmp", "checkpoints/.partial-step-00000020/model.safetensors"):
        (local / name).parent.mkdir(parents=True, exist_ok=True)
        (local / name).write_text(name)
    uploaded = []
    monkeypatch.setattr(Storage, "upload", lambda self, path, rel, up=Storage.upload: (uploaded.append(rel), up(self, path, rel)))
    mirror = Mirror(storage, "", local, last=("checkpoints/latest.json", "result.json"))
    mirror.push()
    assert uploaded == ["checkpoints/step-00000010/model.safetensors", "metrics.jsonl", "checkpoints/latest.json", "result.json"]
    assert mirror.push() == []  # nothing changed since
    (local / "checkpoints/step-00000010/model.safetensors").unlink()  # an old checkpoint pruned here goes there too
    (local / "metrics.jsonl").write_text("longer now")
    assert mirror.push() == ["metrics.jsonl"]
    assert set(storage.listing()) == {"result.json", "checkpoints/latest.json", "metrics.jsonl"}
    storage.write_bytes("attempt.lock", b"someone")  # a storage's own lease is neither taken down nor removed
    elsewhere = Mirror(storage, "", tmp_path / "node")
    assert sorted(elsewhere.pull()) == ["checkpoints/latest.json", "metrics.jsonl", "result.json"]
    assert elsewhere.pull() == [] and (tmp_path / "node" / "metrics.jsonl").read_text() == "longer now"
    elsewhere.push()
    assert storage.read_bytes("attempt.lock") == b"someone"


def test_a_trial_that_a_newer_attempt_replaced_writes_nothing_more(tmp_path, s3, monkeypatch):
    from blockforge.search.records.store import Superseded, trial_folder

    storage = Storage.open(s3.direct(s3.bucket(), "search"))
    monkeypatch.setenv("BLOCKFORGE_CACHE", str(tmp_path / "node-a"))
    with trial_folder(storage, "depth=2", "abc") as (old, old_mirror):
        (old / "metrics.jsonl").write_text("1\n")
        old_mirror.push()
        monkeypatch.setenv("BLOCKFORGE_CACHE", str(tmp_path / "node-b"))  # the search resumed, the trial started again elsewhere
        with trial_folder(storage, "depth=2", "abc") as (new, new_mirror):
            assert (new / "metrics.jsonl").read_text() == "1\n" and new != old  # it starts from what the storage holds
            (old / "metrics.jsonl").write_text("1\n2 from the old attempt\n")
            with pytest.raises(Superseded):
                old_mirror.push()
            (new / "metrics.jsonl").write_text("1\n2\n")
            new_mirror.push()
    assert storage.read_bytes("trials/depth=2/abc/metrics.jsonl") == b"1\n2\n"


@pytest.mark.slow
def test_a_finished_trial_whose_record_and_result_were_both_lost_is_taken_up_from_its_run(tmp_path, ray_session):
    path = _search(tmp_path, alphas=(0.5,))
    out = tmp_path / "out"
    first = run_search(path, out=out, progress_every_s=100)
    (done,) = [r for r in first.records if r.status == "completed"]
    for name in ("trials.jsonl", "trials.backup.jsonl"):  # both copies lost its completion
        lines = (out / name).read_text().splitlines()
        (out / name).write_text("".join(line + "\n" for line in lines if json.loads(line)["status"] != "completed"))
    result = Path(done.run_dir) / "result.json"
    result.write_text(result.read_text()[:10])  # and its result file was cut short
    again = run_search(path, out=out, resume=True, progress_every_s=100)
    (record,) = [r for r in again.records if r.status == "completed"]
    assert record.value == done.value and record.steps == done.steps
    assert len((Path(done.run_dir) / "attempts.jsonl").read_text().splitlines()) == 1  # read from its run: nothing trained again
    assert json.loads(result.read_text())["status"] == "completed"  # and its result written again


@pytest.mark.slow  # the storage's client tries three times over ~6 s before it gives up
def test_a_preparation_into_a_storage_that_goes_away_publishes_nothing_and_a_rerun_continues(tmp_path, s3, monkeypatch):
    """The storage is cut after two parts: one sentence, no manifest; back again, the same preparation goes on from the
    parts recorded there (its lease, which it could not remove, is taken over: its process is gone from this host)."""
    import yaml
    from tiny_data import tiny_recipe

    from blockforge.data import prepare as prepare_module
    from blockforge.data.prepare import prepare, request_for
    from blockforge.spec import load_recipe

    (tmp_path / "r.yaml").write_text(yaml.safe_dump(tiny_recipe(tmp_path)))
    request = request_for(load_recipe(tmp_path / "r.yaml"))
    where = f"s3://{s3.bucket()}/sets/tiny"
    monkeypatch.setattr(prepare_module, "PART_CHARS", 20_000)
    real, done = prepare_module.run_part, []

    def cut_after_two(part, job, texts=None):
        if len(done) == 2:
            s3.proxy.cut()
        record = real(part, job, texts)
        done.append(record["part"])
        return record

    monkeypatch.setattr(prepare_module, "run_part", cut_after_two)
    try:
        with pytest.raises(StorageError, match=f"^{where}: cannot .*the storage cannot be reached"):
            prepare(request, where, progress=False)
    finally:
        s3.proxy.restore()
    storage = Storage.open(where)
    assert storage.read_bytes("manifest.json") is None and len([n for n in storage.listing("parts") if n.endswith(".json")]) == 2
    monkeypatch.setattr(prepare_module, "run_part", real)
    outcome = prepare(request, where, progress=False)
    assert outcome.parts_resumed == 2 and outcome.parts_done >= 1 and storage.read_bytes("manifest.json") is not None
    whole = prepare(request, tmp_path / "whole", progress=False)
    assert outcome.manifest.splits == whole.manifest.splits  # the same shards, byte for byte


def test_a_second_preparation_of_a_storage_folder_is_refused_while_the_first_holds_its_lease(tmp_path, s3):
    import yaml
    from tiny_data import tiny_recipe

    from blockforge.data.prepare import LEASE, prepare, request_for
    from blockforge.errors import FolderInUseError
    from blockforge.spec import load_recipe
    from blockforge.storage import Lease

    (tmp_path / "r.yaml").write_text(yaml.safe_dump(tiny_recipe(tmp_path)))
    where = s3.direct(s3.bucket(), "sets/tiny")
    storage = Storage.open(where)
    held = Lease(storage, LEASE, "preparing a data set in it").take()
    try:
        with pytest.raises(FolderInUseError, match=f"is in use by process {os.getpid()} on .*, which is preparing a data set in it .its "
                                                   r"lease was renewed \d+ s ago.; wait for it to end"):
            prepare(request_for(load_recipe(tmp_path / "r.yaml")), where, progress=False)
    finally:
        held.release()
    assert storage.read_bytes("prepare.lease") is None and storage.read_bytes("manifest.json") is None
    assert prepare(request_for(load_recipe(tmp_path / "r.yaml")), where, progress=False).manifest.splits["train"].tokens > 0


@pytest.mark.slow
@pytest.mark.parametrize("lost", ["the trials' folders", "every object of the search"])
def test_a_storage_that_loses_a_running_trials_files_stops_the_search_in_one_sentence(tmp_path, s3, lost):
    """Someone (a lifecycle rule, a person) removes the search's objects while a trial trains: the driver stops with one
    sentence saying the storage lost that trial's files, never a traceback, never a finished summary."""
    path = write_search(tmp_path, cells={"model.depth": [3]}, trials_per_cell=2, scheduler=None, baselines=[], max_concurrent=1,
                        space={"model.layers.mix_ln.alpha": {"choice": [0.0, 0.5]}}, sampler={"grid": {}},
                        overrides={"train.steps": 80, "train.checkpoint_every": 10, "train.eval_every": 10})
    uri = f"s3://{s3.bucket()}/lost"
    storage = Storage.open(uri)
    proc = subprocess.Popen([sys.executable, "-m", "blockforge", "search", str(path), "--out", uri], cwd=tmp_path,
                            env=dict(os.environ, BLOCKFORGE_CACHE=str(tmp_path / "cache")), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.time() + 1800  # a guard against a hang, not a speed limit
    while time.time() < deadline and not any(n.endswith("state.json") for n in storage.listing("trials")):
        time.sleep(0.2)
    for name in storage.listing("trials" if lost == "the trials' folders" else ""):
        storage.delete(f"trials/{name}" if lost == "the trials' folders" else name)
    _, err = proc.communicate(timeout=400)
    lines = err.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "the storage lost this trial's files while it trained" in lines[0] and "--resume" in lines[0], lines[0]


@pytest.mark.slow  # the storage's client tries three times over ~6 s before it gives up
def test_a_failing_endpoint_in_the_uri_is_named_as_the_uris(tmp_path, capsys, s3, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = f"s3://{s3.bucket()}/x?endpoint_override=127.0.0.1:1&scheme=http"
    assert main(["search", str(_search(tmp_path)), "--out", out]) == 2
    err = capsys.readouterr().err
    assert "cannot be reached at 127.0.0.1:1" in err and "the URI's endpoint_override" in err and "AWS_ENDPOINT_URL" not in err, err
    assert len(err.strip().splitlines()) == 1


def test_a_run_whose_curve_changed_keeps_one_tensorboard_file_in_the_storage(tmp_path, s3):
    """A trial resumed after a stop rewrites its run's event file whole under a new name: the storage keeps only the new
    one, so TensorBoard shows each step once."""
    from blockforge.search.config import load_search
    from blockforge.search.records.ledger import Ledger
    from blockforge.search.reports.report import write_reports

    from .test_api import quickstart
    from .test_golden import ROOT

    uri = s3.direct(s3.bucket(), "qs")
    plan, store = quickstart(uri, tmp_path / "node", plan=load_search(ROOT / "searches" / "quickstart.yaml", [("cells.model.depth", [4])]))
    events = lambda: sorted(n for n in store.storage.listing("tensorboard") if "events.out.tfevents" in n)  # noqa: E731
    before = events()
    record = next(r for r in Ledger(store.local / "trials.jsonl").records() if r.status == "completed")
    with open(Path(record.run_dir) / "metrics.jsonl", "a") as f:  # its curve as the resumed trial leaves it: one step more
        f.write(json.dumps({"step": record.steps + 1, "event": "train", "loss": 1.0}) + "\n")
    time.sleep(1.1)  # an event file's name carries the second it was written in
    write_reports(store.local, plan, Ledger(store.local / "trials.jsonl"), location=uri)
    store.put_reports()
    after = events()
    assert len(after) == len(before) and len(set(after) - set(before)) == 1  # the changed run's file replaced, every other kept
    folders = [name.rsplit("/", 1)[0] for name in after]
    assert len(folders) == len(set(folders))  # one event file per run
