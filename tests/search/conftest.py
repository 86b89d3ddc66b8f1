"""One local Ray for the whole test session (on loopback, object store capped) and tiny search files."""

from pathlib import Path

import pytest
import s3_server  # noqa: F401  (before any Ray starts: its endpoint and dummy credentials reach every Ray worker)
import yaml
from tiny_data import tiny_recipe


TINY_VIT = {"family": "vit", "width": 32, "depth": 4, "heads": 2, "ffn": 64, "image_size": 8, "patch_size": 2, "channels": 1,
            "classes": 10, "layers": {"mix_ln": {"alpha": 0.25}}}


def write_search(folder: Path, family: str = "llama", **changes) -> Path:
    """A tiny search (2 cells, alpha searched, ASHA, TPE) on a generated corpus (a llama) or scikit-learn's digits (a vit,
    `family="vit"`); `changes` replace top-level keys."""
    if family == "vit":
        recipe = {"model": dict(TINY_VIT), "data": {"source": "digits"}}
    else:
        recipe = tiny_recipe(folder, alpha=0.25, depth=4)
    recipe["train"] = {"steps": 30, "batch_size": 4, "lr": 3e-3, "eval_every": 10, "eval_batches": 2, "checkpoint_every": 10,
                       "log_every": 5, "grad_norm_every": 0}
    (folder / "tiny.yaml").write_text(yaml.safe_dump(recipe))
    search = {
        "name": "tiny",
        "base": "tiny.yaml",
        "cells": {"model.depth": [2, 4]},
        "space": {"model.layers.mix_ln.alpha": {"uniform": [0.0, 0.75]}},
        "baselines": [{"model.layers.mix_ln.alpha": 0.0}, {"model.layers.mix_ln.alpha": 0.5}],
        "trials_per_cell": 5,
        "objective": {"metric": "val_loss", "mode": "min"},
        "scheduler": {"asha": {"grace_steps": 10, "reduction_factor": 2}},
        "sampler": {"tpe": {"seed": 0, "startup_trials": 2}},
        "divergence": {"max_loss": 20.0},
        "resources": {"cpu": 1},
    }
    search.update(changes)
    path = folder / "search.yaml"
    path.write_text(yaml.safe_dump(search))
    return path


@pytest.fixture(scope="session")
def s3():
    """The session's local S3-compatible server (s3_server.S3): `s3.bucket()` makes a bucket, `s3.proxy.cut()` takes it away."""
    server = s3_server.S3()
    yield server
    server.close()


@pytest.fixture(scope="session")
def ray_session(blockforge_cache):
    import ray

    ray.init(num_cpus=2, object_store_memory=200 * 2**20, include_dashboard=False, log_to_driver=False,
             logging_level="warning", _node_ip_address="127.0.0.1",
             runtime_env={"env_vars": {"BLOCKFORGE_CACHE": str(blockforge_cache)}})
    yield ray
    ray.shutdown()


def drive(searcher, value_of=lambda config: 5.0, *, limit: int = 200, trial_prefix: str = "t", extra=None) -> list[dict]:
    """Run a CellSearcher the way Tune does, without Ray or training: every trial it hands out finishes at once
    at its cell's full budget with `value_of(config)` (and what `extra(config)` adds to its result, e.g. how stable it
    was). Returns the configs of the trials it handed out."""
    import time

    from ray.tune.search import Searcher

    from blockforge.search.config import OBJECTIVE

    handed, idle, i = [], 0, 0
    while i < limit:
        trial_id = f"{trial_prefix}{i}"
        config = searcher.suggest(trial_id)
        if config == Searcher.FINISHED:
            break
        if config is None:  # nothing to hand out yet: Tune asks again
            idle += 1
            assert idle < 20000, "the searcher handed out nothing for too long"
            time.sleep(0.001)
            continue
        i, idle = i + 1, 0
        handed.append(config)
        steps = searcher.live[trial_id].steps
        value = value_of(config)
        searcher.on_trial_complete(trial_id, {OBJECTIVE: value, "val_loss": value, "step": steps, **(extra(config) if extra else {})})
    return handed


def drive_curves(searcher, scheduler, curve, *, limit: int = 200, stop_after=None, node: Path | None = None,
                 checkpoints: bool = False) -> list[dict]:
    """Run a CellSearcher and CellScheduler the way Tune does, one trial at a time, without Ray or training.

    Every trial handed out "trains" along `curve(config) -> {step: value}`: each evaluation is written to its
    run folder's metrics.jsonl and reported to the scheduler, which may stop it there (then it ends pruned);
    a value of None diverges there; otherwise it ends at its cell's full budget. `stop_after(handed)` -> True ends the drive early (a kill).
    A search kept in an object storage (the searcher's store is remote) has its trials write in a folder of their
    own node (`node`) and put the run folder up before each report, as trials do (search/run/trials.py).
    `checkpoints`: each evaluation also writes a (stand-in) checkpoint, the trial keeping only its newest and thinning to
    its final weights when it ends and nothing continues it, as trials do; a trial that continues a run (a longer
    training's source, a pruned run brought back) asserts the checkpoint it needs is there.
    Returns the configs handed out."""
    import json
    import time

    from ray.tune.search import Searcher

    from blockforge.search.config import OBJECTIVE, trial_dir, trial_rel
    from blockforge.storage import Mirror

    class Trial:
        def __init__(self, trial_id, config):
            self.trial_id, self.config = trial_id, config

    store = searcher.context.store
    handed, idle, i = [], 0, 0
    while i < limit:
        trial_id = f"c{i}"
        config = searcher.suggest(trial_id)
        if config == Searcher.FINISHED:
            break
        if config is None:  # nothing to hand out yet (e.g. a transfer target waits for its predictions): Tune asks again
            idle += 1
            assert idle < 20000, "the searcher handed out nothing for too long"
            time.sleep(0.001)
            continue
        i, idle = i + 1, 0
        handed.append(config)
        if store.remote:
            rel = trial_rel(config["cell"], config["identity"])
            run_dir, mirror = node / rel, Mirror(store.storage, rel, node / rel)
        else:
            run_dir, mirror = Path(trial_dir(searcher.search_dir, config["cell"], config["identity"])), None
        run_dir.mkdir(parents=True, exist_ok=True)
        if checkpoints:
            _needs_checkpoints(searcher, config, run_dir)
        result, stopped = {}, False
        for step, value in sorted(curve(config).items()):
            if value is None:  # the run diverged here: it reports the penalty and the flag, and ends
                result = {OBJECTIVE: searcher.plan.penalty, "step": step, "diverged": True}
                searcher.on_trial_result(trial_id, result)
                scheduler.on_trial_result(None, Trial(trial_id, config), result)
                break
            with open(run_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps({"step": step, "event": "eval", "val_loss": value}) + "\n")
            if checkpoints:
                _stand_in_checkpoint(run_dir, step)
            if mirror is not None:
                mirror.push()
            result = {OBJECTIVE: value, "val_loss": value, "step": step}
            searcher.on_trial_result(trial_id, result)
            if scheduler.on_trial_result(None, Trial(trial_id, config), result) == "STOP":
                stopped = True
                break
        if checkpoints and not stopped and not searcher.plan.continues_completed:
            from blockforge.train.checkpoint import keep_final_weights

            keep_final_weights(run_dir)  # as a trial does at its end when nothing will continue it
        if not stopped:  # Tune tells the scheduler of the trials that end by themselves (it knows those it stopped)
            scheduler.on_trial_complete(None, Trial(trial_id, config), result)
        searcher.on_trial_complete(trial_id, result)
        if stop_after is not None and stop_after(handed):
            break
    return handed


def _stand_in_checkpoint(run_dir: Path, step: int) -> None:
    """A checkpoint folder as a trial leaves it (its newest only): state.json and the weights' file, as stand-ins."""
    import shutil

    folder = run_dir / "checkpoints" / f"step-{step:08d}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.safetensors").write_bytes(f"weights at {step}".encode())
    (folder / "state.json").write_text("{}")
    for older in (run_dir / "checkpoints").glob("step-*"):
        if older != folder:
            shutil.rmtree(older)


def _needs_checkpoints(searcher, config: dict, run_dir: Path) -> None:
    """A trial that continues a run finds the checkpoint it continues from (thinning never took what a stage still needs)."""
    source = config.get("continues")
    if source:
        assert list((Path(searcher.search_dir) / source / "checkpoints").glob("step-*/state.json")), f"{source} lost its checkpoint"
    elif (run_dir / "metrics.jsonl").exists() and not (run_dir / "result.json").exists():  # a stopped run taken up again
        assert list((run_dir / "checkpoints").glob("step-*/state.json")), f"{run_dir} was thinned before it was continued"


def run_search_stopped_by_sigterm(path: Path, out: Path, ready) -> None:
    """`blockforge.run_search(path, out=out)`, sent SIGTERM (as a cluster preempts the process) once `ready()` holds: it
    raises SearchInterrupted with the Python and the shell line that resume it, and leaves the search not running."""
    import os
    import re
    import signal
    import threading

    import blockforge

    def stop_when_ready():
        while not ready():
            if done.wait(0.05):
                return
        os.kill(os.getpid(), signal.SIGTERM)

    done = threading.Event()
    threading.Thread(target=stop_when_ready, daemon=True).start()
    again = f"resume with: blockforge.run_search('{path}', out='{out}', resume=True) (from a shell: blockforge search {path} --out {out} --resume)"
    with pytest.raises(blockforge.SearchInterrupted, match=f"stopped by SIGTERM.*{re.escape(again)}"):
        try:
            blockforge.run_search(path, out=out)
        finally:
            done.set()
    assert not blockforge.open_search(out).running
