"""`blockforge prepare`: tokenize a recipe's (or a search's) text once into a prepared set that runs read by index."""

from __future__ import annotations

import argparse
import os
import re
import sys

SEARCH_KEYS = {"cells", "space", "baselines", "trials_per_cell", "objective", "objectives", "scheduler", "sampler", "confirm",
               "transfer", "guide", "constraints", "resources", "max_concurrent", "divergence", "steps", "overrides"}


MAX_TOKENS = 10**18  # token counts and offsets are int64 in a set; no source holds more


def token_count(text: str) -> int:
    """An argparse type: a count of tokens, whole or with a suffix (13.1B, 500M, 20k, 1e9)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kKmMbBtT]?)\s*", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"'{text}' is not a count of tokens; give a number such as 2000000, 500M or 13.1B")
    value = float(match.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}[match.group(2).lower()]
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a count of tokens; give 1 or more")
    if not value <= MAX_TOKENS:  # inf too
        raise argparse.ArgumentTypeError(f"{text} tokens is more than a set can hold; give at most 1e18")
    return round(value)


def add_parser(sub) -> None:
    from blockforge.cli.common import add_set, positive_int

    p = sub.add_parser("prepare", help="tokenize a recipe's or a search's text once into a prepared set (read by index)")
    p.add_argument("file", help="a recipe, or a search file (its base recipe's data with the search's overrides)")
    p.add_argument("--out", help="where the set goes: a folder, or a URI such as s3://bucket/prefix (a search file's sets go into "
                                 "OUT/data/<fingerprint>/, where `blockforge search FILE --out OUT` reads them)")
    p.add_argument("--tokens", type=token_count, help="a stream's training tokens to take (tokens of rows: each row gives context "
                                                       "targets); default for a search file: what its plan's longest trial trains on")
    p.add_argument("--plan", action="store_true", help="print how much each set holds and how long preparing it takes, and stop")
    p.add_argument("--workers", type=positive_int, help="parts tokenized at once (default: this machine's cores, or the cluster's "
                                                          "CPUs with --address)")
    p.add_argument("--address", help="prepare as Ray tasks on this Ray cluster ('auto' or host:port)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_set(p)
    p.set_defaults(func=run)


def _is_search(path: str) -> bool:
    from blockforge.spec.recipe import read_yaml

    data = read_yaml(path)
    return isinstance(data, dict) and bool(SEARCH_KEYS & set(data)) and "model" not in data


def _requests(args: argparse.Namespace) -> tuple[list, str | None]:
    """(sets to prepare as (request, where under --out, what reads it), the search's name or None)."""
    if _is_search(args.file):
        from blockforge.errors import BlockforgeError
        from blockforge.search.config import load_search

        plan = load_search(args.file, args.overrides)  # a bad file is refused before torch is imported
        from blockforge.search.run.datasets import search_sets

        sets = search_sets(plan, args.tokens)
        if not sets:
            raise BlockforgeError(f"{args.file}: its trials read no text that is not prepared already (data.prepared, or images); "
                                  "there is nothing to prepare")
        if args.tokens is not None and not any(s.request.streamed for s in sets):
            sources = ", ".join(sorted({s.request.data.source for s in sets}))
            raise BlockforgeError(f"--tokens: every set {args.file} reads is finite (data.source {sources}) and is prepared whole "
                                  "(it repeats in epochs as it trains); leave --tokens out")
        return [(s.request, s.rel, s) for s in sets], plan.name
    from blockforge.cli.common import load_recipe_with_sets

    recipe = load_recipe_with_sets(args.file, args.overrides)
    from blockforge.data.prepare import request_for

    return [(request_for(recipe, args.tokens), "", None)], None


def run(args: argparse.Namespace) -> int:
    from blockforge.errors import BlockforgeError

    if not args.plan and not args.out:
        raise BlockforgeError("--out: say where the prepared set goes (a folder, or a URI such as s3://bucket/prefix)")
    if args.plan and args.address:
        raise BlockforgeError("--plan prepares nothing: drop --address")
    requests, search = _requests(args)
    if args.plan:
        print(_plan(args, requests, search))
        return 0
    _check_out(args.out)
    from blockforge.storage import Storage

    out = Storage.open(args.out)
    workers, started_ray = _workers(args, requests)
    try:
        for request, rel, entry in requests:
            where = str(out.child(rel)) if rel else str(out)
            _prepare_one(request, where, workers, args, entry)
    finally:
        if started_ray:
            from blockforge.cluster import stop_ray

            stop_ray()
    return 0


def _check_out(out: str) -> None:
    """A local --out must be a folder, or a path where one can be made: checked before any work (a URI is checked where
    the preparation opens it)."""
    from blockforge.errors import BlockforgeError
    from blockforge.storage import is_uri

    if is_uri(out):
        return
    folder = os.path.expanduser(out)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise BlockforgeError(f"--out {out}: is a file, not a folder; give a folder (new or empty) for the prepared set")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        raise BlockforgeError(f"--out {out}: cannot make a folder there ({err.strerror or err}); give a folder this process "
                              "can write") from None


def _workers(args: argparse.Namespace, requests: list):
    """Where parts run: this process (one worker, or a set of one part), else Ray tasks on a local Ray or on --address."""
    from blockforge.data.prepare import InProcess, RayWorkers, part_count

    wanted = args.workers or (None if args.address else os.cpu_count() or 1)
    if args.address is None and (wanted == 1 or max(part_count(request) for request, _, _ in requests) <= 1):
        return InProcess(), False
    from blockforge.cluster import ensure_ray, stop_ray

    started = ensure_ray(args.address)
    if args.address is not None:
        try:
            _check_nodes(args, [request for request, _, _ in requests])
        except BaseException:
            if started:
                stop_ray()
            raise
    return RayWorkers(wanted), started


def _check_nodes(args: argparse.Namespace, requests: list) -> None:
    """Before any work on a cluster: every node that can run a part sees --out (a local folder) or reaches it (a storage),
    and reads the files of a stream the parts read where they run."""
    import ray

    from blockforge.search.preflight import check_files_on_nodes, check_shared_folder, check_storage_on_nodes
    from blockforge.storage import Storage, is_uri

    nodes = [n for n in ray.nodes() if n.get("Alive") and n["Resources"].get("CPU", 0) > 0]
    if is_uri(args.out):
        check_storage_on_nodes(Storage.open(args.out), nodes, what="the storage of --out", runs="no part could be written from there",
                               again="prepare again")
    else:
        check_shared_folder(args.out, nodes, what="this folder", writes="its tasks would write where this process never reads")
    for request in requests:
        if request.streamed and request.data.path:
            check_files_on_nodes(request.data.path, nodes)


def _prepare_one(request, where: str, workers, args: argparse.Namespace, entry) -> None:
    from blockforge.data.prepare import prepare

    def say(line: str) -> None:
        print(f"blockforge: {line}", file=sys.stderr, flush=True)

    outcome = prepare(request, where, workers=workers, progress=not args.no_progress, say=say)
    manifest = outcome.manifest
    train, val = manifest.splits["train"], manifest.splits["val"]
    if outcome.reused:
        print(f"{where}: holds this set already ({train.tokens:,} training tokens); nothing to do")
        return
    resumed = f", {outcome.parts_resumed} of them done before" if outcome.parts_resumed else ""
    print(f"prepared {where} in {outcome.seconds:.1f} s ({outcome.parts_done + outcome.parts_resumed} part(s){resumed}): "
          f"train {train.tokens:,} tokens in {train.rows(manifest.layout):,} {manifest.layout.name} rows of {manifest.layout.context}, "
          f"validation {val.tokens:,} tokens; tokenizer {manifest.tokenizer['name']}")
    if entry is not None:
        print(f"  read by {', '.join(entry.cells)}; `{_search_command(args)}` finds it there")
    else:
        print(f"  train on it with: --set data.prepared={where}")


def _search_command(args: argparse.Namespace) -> str:
    """The search command that reads what this preparation wrote: the same file, --set flags, --out and --address."""
    import shlex

    sets = [part for assignment in args.overrides for part in ("--set", str(assignment))]
    where = ["--address", args.address] if args.address is not None else []
    return shlex.join(["blockforge", "search", args.file, *sets, "--out", args.out, *where])


def _plan(args: argparse.Namespace, requests: list, search: str | None) -> str:
    """Per set: its source and layout, the tokens it holds, and the time and core-hours preparing it takes."""
    from blockforge.data.prepare import VAL_TOKENS, measure_rate

    lines = []
    workers = args.workers or os.cpu_count() or 1
    for request, rel, entry in requests:
        data = request.data
        source = {"builtin": "the builtin corpus", "text": f"text files {data.path}",
                  "hf": f"{data.dataset}{f' ({data.name})' if data.name else ''}{', streamed' if request.streamed else ''}"}[data.source]
        tokenizer = f"bpe {data.tokenizer.bpe}" if data.tokenizer.bpe else data.tokenizer.hf
        head = f"data/{request.fingerprint}" if rel else (args.out or "the set")
        lines.append(f"{head}: {source}, tokenizer {tokenizer}, {request.layout.name} rows of {request.layout.context}"
                     + (f"; read by {', '.join(entry.cells)}" if entry else ""))
        rate = measure_rate(request)
        if request.streamed:
            rows = request.layout.rows_for(request.tokens)
            why = f" (the longest trial: {entry.largest})" if entry is not None and args.tokens is None else ""
            lines.append(f"  training: {request.tokens:,} tokens{why} = {rows:,} rows; validation: up to {VAL_TOKENS:,} tokens")
        else:
            lines.append(f"  the whole source: about {rate.work(request):,.0f} tokens (it repeats in epochs as it trains)")
        core_hours = rate.work(request) / rate.tokens_per_s / 3600
        documents = ""
        if request.streamed and not request.layout.pack:
            documents = (f"; its documents average {rate.document_tokens:,.0f} tokens, each tokenized whole" if rate.document_tokens
                         else f"; at least: each document is tokenized whole, and its mean length is not known here (counted as {request.layout.context + 1})")
        lines.append(f"  preparing: {_hours(core_hours)} core-hours at {rate.tokens_per_s:,.0f} tokens/s per core ({rate.note}{documents}); "
                     f"about {_duration(core_hours * 3600 / workers)} on {workers} worker(s)")
    return "\n".join(lines)


def _hours(hours: float) -> str:
    return f"{hours:,.1f}" if hours >= 10 else f"{hours:.2g}"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
