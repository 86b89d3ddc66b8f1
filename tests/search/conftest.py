"""One local Ray for the whole test session (on loopback, object store capped) and tiny search files."""

from pathlib import Path

import pytest
import yaml

from tiny_data import tiny_recipe

def write_search(folder: Path, **changes) -> Path:
    """A tiny search (2 cells, alpha searched, ASHA, TPE) on a generated corpus; `changes` replace top-level keys."""
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
def ray_session(blockforge_cache):
    import ray

    ray.init(num_cpus=2, object_store_memory=200 * 2**20, include_dashboard=False, log_to_driver=False,
             logging_level="warning", _node_ip_address="127.0.0.1",
             runtime_env={"env_vars": {"BLOCKFORGE_CACHE": str(blockforge_cache)}})
    yield ray
    ray.shutdown()


def drive(searcher, value_of=lambda config: 5.0, *, limit: int = 200, trial_prefix: str = "t") -> list[dict]:
    """Run a CellSearcher the way Tune does, without Ray or training: every trial it hands out finishes at once
    at its cell's full budget with `value_of(config)`. Returns the configs of the trials it handed out."""
    from ray.tune.search import Searcher

    from blockforge.search.config import OBJECTIVE

    handed = []
    for i in range(limit):
        trial_id = f"{trial_prefix}{i}"
        config = searcher.suggest(trial_id)
        if config == Searcher.FINISHED:
            break
        if config is None:
            continue
        handed.append(config)
        steps = searcher.live[trial_id]["steps"]
        value = value_of(config)
        searcher.on_trial_complete(trial_id, {OBJECTIVE: value, "val_loss": value, "step": steps})
    return handed
