"""Hostile search inputs: each bad search file or flag is one sentence on stderr naming the file (or the
flag) and the key path, exit status 2, within seconds, before any trial, and leaves no search.json."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from blockforge.cli import main
from blockforge.search.config import load_search
from blockforge.search.preflight import check_nodes

from .conftest import write_search

ALPHA = "model.layers.mix_ln.alpha"
LR = "train.lr"


def alpha_space(dist):
    return {"space": {ALPHA: dist}, "baselines": []}


CASES = {
    # finite numbers
    "uniform bound .inf": (alpha_space({"uniform": [0.0, float("inf")]}), [], f"space.{ALPHA}.uniform"),
    "loguniform bound .nan": ({"space": {ALPHA: {"uniform": [0.0, 0.5]}, LR: {"loguniform": [float("nan"), 0.01]}}, "baselines": []}, [],
                              f"space.{LR}.loguniform"),
    "choice lists .inf": ({"space": {ALPHA: {"uniform": [0.0, 0.5]}, LR: {"choice": [0.001, float("inf")]}}, "baselines": []}, [],
                          f"space.{LR}.choice"),
    "penalty .nan": ({"divergence": {"max_loss": 20.0, "penalty": float("nan")}}, [], "divergence.penalty"),
    "max_loss .inf": ({"divergence": {"max_loss": float("inf")}}, [], "divergence.max_loss"),
    # signs and ranges
    "max_loss negative": ({"divergence": {"max_loss": -1.0}}, [], "divergence.max_loss"),
    "max_concurrent 0": ({"max_concurrent": 0}, [], "max_concurrent"),
    "max_concurrent negative": ({"max_concurrent": -3}, [], "max_concurrent"),
    "--max-concurrent -1": ({}, ["--max-concurrent", "-1"], "--max-concurrent"),
    "--max-concurrent 0": ({}, ["--max-concurrent", "0"], "--max-concurrent"),
    "startup_trials negative": ({"sampler": {"tpe": {"seed": 0, "startup_trials": -1}}}, [], "sampler.tpe.startup_trials"),
    "sampler seed negative": ({"sampler": {"random": {"seed": -5}}}, [], "sampler.random.seed"),
    "trials_per_cell 0": ({"trials_per_cell": 0}, [], "trials_per_cell"),
    "steps 0": ({"steps": 0}, [], "steps"),
    "cpu 0": ({"resources": {"cpu": 0}}, [], "resources.cpu"),
    "gpu 1.5": ({"resources": {"cpu": 1, "gpu": 1.5}}, [], "resources.gpu"),
    "more workers than cpus": ({"resources": {"cpu": 1, "workers": 4}}, [], "resources.workers"),
    # Mix-LN alpha inside [0, 1]
    "alpha uniform above 1": (alpha_space({"uniform": [0.0, 1.5]}), [], f"space.{ALPHA}.uniform"),
    "alpha choice above 1": (alpha_space({"choice": [0.0, 2.0]}), [], f"space.{ALPHA}.choice"),
    "alpha grid below 0": ({**alpha_space({"grid": [-0.5, 0.5]}), "sampler": {"grid": {}}}, [], f"space.{ALPHA}.grid"),
    "alpha baseline above 1": ({"baselines": [{ALPHA: 1.5}]}, [], f"baselines[0].{ALPHA}"),
    # baselines are points of the space
    "baseline outside the range": ({"baselines": [{ALPHA: 0.0}, {ALPHA: 0.9}]}, [], f"baselines[1].{ALPHA}"),
    "baseline not a listed choice": ({"space": {ALPHA: {"choice": [0.0, 0.25, 0.5]}}, "baselines": [{ALPHA: 0.3}]}, [], f"baselines[0].{ALPHA}"),
    "baseline sets an unsearched key": ({"baselines": [{ALPHA: 0.0, LR: 0.01}]}, [], f"baselines[0].{LR}"),
    # every searched value builds a model somewhere, and every cell has a value that builds
    "choice values of the wrong type": ({"space": {ALPHA: {"uniform": [0.0, 0.5]}, LR: {"choice": ["fast", "slow"]}}, "baselines": []}, [],
                                        f"space.{LR}.choice"),
    "a cell where no value builds": ({"cells": {"model.width": [36, 40, 44]}, "space": {"model.heads": {"choice": [9, 5]}}, "baselines": []}, [],
                                     "cell width=44"),
    # the transfer stage's targets are sizes of the cell keys the search does not search
    "transfer target with another key": ({"transfer": {"to": [{"model.width": 64}]}}, [], "transfer.to[0]"),
    "transfer target that is a proxy cell": ({"transfer": {"to": [{"model.depth": 4}]}}, [], "transfer.to[0]"),
    "transfer with one seed": ({"transfer": {"to": [{"model.depth": 8}], "seeds": 1}}, [], "transfer.seeds"),
    "transfer without alpha searched": ({"space": {LR: {"loguniform": [1e-3, 1e-2]}}, "baselines": [], "transfer": {"to": [{"model.depth": 8}]}}, [],
                                        "transfer"),
    "transfer target larger than the node": ({"cells": {"model.width": [32]}, "transfer": {"to": [{"model.width": 10**6}]}}, [], "width=1000000"),
    # the objective is something the family reports
    "val_acc on a llama search": ({"objective": {"metric": "val_acc"}}, [], "objective.metric"),
    # a key is fixed, varied by cells, or searched: one of these
    "searched and fixed": ({"overrides": {ALPHA: 0.25}}, [], f"space.{ALPHA}"),
    "searched and a cell": ({"cells": {"model.depth": [2], ALPHA: [0.0, 0.5]}}, [], f"space.{ALPHA}"),
    "a cell and fixed": ({"overrides": {"model.depth": 4}}, [], "cells.model.depth"),
    "searched and --set": ({}, ["--set", f"{ALPHA}=0.25"], f"space.{ALPHA}"),
    "searched under a fixed mapping": ({"overrides": {"model.layers.mix_ln": {"alpha": 0.5}}}, [], f"space.{ALPHA}"),
    "a cell listed twice": ({"cells": {"model.depth": [2, 2]}}, [], "cells.model.depth"),
    # the name is a folder name
    "name climbs out": ({"name": "../escape"}, [], "name"),
    "name with a slash": ({"name": "a/b"}, [], "name"),
    "name with a control character": ({"name": "a\x01b"}, [], "name"),
    "name empty": ({"name": ""}, [], "name"),
    # a tracker's project is a name: an empty one is said to be empty
    "tracking project blank": ({"tracking": {"report_to": ["wandb"], "project": "  "}}, [], "tracking.project: is empty; give a W&B project name"),
    "tracking entity empty": ({"tracking": {"entity": ""}}, [], "tracking.entity: is empty; give a W&B entity name"),
    # objectives and constraints: what a cost axis may say
    "objectives empty": ({"objective": None, "objectives": []}, [], "objectives"),
    "objectives not a list": ({"objective": None, "objectives": {"metric": "val_loss"}}, [], "objectives"),
    "an objective that is neither metric nor cost": ({"objective": None, "objectives": [{"metric": "val_loss"}, {}]}, [], "objectives[1]"),
    "a constraint bound .nan": ({"objective": None, "objectives": [{"metric": "val_loss"}, {"cost": "parameters"}],
                                 "constraints": {"parameters": {"max": float("nan")}}}, [], "constraints.parameters.max"),
    "a constraint no candidate meets": ({"objective": None, "objectives": [{"metric": "val_loss"}, {"cost": "parameters"}],
                                         "constraints": {"parameters": {"max": 10}}}, [], "constraints.parameters: no candidate meets max 10"),
    "a constraint with min above max": ({"objective": None, "objectives": [{"metric": "val_loss"}, {"cost": "parameters"}],
                                         "constraints": {"parameters": {"min": 10, "max": 5}}}, [], "constraints.parameters"),
    # the transfer stage's own settings
    "transfer neighbours negative": ({"transfer": {"to": [{"model.depth": 8}], "neighbours": -1}}, [], "transfer.neighbours"),
    "transfer with no target": ({"transfer": {"to": []}}, [], "transfer.to"),
    "transfer target with an unknown key": ({"transfer": {"to": [{"model.depht": 8}]}}, [], "transfer.to[0]"),
    # parametrizations and the newer per-layer fields, set through the search file
    "mup without a base width": ({"overrides": {"model.parametrization": "mup"}}, [], "base_width"),
    "a negative attention soft cap": ({"overrides": {"model.layers.default.attn_logit_softcap": -1.0}}, [], "attn_logit_softcap"),
    "a zero linear RoPE factor": ({"overrides": {"model.layers.default.rope_linear_factor": 0.0}}, [], "rope_linear_factor"),
    "an unknown qk_norm_over": ({"overrides": {"model.layers.default.qk_norm_over": "everything"}}, [], "qk_norm_over"),
    # what the cluster and the memory plan refuse
    "a width too large to lay out": ({"cells": {"model.width": [10**12]}}, [], "width=1000000000000"),
    "a model larger than the node": ({"cells": {"model.width": [10**6]}}, [], "width=1000000"),
    "more cpus than any node": ({"resources": {"cpu": 1000}}, [], "resources"),
    "more gpus than any node": ({"resources": {"cpu": 1, "gpu": 1000}}, [], "resources"),
    "--address that answers nothing": ({}, ["--address", "127.0.0.1:1"], "--address 127.0.0.1:1"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_search_input_is_one_sentence_before_any_trial(tmp_path, capsys, monkeypatch, ray_session, case):
    changes, flags, needle = CASES[case]
    path = write_search(tmp_path, **changes)
    out = tmp_path / "out"
    capsys.readouterr()

    def no_tune(*args, **kwargs):
        raise AssertionError("Ray Tune was started before the input was refused")

    monkeypatch.setattr("ray.tune.Tuner", no_tune)  # the refusal comes before any trial can run
    code = main(["search", str(path), "--out", str(out), *flags])
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == 2, (code, err, captured.out[-500:])
    assert "Traceback" not in err and 1 <= len(err.splitlines()) <= 6, err
    assert needle in err, err
    if not needle.startswith("--"):
        assert str(path) in err, err
    assert not (out / "search.json").exists()
    assert not (out / "trials.jsonl").exists()


HOLD_LOCK = """
import sys, time
from pathlib import Path
from blockforge.lock import RunLock
RunLock(Path(sys.argv[1]), "search.lock", "running a search in it").acquire()
print("held", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("resume", [False, True], ids=["a second start", "a second driver with --resume"])
def test_a_search_folder_has_one_driver(tmp_path, capsys, resume):
    """Whoever holds the folder's lock (the first of two drivers started together, or a running search), another
    driver is refused before it writes anything, --resume or not."""
    out = tmp_path / "out"
    out.mkdir()
    search = write_search(tmp_path)
    if resume:
        from blockforge.io import atomic_write_json
        from blockforge.search.config import folder_marker

        atomic_write_json(out / "search.json", folder_marker(load_search(search), []))
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = sorted(p.name for p in out.iterdir())
        code = main(["search", str(search), "--out", str(out)] + (["--resume"] if resume else []))
        err = capsys.readouterr().err
        assert code == 2 and "is in use by process" in err and "running a search in it" in err, err
        assert holder.poll() is None  # refused while the lock is held: it did not wait for the holder to let go
        assert sorted(p.name for p in out.iterdir()) == before  # nothing written beside the holder's lock
    finally:
        holder.kill()
        holder.wait()


def test_shipped_searches_pass_the_checks():
    for path in sorted(Path(__file__).resolve().parents[2].joinpath("searches").glob("*.yaml")):
        load_search(path)


@pytest.mark.slow
def test_a_failed_start_leaves_nothing_that_blocks_the_next_plain_run(tmp_path, capsys, ray_session):
    out = tmp_path / "out"
    bad = write_search(tmp_path, resources={"cpu": 1000})
    assert main(["search", str(bad), "--out", str(out)]) == 2
    good = write_search(tmp_path, cells={"model.depth": [2]}, trials_per_cell=1, baselines=[], scheduler=None,
                        overrides={"train.steps": 10, "train.eval_every": 10})
    capsys.readouterr()
    assert main(["search", str(good), "--out", str(out)]) == 0, capsys.readouterr().err
    assert (out / "search.json").exists()


def node(cpu=2.0, gpu=0.0, memory_gib=8.0, address="10.0.0.1", node_id="a"):
    return {"Alive": True, "NodeID": node_id, "NodeManagerAddress": address,
            "Resources": {"CPU": cpu, "GPU": gpu, "memory": memory_gib * 2**30}}


def test_resources_and_memory_are_compared_with_the_nodes(tmp_path):
    plan = load_search(write_search(tmp_path, resources={"cpu": 4, "gpu": 1}))
    needs = {"depth=2": 3 * 2**30, "depth=4": 5 * 2**30}
    with pytest.raises(Exception, match=r"resources: a trial asks for 4 CPU and 1 GPU.*10.0.0.1: 2 CPU, 0 GPU.*10.0.0.2: 8 CPU, 0 GPU"):
        check_nodes(plan, needs, [node(), node(cpu=8, address="10.0.0.2")], gpu_memory=None)
    gpu_node = node(cpu=8, gpu=2)
    check_nodes(plan, needs, [gpu_node], gpu_memory=None)  # GPU memory unknown: not refused
    check_nodes(plan, needs, [gpu_node], gpu_memory=6 * 2**30)
    with pytest.raises(Exception, match=r"cell depth=4: a trial needs about 5.0 GiB .* 4.0 GiB memory of one GPU"):
        check_nodes(plan, needs, [gpu_node], gpu_memory=4 * 2**30)
    cpu_plan = load_search(write_search(tmp_path, resources={"cpu": 2, "workers": 2}))
    # Two data-parallel processes hold a copy each: 2 x 5 GiB do not fit 8 GiB, on the node that has the CPUs.
    with pytest.raises(Exception, match=r"cell depth=4: a trial needs about 10.0 GiB \(2 processes\)"):
        check_nodes(cpu_plan, needs, [node(cpu=2, memory_gib=8), node(cpu=1, memory_gib=64)], gpu_memory=None)
    check_nodes(cpu_plan, needs, [node(cpu=2, memory_gib=16)], gpu_memory=None)


@pytest.mark.slow
def test_an_address_that_accepts_but_is_no_ray_is_given_up_on(tmp_path):
    """ray.init alone would wait for minutes; the driver gives up after its own join timeout and says so."""
    path = write_search(tmp_path)
    with socket.socket() as listener:  # accepts connections (the kernel does) and never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        done = subprocess.run([sys.executable, "-m", "blockforge", "search", str(path), "--out", str(tmp_path / "out"), "--address", address],
                              capture_output=True, text=True, timeout=120, env=dict(os.environ))
    err = done.stderr.strip()
    assert done.returncode == 2, err
    assert "no Ray cluster answered within" in err or "cannot join the Ray cluster" in err, err
    assert address in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "out" / "search.json").exists()


def test_a_baseline_inside_the_space_and_a_key_fixed_in_one_place_still_load(tmp_path):
    plan = load_search(write_search(tmp_path, overrides={"model.layers.mix_ln.early": "post"}, baselines=[{ALPHA: 0.75}]))
    assert plan.baselines == [{ALPHA: 0.75}]


def _mount_namespace() -> list[str] | None:
    """The command prefix that runs a process in a mount namespace of its own (root, or a user namespace), if any."""
    for prefix in (["unshare", "-m"], ["unshare", "-rm"]):
        try:
            if subprocess.run(prefix + ["true"], capture_output=True, timeout=10).returncode == 0:
                return prefix
        except (OSError, subprocess.TimeoutExpired):
            continue
    return None


@pytest.mark.slow
def test_a_full_disk_stops_the_search_in_one_sentence_and_resume_continues_it(tmp_path):
    import json

    prefix = _mount_namespace()
    if prefix is None:
        pytest.skip("no mount namespace here (unshare -m) to give the search a small disk of its own")
    env = dict(os.environ, BLOCKFORGE_CACHE=str(tmp_path / "cache"))
    done = subprocess.run(prefix + [sys.executable, str(Path(__file__).parent / "full_disk_check.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    first, second = seen["first"], seen["second"]
    err = first["stderr"].strip()
    assert first["exit"] == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "No space left on device" in err and "--resume" in err, err
    assert first["seconds"] < 10, first
    assert second["exit"] == 0, second["stderr"][-3000:]
    assert "Traceback" not in second["stderr"], second["stderr"]
    assert seen["summary"] and not {"running", "interrupted"} & set(seen["statuses"]), seen


def test_a_set_with_a_cut_shard_is_refused_before_ray_starts(tmp_path, capsys, monkeypatch):
    """A search whose recipe names a prepared set that lost the end of a shard: one sentence naming the file, in seconds,
    before Ray starts (its trials would each fail on it)."""
    path = write_search(tmp_path, cells={"model.depth": [2]}, baselines=[])
    assert main(["prepare", str(tmp_path / "tiny.yaml"), "--out", str(tmp_path / "set"), "--no-progress", "--workers", "1"]) == 0
    shard = tmp_path / "set" / "train" / "000000.bin"
    shard.write_bytes(shard.read_bytes()[:-2])

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started before the set was refused")

    monkeypatch.setattr("blockforge.search.run.driver.RayStart", no_ray)
    capsys.readouterr()
    assert main(["search", str(path), "--out", str(tmp_path / "out"), "--set", f"data.prepared={tmp_path / 'set'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"data.prepared: {shard} holds" in err and "prepare the set again" in err and "Traceback" not in err, err
    assert not (tmp_path / "out" / "search.json").exists()


def test_a_search_refused_for_its_memory_plan_stops_the_ray_that_started_meanwhile(tmp_path):
    """The memory plan is made while a local Ray starts: a refusal there is one sentence, and that Ray is stopped, not
    left running (in a process of its own: the session's Ray would be reused instead)."""
    path = write_search(tmp_path, cells={"model.depth": [2]}, baselines=[])
    script = f"""
import json, threading
import psutil
import blockforge.search.preflight as preflight
from blockforge.errors import BlockforgeError

def raylets():
    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            if process.name() == "raylet":
                found.append(process)
        except psutil.Error:  # ended meanwhile
            continue
    return found

def refuse(plan):
    seen.extend(t.name for t in threading.enumerate() if t.name == "ray-start")  # Ray starts beside the plan
    raise BlockforgeError("cell depth=2: too large to plan")

seen = []
preflight.memory_needs = refuse
from blockforge.cli import main
code = main(["search", {str(path)!r}, "--out", {str(tmp_path / "out")!r}])
print(json.dumps({{"code": code, "starting_while_planning": seen == ["ray-start"], "raylets_after": len(raylets())}}))
"""
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"code": 2, "starting_while_planning": True, "raylets_after": 0}, (seen, done.stderr[-2000:])
    err = done.stderr.strip()
    assert "too large to plan" in err and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out" / "search.json").exists()


def test_tunes_copy_meeting_a_file_tune_was_replacing_is_no_failure_of_the_search():
    """Tune copies its driver folder to the storage while it writes its searcher's state beside it (a temporary, then a
    rename): the copy can miss the temporary. Nothing is lost (the next save copies it), so no traceback is shown and the
    search goes on; any other failed save is left as it was."""
    import logging

    from blockforge.search.run.driver import _StateWriteFailure

    told = []

    class Interrupts:
        def write_failed(self, *said):
            told.append(said)

    class Store:
        remote, local = False, Path("/searches/s")

    def record(err: OSError) -> logging.LogRecord:
        try:
            raise err
        except OSError:
            return logging.LogRecord("ray.tune.execution.experiment_state", logging.ERROR, __file__, 1, "Saving experiment state "
                                     "to storage failed", None, sys.exc_info())

    state_failure = _StateWriteFailure(Interrupts(), Store())
    raced = FileNotFoundError(2, "Failed to open local file '/tmp/ray/s/tune/driver_artifacts/.0490-tmp-searcher-state-1.pkl'")
    assert state_failure.filter(record(raced)) is False and told == []
    assert state_failure.filter(record(FileNotFoundError(2, "No such file or directory", "/searches/s/tune/state.json"))) is True
    assert told == []


# ---- ledger rows of the wrong types or values: not records, as a cut or garbled line is not ----------------------------

BAD_FIELDS = [
    ("metrics.train_spikes", "3"), ("metrics.train_spikes", float("nan")), ("metrics.train_spikes", float("inf")),
    ("metrics.train_spikes", -1), ("metrics.val_loss", "low"), ("alpha", "0.25"), ("alpha", float("nan")), ("alpha", float("inf")),
    ("alpha", 1.5), ("post_ln_layers", "1"), ("post_ln_layers", float("inf")), ("post_ln_layers", -1), ("post_ln_layers", True),
    ("uniform_pre", "no"), ("uniform_pre", 0), ("costs.parameters", "many"),
]


def _set_field(record: dict, key: str, value) -> dict:
    record = json.loads(json.dumps(record))
    *parents, last = key.split(".")
    held = record
    for part in parents:
        held = held.setdefault(part, {})
    held[last] = value
    return record


GOOD_ROW = {"cell": "depth=4", "trial": 3, "status": "completed", "stage": "explore", "seed": 0, "model": "m", "uniform_pre": False,
            "identity": "i", "overrides": {ALPHA: 0.25}, "alpha": 0.25, "post_ln_layers": 1, "steps": 30, "metric": "val_loss",
            "value": 5.0, "metrics": {"val_loss": 5.0, "train_spikes": 2, "train_rise": 0.1}, "costs": {"parameters": 1000.0},
            "wall_s": 1.0, "duplicate_of": None, "run_dir": "trials/depth=4/i", "note": "", "promoted": "", "retry": False, "unstable": "", "seq": 4}


@pytest.mark.parametrize("key,value", BAD_FIELDS, ids=[f"{k}={v!r}" for k, v in BAD_FIELDS])
def test_a_ledger_row_of_the_wrong_type_or_value_is_not_a_record(key, value):
    from blockforge.search.records.ledger import parse_record

    assert parse_record(json.dumps(GOOD_ROW)) is not None
    assert parse_record(json.dumps(_set_field(GOOD_ROW, key, value))) is None
    # a model every layer of which is Pre-LN has no Post-LN layer
    assert parse_record(json.dumps({**GOOD_ROW, "uniform_pre": True, "post_ln_layers": 0})) is not None
    assert parse_record(json.dumps({**GOOD_ROW, "uniform_pre": True, "post_ln_layers": 2})) is None


@pytest.fixture(scope="module")
def stability_folder(tmp_path_factory):
    """A Mix-LN search with a stability check, driven without Ray (alpha 0.25 is best), and the view's answer."""
    import blockforge
    from blockforge.io import atomic_write_json
    from blockforge.search.config import MARKER, folder_marker
    from blockforge.search.run.searcher import CellSearcher

    from .conftest import drive

    tmp = tmp_path_factory.mktemp("ledger")
    plan = load_search(write_search(tmp, cells={"model.depth": [4]}, scheduler=None, trials_per_cell=2, baselines=[], sampler={"grid": {}},
                                    confirm={"top": 1, "seeds": 2, "stability": {"lr_max": 0.1, "resolution": 2.0}},
                                    space={ALPHA: {"grid": [0.0, 0.25]}}))

    def value(config):
        overrides = dict(config["overrides"])
        return 5.0 + 0.4 * abs(overrides[ALPHA] - 0.25) + 0.01 * overrides["train.seed"]

    def stability(config):
        lr = dict(config["overrides"]).get("train.lr", 3e-3)
        return {"unstable": "" if lr <= 0.02 else "its loss rose", "train_spikes": 1}

    folder = tmp / "s"
    drive(CellSearcher(plan, str(folder)), value, extra=stability, limit=500)
    atomic_write_json(folder / MARKER, folder_marker(plan, None))
    return folder, _answer(blockforge.open_search(folder))


def _answer(search) -> tuple:
    answer = search.cells()["depth=4"]
    return answer.claim, answer.curves.answer, search.results().to_dict("list")


@pytest.mark.parametrize("key,value", BAD_FIELDS[:-1], ids=[f"{k}={v!r}" for k, v in BAD_FIELDS[:-1]])
def test_ledger_rows_of_the_wrong_type_are_read_as_damaged_lines_by_a_view(stability_folder, tmp_path, capsys, key, value):
    """A view reads a row of the wrong type as it reads a garbled line: the other copy's record stands, and one warning
    names the lines (never a traceback in results() or the stability check, or Pre-LN's verdict for a Mix-LN model)."""
    import shutil

    import blockforge

    source, undamaged = stability_folder
    folder = tmp_path / "s"
    shutil.copytree(source, folder)
    copy = folder / "trials.backup.jsonl"  # read after trials.jsonl: its record of a trial is the one a view keeps
    rows = [json.loads(line) for line in copy.read_text().splitlines()]
    damaged = [i for i, row in enumerate(rows) if row["alpha"] == 0.25 and row["status"] == "completed"]
    for i in damaged:
        rows[i] = _set_field(rows[i], key, value)
    copy.write_text("".join(json.dumps(row) + "\n" for row in rows))
    capsys.readouterr()
    assert _answer(blockforge.open_search(folder)) == undamaged
    warned = [line for line in capsys.readouterr().err.splitlines() if "trials.backup.jsonl are not records" in line]
    assert len(warned) == 1 and f"line(s) {damaged[0] + 1}, " in warned[0], warned


def test_a_folder_where_a_report_file_belongs_is_one_sentence_naming_it(stability_folder, tmp_path):
    """Each file the reports write (summary.md, results.csv, stability.json, the figures, best/...), found a folder: one
    sentence naming it, not a traceback; once it is moved aside the reports are written."""
    import shutil

    import blockforge
    from blockforge.io import FolderInTheWay
    from blockforge.search.records.ledger import Ledger
    from blockforge.search.reports.report import write_reports

    source, _ = stability_folder
    folder = tmp_path / "s"
    shutil.copytree(source, folder)
    plan = blockforge.open_search(folder).plan
    before = {p for p in folder.rglob("*") if p.is_file()}
    write_reports(folder, plan, Ledger(folder / "trials.jsonl"))
    written = sorted(p for p in folder.rglob("*") if p.is_file() and p not in before)
    assert {"summary.md", "results.csv", "stability.json", "optuna.journal"} <= {p.name for p in written}, written
    for path in written:
        path.unlink()
        (path / "kept").mkdir(parents=True)
        with pytest.raises(FolderInTheWay) as refused:
            write_reports(folder, plan, Ledger(folder / "trials.jsonl"))
        assert str(refused.value) == (f"{path}: is a folder where a file belongs ({path.name} is written there); move the folder "
                                      "aside or remove it")
        shutil.rmtree(path)
    write_reports(folder, plan, Ledger(folder / "trials.jsonl"))
    assert all(p.is_file() for p in written)


RAY_ENVIRONMENT = [
    ("RAY_memory_usage_threshold", "abc", "a fraction of a node's memory from 0 to 1"),
    ("RAY_memory_usage_threshold", "", "a fraction of a node's memory from 0 to 1"),
    ("RAY_memory_usage_threshold", "1.5", "a fraction of a node's memory from 0 to 1"),
    ("RAY_memory_monitor_refresh_ms", "0.5", "a whole number of milliseconds, 0 or more"),
    ("RAY_AUTH_MODE", "tokn", "disabled or token"),
    ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "yes", "1 or 0 (true or false)"),
    ("TUNE_GLOBAL_CHECKPOINT_S", "soon", "a number of seconds, or auto"),
]


@pytest.mark.parametrize("name,value,accepts", RAY_ENVIRONMENT, ids=[f"{n}={v!r}" for n, v, _ in RAY_ENVIRONMENT])
def test_a_ray_setting_ray_cannot_read_is_one_sentence_before_ray_is_imported(tmp_path, capsys, monkeypatch, name, value, accepts):
    """Ray reads its settings from the environment as it is imported, and crashes (SIGSEGV) on a number it cannot read or takes
    a flag it does not know for false: `search` and `prepare` name the variable, its value and what it takes, first."""
    path = write_search(tmp_path, cells={"model.depth": [2]}, baselines=[])

    def no_ray():
        raise AssertionError("Ray was imported before its settings were checked")

    monkeypatch.setattr("blockforge.cluster._import_ray", no_ray)
    monkeypatch.setenv(name, value)
    said = f"{name}={value!r} in the environment is not {accepts}"
    for argv in (["search", str(path), "--out", str(tmp_path / "out")],
                 ["prepare", str(tmp_path / "tiny.yaml"), "--out", str(tmp_path / "set"), "--address", "127.0.0.1:1"]):
        capsys.readouterr()
        assert main(argv) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert said in line and f"set {name} to one, or unset it" in line, line
    assert not (tmp_path / "out" / "search.json").exists()


def test_a_ray_setting_that_crashes_ray_is_one_sentence_in_a_real_process(tmp_path):
    """The same in a process of its own, where `import ray` itself would end the process with SIGSEGV and no message."""
    path = write_search(tmp_path, cells={"model.depth": [2]}, baselines=[])
    env = dict(os.environ, RAY_memory_usage_threshold="abc", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "blockforge", "search", str(path), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, env=env, timeout=120)
    err = done.stderr.strip()
    assert done.returncode == 2 and len(err.splitlines()) == 1 and "RAY_memory_usage_threshold='abc' in the environment" in err, (done.returncode, err)


def test_a_broken_tracker_install_stops_no_search_and_a_report_in_a_folders_place_is_one_sentence_on_resume(tmp_path, capsys, ray_session):
    """A Python whose `import wandb` and `import mlflow` raise (a broken install): Ray Tune imports both for its own
    integrations, whatever the search asks for. A search that asks for W&B gets one warning naming it and runs on without
    it; MLflow, not asked for, is not said at all. Then a report of the finished search that is a folder: `--resume` says so
    in one sentence naming it, with the resume line."""
    broken = tmp_path / "broken"
    for name in ("wandb", "mlflow"):
        (broken / name).mkdir(parents=True)
        (broken / name / "__init__.py").write_text(f"raise RuntimeError('this {name} install is broken')\n")
    path = write_search(tmp_path, cells={"model.depth": [2]}, trials_per_cell=1, baselines=[], scheduler=None,
                        overrides={"train.steps": 2, "train.eval_every": 2, "train.checkpoint_every": 2, "train.log_every": 1},
                        tracking={"report_to": ["wandb"]})
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(broken), *filter(None, [os.environ.get("PYTHONPATH")])]), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "blockforge", "search", str(path), "--out", str(out)], capture_output=True, text=True,
                          env=env, timeout=300)
    (line,) = done.stderr.strip().splitlines() or [""]
    assert done.returncode == 0 and "tracking: wandb failed importing its package (RuntimeError: this wandb install is broken)" in line, done.stderr
    assert [json.loads(x)["status"] for x in (out / "trials.jsonl").read_text().splitlines()][-1] == "completed"
    (out / "results.csv").unlink()
    (out / "results.csv").mkdir()
    capsys.readouterr()
    assert main(["search", str(path), "--out", str(out), "--resume", "--set", "tracking.report_to=[]"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"blockforge: error: {out / 'results.csv'}: is a folder where a file belongs") and "then resume with:" in line, line
