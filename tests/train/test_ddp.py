"""Data-parallel training under torchrun: two gloo processes give the single-process loss curve."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from blockforge.spec import load_recipe
from blockforge.train.loop import train


@pytest.mark.slow
def test_torchrun_two_processes_match_one(tmp_path, recipe_file):
    path = recipe_file(steps=12, batch_size=8, micro_batch_size=2, eval_every=6)
    single = train(load_recipe(path), tmp_path / "single", progress=False)
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([torchrun, "--nproc_per_node=2", "--master_port=29561", "-m", "blockforge", "train", str(path),
                           "--out", str(tmp_path / "ddp"), "--no-progress"], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    read = lambda run: {r["step"]: r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["event"] == "train"}  # noqa: E731
    ddp, one = read(tmp_path / "ddp"), read(tmp_path / "single")
    assert ddp.keys() == one.keys()
    for step in one:
        assert ddp[step] == pytest.approx(one[step], abs=2e-4), step
    result = json.loads((tmp_path / "ddp" / "result.json").read_text())
    assert result["status"] == "completed" and result["metrics"]["val_loss"] == pytest.approx(single.metrics["val_loss"], abs=2e-4)
