"""`blockforge eval`: the validation metrics of a run or an exported model, on its recipe's data."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub) -> None:
    from blockforge.cli.common import positive_int

    p = sub.add_parser("eval", help="validation loss/perplexity (LM) or accuracy (vit) of a run or export")
    p.add_argument("dir", help="a run folder or an exported model folder")
    p.add_argument("--batches", type=positive_int, help="validation micro-batches (default: the recipe's train.eval_batches)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from blockforge.cli.common import format_metrics
    from blockforge.data import dataset_for
    from blockforge.errors import BlockforgeError
    from blockforge.export import load
    from blockforge.spec.recipe import read_yaml, recipe_from_data
    from blockforge.train.runtime import Runtime, pick_device
    from blockforge.train.task import evaluate

    folder = Path(args.dir)
    model = load(folder)
    if not (folder / "recipe.yaml").exists():
        raise BlockforgeError(f"{folder}: recipe.yaml is missing, so the evaluation data is unknown")
    recipe = recipe_from_data(read_yaml(folder / "recipe.yaml"), file=str(folder / "recipe.yaml"))
    runtime = Runtime(pick_device(args.device), recipe.train.precision)
    data = dataset_for(recipe)
    batches = data.val_batches(recipe.train.micro_batch, args.batches or recipe.train.eval_batches)
    print(format_metrics(evaluate(model.to(runtime.device), batches, runtime, getattr(data, "pad_id", None))))
    return 0
