"""The ``fedlit`` command: dispatches ``argv`` to a command, and turns configuration errors into one line.

::

    fedlit fit | validate | test --config RECIPE.yaml [--section.key value ...]   fedlit.commands.fit
    fedlit fit --config RECIPE.yaml --seeds 0 1 2                                 fedlit.commands.seeds
    fedlit cost --config RECIPE.yaml [--compare FedAvg ...]                       fedlit.commands.cost
    fedlit partition --config RECIPE.yaml                               fedlit.commands.partition_summary
    fedlit export --run RUN                                                       fedlit.commands.export
    fedlit grid --config GRID.yaml [--only DATASET/METHOD ...] [--dry_run]         fedlit.commands.grid
    fedlit report RUN [RUN ...]                                                   fedlit.commands.report
    fedlit recipes [NAME ...] [--out DIR]                                         fedlit.commands.recipes
    fedlit flower-app --config RECIPE.yaml --out APP                              fedlit.flower.app
    fedlit certs --out DIR --host HOST [--nodes N]                                fedlit.flower.certs
    fedlit node-state --state_dir DIR [--older_than DAYS] [--delete]              fedlit.flower.node_state
    fedlit flower-wait [--superlink NAME] [--run_id N]                            fedlit.flower.wait

Each command parses its own options and builds its objects (:func:`prepare`); the result runs it. Errors in the
recipe, the command line, the input files or the run folder end with one clear line and exit code 2: fedlit's own
:class:`~fedlit.core.errors.FedlitError` and the parser's errors (:data:`fedlit.config.explain.CONFIG_ERRORS`).
Anything else (a bug in a custom strategy, module or data module, even while it is built) keeps its traceback
(exit code 1). A Ctrl-C ends with one line too (exit code 130); an interrupted ``fit`` gives the exact command that
resumes it (:func:`fedlit.commands.fit.interrupted`). torch and Lightning are imported by the commands, so
``fedlit --help`` and ``fedlit --version`` answer in a fraction of a second.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any, NoReturn

#: Each subcommand: its help line, the module that runs it and that module's function from ``argv`` to a job.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "fit": ("Run a federated experiment (resume with --ckpt_path last).", "fedlit.commands.fit", "prepare"),
    "validate": ("Evaluate a checkpoint on every client's validation split.", "fedlit.commands.fit", "prepare"),
    "test": ("Evaluate a checkpoint on every client's test split.", "fedlit.commands.fit", "prepare"),
    "export": (
        "Write each client's personalized tensors of a run (safetensors, and a peft adapter with LoRA).",
        "fedlit.commands.export",
        "command",
    ),
    "cost": (
        "Print the parameters per role and the bytes a run would communicate, before training (no data read).",
        "fedlit.commands.cost",
        "command",
    ),
    "partition": (
        "Build a recipe's data only: print each client's samples per split and class, plot them.",
        "fedlit.commands.partition_summary",
        "command",
    ),
    "grid": (
        "Run every method of a grid file on every data set over its seeds (a benchmark table's runs).",
        "fedlit.commands.grid",
        "main",
    ),
    "report": (
        "Compare finished runs (seeds grouped by method): tables, curves and costs in report.md and .html.",
        "fedlit.commands.report",
        "main",
    ),
    "flower-app": (
        "Write a Flower app folder that deploys a recipe on a SuperLink and SuperNodes (`flwr run`).",
        "fedlit.flower.app",
        "main",
    ),
    "certs": (
        "Make a Flower deployment's TLS certificates (CA, SuperLink) and SuperNode key pairs.",
        "fedlit.flower.certs",
        "main",
    ),
    "node-state": (
        "List (and with --delete remove) the runs a SuperNode keeps in its state-dir.",
        "fedlit.flower.node_state",
        "main",
    ),
    "flower-wait": (
        "Wait for a Flower run to finish; exit 1 when it failed or was stopped (`flwr run --stream` exits 0).",
        "fedlit.flower.wait",
        "main",
    ),
    "recipes": (
        "List the recipes that ship with fedlit, or copy some into a folder (default recipes/).",
        "fedlit.commands.recipes",
        "main",
    ),
}
#: Commands that parse their own arguments (those after the subcommand) when run.
_OWN_PARSER = ("grid", "report", "flower-app", "certs", "node-state", "flower-wait", "recipes")


def _summary(argv: list[str]) -> NoReturn:
    """``fedlit --help``, ``--version``, or an unknown subcommand: answered without importing torch."""
    from jsonargparse import ArgumentParser

    from fedlit.core.version import __version__

    parser = ArgumentParser(
        prog="fedlit", description="Personalized federated fine-tuning of medical models.", exit_on_error=False
    )
    parser.add_argument(
        "--version", action="version", version=f"fedlit {__version__}", help="Print the version and exit."
    )
    subcommands = parser.add_subcommands(dest="subcommand")
    for name, (help_text, _, _) in COMMANDS.items():
        subcommands.add_subcommand(name, ArgumentParser(description=help_text, exit_on_error=False), help=help_text)
    parser.parse_args(argv)  # prints and exits, or raises ArgumentError
    raise SystemExit(0)


def prepare(argv: list[str] | None = None, **options: Any) -> Callable[[], Any]:
    """The command of ``argv``, parsed and built (configuration errors are raised here); calling it runs it.
    ``options`` go to the command's builder (``wrap_data`` for ``fit``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    name = argv[0] if argv else ""
    if name not in COMMANDS:
        _summary(argv)
    _, module, function = COMMANDS[name]
    if name == "fit":
        from fedlit.commands import seeds

        if seeds.requested(argv):
            return seeds.prepare(argv)  # one plain fit per seed
    if name in _OWN_PARSER:
        return lambda: getattr(importlib.import_module(module), function)(argv[1:])
    return getattr(importlib.import_module(module), function)(argv, **options)


def run(argv: list[str] | None = None) -> Any:
    """Parse ``argv``, build the objects and run the command; returns its results."""
    return prepare(argv)()


def main(argv: list[str] | None = None) -> None:
    """Console entry point (see the module docstring for what becomes a one-line error)."""
    from fedlit.config.explain import CONFIG_ERRORS, explain
    from fedlit.core.errors import FedlitError

    try:
        job = prepare(argv)
    except CONFIG_ERRORS as err:
        _fail(explain(err))
    except KeyboardInterrupt:
        _interrupted("interrupted")
    try:
        job()
    except FedlitError as err:
        _fail(str(err))
    except KeyboardInterrupt as err:  # Ctrl-C: a fit says how to resume (fedlit.commands.fit.interrupted)
        _interrupted(str(err) or "interrupted")


def _interrupted(message: str) -> NoReturn:
    print(f"fedlit: {message}", file=sys.stderr)
    raise SystemExit(130) from None  # 128 + SIGINT, as a shell reports a Ctrl-C


def _fail(message: str) -> NoReturn:
    print(f"fedlit: error: {message}", file=sys.stderr)
    raise SystemExit(2) from None
