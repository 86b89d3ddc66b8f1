"""`blockforge export`: a run, or the confirmed winner of a search cell, as a model folder."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="export a run, or the best trial of a search cell, as a model (safetensors + spec + card)")
    p.add_argument("source", help="a run folder or a search folder")
    p.add_argument("--out", required=True, help="the export folder")
    p.add_argument("--cell", help="search folders: the cell, e.g. depth=12,width=256 (needed when there are several)")
    p.add_argument("--retrain", action="store_true", help="search folders: train the best spec to the full budget first")
    p.add_argument("--no-progress", action="store_true", help="no progress bar while retraining")
    p.add_argument("--pick", type=int, help="search folders with a cost axis: the front point N (as summary.md numbers them)")
    p.add_argument("--under", help="search folders with a cost axis: the best quality on the front within COST=X, e.g. kv_cache_bytes=65536")
    p.add_argument("--format", choices=["blockforge", "hf", "timm"], default="blockforge",
                   help="blockforge (read by blockforge.load), hf (transformers: a llama, with its tokenizer) or timm (a uniform Pre-LN vit)")
    p.add_argument("--dtype", choices=["fp32", "bf16", "fp16"],
                   help="--format hf or timm: the weights' precision (default fp32, or a converted model's source precision)")
    p.add_argument("--force", action="store_true", help="replace an earlier export in --out (a non-empty --out is refused without it)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from blockforge.export import export_dtype, export_folder, export_run

    source = Path(args.source)
    export_dtype(args.dtype, args.format)  # refused before anything is read
    if args.pick is not None and args.under:
        from blockforge.errors import BlockforgeError

        raise BlockforgeError("give --pick or --under, not both")
    if (source / "search.json").exists():
        from blockforge.search.best import export_best

        with export_folder(args.out, force=args.force, run_dir=source) as stage:  # checked before any retraining
            export_best(source, stage, cell=args.cell, retrain=args.retrain, progress=not args.no_progress, format=args.format,
                        pick=args.pick, under=args.under, dtype=args.dtype)
    else:
        if args.cell or args.retrain or args.pick is not None or args.under:
            from blockforge.errors import BlockforgeError

            raise BlockforgeError(f"{source}: --cell, --retrain, --pick and --under apply to a search folder, and this is not one (no search.json)")
        export_run(source, args.out, force=args.force, format=args.format, dtype=args.dtype)
    print(f"exported to {args.out}" + (f" ({args.format} format)" if args.format != "blockforge" else ""))
    return 0
