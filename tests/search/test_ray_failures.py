"""Ray's own failures met by a real search, as clusters short of memory or cores meet them: trials killed by Ray's memory
monitor, and a local Ray whose node does not start in time. Each ends in one sentence with what to change and the line
that resumes, never a Ray traceback, and the search finishes when resumed. (Slow: each starts Ray and trains.)"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from blockforge.search.records.ledger import Ledger

from .conftest import write_search

ALPHA = "model.layers.mix_ln.alpha"


def search_file(tmp_path: Path) -> Path:
    return write_search(tmp_path, scheduler=None, cells={"model.depth": [2]}, trials_per_cell=1, baselines=[], space={ALPHA: {"grid": [0.0]}},
                        sampler={"grid": {}}, overrides={"train.steps": 40, "train.eval_every": 10})


def blockforge(args: list[str], **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "blockforge", *args], capture_output=True, text=True, timeout=600, env={**os.environ, **env})


@pytest.mark.slow
def test_trials_killed_by_rays_memory_monitor_end_in_one_sentence_and_resume_finishes_the_search(tmp_path):
    path, out = search_file(tmp_path), tmp_path / "out"
    # Ray's memory monitor, told to kill above 2% of the node's memory, kills every trial as soon as it starts
    killed = blockforge(["search", str(path), "--out", str(out)], RAY_memory_usage_threshold="0.02", RAY_memory_monitor_refresh_ms="100")
    assert killed.returncode == 1, killed.stderr
    assert "Traceback" not in killed.stderr and "ERROR" not in killed.stderr, killed.stderr
    lines = killed.stderr.strip().splitlines()
    assert len(lines) == 2 and "killed by Ray's memory monitor on node 127.0.0.1" in lines[0]  # said once as it happens...
    assert "a trial's process used up to" in lines[1] and "--max-concurrent" in lines[1]  # ...and at the end, with the numbers
    assert lines[1].endswith(f"resume with: blockforge search {path} --out {out} --resume (it trains the 1 failed for a cause outside them again)")
    (record,) = Ledger(out / "trials.jsonl").records()
    assert record.status == "failed" and record.retry and "memory monitor" in record.note
    resumed = blockforge(["search", str(path), "--out", str(out), "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    assert [r.status for r in Ledger(out / "trials.jsonl").records()] == ["completed"]


@pytest.mark.slow
def test_a_local_ray_that_does_not_start_in_time_is_one_sentence_and_a_later_run_starts(tmp_path):
    path, out = search_file(tmp_path), tmp_path / "out"
    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text(  # Ray's agents slow to import their packages (as a package installed beside them can be)
        "import sys, time\nif any(a.endswith(('dashboard/agent.py', 'runtime_env/agent/main.py')) for a in sys.argv):\n    time.sleep(45)\n")
    stuck = blockforge(["search", str(path), "--out", str(out)], PYTHONPATH=str(slow))
    assert stuck.returncode == 2 and "Traceback" not in stuck.stderr, stuck.stderr
    last = stuck.stderr.strip().splitlines()[-1]
    assert "Ray's local node did not start within 30 s, 3 time(s)" in last and "session_latest/logs" in last
    assert last.endswith("then run the same command again") and not (out / "search.json").exists()
    started = blockforge(["search", str(path), "--out", str(out)])
    assert started.returncode == 0, started.stderr
