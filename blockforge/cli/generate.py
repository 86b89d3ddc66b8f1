"""`blockforge generate`: continue a prompt with a trained language model, streaming tokens as they come."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


DEFAULT_NEW_TOKENS = 64


def add_parser(sub) -> None:
    from blockforge.cli.common import positive_int

    p = sub.add_parser("generate", help="continue a text prompt with a trained llama (a run or export folder)")
    p.add_argument("dir", help="a run folder, an exported model folder (with its tokenizer/) or a folder `export --format hf` wrote; a local path or a URI")
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-new-tokens", type=positive_int, default=None,
                   help="default: 64, or fewer where the model's context ends first: its context less the prompt's tokens, plus "
                        "one (the last new token never runs through the model); said on stderr")
    p.add_argument("--temperature", type=float, default=None,
                   help="0: greedy (default: the model's generation config, e.g. a converted model's sampling defaults, else 0.8)")
    p.add_argument("--top-k", type=int, default=None, help="default: the model's generation config, else none")
    p.add_argument("--top-p", type=float, default=None, help="default: the model's generation config, else none")
    p.add_argument("--seed", type=int, default=0, help="the sampling seed: a whole number from 0 to 2**64 - 1 (default 0)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from blockforge.errors import BlockforgeError
    from blockforge.export import load, read_tokenizer
    from blockforge.families.conversion import read_generation
    from blockforge.families.hf_export import blockforge_bpe, packed
    from blockforge.nn.generate import check_sampling
    from blockforge.train.runtime import pick_device

    try:  # before anything is loaded or printed
        check_sampling(0.8 if args.temperature is None else args.temperature, args.top_k, args.top_p, args.seed)
    except BlockforgeError as e:
        raise BlockforgeError(f"--{str(e).replace('_', '-', 1)}") from None
    check_prompt(args.prompt)
    from blockforge.storage import Storage, fetch_folder, is_uri

    folder = fetch_folder(Storage.open(args.dir)) if is_uri(args.dir) else Path(args.dir)  # a URI's: a local copy, kept up to date
    device = pick_device(args.device)
    model = load(folder, device=device)
    if not hasattr(model, "generate"):
        raise BlockforgeError(f"{folder}: a {model.spec.family} model does not generate text; give a language model's folder")
    tokenizer = read_tokenizer(folder)
    settings = read_generation(folder)  # a converted model's, or a transformers export's
    temperature, top_k, top_p = sampling(args, settings)
    if blockforge_bpe(folder, tokenizer.hf) and packed(folder):
        # Packed training documents start after an end-of-text id, so a prompt starts the same way.
        ids = [tokenizer.eos_id] + tokenizer.encode(args.prompt)
    else:  # any other tokenizer: as it encodes a prompt itself (a bos where it adds one)
        ids = tokenizer.hf(args.prompt)["input_ids"]
    if not ids:
        raise BlockforgeError(f"--prompt {args.prompt!r}: encodes to no token, and this model's tokenizer adds none before it; give "
                              "some text to continue")
    stops = settings.get("eos_token_id", tokenizer.eos_id)
    stops = [int(i) for i in stops] if isinstance(stops, list) else [int(stops)]
    new: list[int] = []
    shown = ""

    def stream(column: torch.Tensor) -> None:
        nonlocal shown
        token = int(column[0])
        if token in stops:
            return
        new.append(token)
        text = tokenizer.decode(new)
        if not text.endswith("\ufffd"):  # a multi-byte character is complete: print what is new
            sys.stdout.write(text[len(shown):])
            sys.stdout.flush()
            shown = text

    new_tokens = args.max_new_tokens
    if new_tokens is None:  # the default fits the model: a short-context model continues as far as its context allows
        room = model.spec.context + 1 - len(ids)  # the last new token is chosen, never run through the model
        new_tokens = min(DEFAULT_NEW_TOKENS, room)
        if new_tokens < 1:
            raise BlockforgeError(f"--prompt: {len(ids)} tokens fill the model's context of {model.spec.context}; shorten the prompt")
        if new_tokens < DEFAULT_NEW_TOKENS:
            print(f"blockforge: generating {new_tokens} new tokens (the model's context of {model.spec.context} less the prompt's "
                  f"{len(ids)}, plus the last new token, which never runs through the model); --max-new-tokens sets it", file=sys.stderr)
    sys.stdout.write(args.prompt)
    model.generate(torch.tensor([ids], device=device), new_tokens, temperature=temperature, top_k=top_k,
                   top_p=top_p, seed=args.seed, eos_id=stops, on_token=stream)
    sys.stdout.write("\n")
    return 0


def check_prompt(prompt: str) -> None:
    """--prompt refused in one sentence when it is not text: bytes that are not UTF-8 (a terminal set to another
    encoding, a file of another encoding given as $(cat FILE)) reach Python as lone surrogates no tokenizer encodes."""
    from blockforge.errors import BlockforgeError

    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as err:
        code = ord(prompt[err.start])
        what = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"  # a byte as the shell gave it
        raise BlockforgeError(f"--prompt: {what} (character {err.start + 1}) is not UTF-8 text; give the prompt in UTF-8 (a file "
                              "of another encoding: iconv -t UTF-8 FILE)") from None


def sampling(args: argparse.Namespace, settings: dict) -> tuple[float, int | None, float | None]:
    """Temperature, top-k and top-p: each flag given, else the model's generation config (greedy unless it samples), else
    blockforge's defaults (0.8, none, none)."""
    if not settings:
        return (0.8 if args.temperature is None else args.temperature), args.top_k, args.top_p
    samples = bool(settings.get("do_sample", False))
    temperature = args.temperature if args.temperature is not None else (float(settings.get("temperature", 1.0)) if samples else 0.0)
    top_k = args.top_k if args.top_k is not None else (settings.get("top_k") if samples else None)
    top_p = args.top_p if args.top_p is not None else (settings.get("top_p") if samples else None)
    return temperature, top_k or None, top_p
