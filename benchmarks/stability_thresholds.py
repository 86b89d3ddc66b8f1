"""What healthy and unstable runs look like at the sizes this project trains on CPUs: the measurements the instability
rule's thresholds (blockforge/train/stability.py RULE) are chosen from.

The quickstart's llama (width 64, context 64, batch 16, 150 steps, the built-in corpus) at depths 4 and 12, Pre-LN,
Post-LN and Mix-LN (alpha 0.25), trained over learning rates from 1e-3 to 3e-1, with warm-up 10% and none, two seeds.
Every step's training loss is taken from the loop; per run it prints the largest rise of the loss level (the mean of
WINDOW steps) above its lowest after warm-up, the largest jump of one step above the level before it, the final
validation loss and the unigram baseline. The summary shows what separates runs that learnt from runs that collapsed to
about the unigram model or diverged (how far below the baseline each finished run ends), the largest rise and jump of
any run, and per model and seed the largest learning rate the rule calls stable.

    python benchmarks/stability_thresholds.py                  # about 25 minutes on two cores
    python benchmarks/stability_thresholds.py --quick          # depth 4 only, one seed (about 5 minutes)
    python benchmarks/stability_thresholds.py --json runs/stability-thresholds.json
    python benchmarks/stability_thresholds.py --from-json runs/stability-thresholds.json   # judge saved runs by today's rule
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LRS = [1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1]


def run(folder: Path, depth: int, alpha: float, lr: float, warmup: float, seed: int, steps: int) -> dict:
    import blockforge
    from blockforge.train.loop import Trainer
    from blockforge.train.stability import Monitor, baseline_loss

    sets = [("model.width", 64), ("model.heads", 2), ("model.ffn", 172), ("model.context", 64), ("model.depth", depth),
            ("model.layers.mix_ln.alpha", alpha), ("train.batch_size", 16), ("train.lr", lr), ("train.warmup", warmup),
            ("train.steps", steps), ("train.seed", seed), ("train.eval_batches", 8), ("train.checkpoint_every", 0),
            ("train.grad_norm_every", 0), ("train.divergence.max_loss", 20.0)]
    recipe = blockforge.load_recipe(ROOT / "recipes" / "llama-tiny-mix.yaml", sets)
    losses: list[float] = []
    trainer = Trainer(recipe, folder / f"d{depth}-a{alpha}-lr{lr:g}-w{warmup}-s{seed}", progress=False,
                      callbacks=[lambda t, info: losses.append(info.loss)])
    result = trainer.run()
    monitor = Monitor(recipe.train.warmup_steps)
    for step, loss in enumerate(losses, start=1):
        monitor.update(step, loss)
    val = result.metrics.get("val_loss") if result.status == "completed" else None
    baseline = baseline_loss(trainer.data_info)
    judged = monitor.judge(diverged=result.message if result.status == "diverged" else None, final_loss=val, baseline=baseline)
    return {"depth": depth, "alpha": alpha, "lr": lr, "warmup": warmup, "seed": seed, "status": str(result.status), "val_loss": val,
            "baseline": baseline, "rise": monitor.state["rise"], "largest_jump": monitor.state["largest_spike"],
            "spikes": judged.spikes, "unstable": judged.unstable, "losses": losses}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="depth 4, one seed")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--json", type=Path, help="write every run's numbers (and losses) here")
    parser.add_argument("--from-json", type=Path, help="judge the runs saved by --json again, by the rule as it is now (no training)")
    args = parser.parse_args()
    if args.from_json:
        return summarize(rejudged(json.loads(args.from_json.read_text())), 0.0)
    import torch

    torch.set_num_threads(2)
    depths, seeds = ([4], [0]) if args.quick else ([4, 12], [0, 1])
    runs = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for depth in depths:
            for alpha in (0.0, 0.25, 1.0):
                for warmup in (0.1, 0.0):
                    for seed in seeds:
                        for lr in LRS:
                            runs.append(run(Path(tmp), depth, alpha, lr, warmup, seed, args.steps))
                            r = runs[-1]
                            print(f"depth {depth} alpha {alpha} warmup {warmup} seed {seed} lr {lr:g}: {r['status']}, val "
                                  f"{r['val_loss'] if r['val_loss'] is None else round(r['val_loss'], 3)}, rise {r['rise']:.3f}, "
                                  f"largest jump {r['largest_jump']:.3f}, spikes {r['spikes']}, {r['unstable'] or 'stable'}", flush=True)
    summarize(runs, time.perf_counter() - started)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(runs))


def rejudged(runs: list[dict]) -> list[dict]:
    """Saved runs judged by the rule as it is now (their losses, final validation loss and baseline are kept)."""
    from blockforge.train.stability import judge_curve

    for r in runs:
        diverged = "diverged" if r["status"] == "diverged" else None
        judged = judge_curve(r["losses"], int(r["warmup"] * 150), final_loss=r["val_loss"], baseline=r["baseline"], diverged=diverged)
        r["unstable"], r["spikes"] = judged.unstable, judged.spikes
    return runs


def summarize(runs: list[dict], seconds: float) -> None:
    """What separates the runs that learnt from those that collapsed or diverged, and where the rule's thresholds sit."""
    from blockforge.train.stability import RULE

    finished = [r for r in runs if r["val_loss"] is not None]
    for r in finished:
        r["gain"] = r["baseline"] - r["val_loss"]
    print(f"\n{len(runs)} runs" + (f" in {seconds:.0f} s" if seconds else "") + f" ({len(runs) - len(finished)} diverged); the rule: {RULE}")
    bins = [(-math.inf, 0.10), (0.10, RULE.learnt), (RULE.learnt, 0.20), (0.20, 0.30), (0.30, math.inf)]
    print("final validation loss below the unigram baseline (nats), finished runs:")
    for low, high in bins:
        inside = [r for r in finished if low <= r["gain"] < high]
        kinds = sorted({(r["alpha"], r["lr"]) for r in inside})
        print(f"  [{low:g}, {high:g}): {len(inside)} runs" + (f"; alpha, lr: {kinds}" if 0 < len(inside) <= 24 else ""))
    print(f"largest rise of the loss level above its lowest after warm-up: {max(r['rise'] for r in runs):.3f} nats (the rule: {RULE.rise:g})")
    quiet = [r["largest_jump"] for r in runs if r["spikes"] == 0 and r["status"] == "completed"]
    print(f"runs with a spike: {sum(r['spikes'] > 0 for r in runs)}; largest jump of a run without one {max(quiet):.3f} nats (the rule: {RULE.spike:g})")
    print("largest learning rate from 3e-3 up that the rule calls stable, per model (depth, alpha, warm-up) and seed:")
    chains: dict[tuple, dict] = {}
    for r in runs:
        chains.setdefault((r["depth"], r["alpha"], r["warmup"]), {}).setdefault(r["seed"], {})[r["lr"]] = r
    for key, seeds in sorted(chains.items()):
        found = []
        for seed, by_lr in sorted(seeds.items()):
            largest = None
            for lr in sorted(by_lr):
                if lr < 3e-3:
                    continue
                if by_lr[lr]["unstable"]:
                    break
                largest = lr
            found.append("unstable at 3e-3" if largest is None else f"{largest:g}")
        print(f"  depth {key[0]}, alpha {key[1]}, warm-up {key[2]}: {', '.join(found)}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
