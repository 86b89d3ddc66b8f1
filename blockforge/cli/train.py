"""`blockforge train`: a recipe into a run folder (also a rank of a torchrun data-parallel run)."""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from pathlib import Path


def add_parser(sub) -> None:
    from blockforge.cli.common import add_report_to, add_set

    p = sub.add_parser("train", help="train a recipe into a run folder")
    p.add_argument("recipe", help="a recipe YAML file")
    add_set(p)
    add_report_to(p, "the run")
    p.add_argument("--out", help="the run folder (default: runs/<recipe name>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def resume_command(args: argparse.Namespace, out: Path) -> str:
    """The command line that continues this run: the same recipe and --set flags, with --resume."""
    sets = [part for assignment in args.overrides for part in ("--set", str(assignment))]
    return shlex.join(["blockforge", "train", args.recipe, *sets, "--out", str(out), "--resume"])


def run(args: argparse.Namespace) -> int:
    from blockforge.cli.common import format_metrics, load_recipe_with_sets

    recipe = load_recipe_with_sets(args.recipe, args.overrides)  # a bad recipe is refused before torch is imported
    from blockforge.train.events import Status
    from blockforge.train.loop import EXIT_DIVERGED, Trainer

    out = Path(args.out) if args.out else Path("runs") / Path(args.recipe).stem
    trainer = Trainer(recipe, out, resume=args.resume, progress=not args.no_progress)
    result = trainer.run()
    if result.status == Status.INTERRUPTED:  # SIGTERM or Ctrl-C: the shell's code for death by that signal
        if trainer.world.is_main:
            print(f"blockforge: {result.message}; continue with: {resume_command(args, out)}", file=sys.stderr)
        return 128 + result.signal
    if not trainer.world.is_main:
        return 0
    if result.status == Status.DIVERGED:
        print(f"blockforge: {result.message} (run folder {out})", file=sys.stderr)
        return EXIT_DIVERGED
    print(f"{result.status} at step {result.step}: {format_metrics(result.metrics)}")
    baseline = result.metrics.get("val_baseline")
    if baseline is not None and "val_ppl" in result.metrics:
        print(f"baseline: a unigram model of the training split scores the same validation tokens at val_loss {baseline:.4g} "
              f"(val_ppl {math.exp(baseline):.2f}); this run learnt {baseline - result.metrics['val_loss']:.3g} nats beyond it")
    stability = result.stability
    if stability is not None and (stability.unstable or stability.spikes):  # train/stability.py's rule, as every search applies it
        spikes = f"{stability.spikes} loss spike(s), the largest {stability.largest_spike:.2f} nats above the level before it"
        print(f"unstable: {stability.unstable}" + (f"; {spikes}" if stability.spikes else "") if stability.unstable else f"stable, with {spikes}")
    print(f"run folder: {out}")
    return 0
