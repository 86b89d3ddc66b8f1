"""Training-loop overhead: tokens/s of `Trainer.run()` against a bare forward+backward+step loop.

Both train the same tiny llama on the same batches in one process, alternating full and bare runs so
machine noise hits both alike. The full loop's final evaluation and checkpoint are timed separately
and subtracted: what remains is data, schedule, clipping, logging and the progress bar.

    python benchmarks/train_loop.py [--steps 40] [--repeats 3] [--recipe recipes/llama-tiny-mix.yaml]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from itertools import islice
from pathlib import Path

import torch

from blockforge.spec import load_recipe
from blockforge.train.checkpoint import save_checkpoint
from blockforge.train.loop import Trainer
from blockforge.train.optim import make_optimizer
from blockforge.train.task import evaluate


def full_loop(recipe, steps: int) -> float:
    """Seconds per step of Trainer.run(), final evaluation and checkpoint excluded."""
    with tempfile.TemporaryDirectory() as folder:
        trainer = Trainer(recipe, Path(folder) / "run", progress=True)
        start = time.perf_counter()
        trainer.run()
        total = time.perf_counter() - start
        start = time.perf_counter()  # what the last step added on top of training
        evaluate(trainer.model, trainer.val_batches, trainer.runtime, trainer.pad_id)
        save_checkpoint(Path(folder) / "again", trainer.model, trainer.optimizer, dict(trainer.state))
        extra = time.perf_counter() - start
    return (total - extra) / steps


def bare_loop(recipe, steps: int) -> float:
    """Seconds per step of forward+backward+optimizer step on pre-fetched batches (same model, same init)."""
    with tempfile.TemporaryDirectory() as folder:
        trainer = Trainer(recipe, Path(folder) / "bare", progress=False)
    model = trainer.model
    optimizer = make_optimizer(model, trainer.spec, recipe.train, trainer.device)
    batches = list(islice(trainer.data.train_batches(recipe.train.micro_batch), steps * trainer.accumulation))
    start = time.perf_counter()
    for i in range(steps):
        for micro in batches[i * trainer.accumulation:(i + 1) * trainer.accumulation]:
            loss = trainer.family.loss(model, micro, trainer.pad_id)[0]
            (loss / trainer.accumulation).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="recipes/llama-tiny-mix.yaml")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    recipe = load_recipe(args.recipe, [("train.steps", args.steps), ("train.eval_every", 0), ("train.checkpoint_every", 0)])
    tokens_per_step = recipe.train.batch_size * recipe.model.context

    full_loop(recipe, args.steps), bare_loop(recipe, args.steps)  # warm-up: allocator, kernels, caches
    full, bare = [], []
    for _ in range(args.repeats):
        full.append(full_loop(recipe, args.steps))
        bare.append(bare_loop(recipe, args.steps))
    f, b = statistics.median(full), statistics.median(bare)
    print(f"{args.recipe}: {args.steps} steps x {args.repeats} repeats, batch {recipe.train.batch_size} x {recipe.model.context} tokens")
    print(f"  full loop   {tokens_per_step / f:10,.0f} tok/s  ({f * 1000:.1f} ms/step)")
    print(f"  bare loop   {tokens_per_step / b:10,.0f} tok/s  ({b * 1000:.1f} ms/step)")
    print(f"  overhead    {(f / b - 1) * 100:+.1f}%")


if __name__ == "__main__":
    main()
