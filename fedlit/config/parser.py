"""The parser of a recipe: its sections (``data``, ``model``, ``strategy`` as ``class_path`` + ``init_args``; the
``federation`` settings; ``callbacks``; ``out_dir``) and the options every command that runs a recipe shares.

A recipe has five sections: ``model`` (a FederatedModule), ``data`` (a FederatedDataModule), ``strategy`` (a
Strategy; short names such as ``FedAvg`` work), ``federation`` (the loop's settings:
:class:`~fedlit.engine.loop.settings.Settings`) and optional ``callbacks``; plus ``out_dir``. Dotted overrides
(``--federation.rounds 3``) and ``--print_config`` come from jsonargparse; ``imports`` lists the recipe's own code
(:mod:`fedlit.config.imports`). torch, Lightning and the model libraries are imported only when a recipe parser is
built, so ``fedlit --help`` answers in a fraction of a second.

A command reads its recipe in three steps, each called once and in order by the command itself:
:func:`load` (this module: ``argv`` -> :class:`Recipe`, the recipe's code imported), then
:func:`fedlit.config.resolve.resolve_run` (the run folder and checkpoint), then :func:`fedlit.config.build.build_run`
(the objects); ``fedlit cost`` and ``fit --dry_run`` go from :func:`load` to :mod:`fedlit.config.costing` instead.
"""

from __future__ import annotations

import difflib
import importlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import ActionConfigFile, ArgumentParser, Namespace

from fedlit.config import imports, recipe_checks, resolve
from fedlit.core.errors import ConfigError
from fedlit.core.version import __version__

SECTIONS = ("model", "data", "strategy")


def bases() -> dict[str, type]:
    """The base class of each ``class_path`` section (imports torch and Lightning)."""
    import fedlit.strategies  # noqa: F401  (registers the built-in strategies for short names)
    from fedlit.data import FederatedDataModule
    from fedlit.module import FederatedModule
    from fedlit.strategies.base import Strategy

    return {"model": FederatedModule, "data": FederatedDataModule, "strategy": Strategy}


def recipe_parser(subcommand: str, description: str) -> ArgumentParser:
    """The parser of a command that reads a recipe: its sections, ``--out_dir``, ``--ckpt_path``, ``--name``,
    ``--version`` (and ``--run`` for validate and test)."""
    from lightning.pytorch import Callback

    import fedlit.callbacks  # noqa: F401  (lists fedlit's own callbacks in --help)
    from fedlit.engine.loop.settings import Settings

    FederatedModule, FederatedDataModule, Strategy = bases().values()  # noqa: N806  (classes)
    parser = ArgumentParser(description=description, exit_on_error=False)
    parser.add_argument("--config", action=ActionConfigFile, help="A recipe (YAML).")
    # data before model: the data set is built first, so a missing data folder is reported before a large
    # backbone is built (and before its weight file is looked for)
    parser.add_subclass_arguments(FederatedDataModule, "data", required=True, help="The federated data.")
    parser.add_subclass_arguments(FederatedModule, "model", required=True, help="The client model.")
    parser.add_subclass_arguments(Strategy, "strategy", required=True, help="The server algorithm.")
    parser.add_class_arguments(Settings, "federation", instantiate=False, help="Settings of the federated loop.")
    callbacks = parser.add_argument(
        "--callbacks",
        type=list[Callback] | None,
        default=None,
        help="Extra callbacks, e.g. fedlit.callbacks.EarlyStopping. Only callbacks that act in the "
        "federated loop's hooks (docs/concepts.md, 'The loop') are accepted: Lightning's own "
        "(EarlyStopping, ModelCheckpoint, ModelSummary...), written for its Trainer, are refused.",
    )
    callbacks.extra_help = lambda: accepted_callbacks_help(Callback, Strategy)  # not every Callback subclass
    parser.add_argument(
        "--out_dir", type=str | None, default=None, help="Output folder (default: runs/<name>/<version>)."
    )
    parser.add_argument(
        "--ckpt_path",
        type=str | None,
        default=None,
        help="Checkpoint to resume or evaluate: a path, `last` (of the newest run of this name), "
        "or, for validate and test, `best` (its best-validation checkpoint).",
    )
    parser.add_argument(
        f"--{imports.KEY}",
        type=list[str] | None,
        default=None,
        help="Your own code to import before class paths are resolved (strategies, models, data "
        "modules): .py files relative to the recipe's folder, or module names, e.g. "
        f"[my_strategies.py]. On the command line, {imports.OPTION} MODULE_OR_FILE adds one "
        "(relative to the current folder; repeat it for more).",
    )
    resolve.add_run_arguments(parser, subcommand)
    return parser


def accepted_callbacks_help(callback: type, strategy: type) -> str:
    """The end of ``--callbacks``' help: the callbacks the loop accepts (:func:`fedlit.callbacks.accepted`), where
    jsonargparse would list every subclass of ``callback``, Lightning's Trainer-only ones and the strategies too."""
    from fedlit.callbacks import accepted

    names = sorted(
        f"{c.__module__}.{c.__qualname__}" for c in subclasses(callback) if accepted(c) and not issubclass(c, strategy)
    )
    return f", accepted: {', '.join(names)}, or a Callback of your own that implements only the loop's hooks"


def root_parser(subcommands: Mapping[str, tuple[str, ArgumentParser]]) -> ArgumentParser:
    """The ``fedlit`` parser over ``subcommands`` (name -> help, its parser)."""
    parser = ArgumentParser(
        prog="fedlit", description="Personalized federated fine-tuning of medical models.", exit_on_error=False
    )
    parser.add_argument(
        "--version", action="version", version=f"fedlit {__version__}", help="Print the version and exit."
    )
    commands = parser.add_subcommands(dest="subcommand")
    for name, (help_text, sub) in subcommands.items():
        commands.add_subcommand(name, sub, help=help_text)
    return parser


@dataclass
class Recipe:
    """A command line read by :func:`load`: the recipe's files and overrides parsed, its own code imported.

    Attributes:
        subcommand: ``fit``, ``validate``, ``test``, ``cost``...
        parser: The ``fedlit`` parser with that one subcommand (it dumps and instantiates ``cfg``).
        cfg: The parsed namespace (the subcommand's options are under ``cfg[subcommand]``: :attr:`options`).
    """

    subcommand: str
    parser: ArgumentParser
    cfg: Namespace

    @property
    def options(self) -> Namespace:
        """The subcommand's options: the recipe's sections and the command's own options."""
        return self.cfg[self.subcommand]


def load(argv: list[str], sub: ArgumentParser) -> Recipe:
    """``argv`` (``fit --config R.yaml ...``) read with the subcommand's parser ``sub``: ``--run DIR`` expanded to
    the run's recipe, the recipe's ``imports`` (and ``--import``) imported, then the checks that give clearer
    messages than jsonargparse, then parsed. Configuration errors are raised here."""
    root = root_parser({argv[0]: (sub.description or argv[0], sub)})
    return Recipe(argv[0], root, parse(root, argv))


def parse(parser: ArgumentParser, argv: list[str]) -> Namespace:
    """``argv`` parsed, after the checks that give clearer messages than jsonargparse (recipe files, YAML syntax,
    ``class_path`` names); ``--run DIR`` reads the run's recipe; the recipe's ``imports`` and ``--import`` are
    imported first, and recorded as ``imports`` (absolute paths)."""
    argv = recipe_checks.join_negative_values(resolve.expand_run(list(argv)))
    recipes = read_configs(argv)
    recipe_checks.check_top_level_keys(recipes, top_level_keys(parser, argv[0]))
    argv, entries = imports.split(argv)
    for i, arg in enumerate(argv[:-1]):
        if arg == f"--{imports.KEY}":
            entries = [*imports.of_option(argv[i + 1]), *entries]
    entries = [
        e
        for path, recipe in recipes
        for e in imports.of_recipe(
            recipe, path.parent if path else Path.cwd(), str(path) if path else "the run's config.json"
        )
    ] + entries
    if entries:
        argv = [*argv, f"--{imports.KEY}", json.dumps(imports.import_all(entries))]
    precheck(argv, recipes)
    return parser.parse_args(argv)


def top_level_keys(parser: ArgumentParser, subcommand: str) -> set[str]:
    """The options of ``subcommand`` under the ``fedlit`` parser ``parser``: what a recipe's top-level keys may be."""
    subs = [a.choices[subcommand] for a in parser._actions if isinstance(a.choices, dict) and subcommand in a.choices]
    return {a.dest.split(".")[0] for sub in subs for a in sub._actions}  # argparse keeps its options there


def read_configs(argv: list[str]) -> list[tuple[Path | None, Any]]:
    """Each ``--config`` of ``argv`` read: (its file, its content); a recipe given as text (``--run``'s
    ``config.json``) has no file."""
    found: list[tuple[Path | None, Any]] = []
    for i, arg in enumerate(argv[:-1]):
        if arg == "--config":
            value = argv[i + 1]
            if value.lstrip().startswith("{"):  # a recipe as JSON text
                found.append((None, load_recipe(value, "the run's config.json")))
            else:
                found.append((Path(value), read_recipe(Path(value))))
    return found


def precheck(argv: list[str], recipes: list[tuple[Path | None, Any]] | None = None) -> None:
    """Checks that give a clearer message than jsonargparse: recipe files exist and are valid YAML (file, line and
    column), and each ``class_path`` names a known class of the right kind."""
    sections: dict[str, Any] = {}
    named: dict[str, bool] = {}  # each section given: whether some --config or option names its class
    contents = iter([content for _, content in (read_configs(argv) if recipes is None else recipes)])
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):  # in order: a later --config or option overrides an earlier one
            loaded = next(contents, None)
            if isinstance(loaded, dict):
                given = {k: v for k, v in loaded.items() if k in SECTIONS}
                sections.update(given)
                named |= {k: named.get(k, False) or _names_class(v) for k, v in given.items()}
        for section in SECTIONS:
            if arg in (f"--{section}", f"--{section}.class_path") and i + 1 < len(argv):
                sections[section] = {"class_path": argv[i + 1]}
            if arg.split("=", 1)[0] in (f"--{section}", f"--{section}.class_path"):
                named[section] = True
    missing = [f"{section}.class_path" for section in SECTIONS if named.get(section) is False]
    if missing:
        raise ConfigError(
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing: the model, data and strategy "
            "sections each name their class, as in `data: {class_path: fedlit.data.SiteFolders, init_args: {...}}` "
            "(`fedlit recipes` lists recipes to start from)."
        )
    for section, value in sections.items():
        name = value.get("class_path") if isinstance(value, dict) else value
        if isinstance(name, str):
            check_class_path(section, name)


def _names_class(value: Any) -> bool:
    """Whether a recipe's section names its class: a ``class_path``, or a short name (``strategy: FedAvg``)."""
    return isinstance(value, str) or (isinstance(value, dict) and value.get("class_path") is not None)


class DuplicateKeyError(yaml.YAMLError):
    """A mapping of a recipe gives a key twice: ``key`` (dotted from the top), the 1-based lines of both."""

    def __init__(self, key: str, first: int, second: int) -> None:
        super().__init__(f"duplicate key {key!r} (lines {first} and {second})")
        self.key, self.first, self.second = key, first, second


class RecipeLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses a key given twice in a mapping, at any level (PyYAML keeps the last)."""

    def construct_document(self, node: yaml.Node) -> Any:
        check_duplicate_keys(node)
        return super().construct_document(node)


def check_duplicate_keys(node: yaml.Node, prefix: str = "", seen: set[int] | None = None) -> None:
    """Raise :class:`DuplicateKeyError` for the first key given twice in a mapping of ``node``'s tree."""
    seen = set() if seen is None else seen
    if id(node) in seen:  # an alias to a node already checked
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        lines: dict[str, int] = {}
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key, line = f"{prefix}{key_node.value}", key_node.start_mark.line + 1
                if key in lines:
                    raise DuplicateKeyError(key, lines[key], line)
                lines[key] = line
                check_duplicate_keys(value_node, f"{key}.", seen)
            else:
                check_duplicate_keys(value_node, prefix, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            check_duplicate_keys(item, f"{prefix.rstrip('.')}[{i}].", seen)


def read_recipe(path: Path) -> Any:
    if not path.is_file():
        where = "it is a folder" if path.is_dir() else f"no such file (relative to {Path.cwd()})"
        raise ConfigError(f"--config {path}: {where}. Give the path of a recipe .yaml file.")
    return load_recipe(path.read_text(), str(path))


def load_recipe(text: str, where: str) -> Any:
    """The recipe ``text`` parsed with :class:`RecipeLoader`; a key given twice or bad YAML raises
    :class:`~fedlit.core.errors.ConfigError` naming ``where`` (a file, or the run config's recipe) and the line."""
    path = where
    try:
        return yaml.load(text, Loader=RecipeLoader)  # noqa: S506  (a SafeLoader)
    except DuplicateKeyError as err:
        raise ConfigError(
            f"{path}: key {err.key!r} is given twice (line {err.first} and line {err.second}); YAML "
            "would silently keep the last one. Merge the two into one."
        ) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        context, start = getattr(err, "context", None), getattr(err, "context_mark", None)
        if context and start is not None:
            problem += f" ({context} that starts at line {start.line + 1}, column {start.column + 1})"
        raise ConfigError(f"{path}{where}: {problem}. Fix the YAML syntax of the recipe.") from None


def check_class_path(section: str, name: str) -> None:
    """Refuse a ``class_path`` that is not a subclass of the section's base class, with the key as in the YAML.

    A short name is looked up among the known subclasses without importing anything; a dotted path is imported
    (its module's import is the only code run) and its object checked.
    """
    bases_ = bases()
    base, key = bases_[section], f"{section}.class_path"
    if "." not in name:
        known = {c.__name__ for c in subclasses(base)}
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
            f"{key}={name!r}: no module named {err.name!r}. Check the spelling, or name your own code in the "
            f"recipe: `{imports.KEY}: [{err.name.split('.')[0]}.py]` (a file beside the recipe) or "
            f"`{imports.KEY}: [{err.name}]` (a module), or pass {imports.OPTION} on the command line."
        ) from None
    obj = getattr(module, attr, None)
    if obj is None:
        candidates = sorted(n for n, v in vars(module).items() if isinstance(v, type) and issubclass(v, base))
        close = difflib.get_close_matches(attr, candidates, n=1)
        hint = f" Did you mean {module_name}.{close[0]}?" if close else ""
        raise ConfigError(f"{key}={name!r}: module {module_name} has no {attr!r}.{hint}")
    if not (isinstance(obj, type) and issubclass(obj, base)):
        kind = next(
            (b.__name__ for b in bases_.values() if isinstance(obj, type) and issubclass(obj, b)),
            type(obj).__name__ if not isinstance(obj, type) else "class",
        )
        raise ConfigError(
            f"{key}={name!r} is a {kind}, not a {base.__name__}: the {section} section needs a subclass of "
            f"{base.__module__}.{base.__name__}."
        )


def subclasses(base: type) -> set[type]:
    found: set[type] = set()
    stack = [base]
    while stack:
        subs: list[type] = stack.pop().__subclasses__()
        for sub in subs:
            if sub not in found and not sub.__name__.startswith("_"):
                found.add(sub)
                stack.append(sub)
    return found
