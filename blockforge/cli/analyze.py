"""`blockforge analyze`: per-layer gradient norms, angular distance and layer-drop, as figures + JSON.

The work is done by blockforge.analysis.report.analyze, which the Python API and the benchmarks call too.
"""

from __future__ import annotations

import argparse
import sys

from blockforge.analysis.defaults import DEFAULT_IMAGES, DEFAULT_SEEDS, DEFAULT_TOKENS

DESCRIPTION = """\
Measure each layer of one or more targets (run folders, export folders or recipe YAML files) and write,
per chosen analysis, a comparison figure (PNG) and its data with the inputs (JSON) into --out.
Trained targets are measured at their weights (--at-init: as freshly initialized); recipes always at
initialization, gradient norms averaged over --seeds. Runs also get their logged gradient norms along
training. Data: the target's recipe data section; validation samples first, then (for gradient norms and
angular distance, when a budget exceeds the validation split) training samples; layer-drop uses
validation samples only."""


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of integers, e.g. 0,1,2") from None
    if not seeds:
        raise argparse.ArgumentTypeError("give at least one seed, e.g. 0,1,2")
    return seeds


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add `analyze` to the subparsers of the `blockforge` command."""
    from blockforge.cli.common import add_set

    p = subparsers.add_parser("analyze", help="per-layer gradient norms, angular distance and layer-drop, as figures + JSON",
                              description=DESCRIPTION)
    p.add_argument("targets", nargs="+", metavar="TARGET", help="a run folder, an export folder or a recipe YAML (several: compared)")
    p.add_argument("--grad-norms", action="store_true", help="gradient L2 norm over each layer's parameters")
    p.add_argument("--angular", action="store_true", help="angular distance between the inputs of layers l and l+n")
    p.add_argument("--layer-drop", action="store_true", help="change of the validation metric when one layer is skipped")
    p.add_argument("--all", action="store_true", help="all three analyses")
    p.add_argument("--at-init", action="store_true", help="analyse trained targets as freshly initialized models")
    p.add_argument("--out", required=True, help="the folder for the figures and their JSON")
    add_set(p)
    p.add_argument("--tokens", type=int, default=DEFAULT_TOKENS, help=f"LM tokens for angular distance and layer-drop (default {DEFAULT_TOKENS})")
    p.add_argument("--images", type=int, default=DEFAULT_IMAGES, help=f"vit images (all their tokens) for the same (default {DEFAULT_IMAGES})")
    p.add_argument("--seeds", type=_seeds, default=list(DEFAULT_SEEDS), help="init seeds for gradient norms at init (default 0,1,2)")
    p.add_argument("--batch-size", type=int, default=16, help="sequences or images per batch (default 16)")
    p.add_argument("--grad-batches", type=int, default=4, help="batches per model for gradient norms (default 4)")
    p.add_argument("--drop-metric", default="val_loss", choices=["val_loss", "val_ppl", "val_acc"], help="layer-drop metric (default val_loss)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.set_defaults(func=run)
    return p


def _tables(records: dict) -> list[tuple[str, list[str], list[list]]]:
    """(title, headers, rows) per analysis: one row per layer, one column per target."""
    tables = []

    def per_layer(title: str, results: list[dict], cell) -> None:
        depth = max(len(r["placements"]) for r in results)
        rows = [[i] + [cell(r, i) if i < len(r["placements"]) else "" for r in results] for i in range(depth)]
        tables.append((title, ["layer"] + [r["label"] for r in results], rows))

    if "grad_norms" in records:
        per_layer("gradient norm per layer (mean ± std)", records["grad_norms"]["results"],
                  lambda r, i: f"{r['mean'][i]:.3g} ± {r['std'][i]:.2g}")
    if "angular_distance" in records:
        per_layer("angular distance to the next layer's input, d(x_l, x_l+1)", records["angular_distance"]["results"],
                  lambda r, i: f"{r['distances'][0][i]:.3f}")
    if "layer_drop" in records:
        results = records["layer_drop"]["results"]
        per_layer(f"layer-drop: change in {results[0]['metric']} (full model: "
                  + ", ".join(f"{r['baseline']:.4g}" for r in results) + ")", results, lambda r, i: f"{r['change'][i]:+.4g}")
    return tables


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from blockforge.spec import load_recipe

    for target in args.targets:  # recipes among the targets are read, and a bad one refused, before torch is imported
        if Path(target).is_file():
            load_recipe(target, args.overrides)
    from blockforge.analysis.report import analyze
    from blockforge.tables import text_table

    everything = args.all
    records = analyze(
        args.targets, args.out,
        grad_norms=args.grad_norms or everything, angular=args.angular or everything, layer_drop=args.layer_drop or everything,
        at_init=args.at_init, overrides=args.overrides, tokens=args.tokens, images=args.images, seeds=args.seeds,
        batch_size=args.batch_size, grad_batches=args.grad_batches, drop_metric=args.drop_metric, device=args.device,
        echo=lambda line: print(line, file=sys.stderr),
    )
    for title, headers, rows in _tables(records):
        print(title)
        print(text_table(headers, rows, "r" * len(headers)))
        print()
    out = Path(args.out)
    print("wrote " + ", ".join(str(out / f"{name}.{ext}") for name in records for ext in ("json", "png")))
    return 0
