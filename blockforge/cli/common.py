"""What several subcommands share: the `--set` flag (parsed once into Assignments), counts, and metric lines."""

from __future__ import annotations

import argparse

from blockforge.errors import SpecError
from blockforge.spec.recipe import Assignment, Recipe, parse_assignment


def _assignment(text: str) -> Assignment:
    try:
        return parse_assignment(text)
    except SpecError as err:
        raise argparse.ArgumentTypeError(err.message) from None


def load_recipe_with_sets(path: str, overrides: list[Assignment]) -> Recipe:
    """load_recipe, a bad value that a --set gave named with that --set (the file does not hold it)."""
    from blockforge.spec import load_recipe

    try:
        return load_recipe(path, overrides)
    except SpecError as err:
        raise err.given_by(overrides) from None


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a count; give 1 or more")
    return value


def add_set(parser: argparse.ArgumentParser, help: str = "override a recipe value by dotted key, e.g. --set model.layers.mix_ln.alpha=0.125 "
                                                           "(repeatable)") -> None:
    """The repeatable `--set KEY=VALUE` flag, parsed into `args.overrides` (a list of Assignment)."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", type=_assignment, help=help)


def add_report_to(parser: argparse.ArgumentParser, what: str) -> None:
    """`--report-to wandb,mlflow,tensorboard` (the HF Trainer's flag): the same as `--set tracking.report_to=[...]`."""
    parser.add_argument("--report-to", dest="overrides", action="append", metavar="TRACKERS", type=_report_to,
                        help=f"log {what} to these trackers, comma-separated (wandb, mlflow, tensorboard; none), as "
                             "--set tracking.report_to=[...] does; credentials from each tool's environment variables")


def _report_to(text: str) -> Assignment:
    from blockforge.spec.tracking import report_to_flag

    try:
        return Assignment("tracking.report_to", report_to_flag(text))
    except SpecError as err:
        raise argparse.ArgumentTypeError(err.message) from None


def format_metrics(metrics: dict | None) -> str:
    if not metrics:
        return "no metrics"
    return ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items())
