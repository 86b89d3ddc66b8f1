"""The `blockforge` command: inspect, train, eval, analyze, search, export.

Every subcommand goes through the same load -> resolve -> build path as the Python API; a problem
with a file, a flag or a path is printed as one sentence and exits with status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter

from blockforge.errors import BlockforgeError
from blockforge.tables import text_table


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line (no usage dump) with exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}; see '{self.prog} --help'\n")


def _add_set(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a recipe value by dotted key, e.g. --set model.layers.mix_ln.alpha=0.125 (repeatable)",
    )


def human_count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


def parse_assignment(text: str):
    from blockforge.spec import parse_assignment as parse

    return parse(text)


def cmd_inspect(args: argparse.Namespace) -> int:
    from blockforge.nn.build import build_model, layer_parameter_counts, parameter_count
    from blockforge.spec import load_recipe, resolve

    recipe = load_recipe(args.recipe, args.overrides)
    spec = resolve(recipe.model)
    model = build_model(spec, device="meta")  # counts only: nothing is allocated
    per_layer = layer_parameter_counts(model)
    rows = [
        [layer.index, layer.placement, layer.heads, spec.width // layer.heads, layer.ffn, layer.init_scale, layer.lr_mult, f"{n:,}"]
        for layer, n in zip(spec.layers, per_layer)
    ]
    print(text_table(["layer", "placement", "heads", "head_dim", "ffn", "init_scale", "lr_mult", "params"], rows, "rlrrrrrr"))
    total = parameter_count(model)
    blocks = sum(per_layer)
    counts = Counter(layer.placement for layer in spec.layers)
    print()
    print(f"family       {spec.family} (width {spec.width}, depth {spec.depth}, norm {spec.norm}, attention {spec.attention})")
    print("placements   " + ", ".join(f"{name} x{n}" for name, n in counts.items()))
    print(f"parameters   {total:,} ({human_count(total)}); blocks {blocks:,}, other {total - blocks:,}")
    print(f"arch hash    {spec.arch_hash()}")
    if args.memory:
        from blockforge.train.memory import memory_plan

        plan = memory_plan(recipe, gpus=args.gpus, sharded=args.fsdp)
        print()
        print(text_table(["memory plan (meta device, nothing allocated)", "size", ""], plan.rows(), "lrl"))
    return 0


def _format_metrics(metrics: dict | None) -> str:
    if not metrics:
        return "no metrics"
    return ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items())


def cmd_train(args: argparse.Namespace) -> int:
    from pathlib import Path

    from blockforge.spec import load_recipe
    from blockforge.train.loop import EXIT_DIVERGED, Trainer

    recipe = load_recipe(args.recipe, args.overrides)
    out = Path(args.out) if args.out else Path("runs") / Path(args.recipe).stem
    trainer = Trainer(recipe, out, resume=args.resume, progress=not args.no_progress)
    result = trainer.run()
    if not trainer.world.is_main:
        return 0
    if result.status == "diverged":
        print(f"blockforge: {result.message} (run folder {out})", file=sys.stderr)
        return EXIT_DIVERGED
    print(f"{result.status} at step {result.step}: {_format_metrics(result.metrics)}")
    unigram = trainer.data_info.get("unigram_val_ppl")
    if unigram is not None and "val_ppl" in result.metrics:
        print(f"baseline: a unigram model of the same tokens has val_ppl {unigram:.2f}")
    print(f"run folder: {out}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from pathlib import Path

    from blockforge.data import build_dataset
    from blockforge.export import load
    from blockforge.spec.recipe import read_yaml, recipe_from_data
    from blockforge.train.loop import cache_dir, evaluate, pick_device

    folder = Path(args.dir)
    model = load(folder)
    if not (folder / "recipe.yaml").exists():
        from blockforge.errors import BlockforgeError

        raise BlockforgeError(f"{folder}: recipe.yaml is missing, so the evaluation data is unknown")
    recipe = recipe_from_data(read_yaml(folder / "recipe.yaml"), file=str(folder / "recipe.yaml"))
    spec = model.spec
    device = pick_device(args.device)
    data = build_dataset(
        recipe.data, family=spec.family, seq_len=spec.context, vocab=spec.vocab, image_size=spec.image_size,
        channels=spec.channels, classes=spec.classes, seed=recipe.train.seed, cache_dir=cache_dir(),
    )
    batches = data.val_batches(recipe.train.micro_batch, args.batches or recipe.train.eval_batches)
    metrics = evaluate(model.to(device), batches, data.kind, device, recipe.train.precision, getattr(data, "pad_id", None))
    print(_format_metrics(metrics))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from blockforge.export import export_run

    source = Path(args.source)
    if (source / "search.json").exists():
        from blockforge.search.best import export_best

        out = export_best(source, args.out, cell=args.cell, retrain=args.retrain, progress=not args.no_progress)
    else:
        if args.cell or args.retrain:
            from blockforge.errors import BlockforgeError

            raise BlockforgeError(f"{source}: --cell and --retrain apply to a search folder, and this is not one (no search.json)")
        out = export_run(source, args.out)
    print(f"exported to {out}")
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    from blockforge.search.driver import run_search

    outcome = run_search(args.file, out=args.out, address=args.address, resume=args.resume, max_concurrent=args.max_concurrent,
                         overrides=[parse_assignment(a) for a in args.overrides])
    print()
    print(outcome.summary)
    print(f"\nsearch folder: {outcome.search_dir} (summary.md, results.csv, best/, plots)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="blockforge", description=__doc__.splitlines()[0])
    from blockforge import __version__

    parser.add_argument("--version", action="version", version=f"blockforge {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")

    p = sub.add_parser("inspect", help="print the resolved per-layer table of a recipe")
    p.add_argument("recipe", help="a recipe YAML file")
    _add_set(p)
    p.add_argument("--memory", action="store_true", help="also print the training memory plan (computed on the meta device)")
    p.add_argument("--gpus", type=int, default=1, help="GPUs the plan spreads over (with --fsdp)")
    p.add_argument("--fsdp", action="store_true", help="plan for weights, gradients and optimizer state sharded over --gpus")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("train", help="train a recipe into a run folder")
    p.add_argument("recipe", help="a recipe YAML file")
    _add_set(p)
    p.add_argument("--out", help="the run folder (default: runs/<recipe name>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("eval", help="validation loss/perplexity (LM) or accuracy (vit) of a run or export")
    p.add_argument("dir", help="a run folder or an exported model folder")
    p.add_argument("--batches", type=int, help="validation micro-batches (default: the recipe's train.eval_batches)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.set_defaults(func=cmd_eval)

    from blockforge.analysis.cli import add_analyze_parser

    add_analyze_parser(sub)

    p = sub.add_parser("search", help="search alpha (or any dotted keys) per cell on Ray Tune + Optuna")
    p.add_argument("file", help="a search YAML file (see searches/)")
    p.add_argument("--out", help="the search folder (default: runs/search-<name>)")
    p.add_argument("--address", help="join a Ray cluster ('auto' or ray://host:port); default: start a local Ray")
    p.add_argument("--resume", action="store_true", help="continue the search in --out")
    p.add_argument("--max-concurrent", type=int, help="trials at once (default: as many as resources allow)")
    _add_set(p)
    p.set_defaults(func=cmd_search)

    p = sub.add_parser("export", help="export a run, or the best trial of a search cell, as a model (safetensors + spec + card)")
    p.add_argument("source", help="a run folder or a search folder")
    p.add_argument("--out", required=True, help="the export folder")
    p.add_argument("--cell", help="search folders: the cell, e.g. depth=12,width=256 (needed when there are several)")
    p.add_argument("--retrain", action="store_true", help="search folders: train the best spec to the full budget first")
    p.add_argument("--no-progress", action="store_true", help="no progress bar while retraining")
    p.set_defaults(func=cmd_export)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except BlockforgeError as err:
        print(f"blockforge: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("blockforge: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`blockforge inspect ... | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes stdout
        return 0


if __name__ == "__main__":
    sys.exit(main())
