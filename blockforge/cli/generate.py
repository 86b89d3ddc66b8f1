"""`blockforge generate`: continue a prompt with a trained language model, streaming tokens as they come."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(sub) -> None:
    from blockforge.cli.common import positive_int

    p = sub.add_parser("generate", help="continue a text prompt with a trained llama (a run or export folder)")
    p.add_argument("dir", help="a run folder, an exported model folder (with its tokenizer/) or a folder `export --format hf` wrote")
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-new-tokens", type=positive_int, default=64)
    p.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from blockforge.data import load_tokenizer
    from blockforge.errors import BlockforgeError
    from blockforge.export import load, tokenizer_folder
    from blockforge.nn.generate import check_sampling
    from blockforge.train.runtime import pick_device

    try:  # before anything is loaded or printed
        check_sampling(args.temperature, args.top_k, args.top_p)
    except BlockforgeError as e:
        raise BlockforgeError(f"--{str(e).replace('_', '-', 1)}") from None
    folder = Path(args.dir)
    device = pick_device(args.device)
    model = load(folder, device=device)
    if not hasattr(model, "generate"):
        raise BlockforgeError(f"{folder}: a {model.spec.family} model does not generate text; give a language model's folder")
    tokenizer = load_tokenizer(tokenizer_folder(folder))
    # Training documents start after an end-of-text id (packed rows), so a prompt starts the same way.
    ids = [tokenizer.eos_id] + tokenizer.encode(args.prompt)
    new: list[int] = []
    shown = ""

    def stream(column: torch.Tensor) -> None:
        nonlocal shown
        token = int(column[0])
        if token == tokenizer.eos_id:
            return
        new.append(token)
        text = tokenizer.decode(new)
        if not text.endswith("\ufffd"):  # a multi-byte character is complete: print what is new
            sys.stdout.write(text[len(shown):])
            sys.stdout.flush()
            shown = text

    sys.stdout.write(args.prompt)
    model.generate(torch.tensor([ids], device=device), args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                   top_p=args.top_p, seed=args.seed, eos_id=tokenizer.eos_id, on_token=stream)
    sys.stdout.write("\n")
    return 0
