"""Does the best learning rate stay put as the model grows? A learning-rate sweep across widths (depth 4) and
depths (width 64), standard parametrization against the transfer one (muP with base width 64 for the width
sweep; CompleteP with base depth 4 for the depth sweep), on the built-in corpus.

Each (size, parametrization, learning rate) is trained with --seeds seeds (a search per sweep: cells are
size x parametrization x seed, the learning rate a grid). Per size and parametrization: the learning rate
with the best mean validation loss, and a 95% range for it from resampling the seeds (each resample takes
the best mean again).

    python benchmarks/lr_transfer.py [--steps 100] [--seeds 2] [--out runs/lr-transfer]   # lr_transfer.json, lr_transfer.png

Every search folder is kept, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np
import yaml

from blockforge.io import pyplot, save_png
from blockforge.search.run.driver import run_search

ROOT = Path(__file__).resolve().parent.parent
LRS = [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2]
SWEEPS = {
    "width": {"key": "model.width", "sizes": [64, 128, 256, 512], "fixed": {"model.depth": 4}, "transfer": "mup",
              "base": {"model.base_width": 64}},
    "depth": {"key": "model.depth", "sizes": [4, 8, 16, 32], "fixed": {"model.width": 64}, "transfer": "completep",
              "base": {"model.base_depth": 4}},
}


def search_file(folder: Path, sweep: str, steps: int, seeds: int) -> Path:
    s = SWEEPS[sweep]
    data = {
        "name": f"lr-{sweep}", "base": str(ROOT / "recipes" / "llama-tiny-pre.yaml"), "steps": steps,
        "overrides": {"model.heads": None, "model.head_dim": 32, "model.ffn": None, "model.ffn_mult": 2.6875, "model.ffn_multiple_of": 8, "model.context": 64,
                      "train.batch_size": 16, "train.eval_batches": 8, "train.eval_every": steps, "train.checkpoint_every": steps,
                      "train.grad_norm_every": 0, **s["fixed"], **s["base"]},
        "cells": {s["key"]: s["sizes"], "model.parametrization": ["standard", s["transfer"]], "train.seed": list(range(seeds))},
        "space": {"train.lr": {"grid": LRS}}, "sampler": {"grid": {}}, "trials_per_cell": len(LRS),
        "objective": {"metric": "val_loss", "mode": "min"}, "divergence": {"max_loss": 20.0}, "resources": {"cpu": 1},
    }
    path = folder / f"lr-{sweep}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def best_with_range(table: dict[float, dict[int, float]], resamples: int = 2000, seed: int = 0) -> tuple[float, float, float, dict]:
    """(best lr by mean, 2.5 and 97.5 percentiles of the best lr over seed resamples, means)."""
    lrs = sorted(table)
    seeds = sorted(set.intersection(*(set(v) for v in table.values())))
    values = np.array([[table[lr][s] for s in seeds] for lr in lrs])  # (lrs, seeds)
    means = values.mean(axis=1)
    rng = np.random.default_rng(seed)
    picks = [lrs[int(np.argmin(values[:, rng.integers(0, len(seeds), len(seeds))].mean(axis=1)))] for _ in range(resamples)]
    return lrs[int(np.argmin(means))], float(np.percentile(picks, 2.5)), float(np.percentile(picks, 97.5)), dict(zip(lrs, means.tolist()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--sweeps", default="width,depth")
    parser.add_argument("--out", default="runs/lr-transfer")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {}
    for sweep in args.sweeps.split(","):
        s = SWEEPS[sweep]
        path = search_file(out, sweep, args.steps, args.seeds)
        folder = out / f"lr-{sweep}"
        outcome = run_search(path, out=folder, resume=(folder / "search.json").exists(), progress_every_s=1e9)
        if outcome.interrupted is not None:
            raise SystemExit(f"the {sweep} sweep was stopped before it finished; run the same command again to resume it")
        runs: dict[tuple[int, str], dict[float, dict[int, float]]] = {}
        for r in outcome.records:
            if r.status not in ("completed", "diverged"):
                continue
            parts = dict(part.split("=") for part in r.cell.split(","))
            size, param, seed = int(parts[s["key"].rsplit(".", 1)[1]]), parts["parametrization"], int(parts["seed"])
            value = r.value if r.status == "completed" else 20.0
            runs.setdefault((size, param), {}).setdefault(r.overrides["train.lr"], {})[seed] = value
        rows = []
        for size in s["sizes"]:
            for param in ("standard", s["transfer"]):
                if (size, param) not in runs:
                    raise SystemExit(f"no finished run for {sweep} {size} {param} in {folder}; see its summary.md")
                best, low, high, means = best_with_range(runs[(size, param)])
                rows.append({"size": size, "parametrization": param, "best_lr": best, "range": [low, high], "means": means})
                print(f"{sweep} {size:4d} {param:9s}: best lr {best:g} (95% over seed resamples {low:g}-{high:g}); "
                      + ", ".join(f"{lr:g}: {m:.3f}" for lr, m in means.items()), flush=True)
        report[sweep] = rows
    (out / "lr_transfer.json").write_text(json.dumps(report, indent=1))
    plot(report, out / "lr_transfer.png")
    for sweep, rows in report.items():
        for param in sorted({r["parametrization"] for r in rows}):
            best = [r["best_lr"] for r in rows if r["parametrization"] == param]
            spread = max(best) / min(best)
            print(f"{sweep} sweep, {param}: best lr from {best[0]:g} to {best[-1]:g} (largest / smallest {spread:g}); mean of the best "
                  f"{statistics.mean(best):.3g}")


def plot(report: dict, path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(10, 7.5))
    for row, (sweep, rows) in enumerate(report.items()):
        params = list(dict.fromkeys(r["parametrization"] for r in rows))
        for col, param in enumerate(params):
            ax = axes[row][col]
            mine = [r for r in rows if r["parametrization"] == param]
            cmap = plt.get_cmap("viridis")
            for i, r in enumerate(mine):
                lrs = sorted(float(lr) for lr in r["means"])
                color = cmap(i / max(1, len(mine) - 1))
                ax.plot(lrs, [r["means"][lr] for lr in lrs], "o-", color=color, markersize=3, label=f"{sweep} {r['size']}")
                ax.plot([r["best_lr"]], [r["means"][r["best_lr"]]], "*", color=color, markersize=11)
                ax.hlines(r["means"][r["best_lr"]], r["range"][0], r["range"][1], color=color, alpha=0.6, linewidth=3)
            ax.set_xscale("log")
            ax.set_xlabel("learning rate")
            ax.set_ylabel("val_loss (mean over seeds)")
            ax.set_title(f"{param}: {sweep} sweep", fontsize=10)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle("best learning rate by size (star; bar: 95% range over seed resamples)", fontsize=11)
    fig.tight_layout()
    save_png(fig, path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
