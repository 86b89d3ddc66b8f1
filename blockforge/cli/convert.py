"""`blockforge convert`: a transformers model folder (Llama, Mistral, Qwen2/3, OLMo 2, Gemma 1-3, Phi-3, SmolLM3,
Granite) as a blockforge model folder, with its tokenizer, generation config and provenance; or, with --format hf,
straight back out as its own transformers class (a round trip checked end to end)."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("convert", help="convert a transformers model folder into a blockforge model folder (tokenizer, generation config and all)")
    p.add_argument("source", help="a local transformers folder (config.json, model.safetensors, tokenizer files)")
    p.add_argument("--out", required=True, help="the folder to write")
    p.add_argument("--format", choices=["blockforge", "hf"], default="blockforge",
                   help="blockforge (read by blockforge.load, generate, search recipes) or hf (through blockforge and back to transformers)")
    p.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], help="--format hf: the weights' precision (default: the source's)")
    p.add_argument("--base-model", help="the hub id the card names as base_model (default: the source card's, else its name)")
    p.add_argument("--license", help="the license the card names (default: the source card's)")
    p.add_argument("--force", action="store_true", help="replace an earlier export in --out")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from blockforge.errors import BlockforgeError
    from blockforge.export import _replaceable, export_dtype, export_run, save
    from blockforge.families.llama_hf import from_hf_llama

    source, out = Path(args.source), Path(args.out)
    if not source.is_dir():
        raise BlockforgeError(f"{source}: no such folder; give a local transformers model folder")
    if args.dtype is not None:
        export_dtype(args.dtype, args.format)  # refused before any work
    _replaceable(out, args.force, None)
    model = from_hf_llama(source)
    if args.format == "blockforge":
        save(model, out, force=args.force, base_model=args.base_model, license=args.license)
    else:
        with tempfile.TemporaryDirectory(prefix=".convert-", dir=out.parent if out.parent.exists() else None) as scratch:
            native = save(model, Path(scratch) / "native", base_model=args.base_model, license=args.license)
            export_run(native, out, force=args.force, format="hf", dtype=args.dtype)
    kind = model.hf_source["class"]
    print(f"converted {kind} ({model.spec.depth} layers, logits checked against the source) to {out}"
          + (" (hf format)" if args.format == "hf" else ""))
    return 0
