"""``fedlit cost --config RECIPE.yaml [--compare FedAvg ...] [--format json]``: what a run costs before it trains.

The estimate itself is :mod:`fedlit.config.costing` (``fedlit fit --dry_run`` prints the same one); this command
adds ``--compare`` (one row per other strategy, built with its default arguments, and the ratio of its upload to
the recipe strategy's) and ``--format``.
"""

from __future__ import annotations

from typing import Literal

from jsonargparse import ArgumentParser

from fedlit.config.cost_table import format_table
from fedlit.config.costing import CostJob, estimate, estimate_costs
from fedlit.config.parser import load, recipe_parser

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
    """``fedlit cost ...`` read and estimated (configuration errors are raised here)."""
    recipe = load(argv, parser(argv[0]))
    options = recipe.options
    return CostJob(estimate(recipe, options.compare or ()), options.format, "fedlit cost")
