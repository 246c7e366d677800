"""The ``fedlit`` command: ``fedlit fit | validate | test --config RECIPE.yaml [--section.key value ...]``.

A recipe has five sections: ``model`` (a FederatedModule, ``class_path`` + ``init_args``), ``data`` (a
FederatedDataModule), ``strategy`` (a Strategy; short names such as ``FedAvg`` work), ``federation`` (the loop's
settings: :class:`~fedlit.federation.Federation`'s keyword arguments) and optional ``callbacks``; plus
``out_dir``. Dotted overrides (``--federation.rounds 3``) and ``--print_config`` come from jsonargparse.

A fresh ``fit`` writes into ``runs/<name>/<version>`` (``--name`` defaults to ``<recipe>_<strategy>``,
``--version`` to the next ``version_<n>``), or into ``--out_dir``, which must not hold another run (see
:mod:`fedlit.engine.run_folder`). ``--ckpt_path last`` (and ``validate``/``test`` without ``--ckpt_path``) means the
checkpoint of the newest run of that name, or of ``--out_dir``; when that run has none, the command says so
rather than falling back to an older run. ``validate``/``test --run DIR`` rebuild a run from its ``config.json``
and evaluate its ``last`` or ``best`` checkpoint (see :mod:`fedlit.config.resolve`; :mod:`fedlit.engine.record` says what a
run records). ``fedlit cost`` (and ``fit --dry_run``) prints the parameters per role and the bytes a run would
exchange, before training and without reading data (see :mod:`fedlit.commands.cost`). ``fit --seeds 0 1 2`` runs the recipe
once per seed (see :mod:`fedlit.commands.seeds`); ``fedlit partition`` builds the data alone and counts and plots it per
client (see :mod:`fedlit.commands.partition`); ``fedlit report RUN...`` compares finished runs (see :mod:`fedlit.commands.report`).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import yaml
from jsonargparse import ActionConfigFile, ArgumentParser, Namespace

from fedlit.config import resolve as runnames
from fedlit.core.errors import CheckpointError, ConfigError, FedlitError
from fedlit.core.version import __version__
from fedlit.engine.run_folder import check_run_dir, lock_holder, new_version_dir, run_versions

if TYPE_CHECKING:
    from collections.abc import Callable

    from fedlit.commands.cost import CostJob
    from fedlit.commands.partition import PartitionJob
    from fedlit.commands.seeds import SeedsJob
    from fedlit.federation import Federation

# torch, Lightning and the model libraries are imported where they are needed (building the parser of a
# subcommand, building the objects), so `fedlit --help` and `fedlit --version` answer in a fraction of a second.

SUBCOMMANDS = {
    "fit": "Run a federated experiment (resume with --ckpt_path last).",
    "validate": "Evaluate a checkpoint on every client's validation split.",
    "test": "Evaluate a checkpoint on every client's test split.",
    "export": "Write each client's personalized tensors of a run (safetensors, and a peft adapter with LoRA).",
    "cost": "Print the parameters per role and the bytes a run would communicate, before training (no data read).",
    "partition": "Build a recipe's data only: print each client's samples per split and class, plot them.",
    "report": "Compare finished runs (seeds grouped by method): tables, curves and costs in report.md and .html.",
    "flower-app": "Write a Flower app folder that deploys a recipe on a SuperLink and SuperNodes (`flwr run`).",
}
SECTIONS = ("model", "data", "strategy")
LAST_KEYWORD = "last"
BEST_KEYWORD = "best"
#: Errors of parsing the recipe and building the objects: printed as one line (exit code 2).
CONFIG_ERRORS = (argparse.ArgumentError, FedlitError, ValueError, TypeError, KeyError, FileNotFoundError)


def _bases() -> dict[str, type]:
    """The base class of each ``class_path`` section (imports torch and Lightning)."""
    import fedlit.strategies  # noqa: F401  (registers the built-in strategies for short names)
    from fedlit.data import FederatedDataModule
    from fedlit.module import FederatedModule
    from fedlit.strategies.base import Strategy

    return {"model": FederatedModule, "data": FederatedDataModule, "strategy": Strategy}


def _subparser(name: str) -> ArgumentParser:
    from lightning.pytorch import Callback

    import fedlit.callbacks  # noqa: F401  (lists fedlit's own callbacks in --help)
    from fedlit.federation import Federation

    FederatedModule, FederatedDataModule, Strategy = _bases().values()  # noqa: N806  (classes)
    parser = ArgumentParser(description=SUBCOMMANDS[name], exit_on_error=False)
    parser.add_argument("--config", action=ActionConfigFile, help="A recipe (YAML).")
    # data before model: the data set is built first, so a missing data folder is reported before a large
    # backbone is built (and before its weight file is looked for)
    parser.add_subclass_arguments(FederatedDataModule, "data", required=True, help="The federated data.")
    parser.add_subclass_arguments(FederatedModule, "model", required=True, help="The client model.")
    parser.add_subclass_arguments(Strategy, "strategy", required=True, help="The server algorithm.")
    parser.add_class_arguments(
        Federation, "federation", skip={"module", "datamodule", "strategy", "callbacks", "config", "out_dir"},
        instantiate=False, help="Settings of the federated loop.",
    )
    parser.add_argument("--callbacks", type=list[Callback] | None, default=None,
                        help="Extra callbacks, e.g. fedlit.callbacks.EarlyStopping. Only callbacks that act in the "
                        "federated loop's hooks (docs/concepts.md, 'The loop') are accepted: Lightning's "
                        "Trainer-only ones (EarlyStopping, ModelCheckpoint...) are refused.")
    parser.add_argument("--out_dir", type=str | None, default=None,
                        help="Output folder (default: runs/<name>/<version>).")
    parser.add_argument("--ckpt_path", type=str | None, default=None,
                        help="Checkpoint to resume or evaluate: a path, `last` (of the newest run of this name), "
                             "or, for validate and test, `best` (its best-validation checkpoint).")
    runnames.add_run_arguments(parser, name)
    if name in ("fit", "test"):
        parser.add_argument("--baseline_run", type=str | None, default=None,
                            help="A finished run of strategy Local on the same data and seed: the report adds each "
                                 "client's test gain over it, with their mean and std (gain_over_local).")
    if name == "partition":
        from fedlit.commands import partition

        partition.add_arguments(parser)
    if name in ("fit", "cost"):
        from fedlit.commands import cost as costs

        costs.add_arguments(parser, name)
    if name == "fit":
        from fedlit.commands import seeds

        seeds.add_arguments(parser)
    return parser


def build_parser(*, summary: bool = False) -> ArgumentParser:
    """The ``fedlit`` parser with its subcommands.

    Args:
        summary: Leave the subcommands' options out: enough for ``fedlit --help`` and ``fedlit --version``,
            without importing torch or Lightning.
    """
    parser = ArgumentParser(prog="fedlit", description="Personalized federated fine-tuning of medical models.",
                            exit_on_error=False)
    parser.add_argument("--version", action="version", version=f"fedlit {__version__}",
                        help="Print the version and exit.")
    subcommands = parser.add_subcommands(dest="subcommand")
    for name, help_text in SUBCOMMANDS.items():
        if summary or name in ("report", "flower-app"):  # they parse their own arguments
            sub = ArgumentParser(description=help_text, exit_on_error=False)
        else:
            sub = _export_parser() if name == "export" else _subparser(name)
        subcommands.add_subcommand(name, sub, help=help_text)
    return parser


def _resolve_run(cfg: Namespace, subcommand: str) -> tuple[Path | None, Path | None]:
    """The run folder and the checkpoint of a command; ``None`` as folder means a new ``runs/<name>/version_<n>``.

    - ``fit``: ``--out_dir`` (or ``--name``/``--version``) as given, else a new version; ``--ckpt_path last``
      resumes the newest run of the name (or the given folder) and never an older one silently.
    - ``validate``/``test``: ``--ckpt_path`` (default ``last``, as for ``fit``; ``best`` for the run's
      ``best.ckpt``) of ``--run`` or the folders above; without them a checkpoint file is evaluated in its own
      run folder.
    """
    from fedlit.core.checkpoint_io import LAST

    named = [f"--{key} {cfg[key]}" for key in ("name", "version") if cfg[key] is not None]
    if cfg.out_dir and named:
        raise ConfigError(f"{' and '.join(named)} and --out_dir {cfg.out_dir}: give one of them (--out_dir is the "
                          "whole folder; --name and --version make runs/<name>/<version>).")
    out_dir = Path(cfg.out_dir) if cfg.out_dir else runnames.version_dir(cfg)
    if cfg.get("run"):
        if cfg.out_dir or cfg.version is not None or cfg.name is not None:
            raise ConfigError(f"--run {cfg.run} is the run's folder: leave out --out_dir, --name and --version.")
        out_dir = Path(cfg.run)
    ckpt_path = cfg.ckpt_path if cfg.ckpt_path is not None or subcommand == "fit" else LAST_KEYWORD
    if ckpt_path is None:
        return out_dir, None
    if ckpt_path == BEST_KEYWORD:
        return runnames.resolve_best(cfg, subcommand, out_dir)
    if ckpt_path != LAST_KEYWORD:
        ckpt = Path(ckpt_path)
        if out_dir is None and subcommand != "fit":
            out_dir = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent
        return out_dir, ckpt
    option = "--ckpt_path last" if cfg.ckpt_path is not None else f"fedlit {subcommand} (without --ckpt_path)"
    if out_dir is not None:
        ckpt = out_dir / "checkpoints" / LAST
        if not ckpt.is_file():
            raise CheckpointError(
                f"{option}: no checkpoint at {ckpt}. Run `fedlit fit` into --out_dir {out_dir} first, or give "
                "--out_dir of the run to resume, or --ckpt_path with the path of a .ckpt file."
            )
        return out_dir, ckpt
    root = runnames.run_root(cfg)
    runs = run_versions(root)
    if not runs:
        raise CheckpointError(
            f"{option}: no run named {root.name} under {root.parent}. Run `fedlit fit` with this recipe first (with "
            "the same --name or --strategy), or give --out_dir or --run of a run, or --ckpt_path with the path of a "
            ".ckpt file."
        )
    newest = runs[-1]
    ckpt = newest / "checkpoints" / LAST
    if not ckpt.is_file():
        holder = lock_holder(newest)
        state = (f"it is still running (pid {holder.get('pid', '?')}) and has not saved one yet" if holder
                 else "it stopped before its first checkpoint")
        older = [p for p in runs[:-1] if (p / "checkpoints" / LAST).is_file()]
        hint = f" (the newest with one is {older[-1]})" if older else ""
        raise CheckpointError(
            f"{option}: the newest run of this name, {newest}, has no checkpoint: {state}. `last` never falls "
            f"back to an older run. Pass --out_dir of an older run{hint}, or --ckpt_path with the path of a "
            ".ckpt file."
        )
    return newest, ckpt


@dataclass
class _Job:
    """A parsed and built command, ready to run."""

    subcommand: str
    federation: Federation
    ckpt_path: Path | None
    created: Path | None  # the new version folder made for this run, removed again if the run leaves it empty

    def __call__(self) -> Any:
        if self.federation.fabric.is_global_zero:
            print(f"fedlit {self.subcommand}: out_dir={self.federation.out_dir}", flush=True)
        try:
            if self.subcommand == "fit":
                return self.federation.fit(ckpt_path=self.ckpt_path)
            return self.federation.evaluate(self.subcommand.replace("validate", "val"), ckpt_path=self.ckpt_path)
        finally:
            _remove_if_empty(self.created)


def _remove_if_empty(folder: Path | None) -> None:
    if folder is not None:
        with contextlib.suppress(OSError):  # not empty (the run wrote into it), or already gone
            folder.rmdir()


def prepare(argv: list[str] | None = None, *, wrap_data: Callable[[Any], Any] | None = None,
            ) -> _Job | _ExportJob | CostJob | SeedsJob | PartitionJob | Callable[[], Any]:
    """Parse ``argv``, resolve the run folder and checkpoint, and build the objects (configuration errors are
    raised here); calling the result runs the subcommand. ``wrap_data`` replaces the recipe's data module, built
    but not set up, by what it returns (a Flower server's view of the nodes' data, :mod:`fedlit.flower`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"], ["--version"]):
        build_parser(summary=True).parse_args(argv[:1])  # prints and exits
    if argv[:1] == ["report"]:
        from fedlit.commands import report

        return lambda: report.main(argv[1:])  # reads run folders only: no recipe, no torch
    if argv[:1] == ["flower-app"]:
        from fedlit.flower import app

        return lambda: app.main(argv[1:])  # fedlit.flower.app
    from lightning.fabric.utilities.seed import seed_everything

    from fedlit.commands import seeds
    from fedlit.engine.ranks import launched_rank_zero
    from fedlit.federation import Federation

    if seeds.requested(argv):
        return seeds.prepare(argv)  # one plain fit per seed (fedlit.commands.seeds)
    parser = build_parser()
    _precheck(argv)
    cfg = parser.parse_args(runnames.expand_run(argv))
    subcommand = cfg.subcommand
    if subcommand == "export":
        return _prepare_export(cfg.export)
    if subcommand == "partition":
        from fedlit.commands import partition

        return partition.prepare(cfg.partition)  # the data module alone: no model, no run folder
    sub_cfg = cfg[subcommand]
    if subcommand == "cost" or sub_cfg.get("dry_run"):
        from fedlit.commands import cost as costs

        return costs.prepare(parser, cfg, subcommand)  # builds no data, writes no run folder
    out_dir, ckpt_path = _resolve_run(sub_cfg, subcommand)
    # Over several processes only the first one checks and makes the run folder; the others take it from rank 0.
    first = (sub_cfg.federation.devices in (1, "1") and sub_cfg.federation.num_nodes == 1) or launched_rank_zero()
    if subcommand == "fit" and out_dir is not None and first:
        check_run_dir(out_dir, resume=ckpt_path is not None)  # refuse a taken folder before the slow part
    config = json.loads(parser.dump(cfg, format="json_indented", skip_none=False, skip_validation=True))[subcommand]
    config.pop("dry_run", None)
    config.pop("seeds", None)  # an option of fit only: validate/test --run rebuild the run from this
    baseline_run = config.pop("baseline_run", None)  # what the run is compared with, not part of it
    # Seed before the objects are built: randomly initialized weights (a frozen random backbone included) and
    # generated data must be the same in a resumed or re-evaluated run as in the original one.
    seed_everything(sub_cfg.federation.seed, verbose=False)
    objects = parser.instantiate_classes(cfg)[subcommand]
    if wrap_data is not None:
        objects.data = wrap_data(objects.data)
    objects.data.setup()  # reading and partitioning the data is input: its errors are configuration errors
    created = None
    if out_dir is None:
        root = runnames.run_root(sub_cfg)
        out_dir = created = new_version_dir(root) if first else root / "version_of_rank_0"  # replaced at launch
    try:
        federation = Federation(
            objects.model, objects.data, objects.strategy, **objects.federation.as_dict(),
            callbacks=objects.callbacks, out_dir=out_dir, config=config,
        )
    except BaseException:
        _remove_if_empty(created)
        raise
    federation.baseline_run = Path(baseline_run) if baseline_run else None
    if federation.fabric.world_size > 1:
        ckpt_path, created = _launch(federation, ckpt_path, created)
    return _Job(subcommand, federation, ckpt_path, created)


def _launch(federation: Federation, ckpt_path: Path | None, created: Path | None) -> tuple[Path | None, Path | None]:
    """Start the processes of a run over several devices or nodes (Fabric's own launcher re-runs this command up to
    here in each further local process); every rank then takes rank 0's run folder and checkpoint."""
    try:
        federation.launch()
        out_dir, ckpt = federation.fabric.broadcast((str(federation.out_dir), ckpt_path and str(ckpt_path)))
    except BaseException:
        _remove_if_empty(created)
        raise
    if not federation.fabric.is_global_zero:
        _remove_if_empty(created)
        created = None
    federation.out_dir = Path(out_dir)
    return (Path(ckpt) if ckpt else None), created


def run(argv: list[str] | None = None) -> Any:
    """Parse ``argv``, build the objects and run the subcommand; returns its results."""
    return prepare(argv)()


def _export_parser() -> ArgumentParser:
    parser = ArgumentParser(description=SUBCOMMANDS["export"], exit_on_error=False)
    parser.add_argument("--run", type=str, required=True, help="The run folder (the out_dir of `fedlit fit`).")
    parser.add_argument("--ckpt_path", type=str, default="last",
                        help="`last` (checkpoints/last.ckpt), `best` (checkpoints/best.ckpt) or a .ckpt file.")
    parser.add_argument("--clients", type=str | None, default=None,
                        help="Comma-separated client ids to export (default: every client).")
    parser.add_argument("--out", type=str | None, default=None, help="Output folder (default: <run>/export).")
    return parser


@dataclass
class _ExportJob:
    """``fedlit export``: the run rebuilt and restored, ready to write."""

    federation: Federation
    checkpoint: Path
    clients: list[str] | None
    out: Path

    def __call__(self) -> dict[str, Path]:
        from fedlit.commands.export import export_federation

        written = export_federation(self.federation, self.out, self.clients, checkpoint=self.checkpoint)
        print(f"fedlit export: round {self.federation.server_round} of {self.checkpoint}, {len(written)} clients "
              f"-> {self.out}", flush=True)
        return written


def _prepare_export(cfg: Namespace) -> _ExportJob:
    """Rebuild the run and restore its checkpoint (configuration errors are raised here, as for the others)."""
    from fedlit.commands.export import checkpoint_of, load_run

    ckpt = checkpoint_of(cfg.run, cfg.ckpt_path)
    clients = [c.strip() for c in cfg.clients.split(",") if c.strip()] if cfg.clients else None
    out = Path(cfg.out) if cfg.out else Path(cfg.run) / "export"
    return _ExportJob(load_run(cfg.run, ckpt), ckpt, clients, out)


def _precheck(argv: list[str]) -> None:
    """Checks that give a clearer message than jsonargparse: recipe files exist and are valid YAML (file, line and
    column), and each ``class_path`` names a known class of the right kind."""
    sections: dict[str, Any] = {}
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            loaded = _read_recipe(Path(argv[i + 1]))
            if isinstance(loaded, dict):
                sections.update({k: v for k, v in loaded.items() if k in SECTIONS})
        for section in SECTIONS:
            if arg in (f"--{section}", f"--{section}.class_path") and i + 1 < len(argv):
                sections[section] = {"class_path": argv[i + 1]}
    for section, value in sections.items():
        name = value.get("class_path") if isinstance(value, dict) else value
        if isinstance(name, str):
            _check_class_path(section, name)


def _read_recipe(path: Path) -> Any:
    if not path.is_file():
        where = "it is a folder" if path.is_dir() else f"no such file (relative to {Path.cwd()})"
        raise ConfigError(f"--config {path}: {where}. Give the path of a recipe .yaml file.")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        context, start = getattr(err, "context", None), getattr(err, "context_mark", None)
        if context and start is not None:
            problem += f" ({context} that starts at line {start.line + 1}, column {start.column + 1})"
        raise ConfigError(f"{path}{where}: {problem}. Fix the YAML syntax of the recipe.") from None


def _check_class_path(section: str, name: str) -> None:
    """Refuse a ``class_path`` that is not a subclass of the section's base class, with the key as in the YAML.

    A short name is looked up among the known subclasses without importing anything; a dotted path is imported
    (its module's import is the only code run) and its object checked.
    """
    bases = _bases()
    base, key = bases[section], f"{section}.class_path"
    if "." not in name:
        known = {c.__name__ for c in _subclasses(base)}
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"{key}={name!r} is not a known {base.__name__}.{hint} "
                f"Valid names: {', '.join(sorted(known))} (or a full import path of your own subclass)."
            )
        return
    module_name, _, attr = name.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name is None or not (module_name == err.name or module_name.startswith(err.name + ".")):
            raise  # the module exists but one of its own imports fails: its traceback says where
        raise ConfigError(
            f"{key}={name!r}: no module named {err.name!r}. Check the spelling, or make the module importable "
            "(install its package, or run from the folder that holds it)."
        ) from None
    obj = getattr(module, attr, None)
    if obj is None:
        candidates = sorted(n for n, v in vars(module).items() if isinstance(v, type) and issubclass(v, base))
        close = difflib.get_close_matches(attr, candidates, n=1)
        hint = f" Did you mean {module_name}.{close[0]}?" if close else ""
        raise ConfigError(f"{key}={name!r}: module {module_name} has no {attr!r}.{hint}")
    if not (isinstance(obj, type) and issubclass(obj, base)):
        kind = next((b.__name__ for b in bases.values() if isinstance(obj, type) and issubclass(obj, b)),
                    type(obj).__name__ if not isinstance(obj, type) else "class")
        raise ConfigError(
            f"{key}={name!r} is a {kind}, not a {base.__name__}: the {section} section needs a subclass of "
            f"{base.__module__}.{base.__name__}."
        )


def _subclasses(base: type) -> set[type]:
    found, stack = set(), [base]
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub not in found and not sub.__name__.startswith("_"):
                found.add(sub)
                stack.append(sub)
    return found


def explain(err: BaseException) -> str:
    """One clear message for a configuration error: the key as spelled in the YAML, the value, the fix.

    jsonargparse wraps the real problem in several layers (union types, nested subclasses); this reads the nesting
    of ``Parser key`` and ``class_path`` out of the outermost message, rebuilds the full dotted key
    (``model.init_args.backbone.init_args.num_features``) and, for an unknown key, lists the valid keys of that
    class or section with the closest match. fedlit's own errors are already written that way.
    """
    if isinstance(err, FedlitError):
        return str(err)
    chain: list[BaseException] = []
    node: BaseException | None = err
    while node is not None and node not in chain:
        chain.append(node)
        node = node.__cause__ or node.__context__
    outer, text = str(chain[0]), "\n".join(str(e) for e in chain)
    keys = list(dict.fromkeys(re.findall(r'Parser key "([\w.]+)"', outer)))
    class_paths = re.findall(r"Problem with given class_path '([\w.]+)'", outer)
    unknown = (re.search(r"does not accept option '([\w.]+)'", text)
               or re.search(r"Option '([\w.]+)' is not accepted", text)
               or re.search(r"unrecognized arguments: --([\w.]+)", text))
    if found := re.search(r"callable class: Option '(\w+)' is not accepted\. Got value: .*?class_path='([\w.]+)'",
                          text):
        option, owner = found.groups()  # a misspelled init_args key of an optimizer or scheduler
        valid = [p for p in _init_args(owner) if p not in ("params", "optimizer")]
        return _unknown_key(f"{_nested_key(keys)}.init_args.{option}", option, valid, f" of {owner}")
    if unknown:
        name = unknown.group(1)
        if class_paths:
            option = name.split(".")[0]
            key = _nested_key(keys) + f".init_args.{option}"
            return _unknown_key(key, option, _init_args(class_paths[-1]), f" of {class_paths[-1]}")
        section, _, option = name.rpartition(".")
        return _unknown_key(name, option, _section_keys(section))
    if found := re.search(r"expects a function or a callable class: (.+?)\. Got value: .*?class_path='([\w.]+)'", text):
        return _callable_class_path(_nested_key(keys), found.group(2), found.group(1))
    if found := re.search(r"Expected a dot import path string: (\S+)", text):
        return _callable_class_path(_nested_key(keys), found.group(1), "not a known class")
    if found := re.search(r"Expected a (.+?)\. Got value: (.*)", text):
        return f"{_nested_key(keys) or '?'}: expected {found.group(1)}, got {found.group(2)!r}."
    innermost = str(chain[-1]).strip()
    return innermost.splitlines()[0] if len(innermost.splitlines()) > 6 else innermost


def _callable_class_path(key: str, name: str, problem: str) -> str:
    """A ``class_path`` of an optimizer or scheduler (a callable-typed option) that jsonargparse refused."""
    module_name, _, attr = name.rpartition(".")
    home = "torch.optim.lr_scheduler" if key.endswith("lr_scheduler") else "torch.optim"
    hint, shorthands = "", ["sgd", "adam", "adamw"] if not module_name and home == "torch.optim" else []
    if "has no attribute" in problem or not module_name:
        with contextlib.suppress(ImportError):
            module = module_name or home
            classes = [n for n, v in vars(importlib.import_module(module)).items() if isinstance(v, type)]
            close = difflib.get_close_matches(attr, classes + shorthands, n=1)
            hint = "" if not close else (f" Did you mean {close[0]!r}?" if close[0] in shorthands
                                         else f" Did you mean {module}.{close[0]}?")
    if shorthands:  # `optimizer: sgdd` reads as a misspelled shorthand too
        return (f"{key}={name!r} is not one of the shorthands ['sgd', 'adam', 'adamw'] nor a known class.{hint} "
                "Give a shorthand, or a class of torch.optim as class_path (its name or full import path).")
    return (f"{key}.class_path={name!r}: {problem.rstrip('.')}.{hint} Give a class of {home} (its name, or a "
            "full import path), or the import path of your own.")


def _nested_key(keys: list[str]) -> str:
    """``["model", "backbone"]`` -> ``model.init_args.backbone`` (jsonargparse's nesting as YAML keys)."""
    return ".init_args.".join(keys)


def _unknown_key(key: str, name: str, valid: list[str], owner: str = "") -> str:
    close = difflib.get_close_matches(name, valid, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"{key} is not an option{owner}.{hint} Valid options: {', '.join(valid)}."


def _section_keys(section: str) -> list[str]:
    import inspect

    if section == "federation":
        from fedlit.federation import Federation

        skip = {"self", "module", "datamodule", "strategy", "callbacks", "config", "out_dir"}
        return [p for p in inspect.signature(Federation.__init__).parameters if p not in skip]
    return ["config", "model", "data", "strategy", "federation", "callbacks", "out_dir", "ckpt_path", "name",
            "version", "run"]


def _init_args(class_path: str) -> list[str]:
    import inspect

    module_name, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError):
        return []
    return [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "args", "kwargs")]


def main(argv: list[str] | None = None) -> None:
    """Console entry point.

    Errors in the recipe, the command line, the input files or the run folder end with one clear line and exit
    code 2: anything raised while parsing and building the objects, and :class:`~fedlit.core.errors.FedlitError`
    raised while running. Any other exception raised while running (a bug in a custom strategy or module, say)
    keeps its traceback (exit code 1).
    """
    try:
        job = prepare(argv)
    except CONFIG_ERRORS as err:
        _fail(explain(err))
    try:
        job()
    except FedlitError as err:
        _fail(str(err))


def _fail(message: str) -> NoReturn:
    print(f"fedlit: error: {message}", file=sys.stderr)
    raise SystemExit(2) from None
