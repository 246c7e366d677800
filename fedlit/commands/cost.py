"""``fedlit cost --config RECIPE.yaml [--compare FedAvg ...] [--format json]``: what a run costs before it trains.

The estimate itself is :mod:`fedlit.config.costing` (``fedlit fit --dry_run`` prints the same one); this command
adds ``--compare`` (one row per other strategy, built with its default arguments, and the ratio of its upload to
the recipe strategy's) and ``--format``.
"""

from __future__ import annotations

from argparse import ArgumentError
from typing import Literal

from jsonargparse import ArgumentParser

from fedlit.config.cost_table import format_table
from fedlit.config.costing import CostJob, estimate, estimate_costs
from fedlit.config.explain import missing_required
from fedlit.config.parser import load, recipe_parser
from fedlit.core.errors import ConfigError

#: What this module defines, and the names it re-exports from :mod:`fedlit.config.costing` and
#: :mod:`fedlit.config.cost_table` (their home before).
__all__ = ["HELP", "CostJob", "add_arguments", "command", "estimate_costs", "format_table", "parser"]


def add_arguments(parser: ArgumentParser) -> None:
    """``--compare`` and ``--format``."""
    parser.add_argument(
        "--compare",
        type=str,
        default=None,
        nargs="+",
        help="Other strategies to compare (short names or import paths, default arguments), "
        "e.g. --compare FedAvg FedProx.",
    )
    parser.add_argument(
        "--format", type=Literal["table", "json"], default="table", help="`table` (readable) or `json`."
    )


HELP = "Print the parameters per role and the bytes a run would communicate, before training (no data read)."


def parser(name: str = "cost") -> ArgumentParser:
    """The options of ``fedlit cost``: a recipe, ``--compare`` and ``--format``."""
    sub = recipe_parser(name, HELP)
    add_arguments(sub)
    return sub


def command(argv: list[str]) -> CostJob:
    """``fedlit cost ...`` read and estimated (configuration errors are raised here). A recipe without its data
    folder (or file: a required option of the data section left out, as in a recipe whose sites each give their
    own) is estimated too, its clients counted from its options (its ``sites`` list)."""
    not_given: list[str] = []
    try:
        recipe = load(argv, parser(argv[0]))
    except ArgumentError as err:
        required = missing_required(err)
        if required is None or required[0] != "data":
            raise
        not_given = required[2]
        placeholders = [f"--data.init_args.{option}=(not given)" for option in not_given]
        try:
            recipe = load([*argv, *placeholders], parser(argv[0]))
        except (ArgumentError, ConfigError):
            raise err from None  # an option that takes no text: the recipe's own error
    options = recipe.options
    return CostJob(estimate(recipe, options.compare or (), not_given), options.format, "fedlit cost")
