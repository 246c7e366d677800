"""``fedlit flower-app``: write a Flower app folder that runs a recipe on a SuperLink and its SuperNodes.

::

    fedlit flower-app --config recipes/quickstart.yaml --out flower_app [--overrides "--federation.rounds 5"]
    flwr run flower_app <superlink connection>

The folder holds one ``pyproject.toml`` (and a ``.gitignore`` that keeps any other file out of the bundle ``flwr run``
ships to every node, :mod:`fedlit.flower.bundle`): the app's components are fedlit's ServerApp and ClientApp
(``fedlit.flower.server:app``, ``fedlit.flower.clientapp:app``; fedlit and flwr must be installed where the SuperLink
and the SuperNodes run), and its run config carries the recipe's text, the overrides (applied on the server and on
every node) and the server's settings (:data:`fedlit.flower.server.RUN_CONFIG`). Any of them can be changed per run
with ``flwr run ... --run-config "key=value"``.

The recipe's own code (its ``imports:``, and ``--import MODULE_OR_FILE``: :mod:`fedlit.config.imports`) travels in
the run config too: each ``.py`` file below the recipe's folder (the current folder for ``--import``), written next
to the recipe where the server and every node rebuild it; a module of an installed package must be installed there.
"""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tomli_w

from fedlit.core.errors import ConfigError
from fedlit.flower.bundle import write_ignore
from fedlit.flower.server import RUN_CONFIG

FLWR_REQUIREMENT = "flwr>=1.40,<1.43"


def write_app(
    recipe: str | Path, out: str | Path, *, overrides: str = "", imports: Sequence[str] = (), **settings: Any
) -> Path:
    """Write the app folder ``out`` for ``recipe`` and return its ``pyproject.toml``.

    Args:
        recipe: The recipe file.
        out: The app folder (created).
        overrides: Command-line overrides of the recipe (``--federation.rounds 3 ...``), for the server and every
            node.
        imports: Modules or ``.py`` files (relative to the current folder) to import before the recipe's class
            paths are resolved, as ``--import`` does; shipped with the recipe's own ``imports``.
        settings: Other run config values (:data:`fedlit.flower.server.RUN_CONFIG`, ``_`` for ``-``); ``out_dir``
            defaults to ``<out>-run`` beside the app folder, and is refused inside it: Flower bundles the app
            folder's ``*.json``, ``*.md``, ... into every ``flwr run`` and ships them to every node.
    """
    from fedlit.config import imports as user_code
    from fedlit.config.parser import read_recipe

    recipe, out = Path(recipe), Path(out).resolve()
    if not recipe.is_file():
        raise ConfigError(f"--config {recipe}: no such recipe file.")
    entries = user_code.of_recipe(read_recipe(recipe), recipe.parent, str(recipe))
    options = [user_code.Entry(value, Path.cwd(), user_code.OPTION) for value in imports]
    user_code.import_all([*entries, *options])
    config = {
        **RUN_CONFIG,
        "recipe": recipe.read_text(),
        "overrides": overrides,
        "out-dir": str(default_out_dir(out)),
        "imports": user_code.ship(entries, options),
    }
    for key, value in settings.items():
        name = key.replace("_", "-")
        if name not in RUN_CONFIG:
            raise ConfigError(f"{key} is not a setting of fedlit's Flower app; valid: {sorted(RUN_CONFIG)}.")
        if value is not None:
            config[name] = value
    run_dir = Path(str(config["out-dir"])).resolve()
    if run_dir == out or out in run_dir.parents:
        raise ConfigError(
            f"--out_dir {run_dir} is inside the app folder {out}: Flower ships the app folder's files "
            "(results.json, manifest.json, ...) to every node on each `flwr run`; put the run folder "
            f"outside it, e.g. the default {default_out_dir(out)}."
        )
    name = "fedlit-" + re.sub(r"[^a-z0-9]+", "-", recipe.stem.lower()).strip("-")
    project = {
        "build-system": {"requires": ["hatchling"], "build-backend": "hatchling.build"},
        "project": {
            "name": name,
            "version": "1.0.0",
            "description": f"fedlit recipe {recipe.name} on Flower",
            "license": "Apache-2.0",
            "dependencies": [FLWR_REQUIREMENT],
        },
        "tool": {
            "flwr": {
                "app": {
                    "publisher": "fedlit",
                    "components": {"serverapp": "fedlit.flower.server:app", "clientapp": "fedlit.flower.clientapp:app"},
                    "config": config,
                }
            }
        },
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / "pyproject.toml"
    path.write_text(tomli_w.dumps(project, multiline_strings=True))
    write_ignore(out)  # a second guard: whatever lands in the folder stays out of the bundle
    return path


def default_out_dir(app: Path) -> Path:
    """The server's run folder when none is given: ``<app>-run``, beside the app folder (never inside it)."""
    return app.parent / f"{app.name}-run"


def main(argv: list[str]) -> Path:
    """``fedlit flower-app``: parse ``argv``, check the recipe with the real parser, write the app folder."""
    parser = argparse.ArgumentParser(
        prog="fedlit flower-app",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", required=True, help="The recipe (YAML).")
    parser.add_argument("--out", required=True, help="The app folder to write.")
    parser.add_argument(
        "--overrides", default="", help="Overrides of the recipe, e.g. --overrides='--federation.rounds 3'."
    )
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE_OR_FILE",
        help="Your own code to import before the recipe's class paths are resolved (a module, or a "
        ".py file relative to the current folder; repeat it for more), shipped with the app as "
        "the recipe's `imports:` are.",
    )
    parser.add_argument(
        "--out_dir", default=None, help="The server's run folder, outside --out (default: <out>-run, beside it)."
    )
    parser.add_argument("--client_ids", default=None, help="The expected clients, comma-separated.")
    parser.add_argument("--num_clients", type=int, default=None, help="The expected number of nodes.")
    parser.add_argument("--client_timeout", type=float, default=None, help="Seconds per turn (0: no limit).")
    parser.add_argument("--connect_timeout", type=float, default=None, help="Seconds to wait for the nodes.")
    parser.add_argument(
        "--secure_aggregation",
        nargs="?",
        const="true",
        default=None,
        help="SecAgg+ for the training uploads; optionally its options as JSON, e.g. "
        "--secure_aggregation '{\"max_weight\": 200}'.",
    )
    args = parser.parse_args(argv)
    from fedlit.flower.secagg import SecAggOptions

    SecAggOptions.from_config(args.secure_aggregation)  # bad options fail here, not on the SuperLink
    from fedlit.config.explain import CONFIG_ERRORS, explain
    from fedlit.config.parser import load, recipe_parser

    try:  # the recipe and overrides as `fedlit fit` reads them: a typo fails here, not on the nodes
        load(
            [
                "fit",
                "--config",
                args.config,
                *shlex.split(args.overrides),
                *[arg for value in args.imports for arg in ("--import", value)],
            ],
            recipe_parser("fit", "The recipe."),
        )
    except CONFIG_ERRORS as err:
        raise ConfigError(f"--config {args.config} --overrides {args.overrides!r}: {explain(err)}") from None
    path = write_app(
        args.config,
        args.out,
        overrides=args.overrides,
        imports=args.imports,
        out_dir=str(Path(args.out_dir).resolve()) if args.out_dir else None,
        client_ids=args.client_ids,
        num_clients=args.num_clients,
        client_timeout=args.client_timeout,
        connect_timeout=args.connect_timeout,
        secure_aggregation=args.secure_aggregation,
    )
    print(f"fedlit flower-app: wrote {path}; run it with `flwr run {path.parent} <superlink connection>`.", flush=True)
    return path
