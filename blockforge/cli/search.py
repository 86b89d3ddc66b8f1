"""`blockforge search`: run (or resume) a search file on Ray Tune + Optuna and print its summary."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    from blockforge.cli.common import add_set

    p = sub.add_parser("search", help="search alpha (or any dotted keys) per cell on Ray Tune + Optuna")
    p.add_argument("file", help="a search YAML file (see searches/)")
    p.add_argument("--out", help="the search folder (default: runs/search-<name>)")
    p.add_argument("--address", help="join a Ray cluster ('auto' or ray://host:port); default: start a local Ray")
    p.add_argument("--resume", action="store_true", help="continue the search in --out")
    p.add_argument("--max-concurrent", type=int, help="trials at once (default: as many as resources allow)")
    add_set(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import signal
    import sys

    from blockforge.search.driver import run_search

    outcome = run_search(args.file, out=args.out, address=args.address, resume=args.resume, max_concurrent=args.max_concurrent,
                         overrides=args.overrides)
    print()
    print(outcome.summary)
    print(f"\nsearch folder: {outcome.search_dir} (summary.md, results.csv, best/, plots)")
    if outcome.interrupted is not None:
        name = signal.Signals(outcome.interrupted).name
        print(f"blockforge: stopped by {name}; the reports cover the trials so far; resume with: {outcome.resume_command}", file=sys.stderr)
        return 128 + outcome.interrupted
    return 0
