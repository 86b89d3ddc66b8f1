"""One search trial: a training run with the trial's overrides, reporting to Ray Tune at every evaluation.

A trial's run folder is named by its cell and identity inside the search folder, and the trial
resumes from that folder's checkpoint whenever it exists. That is what makes a restarted trial (a
resumed search, a retry after its node died) continue instead of starting over. On a multi-node
cluster the search folder must be on storage every node sees, as Ray Tune's storage_path must be.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from blockforge.search.config import SearchPlan


def trial_dir(search_dir: str | Path, cell: str, identity: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9_.=-]+", "_", cell.replace(",", "__"))
    return Path(search_dir) / "trials" / slug / identity


def run_trial(config: dict, plan: SearchPlan, search_dir: str) -> None:
    """The Tune trainable: train config['overrides'] on the base recipe; report the objective as it goes."""
    import torch
    from ray import tune

    from blockforge.search.searcher import OBJECTIVE
    from blockforge.train.checkpoint import latest_checkpoint
    from blockforge.train.loop import Trainer

    torch.set_num_threads(max(1, int(plan.resources.cpu)))
    recipe = plan.recipe([tuple(pair) for pair in config["overrides"]])
    run_dir = trial_dir(search_dir, config["cell"], config["identity"])
    finished = run_dir / "result.json"
    if finished.exists():  # finished before the driver was restarted: report, do not retrain
        result = json.loads(finished.read_text())
        diverged = result["status"] == "diverged"
        metrics = result.get("metrics") or {}
        value = plan.penalty if diverged else metrics.get(plan.metric, plan.penalty)
        tune.report({OBJECTIVE: value, "step": result["step"], "diverged": diverged, **metrics})
        return
    trainer = Trainer(recipe, run_dir, resume=latest_checkpoint(run_dir) is not None, progress=False)
    for event in trainer.iterate():
        metrics = {k: v for k, v in (event["metrics"] or {}).items() if isinstance(v, (int, float))}
        value = plan.penalty if event["diverged"] else metrics[plan.metric]
        tune.report({OBJECTIVE: value, "step": event["step"], "diverged": event["diverged"], **metrics})
