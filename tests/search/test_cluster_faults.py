"""What a cluster's faults leave behind, without a cluster: failures for a cause outside a trial are trained again on
resume and one of its own is a sentence; a search that finished nothing says so; the resume line says where the search
ran; a trial recorded twice is one curve in its cell's rungs; URIs that are no search folder are refused by name; one
driver per search in a storage."""

import os
import time

import pytest

from blockforge.errors import BlockforgeError, FolderInUseError
from blockforge.search.config import OBJECTIVE, load_search
from blockforge.search.records.ledger import Ledger
from blockforge.search.run.searcher import CellSearcher
from blockforge.search.stages.base import FAILURE
from blockforge.storage import LEASE_STALE_S, Lease, Storage

from .conftest import write_search


def _one_cell(tmp_path, **changes):
    settings = dict(cells={"model.depth": [2]}, space={"model.layers.mix_ln.alpha": {"choice": [0.0, 0.5]}}, baselines=[],
                    trials_per_cell=2, scheduler=None, sampler={"grid": {}})
    settings.update(changes)
    return load_search(write_search(tmp_path, **settings))


def test_a_failure_outside_the_trial_is_trained_again_on_resume_and_one_of_its_own_is_a_sentence(tmp_path):
    plan = _one_cell(tmp_path)
    searcher = CellSearcher(plan, str(tmp_path / "s"))
    first, second = searcher.suggest("t0"), searcher.suggest("t1")
    searcher.on_trial_complete("t0", {}, error=True)  # its node was lost, Tune's retries too: a Tune ERROR
    searcher.on_trial_complete("t1", {FAILURE: "data.path: 'gone.txt' is not a file; check the path", OBJECTIVE: plan.penalty})
    ledger = Ledger(tmp_path / "s" / "trials.jsonl")
    records = {r.trial: r for r in ledger.records()}
    lost, own = records[first["number"]], records[second["number"]]
    assert lost.status == own.status == "failed"
    assert lost.retry and "its process or node was lost" in lost.note
    assert not own.retry and own.note == "data.path: 'gone.txt' is not a file; check the path"

    again = ledger.retry_failed()  # what --resume does before it rebuilds the search from its ledger
    assert [r.trial for r in again] == [first["number"]] and again[0].status == "interrupted"
    resumed = CellSearcher(plan, str(tmp_path / "s"), from_ledger=True)
    config = resumed.suggest("t2")
    assert config["number"] == first["number"] and config["identity"] == first["identity"]  # trained again, under its number
    resumed.on_trial_complete("t2", {OBJECTIVE: 5.0, "val_loss": 5.0, "step": plan.settings["depth=2"].steps})
    latest = {r.trial: r for r in Ledger(tmp_path / "s" / "trials.jsonl").records()}
    assert latest[first["number"]].status == "completed" and latest[second["number"]].status == "failed"


def test_a_search_that_finished_nothing_says_so_and_how_to_go_on():
    from blockforge.search.records.ledger import TrialRecord
    from blockforge.search.run.driver import SearchOutcome, nothing_finished

    def outcome(*records):
        return SearchOutcome(None, list(records), "", resume_command="blockforge search s.yaml --out s3://b/x --address auto --resume")

    lost = TrialRecord(cell="depth=2", trial=0, status="failed", note="its process or node was lost", retry=True)
    own = TrialRecord(cell="depth=2", trial=1, status="failed", note="data.path: 'gone.txt' is not a file")
    done = TrialRecord(cell="depth=2", trial=2, status="completed", value=5.0)
    said = nothing_finished(outcome(lost, own))
    assert said.startswith("no trial of the search finished: 2 failed (trial 0 of depth=2: its process or node was lost)")
    assert "--address auto --resume" in said
    assert "start it in another --out" in nothing_finished(outcome(own))
    assert nothing_finished(outcome(lost, done)) is None and nothing_finished(outcome()) is None


def test_the_resume_line_says_where_and_how_the_search_ran():
    from blockforge.search.run.driver import resume_command

    line = resume_command("s.yaml", "s3://b/x", [("train.lr", 0.003)], "10.0.0.1:6379", 8)
    assert line == "blockforge search s.yaml --set train.lr=0.003 --out s3://b/x --address 10.0.0.1:6379 --max-concurrent 8 --resume"
    assert resume_command("s.yaml", "runs/x", None) == "blockforge search s.yaml --out runs/x --resume"


def test_a_trial_recorded_twice_is_one_curve_in_its_cells_rungs(tmp_path):
    """On resume a trial that finished while the driver stopped is read back from its run folder into the rungs, and the
    trial Tune restarts reports the same end again: the rung table counts it once."""
    import json

    from blockforge.search.config import trial_dir
    from blockforge.search.run.scheduler import CellScheduler

    plan = load_search(write_search(tmp_path, cells={"model.depth": [4]}, trials_per_cell=4, baselines=[]))
    scheduler = CellScheduler(plan, str(tmp_path / "s"))
    table = scheduler.table("depth=4")

    class Trial:
        def __init__(self, number, seed=0):
            self.config = {"cell": "depth=4", "number": number, "identity": f"id{number}", "model": f"m{number}", "stage": "explore",
                           "steps": 30, "overrides": [["train.seed", seed]], "early_stop": True}

    for number, curve in enumerate(({10: 6.0, 20: 5.0, 30: 4.0}, {10: 5.5, 20: 5.2, 30: 4.5}, {10: 5.8, 20: 4.9, 30: 4.2})):
        run = trial_dir(tmp_path / "s", "depth=4", f"id{number}")
        run.mkdir(parents=True, exist_ok=True)
        (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "event": "eval", "val_loss": v}) + "\n" for s, v in curve.items()))
        scheduler.on_trial_complete(None, Trial(number), {"val_loss": curve[30], OBJECTIVE: curve[30], "step": 30})
    before = [table.agreement(rung) for rung in table.rungs]
    scheduler.on_trial_complete(None, Trial(2), {"val_loss": 4.2, OBJECTIVE: 4.2, "step": 30})  # the same trial, reported again
    assert [table.agreement(rung) for rung in table.rungs] == before and table.curves == 3
    assert before[0][1] == 3  # three curves: three pairs


@pytest.mark.parametrize("out,needle", [
    ("s3://", "names no bucket"),
    ("s3:///x", "names no bucket"),
    ("s3://b/../../x", "may hold no empty part, '.' or '..'"),
    ("s3://b//x", "may hold no empty part"),
    ("s3://b/x#y", "holds a '#' part"),
    ("s3:relative", "starts like a URI (s3://) but has no '//'"),
    ("gs:bucket/x", "starts like a URI (gs://) but has no '//'"),
    ("file://host/x", "names the host 'host'"),
    ("s3://b/x?foo=bar", "cannot be opened (Unexpected query parameter in S3 URI: 'foo'); fix the URI"),
    ("az://container/x", "az://container/x: no filesystem for az:// is installed"),
    ("nosuchfs://x/y", "nosuchfs://x/y: no filesystem for nosuchfs:// is available"),
    ("memory://x/y", "lives inside one process"),
])
def test_an_out_that_is_no_search_folder_is_refused_by_name_before_anything_is_written(tmp_path, monkeypatch, capsys, out, needle):
    from blockforge.cli import main

    monkeypatch.chdir(tmp_path)
    path = write_search(tmp_path)
    assert main(["search", str(path), "--out", out]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not [p for p in tmp_path.iterdir() if ":" in p.name or p.name in ("host", "x")]  # no local folder named after it


def test_a_uri_s_scheme_is_read_in_any_case_and_a_file_uri_of_this_machine_is_its_path(tmp_path):
    assert Storage.open("S3://bucket/x").uri == "s3://bucket/x"
    assert Storage.open(f"file://localhost{tmp_path}/x") == Storage.open(tmp_path / "x") == Storage.open(f"file://{tmp_path}/x")


def test_one_driver_holds_a_search_in_a_storage(tmp_path, s3):
    """A second driver of the same search, on whatever machine, is refused naming the first; a lease its holder left when
    it died is taken over at once on its host, and elsewhere once it lapses."""
    import json
    import socket

    storage = Storage.open(s3.direct(s3.bucket(), "search"))
    first = Lease(storage, "search.lease", "running this search").take()
    try:
        with pytest.raises(FolderInUseError, match=f"is in use by process {os.getpid()} on {socket.gethostname()}, which is running this search"):
            Lease(storage, "search.lease", "running this search").take()
    finally:
        first.release()
    assert storage.read_bytes("search.lease") is None
    for holder, lapsed in (({"pid": 2**22 + 7, "host": socket.gethostname()}, False),  # a process of this host that is gone
                           ({"pid": 1, "host": "another-machine"}, True)):  # another machine's, not renewed for long
        renewed = time.time() - (LEASE_STALE_S + 1 if lapsed else 0)
        storage.write_bytes("search.lease", json.dumps({**holder, "token": "theirs", "renewed": renewed}).encode())
        taken = Lease(storage, "search.lease", "running this search").take()
        taken.release()
    storage.write_bytes("search.lease", json.dumps({"pid": 1, "host": "another-machine", "token": "theirs", "renewed": time.time()}).encode())
    with pytest.raises(FolderInUseError, match="process 1 on another-machine"):
        Lease(storage, "search.lease", "running this search").take()


def test_a_damaged_record_of_a_remote_search_is_named_in_the_storage_not_the_working_copy(tmp_path, s3, monkeypatch, capsys):
    from blockforge.cli import main
    from blockforge.search.records.store import SearchStore

    monkeypatch.chdir(tmp_path)
    uri = s3.direct(s3.bucket(), "search")
    storage = Storage.open(uri)
    storage.write_bytes("search.json", b"{not json")
    local = str(storage.working_copy())
    err = BlockforgeError(f"{local}/search.json: is not valid JSON; start the search again")
    assert str(SearchStore.located(err, storage)) == f"{uri}/search.json: is not valid JSON; start the search again"
    assert main(["search", str(write_search(tmp_path)), "--out", uri, "--resume"]) == 2
    said = capsys.readouterr().err
    assert f"{uri}/search.json" in said and local not in said and len(said.strip().splitlines()) == 1, said


def test_a_lease_that_cannot_be_dated_is_watched_then_taken_over_or_refused_never_a_traceback(tmp_path, monkeypatch, capsys):
    """A search.lease damaged or edited (renewed as a string, null, NaN or far in the future; no holder; not JSON) neither
    raises Python's error nor blocks for ever: left as it is for two renewal periods, it is taken over with one warning;
    rewritten meanwhile, something holds it and the taker is refused. A lease dated a little ahead (another host's clock)
    is a live one; a holder whose lease is overwritten with damage stops writing with a sentence."""
    import json
    import math
    import socket

    from blockforge import storage as storage_module

    real_sleep, renewal = time.sleep, {}
    monkeypatch.setattr(storage_module, "LEASE_RENEW_S", 0.05)
    monkeypatch.setattr(time, "sleep", lambda seconds: renewal.pop("then", lambda: None)() or real_sleep(min(seconds, 0.01)))
    storage = Storage.open(tmp_path / "search")
    holder = {"pid": 1, "host": "another-machine", "token": "theirs"}
    undated = [(json.dumps({**holder, "renewed": "yesterday"}), 'renewed at "yesterday", which is no time'),
               (json.dumps({**holder, "renewed": None}), "renewed at null, which is no time"),
               (json.dumps({**holder, "renewed": math.nan}), "renewed at NaN, which is no time"),
               (json.dumps({**holder, "renewed": time.time() + 10**6}), "renewed 1000000 s in the future"),
               (json.dumps({"renewed": time.time()}), "names no holder"),
               ("{cut sh", "is not JSON")]
    for raw, says in undated:
        storage.write_bytes("search.lease", raw.encode())
        Lease(storage, "search.lease", "running this search").take().release()
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err and "unless a process renews it meanwhile, this one takes it over" in err, err
    # renewed while watched: a process holds it, however odd its record
    for renewed_to, names in ((json.dumps({**holder, "renewed": time.time() + 10**6 + 30}), "or by a process that rewrites its lease"),
                              (json.dumps({**holder, "renewed": time.time()}), "its lease was renewed 0 s ago")):
        storage.write_bytes("search.lease", undated[3][0].encode())
        renewal["then"] = lambda: storage.write_bytes("search.lease", renewed_to.encode())
        with pytest.raises(FolderInUseError, match=f"in use by process 1 on another-machine.*{names}"):
            Lease(storage, "search.lease", "running this search").take()
    # a little ahead: another host's clock, alive
    storage.write_bytes("search.lease", json.dumps({**holder, "renewed": time.time() + 30}).encode())
    with pytest.raises(FolderInUseError, match="renewed 0 s ago"):
        Lease(storage, "search.lease", "running this search").take()
    storage.delete("search.lease")
    monkeypatch.setattr(storage_module, "LEASE_RENEW_S", 30.0)  # no renewal of its own between the damage and the check
    mine = Lease(storage, "search.lease", "running this search").take()
    storage.write_bytes("search.lease", json.dumps({"host": socket.gethostname(), "renewed": []}).encode())
    with pytest.raises(FolderInUseError, match=r"in use by process \? on .*renewed at \[\], which is no time"):
        mine.check()
    mine.release()
    capsys.readouterr()
