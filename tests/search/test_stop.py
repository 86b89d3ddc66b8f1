"""A search driver stopped by a signal or killed: its trials end as records, its local Ray goes with it,
and --resume keeps every status (pruned stays pruned, finished is not retrained, stopped continues)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from blockforge.reaper import MARK, alive
from blockforge.search.records.ledger import Ledger
from blockforge.search.run.driver import run_search

from .conftest import write_search

ALPHA = "model.layers.mix_ln.alpha"


def start_driver(path: Path, out: Path, logs: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "blockforge", "search", str(path), "--out", str(out)], env=dict(os.environ),
                            stdout=open(logs / "stdout", "w"), stderr=open(logs / "stderr", "w"), start_new_session=True)


def wait_for(predicate, timeout: float, what: str) -> float:
    """Seconds until predicate() held; fails the test after `timeout`."""
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < timeout, f"waited {timeout} s for {what}"
        time.sleep(0.1)
    return time.monotonic() - started


def ray_processes_of(driver: int) -> list[int]:
    """The processes of the local Ray that driver `driver` started (the reaper's mark carries its pid)."""
    needle = f"{MARK}={driver}-".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and any(v.startswith(needle) for v in (entry / "environ").read_bytes().split(b"\0")):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def ray_family_of(driver: int) -> dict[int, int]:
    """Every process of driver `driver`'s local Ray: the marked ones and their descendants (Ray's agents carry no
    mark of their own), as pid -> start time."""
    from blockforge.reaper import family

    tokens = set()
    for pid in ray_processes_of(driver):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        tokens.update(v.split(b"=", 1)[1].decode() for v in environ if v.startswith(f"{MARK}=".encode()))
    return {pid: start for token in tokens for pid, start in family(token, {driver}).items()}


def checkpoint_step(run_dir: Path) -> int:
    pointer = run_dir / "checkpoints" / "latest.json"
    return json.loads(pointer.read_text())["step"] if pointer.exists() else 0


def trained_steps(run_dir: Path) -> list[int]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [x["step"] for x in lines if x["event"] == "train"]


def test_sigterm_stops_the_trials_writes_reports_and_resume_continues_them(tmp_path, ray_session):
    path = write_search(tmp_path, scheduler=None, cells={"model.depth": [4]}, trials_per_cell=2, baselines=[],
                        space={ALPHA: {"choice": [0.0, 0.5]}}, sampler={"random": {"seed": 0}}, max_concurrent=2,
                        overrides={"train.steps": 150, "train.checkpoint_every": 10, "train.eval_every": 10})
    out = tmp_path / "out"
    driver = start_driver(path, out, tmp_path)
    runs = lambda: list(out.glob("trials/*/*"))  # noqa: E731
    wait_for(lambda: any(checkpoint_step(r) >= 20 for r in runs()), 1800, "a trial's checkpoint")
    driver.send_signal(signal.SIGTERM)
    assert driver.wait(timeout=90) == 128 + signal.SIGTERM
    err = (tmp_path / "stderr").read_text()
    assert f"resume with: blockforge search {path} --out {out} --resume" in err and "Traceback" not in err, err
    records = Ledger(out / "trials.jsonl").records()
    assert records and all(r.status != "running" for r in records), [(r.trial, r.status) for r in records]
    stopped = [r for r in records if r.status == "interrupted"]
    assert stopped, [(r.trial, r.status) for r in records]
    assert (out / "summary.md").exists() and (out / "results.csv").exists()
    gone = wait_for(lambda: not ray_processes_of(driver.pid), 120, "the driver's Ray processes to end")
    print(f"Ray processes gone {gone:.1f} s after the driver ended")
    at_stop = {r.identity: checkpoint_step(Path(r.run_dir)) for r in stopped}
    assert any(step > 0 for step in at_stop.values()), at_stop

    prepared = {p: p.stat().st_mtime_ns for p in (out / "data").rglob("*") if p.is_file()}
    assert any(p.name == "manifest.json" for p in prepared)  # the search's data, prepared before its first trial
    outcome = run_search(path, out=out, resume=True, progress_every_s=0)
    assert sorted(r.status for r in outcome.records) == ["completed", "completed"]
    assert {p: p.stat().st_mtime_ns for p in (out / "data").rglob("*") if p.is_file()} == prepared  # reused as it was
    for r in outcome.records:
        run_dir = Path(r.run_dir)
        steps = trained_steps(run_dir)
        assert steps == sorted(set(steps)) and steps[-1] == 150
        if at_stop.get(r.identity, 0) > 0:  # resumed where its checkpoint left it, not started over
            attempts = [json.loads(x) for x in (run_dir / "attempts.jsonl").read_text().splitlines()]
            assert attempts[-1]["start_step"] == at_stop[r.identity] > 0, attempts


@pytest.mark.slow
def test_a_second_signal_ends_the_driver_at_once(tmp_path):
    path = write_search(tmp_path, scheduler=None, cells={"model.depth": [4]}, trials_per_cell=1, baselines=[],
                        space={ALPHA: {"choice": [0.0]}}, sampler={"random": {"seed": 0}},
                        overrides={"train.steps": 2000, "train.checkpoint_every": 10, "train.eval_every": 10})
    out = tmp_path / "out"
    driver = start_driver(path, out, tmp_path)
    wait_for(lambda: any(checkpoint_step(r) >= 10 for r in out.glob("trials/*/*")), 1800, "a trial's checkpoint")
    driver.send_signal(signal.SIGINT)
    time.sleep(0.3)
    driver.send_signal(signal.SIGINT)
    assert driver.wait(timeout=30) == 128 + signal.SIGINT  # (a guard against a hang: a graceful stop of this trial takes longer)
    err = (tmp_path / "stderr").read_text()
    assert "SIGINT again: stopped at once; resume with:" in err and "Traceback" not in err, err
    wait_for(lambda: not ray_processes_of(driver.pid), 120, "the driver's Ray processes to end")


@pytest.mark.slow  # (the in-process kill of tests/search/test_resume_anywhere.py is in the default suite)
def test_resume_after_sigkill_keeps_pruned_trials_pruned(tmp_path, ray_session):
    path = write_search(tmp_path, cells={"model.depth": [8]}, trials_per_cell=6, max_concurrent=2,
                        space={ALPHA: {"uniform": [0.0, 1.0]}}, scheduler={"asha": {"grace_steps": 10, "reduction_factor": 2, "margin": 0.0}},
                        overrides={"train.steps": 60, "train.checkpoint_every": 10})
    out = tmp_path / "out"
    driver = start_driver(path, out, tmp_path)
    wait_for(lambda: any(r.status == "pruned" for r in Ledger(out / "trials.jsonl").records()), 1800, "a pruned trial")
    processes = ray_family_of(driver.pid)
    agents = [pid for pid in processes if b"Agent" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert agents, processes  # Ray's agents (whose environment may not show the mark) are found by descent
    os.kill(driver.pid, signal.SIGKILL)  # the driver alone: its Ray (in its process group or not) must go with it
    driver.wait()
    gone = wait_for(lambda: not alive(processes), 120, "the killed driver's Ray processes (its agents too) to end")
    print(f"Ray processes gone {gone:.1f} s after SIGKILL")
    pruned = {(r.trial, r.identity): r.steps for r in Ledger(out / "trials.jsonl").records() if r.status == "pruned"}
    assert pruned

    outcome = run_search(path, out=out, resume=True, progress_every_s=0)
    after = {(r.trial, r.identity): r for r in outcome.records}
    for key, steps in pruned.items():
        record = after[key]
        assert record.status == "pruned" and record.steps == steps, record
        run_dir = Path(record.run_dir)  # not trained past the step where it was stopped
        assert max(trained_steps(run_dir)) <= steps and checkpoint_step(run_dir) <= steps, (key, trained_steps(run_dir))
    assert all(r.status != "running" for r in outcome.records)
    for r in outcome.records:  # duplicates stay duplicates of a trial of their own model
        if r.status == "duplicate":
            assert after[(r.duplicate_of, r.identity)].identity == r.identity
