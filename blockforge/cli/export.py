"""`blockforge export`: a run, or the confirmed winner of a search cell, as a model folder."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="export a run, or the best trial of a search cell, as a model (safetensors + spec + card)")
    p.add_argument("source", help="a run folder or a search folder: a local path, or a URI such as s3://bucket/search")
    p.add_argument("--out", required=True, help="the export folder: a local path, or a URI (written locally, then put up)")
    p.add_argument("--cell", help="search folders: the cell, e.g. depth=12,width=256 (needed when there are several)")
    p.add_argument("--retrain", action="store_true", help="search folders: train the best spec to the full budget first")
    p.add_argument("--no-progress", action="store_true", help="no progress bar while retraining")
    p.add_argument("--pick", type=int, help="search folders with a cost axis: the front point N (as summary.md numbers them)")
    p.add_argument("--under", help="search folders with a cost axis: the best quality on the front within COST=X, e.g. kv_cache_bytes=65536")
    p.add_argument("--format", choices=["blockforge", "hf", "timm", "gguf"], default="blockforge",
                   help="blockforge (read by blockforge.load), hf (transformers: a llama, with its tokenizer), timm (a uniform Pre-LN vit) "
                        "or gguf (llama.cpp: a uniform Pre-LN llama with blockforge's BPE)")
    p.add_argument("--dtype", choices=["fp32", "bf16", "fp16"],
                   help="--format hf, timm or gguf: the weights' precision (default fp32, or a converted model's source precision; gguf: fp32 or fp16)")
    p.add_argument("--target", choices=["vllm"],
                   help="--format hf: refuse, by name, what that serving engine cannot run (vllm: several window sizes, score soft-caps in "
                        "some layers only, norm gains offset other than 0 or 1)")
    p.add_argument("--force", action="store_true", help="replace an earlier export in --out (a non-empty --out is refused without it)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from blockforge.errors import BlockforgeError
    from blockforge.export import export_dtype

    export_dtype(args.dtype, args.format)  # refused before anything is read
    if args.pick is not None and args.under:
        raise BlockforgeError("give --pick or --under, not both")
    from blockforge.storage import Storage

    source, out = Storage.open(args.source), Storage.open(args.out)
    if out.local:
        _export(args, source, Path(out.uri))
        hint = load_line(Path(out.uri), args.format, args.out)
    else:  # written here, checked as any export is, then put up whole
        import tempfile

        from blockforge.storage import put_folder

        if out.listing() and not args.force:
            raise BlockforgeError(f"{out}: is not empty; pass --force to replace the export in it, or choose another --out")
        with tempfile.TemporaryDirectory(prefix="blockforge-export-") as scratch:
            _export(args, source, Path(scratch) / "export")
            hint = load_line(Path(scratch) / "export", args.format, args.out)
            put_folder(Path(scratch) / "export", out)
    print(f"exported to {args.out}" + (f" ({args.format} format)" if args.format != "blockforge" else ""))
    print(hint)
    return 0


def load_line(folder: Path, format: str, where: str) -> str:
    """How to load the export in `folder` (to be kept at `where`), as the line printed after it."""
    import json

    if format == "blockforge":
        return (f"load it with blockforge.load({where!r}); for transformers, export it with --format hf "
                "(and --format gguf for llama.cpp where the model allows)")
    from blockforge.storage import is_uri

    if format != "blockforge" and is_uri(where):  # other libraries read a local folder
        where = "<a local copy of the folder>"
    if format == "hf":
        remote = "auto_map" in json.loads((folder / "config.json").read_text())
        return (f"load it with transformers.AutoModelForCausalLM.from_pretrained({where!r}"
                + (", trust_remote_code=True)  (its layers differ from any transformers class: the folder carries their code)" if remote else ")"))
    if format == "gguf":
        return f"serve it with llama.cpp: llama-cli -m {where}/model.gguf"
    return f"load it with timm.create_model('local-dir:{where}', pretrained=True)"


def _export(args: argparse.Namespace, source, out: Path) -> None:
    """Export `source` (a blockforge.storage.Storage: a run or search folder, local or remote) into the local folder `out`."""
    from blockforge.errors import BlockforgeError
    from blockforge.export import export_folder, export_run
    from blockforge.search.config import MARKER

    if source.exists(MARKER):
        from blockforge.search.run.best import export_best

        with export_folder(out, force=args.force, run_dir=Path(args.source) if source.local else None) as stage:  # checked before any retraining
            export_best(args.source, stage, cell=args.cell, retrain=args.retrain, progress=not args.no_progress, format=args.format,
                        pick=args.pick, under=args.under, dtype=args.dtype, target=args.target)
        return
    if args.cell or args.retrain or args.pick is not None or args.under:
        raise BlockforgeError(f"{source}: --cell, --retrain, --pick and --under apply to a search folder, and this is not one (no search.json)")
    from blockforge.storage import fetch_folder

    export_run(Path(args.source) if source.local else fetch_folder(source), out, force=args.force, format=args.format, dtype=args.dtype,
               target=args.target)
