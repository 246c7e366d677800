"""``fedlit fit | validate | test --config RECIPE.yaml [--section.key value ...]``: run a recipe, or evaluate a
checkpoint of its run.

A fresh ``fit`` writes into ``runs/<name>/<version>`` (``--name`` defaults to ``<recipe>_<strategy>``,
``--version`` to the next ``version_<n>``), or into ``--out_dir``, which must not hold another run (see
:mod:`fedlit.engine.records.run_folder`). ``--ckpt_path last`` (and ``validate``/``test`` without ``--ckpt_path``)
means the checkpoint of the newest run of that name, or of ``--out_dir``; when that run has none, the command says so
rather than falling back to an older run. ``validate``/``test --run DIR`` rebuild a run from its ``config.json``
and evaluate its ``last`` or ``best`` checkpoint (see :mod:`fedlit.config.resolve`; :mod:`fedlit.engine.records.record`
says what a run records). ``fit --dry_run`` prints what the run would cost (the estimate of ``fedlit cost``:
:mod:`fedlit.config.costing`); ``fit --seeds 0 1 2`` runs it once per seed (:mod:`fedlit.commands.seeds`).
``--import MODULE_OR_FILE`` (and a recipe's ``imports:``) imports your own code first (:mod:`fedlit.config.imports`).

The recipe flows down once: :func:`~fedlit.config.parser.load` (parse, import the recipe's code), then
:func:`~fedlit.config.resolve.resolve_run` (run folder, checkpoint), then :func:`~fedlit.config.build.build_run`
(the objects), or :func:`~fedlit.config.costing.estimate` for ``--dry_run``.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from jsonargparse import ArgumentParser

from fedlit.config.build import build_run, remove_if_empty
from fedlit.config.costing import CostJob, estimate
from fedlit.config.parser import load, recipe_parser, root_parser
from fedlit.config.resolve import resolve_run
from fedlit.core.errors import ConfigError, broken
from fedlit.federation import Federation

HELP = {
    "fit": "Run a federated experiment (resume with --ckpt_path last).",
    "validate": "Evaluate a checkpoint on every client's validation split.",
    "test": "Evaluate a checkpoint on every client's test split.",
}
#: Read before parsing by :mod:`fedlit.commands.seeds`; declared here for ``fedlit fit --help``.
SEEDS = "--seeds"
#: What the seeds of ``--seeds`` vary: ``all`` (the data's seed too) or ``training`` (federation.seed only).
SEEDS_VARY = "--seeds_vary"


def parser(name: str) -> ArgumentParser:
    """The options of ``fit``, ``validate`` or ``test``."""
    sub = recipe_parser(name, HELP[name])
    if name in ("fit", "test"):
        sub.add_argument(
            "--baseline_run",
            type=str | None,
            default=None,
            help="A finished run of strategy Local on the same data and seed: the report adds each "
            "client's test gain over it, with their mean and std (gain_over_local).",
        )
        sub.add_argument(
            "--baseline_compare",
            type=Literal["strict", "any"],
            default="strict",
            help="With --baseline_run: 'strict' refuses a baseline trained with other rounds, local "
            "steps or epochs, model, optimizer or selection metric (naming each difference); "
            "'any' compares anyway and records the differences in results.json.",
        )
    if name == "fit":
        sub.add_argument(
            "--dry_run",
            action="store_true",
            help="Print what the run would communicate (as `fedlit cost`) and exit: the model is built "
            "without its weights, no data is read, nothing is trained or written.",
        )
        sub.add_argument(
            SEEDS,
            type=list[int] | None,
            default=None,
            help="Run the recipe once per seed (--seeds 0 1 2): federation.seed and the data's seed "
            "(unless --seeds_vary training) set to each, runs in runs/<name>/<version>/seed_<s> "
            "(or OUT_DIR/seed_<s>), the experiment recorded in experiment.json.",
        )
        sub.add_argument(
            SEEDS_VARY,
            type=Literal["all", "training"],
            default="all",
            help="With --seeds, what each seed varies: 'all' sets the data's seed too, so each seed "
            "re-draws the data's split; 'training' sets federation.seed only (model "
            "initialization, client sampling, batch order) over the one split of the recipe's data "
            "seed, as FLamby's per-seed results are.",
        )
    return sub


def build_parser(name: str = "fit") -> ArgumentParser:
    """The ``fedlit`` parser with the one subcommand ``name`` (``fit``, ``validate`` or ``test``)."""
    return root_parser({name: (HELP[name], parser(name))})


@dataclass
class FitJob:
    """A built run of ``fit``, ``validate`` or ``test``, ready to run."""

    subcommand: str
    federation: Federation
    ckpt_path: Path | None
    created: Path | None  # the new version folder made for this run, removed again if the run leaves it empty
    argv: list[str] = field(default_factory=list)  # the command line, for the resume command of an interrupted fit

    def __call__(self) -> Any:
        if self.federation.fabric.is_global_zero:
            print(f"fedlit {self.subcommand}: out_dir={self.federation.out_dir}", flush=True)
        try:
            if self.subcommand == "fit":
                try:
                    return self.federation.fit(ckpt_path=self.ckpt_path)
                except KeyboardInterrupt:  # Ctrl-C: one line saying how to go on, for the command line to print
                    raise KeyboardInterrupt(interrupted(self.federation, self.argv)) from None
            if not (self.ckpt_path is not None):  # validate and test resolve a checkpoint (last by default)
                raise broken("validate and test resolve a checkpoint (last by default)")
            return self.federation.evaluate(self.subcommand.replace("validate", "val"), ckpt_path=self.ckpt_path)
        finally:
            remove_if_empty(self.created)


def interrupted(federation: Federation, argv: list[str]) -> str:
    """What an interrupted fit says: the round its last checkpoint holds and the exact command that resumes it
    (``argv`` with ``--out_dir`` of the run and ``--ckpt_path last``), or that there is nothing to resume."""
    state = federation.state
    if state.checkpointed is None:
        return (
            f"fit interrupted in round {max(state.round, 1)}, before its first checkpoint: nothing to resume; run the "
            "same command again to start over."
        )
    dropped = ("--ckpt_path", "--out_dir", "--name", "--version")
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip or arg.split("=", 1)[0] in dropped:
            skip = arg in dropped  # the option's value follows it
            continue
        kept.append(arg)
    command = shlex.join(["fedlit", *kept, "--out_dir", str(federation.out_dir), "--ckpt_path", "last"])
    return f"fit interrupted after round {state.checkpointed} (its checkpoint is kept); resume it with: {command}"


def prepare(argv: list[str], *, wrap_data: Callable[[Any], Any] | None = None) -> FitJob | CostJob:
    """Parse ``argv`` (``fit ...``, ``validate ...`` or ``test ...``), resolve the run folder and checkpoint and
    build the objects (configuration errors are raised here); calling the result runs it. With ``wrap_data`` the
    recipe's data section is validated but never constructed: the run's data module is what ``wrap_data`` returns
    for its :class:`~fedlit.config.build.DataSection` (a Flower server's view of its nodes)."""
    name = argv[0]
    recipe = load(argv, parser(name))
    options = recipe.options
    if name == "fit" and options.seeds_vary != "all":
        raise ConfigError(
            f"{SEEDS_VARY} {options.seeds_vary} without --seeds: it says what the seeds of --seeds "
            f"vary; add --seeds 0 1 2, or leave {SEEDS_VARY} out"
        )
    if name == "fit" and options.dry_run:
        return CostJob(estimate(recipe), title="fedlit fit --dry_run")  # builds no data, writes no run folder
    out_dir, ckpt_path = resolve_run(options, name)
    built = build_run(recipe, out_dir, ckpt_path, wrap_data=wrap_data)
    return FitJob(name, built.federation, built.ckpt_path, built.created, list(argv))
