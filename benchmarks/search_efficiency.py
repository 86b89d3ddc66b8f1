"""ASHA + TPE against the full grid over the same alphas: training steps spent, and the alpha chosen.

For each depth cell the grid trains every distinct Mix-LN stack (0 .. depth/2 Post-LN layers) to the
full budget with two seeds (their spread is the noise floor); ASHA + TPE searches the same alphas with
one seed. Printed per cell: the grid's best alpha, its runner-up gap and seed noise, the alpha ASHA + TPE
chose and whether it is the grid's best or within noise of it, and the fraction of steps it spent.

    python benchmarks/search_efficiency.py [--depths 8 12] [--steps 150] [--trial-fraction 0.5] [--grace-fraction 0.25]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
from pathlib import Path

import yaml

from blockforge.search.driver import run_search

BASE = str(Path(__file__).resolve().parent.parent / "recipes" / "llama-tiny-mix.yaml")
SMALL = {"model.width": 64, "model.heads": 2, "model.ffn": 172, "model.context": 64, "train.batch_size": 16,
         "train.lr": 3.0e-3, "train.eval_batches": 8, "train.grad_norm_every": 0}


def alphas(depth: int) -> list[float]:
    """One alpha per distinct stack with 0 .. depth/2 Post-LN layers (a hair above k/depth, so floor gives k)."""
    return [round(k / depth + 1e-4, 5) if k else 0.0 for k in range(depth // 2 + 1)]


def write_search(folder: Path, name: str, depth: int, steps: int, seed: int, asha: bool,
                 trial_fraction: float = 0.5, grace_fraction: float = 0.25) -> Path:
    grid = alphas(depth)
    search = {
        "name": name, "base": BASE, "steps": steps,
        "overrides": {**SMALL, "train.seed": seed, "train.checkpoint_every": steps // 3},
        "cells": {"model.depth": [depth]},
        "objective": {"metric": "val_loss", "mode": "min"},
        "resources": {"cpu": 1},
    }
    if asha:
        # TPE trains a fraction of the alphas; ASHA compares them after its grace period (past the 10% warmup)
        # and keeps a third at each rung.
        search.update(space={"model.layers.mix_ln.alpha": {"choice": grid}}, trials_per_cell=math.ceil(trial_fraction * len(grid)),
                      scheduler={"asha": {"grace_steps": int(steps * grace_fraction), "reduction_factor": 3}},
                      sampler={"tpe": {"seed": seed, "startup_trials": 2}}, baselines=[{"model.layers.mix_ln.alpha": 0.0}])
    else:
        search.update(space={"model.layers.mix_ln.alpha": {"grid": grid}}, sampler={"grid": {}},
                      overrides={**search["overrides"], "train.eval_every": steps})
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(search, sort_keys=False))
    return path


def steps_spent(records) -> int:
    return sum(r.steps for r in records if r.status != "duplicate")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", type=int, nargs="+", default=[8, 12])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--out", default="runs/bench-efficiency")
    parser.add_argument("--trial-fraction", type=float, default=0.5, help="ASHA + TPE trials per cell, as a fraction of the grid")
    parser.add_argument("--grace-fraction", type=float, default=0.25, help="ASHA grace period, as a fraction of the steps")
    args = parser.parse_args()
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    summary = []
    for depth in args.depths:
        grid_values: dict[float, list[float]] = {}
        grid_steps = 0
        for seed in (0, 1):
            name = f"grid-d{depth}-s{seed}"
            outcome = run_search(write_search(out, name, depth, args.steps, seed, asha=False), out=out / name, progress_every_s=1e9)
            for r in outcome.records:
                if r.status == "completed":
                    grid_values.setdefault(r.post_ln_layers, []).append(r.value)
            if seed == 0:
                grid_steps = steps_spent(outcome.records)
        name = f"asha-d{depth}"
        path = write_search(out, name, depth, args.steps, 0, asha=True, trial_fraction=args.trial_fraction, grace_fraction=args.grace_fraction)
        outcome = run_search(path, out=out / name, progress_every_s=1e9)
        chosen = min((r for r in outcome.records if r.status == "completed"), key=lambda r: r.value)
        means = {k: statistics.mean(v) for k, v in grid_values.items()}
        noise = statistics.mean(abs(v[0] - v[1]) for v in grid_values.values() if len(v) == 2)
        best = min(means, key=means.get)
        ranked = sorted(means.values())
        row = {
            "depth": depth, "grid_best_post_ln": best, "grid_best_val_loss": means[best], "runner_up_gap": ranked[1] - ranked[0],
            "seed_noise": noise, "chosen_post_ln": chosen.post_ln_layers, "chosen_grid_val_loss": means[chosen.post_ln_layers],
            "same_choice": chosen.post_ln_layers == best, "within_noise": means[chosen.post_ln_layers] - means[best] <= noise,
            "grid_steps": grid_steps, "asha_steps": steps_spent(outcome.records),
            "grid_means": {str(k): round(v, 4) for k, v in sorted(means.items())},
        }
        row["fraction"] = row["asha_steps"] / row["grid_steps"]
        summary.append(row)
        print(json.dumps(row))
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print("\ndepth  grid best (post-LN)  chosen  same  within noise  steps ASHA/grid")
    for r in summary:
        print(f"{r['depth']:5d}  {r['grid_best_post_ln']:19d}  {r['chosen_post_ln']:6d}  {str(r['same_choice']):4s}  {str(r['within_noise']):12s}  {r['fraction']:.2f}")
    total = sum(r["asha_steps"] for r in summary) / sum(r["grid_steps"] for r in summary)
    print(f"overall: ASHA + TPE spent {total:.0%} of the grid's steps")


if __name__ == "__main__":
    main()
