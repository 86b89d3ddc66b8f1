"""benchmarks/gpu_check.sh's search stage (benchmarks/gpu_search.py) in its CPU form: a real Ray Tune search, one trial
alone then two at once, each trial's tokens/s measured from its run folder. On a GPU machine the same script shares one GPU
between four trials and samples the GPU's busy fraction and memory."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_search_stage_runs_on_the_cpu_and_reports_every_trials_rate(tmp_path):
    out = tmp_path / "search.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_search.py"), "--device", "cpu", "--json", str(out)],
                         capture_output=True, text=True, timeout=1800, cwd=tmp_path, env={**os.environ, "DEVICE": "cpu"})
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert len(report["alone"]["trials"]) == 1 and len(report["shared"]["trials"]) == 4
    assert all(t["tok_per_s"] > 0 for t in report["alone"]["trials"] + report["shared"]["trials"])
    assert report["aggregate_vs_alone"] > 0 and report["shared"]["busy"] is None  # no GPU: nothing sampled, nothing invented
    assert "tok/s together" in run.stdout
