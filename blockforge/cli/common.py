"""What several subcommands share: the `--set` flag (parsed once into Assignments) and metric lines."""

from __future__ import annotations

import argparse

from blockforge.errors import SpecError
from blockforge.spec.recipe import Assignment, parse_assignment


def _assignment(text: str) -> Assignment:
    try:
        return parse_assignment(text)
    except SpecError as err:
        raise argparse.ArgumentTypeError(err.message) from None


def add_set(parser: argparse.ArgumentParser) -> None:
    """The repeatable `--set KEY=VALUE` flag, parsed into `args.overrides` (a list of Assignment)."""
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", type=_assignment,
        help="override a recipe value by dotted key, e.g. --set model.layers.mix_ln.alpha=0.125 (repeatable)",
    )


def format_metrics(metrics: dict | None) -> str:
    if not metrics:
        return "no metrics"
    return ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items())
