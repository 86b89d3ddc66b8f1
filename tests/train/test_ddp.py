"""Data-parallel training under torchrun (DDP and FSDP2): two gloo processes give the single-process curve."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from blockforge.spec import load_recipe
from blockforge.train.loop import train


@pytest.mark.slow
@pytest.mark.parametrize("parallel,port", [("ddp", 29561), ("fsdp", 29562)])
def test_torchrun_two_processes_match_one(tmp_path, recipe_file, parallel, port):
    path = recipe_file(steps=12, batch_size=8, micro_batch_size=2, eval_every=6, grad_norm_every=3)
    single = train(load_recipe(path), tmp_path / "single", progress=False)
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([torchrun, "--nproc_per_node=2", f"--master_port={port}", "-m", "blockforge", "train", str(path),
                           "--out", str(tmp_path / "ddp"), "--no-progress", "--set", f"train.parallel={parallel}"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    read = lambda run: {r["step"]: r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["event"] == "train"}  # noqa: E731
    ddp, one = read(tmp_path / "ddp"), read(tmp_path / "single")
    assert ddp.keys() == one.keys()
    for step in one:
        assert ddp[step] == pytest.approx(one[step], abs=2e-4), step
    result = json.loads((tmp_path / "ddp" / "result.json").read_text())
    assert result["status"] == "completed" and result["metrics"]["val_loss"] == pytest.approx(single.metrics["val_loss"], abs=2e-4)
    norms = lambda run: [r["layer_grad_norms"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "layer_grad_norms" in r]  # noqa: E731
    for a, b in zip(norms(tmp_path / "ddp"), norms(tmp_path / "single")):
        assert a == pytest.approx(b, rel=1e-3)
    import blockforge  # the checkpoint holds full weights whatever the parallelism

    assert blockforge.load(tmp_path / "ddp").spec.depth == 2
