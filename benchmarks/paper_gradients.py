"""Per-layer gradient norms of the paper's LLaMA-130M and -250M, Pre-LN vs Post-LN vs Mix-LN, on real text.

The Mix-LN paper's gradient evidence (its Fig. 3e and 6a): Pre-LN gradients shrink with depth, Post-LN
gradients vanish in the early layers, Mix-LN (alpha 0.25) is flatter. This measures the same profile
with blockforge.analysis.grad_norms at initialization (several seeds) and again after a few dozen and
a hundred or so Adam steps, on the builtin corpus (the stdlib docs, byte-level BPE of 32,000, context
256) instead of C4, at CPU scale: small batches, a 30-step warmup to the paper's lr 1e-3, then a
constant lr. Per checkpoint it prints the per-layer norms, the slope of ln(norm) over the layer index
(per layer; negative: falling with depth) and the coefficient of variation across layers, and writes
one figure + JSON per (size, step), in the format `blockforge analyze` writes (blockforge.analysis.replot).

    python benchmarks/paper_gradients.py --out /tmp/analysis-figures/paper_gradients [--sizes 130m 250m]
        [--steps 30,100] [--batch-size 2] [--grad-batches 2] [--grad-batch-size 4] [--seeds 0,1,2]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from blockforge.analysis import grad_norms, plot
from blockforge.data import dataset_for
from blockforge.io import atomic_write_json
from blockforge.nn.build import build_model
from blockforge.spec import load_recipe
from blockforge.train.events import Step
from blockforge.train.loop import Trainer

VARIANTS = ("pre", "post", "mix")
# The paper's data (C4, t5-base) cannot load offline: real text from the builtin corpus instead.
DATA = [("data.source", "builtin"), ("data.tokenizer", {"bpe": 32000}), ("data.pack", True)]


def profile_stats(mean: np.ndarray) -> dict:
    """Slope of ln(norm) per layer (least squares), last/first ratio and coefficient of variation across layers."""
    layers = np.arange(len(mean))
    return {
        "log_slope": float(np.polyfit(layers, np.log(mean), 1)[0]),
        "last_over_first": float(mean[-1] / mean[0]),
        "cv": float(mean.std() / mean.mean()),
    }


def measure_variant(size: str, variant: str, args, steps: list[int]) -> dict:
    """Norms at init (per seed) and after each of `steps` Adam steps (seed 0), on fixed validation batches."""
    recipe = load_recipe(f"recipes/llama-{size}-{variant}.yaml", DATA + [
        ("train.steps", max(steps)), ("train.warmup", args.warmup / max(steps)), ("train.schedule", "constant"),
        ("train.lr", args.lr), ("train.seed", args.seeds[0]), ("train.batch_size", args.batch_size),
        ("train.micro_batch_size", args.batch_size), ("train.device", "cpu"), ("train.grad_norm_every", 1),
        ("train.eval_every", 0), ("train.eval_batches", 1), ("train.checkpoint_every", 0),
    ])
    spec = recipe.spec
    data = dataset_for(recipe)
    probe = data.val_batches(args.grad_batch_size, args.grad_batches)  # the same batches at every checkpoint
    started = time.perf_counter()

    # Training seed s starts from the model built with seed s, so the seed-0 model measured here is the one trained below.
    rows = {0: np.concatenate([grad_norms(build_model(spec, seed=seed), probe, pad_id=data.pad_id) for seed in args.seeds])}
    trace, losses = [], []

    def measure(trainer: Trainer, step: Step) -> None:
        trace.append(step.layer_grad_norms)  # this step's own training-batch gradient, for reference
        losses.append(step.loss)
        if step.step in steps:
            rows[step.step] = grad_norms(trainer.model, probe, pad_id=data.pad_id)

    with tempfile.TemporaryDirectory() as folder:
        Trainer(recipe, Path(folder) / "run", progress=False, callbacks=[measure]).run()
    seconds = time.perf_counter() - started
    print(f"  {size} {variant}: loss {losses[0]:.3f} -> {np.mean(losses[-10:]):.3f} (mean of the last 10), {seconds:.0f}s", flush=True)
    return {"spec": spec, "rows": rows, "trace": trace, "losses": losses, "seconds": seconds, "data": data.describe()}


def record_for(size: str, step: int, measured: dict, args) -> dict:
    """A grad_norms record as `blockforge analyze` writes it, one result per variant."""
    results = []
    for variant, m in measured.items():
        rows = m["rows"][step]
        results.append({
            "label": f"{size}-{variant}", "path": f"recipes/llama-{size}-{variant}.yaml", "kind": "recipe", "family": "llama",
            "state": "init" if step == 0 else "trained", "step": step, "seeds": args.seeds if step == 0 else args.seeds[:1],
            "placements": [layer.placement for layer in m["spec"].layers], "data": m["data"],
            "mean": rows.mean(0).tolist(), "std": rows.std(0).tolist(), "per_batch": rows.tolist(),
            **profile_stats(rows.mean(0)),
        })
    inputs = {
        "targets": [{"path": r["path"], "kind": "recipe", "label": r["label"]} for r in results], "at_init": step == 0,
        "overrides": [f"{k}={json.dumps(v)}" for k, v in DATA], "seeds": args.seeds, "batch_size": args.grad_batch_size,
        "grad_batches": args.grad_batches, "train_batch_size": args.batch_size, "lr": args.lr, "warmup_steps": args.warmup,
        "schedule": "constant after warmup", "step": step, "torch": torch.__version__,
    }
    return {"analysis": "grad_norms", "format": 1, "inputs": inputs, "results": results}


def print_table(record: dict) -> None:
    results = record["results"]
    step = record["inputs"]["step"]
    print(f"\n{results[0]['label'].split('-')[0]} at {'init (mean over seeds x batches)' if step == 0 else f'step {step}'}")
    print("layer " + "".join(f"{r['label']:>22}" for r in results))
    for layer in range(len(results[0]["mean"])):
        print(f"{layer:>5} " + "".join(f"{r['mean'][layer]:>13.4g} ±{r['std'][layer]:>7.2g}" for r in results))
    for key in ("log_slope", "last_over_first", "cv"):
        print(f"{key:>15} " + "".join(f"{r[key]:>13.3g}         " for r in results).rstrip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for the figures and JSON")
    parser.add_argument("--sizes", nargs="+", default=["130m", "250m"], choices=["71m", "130m", "250m", "1b"])
    parser.add_argument("--steps", default="30,100", help="training steps at which to measure (comma-separated)")
    parser.add_argument("--batch-size", type=int, default=2, help="training sequences per step (context 256)")
    parser.add_argument("--grad-batches", type=int, default=2, help="fixed validation batches the norms are averaged over")
    parser.add_argument("--grad-batch-size", type=int, default=4, help="sequences per validation batch")
    parser.add_argument("--seeds", default="0,1,2", help="init seeds (training uses the first)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=30, help="linear warmup steps")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    args.seeds = [int(s) for s in args.seeds.split(",")]
    steps = sorted(int(s) for s in args.steps.split(","))
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    summary = {}
    for size in args.sizes:
        print(f"LLaMA-{size}: {len(args.seeds)} init seeds x {args.grad_batches} batches of {args.grad_batch_size}; "
              f"training batch {args.batch_size} x 256, steps {steps}", flush=True)
        measured = {variant: measure_variant(size, variant, args, steps) for variant in VARIANTS}
        for step in [0] + steps:
            record = record_for(size, step, measured, args)
            name = f"llama-{size}-step{step:03d}"
            atomic_write_json(out / f"{name}.json", record)
            plot(record, out / f"{name}.png")
            print_table(record)
            summary[name] = {r["label"]: {k: r[k] for k in ("log_slope", "last_over_first", "cv")} for r in record["results"]}
        atomic_write_json(out / f"llama-{size}-training.json", {
            variant: {"losses": m["losses"], "layer_grad_norms": m["trace"], "seconds": m["seconds"]} for variant, m in measured.items()
        })
    previous = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    atomic_write_json(out / "summary.json", {**previous, **summary})  # sizes may be measured in separate runs
    print(f"\ntotal {time.perf_counter() - started:.0f}s; figures and JSON in {out}")


if __name__ == "__main__":
    main()
