"""A recipe's own code: the modules and ``.py`` files that ``imports:`` (and ``--import`` on the command line)
name, imported before any ``class_path`` is resolved, so that a recipe can use its own strategies, models and data
modules without setting PYTHONPATH::

    imports: [my_strategies.py]            # beside the recipe
    strategy:
      class_path: my_strategies.MyFedAvg

An entry is a ``.py`` file (a path relative to the recipe's folder; for ``--import``, to the current folder) or a
module name (``my_package.strategies``), looked up in the installed packages and then in the recipe's folder (the
current folder for ``--import``). A file is imported under its own name (``my_strategies.py`` -> ``my_strategies``),
or under its package's dotted name when its folder is a package (holds an ``__init__.py``), with the folder above
it added to the end of ``sys.path``. The run's ``config.json`` records every entry as an absolute file path (a module
of an installed package as its name), so ``fedlit test --run`` and ``fedlit export`` find the code again.

A missing file or module is a :class:`~fedlit.core.errors.ConfigError` naming the entry, where it was looked for and
the fix; an error raised by the imported code itself (a bug in it) keeps its traceback.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from fedlit.core.errors import ConfigError

#: The recipe key (and ``--imports`` option) that lists the code to import.
KEY = "imports"
#: The command-line option that adds one entry (repeat it for more).
OPTION = "--import"
_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


@dataclass(frozen=True)
class Entry:
    """One entry to import.

    Attributes:
        value: As written (a ``.py`` path or a module name).
        base: The folder a relative path (or a module name not installed) is looked up in.
        where: Where it was written, for messages (``imports of recipes/r.yaml``, ``--import``).
    """

    value: str
    base: Path
    where: str


def split(argv: Sequence[str]) -> tuple[list[str], list[Entry]]:
    """``argv`` without its ``--import VALUE`` (and ``--import=VALUE``) options, and those entries (relative to the
    current folder)."""
    rest: list[str] = []
    found: list[Entry] = []
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == OPTION:
            if i + 1 >= len(args) or args[i + 1].startswith("--"):
                raise ConfigError(
                    f"{OPTION} needs a value: a module name or a .py file, e.g. {OPTION} "
                    "my_strategies.py (repeat it for more)."
                )
            found.append(Entry(args[i + 1], Path.cwd(), OPTION))
            i += 2
            continue
        if arg.startswith(OPTION + "="):
            found.append(Entry(arg.split("=", 1)[1], Path.cwd(), OPTION))
        else:
            rest.append(arg)
        i += 1
    return rest, found


def of_recipe(recipe: Any, base: Path, where: str) -> list[Entry]:
    """The entries of a recipe mapping's ``imports`` (relative to ``base``, the recipe's folder)."""
    if not isinstance(recipe, dict) or recipe.get(KEY) is None:
        return []
    return _entries(recipe[KEY], base, f"{KEY} of {where}")


def of_option(value: str) -> list[Entry]:
    """The entries of an ``--imports`` value given on the command line (a YAML or JSON list)."""
    try:
        loaded = yaml.safe_load(value)
    except yaml.YAMLError:
        loaded = value
    return _entries(loaded, Path.cwd(), f"--{KEY}")


def _entries(value: Any, base: Path, where: str) -> list[Entry]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ConfigError(
            f"{where}: expected a list of module names or .py files, got {value!r}. Write it as "
            f"`{KEY}: [my_strategies.py]` or `{KEY}: [my_package.strategies]`."
        )
    return [Entry(v.strip(), base, where) for v in value]


def import_all(entries: Iterable[Entry]) -> list[str]:
    """Import each entry (once: an entry already imported is not run again); returns them as the run records
    them (absolute file paths, or module names of installed packages), without duplicates."""
    recorded: list[str] = []
    for entry in entries:
        value = import_entry(entry)
        if value not in recorded:
            recorded.append(value)
    return recorded


def import_entry(entry: Entry) -> str:
    """Import one entry; returns it as the run records it."""
    if entry.value.endswith(".py") or "/" in entry.value or "\\" in entry.value:
        return str(_import_file(entry))
    if not _MODULE_NAME.fullmatch(entry.value):
        raise ConfigError(
            f"{entry.where}: {entry.value!r} is neither a .py file nor a module name. Give the path of "
            "a .py file (my_strategies.py) or a dotted module name (my_package.strategies)."
        )
    module = _import_module(entry)
    path = _file_of(module)
    if path is not None and entry.base.resolve() in path.parents and _dotted_name(path)[0] == entry.value:
        return str(path)  # found in the recipe's folder: recorded by path, so a rebuilt run finds it anywhere
    return entry.value


def _import_file(entry: Entry) -> Path:
    path = Path(entry.value).expanduser()
    path = (path if path.is_absolute() else entry.base / path).resolve()
    relative = "the current folder" if entry.where == OPTION else "the recipe's folder"
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "no such file"
        raise ConfigError(
            f"{entry.where}: {entry.value!r}: {what} ({path}; a relative path is read from {relative}, "
            f"{entry.base}). Give the path of a .py file, or a module name such as my_package.strategies."
        )
    if path.suffix != ".py":
        raise ConfigError(
            f"{entry.where}: {entry.value!r} is not a Python file ({path}). Give a .py file, or a "
            "module name such as my_package.strategies."
        )
    name, root = _dotted_name(path)
    if not _MODULE_NAME.fullmatch(name):
        raise ConfigError(
            f"{entry.where}: {entry.value!r} would be imported as {name!r}, which is not a module "
            f"name. Rename {path.name} to a Python identifier (letters, digits, _)."
        )
    loaded = sys.modules.get(name)
    if loaded is not None and ((loaded_file := _file_of(loaded)) is None or loaded_file.is_file()):
        _check_same(entry, name, path, loaded)
        return path
    if loaded is not None:  # imported from a folder since removed (a Flower node's earlier message): import anew
        del sys.modules[name]
    _add_to_path(root)
    module = importlib.import_module(name)
    _check_same(entry, name, path, module)
    return path


def _import_module(entry: Entry) -> ModuleType:
    try:
        return importlib.import_module(entry.value)
    except ModuleNotFoundError as err:
        if not _is_missing(err, entry.value):
            raise  # the module exists but one of its own imports fails: its traceback says where
    _add_to_path(entry.base.resolve())
    try:
        return importlib.import_module(entry.value)
    except ModuleNotFoundError as err:
        if not _is_missing(err, entry.value):
            raise
        folder = "the current folder" if entry.where == OPTION else "the recipe's folder"
        raise ConfigError(
            f"{entry.where}: {entry.value!r}: no module named {err.name!r}, neither installed nor in {folder} "
            f"({entry.base.resolve()}). Check the spelling, give the path of its .py file ({entry.value.split('.')[-1]}"
            ".py), or install its package."
        ) from None


def _is_missing(err: ModuleNotFoundError, name: str) -> bool:
    """Whether ``err`` says that ``name`` itself (or a package above it) is missing, not one of its imports."""
    return err.name is not None and (name == err.name or name.startswith(err.name + "."))


def _dotted_name(path: Path) -> tuple[str, Path]:
    """The module name of the file ``path`` and the folder to import it from: its stem, prefixed by the packages
    (folders with an ``__init__.py``) it sits in."""
    parts = [] if path.stem == "__init__" else [path.stem]
    folder = path.parent
    while (folder / "__init__.py").is_file() and folder.parent != folder:
        parts.insert(0, folder.name)
        folder = folder.parent
    return ".".join(parts), folder


def _file_of(module: ModuleType) -> Path | None:
    file = getattr(module, "__file__", None)
    return Path(file).resolve() if file else None


def _check_same(entry: Entry, name: str, path: Path, module: ModuleType) -> None:
    """Refuse a file whose module name is already taken by another file (an installed module, or another
    recipe's file of the same name), unless both hold the same code."""
    other = _file_of(module)
    if other is None or other == path:
        return
    try:
        same = other.read_bytes() == path.read_bytes()
    except OSError:
        same = False
    if not same:
        raise ConfigError(
            f"{entry.where}: {entry.value!r} is imported as module {name!r}, but {name!r} is already "
            f"{other}. Rename {path.name} so that its module name is its own."
        )


def _add_to_path(folder: Path) -> None:
    if str(folder) not in sys.path:
        sys.path.append(str(folder))  # at the end: the user's folder never hides an installed module
        importlib.invalidate_caches()


# ------------------------------------------------------------------------------- shipping (a Flower deployment)
def bundle(entries: Iterable[Entry]) -> tuple[dict[str, str], list[str]]:
    """The code of ``entries`` to ship where the recipe is rebuilt from its text (a Flower server and its nodes):
    the files (with the ``__init__.py`` of the packages they sit in), by their path relative to the entry's
    folder, and the entries as they are then imported there (a file's relative path, or an installed module's
    name). The entries must have been imported (:func:`import_all`).

    Raises:
        ConfigError: If a file lies outside its folder (``../lib/x.py``): only the code below it is shipped.
    """
    files: dict[str, str] = {}
    shipped: list[str] = []
    for entry in entries:
        if entry.value.endswith(".py") or "/" in entry.value or "\\" in entry.value:
            path = Path(entry.value).expanduser()
            path = (path if path.is_absolute() else entry.base / path).resolve()
        else:
            found = _file_of(sys.modules[entry.value])
            if found is None or entry.base.resolve() not in found.parents:
                shipped.append(entry.value)  # an installed module: it must be installed where the run is rebuilt
                continue
            path = found
        base = entry.base.resolve()
        if base not in path.parents:
            raise ConfigError(
                f"{entry.where}: {entry.value!r} ({path}) is outside {base}: only the code in that "
                "folder and below is shipped with the recipe. Move the file beside the recipe, or "
                "install it as a package on the server and every node."
            )
        packages = [f / "__init__.py" for f in path.parents if base in f.parents]  # the folders below base
        for source in [path, *packages]:
            if source.is_file():
                files[source.relative_to(base).as_posix()] = source.read_text(encoding="utf-8")
        shipped.append(path.relative_to(base).as_posix())
    return files, shipped


def unpack(files: dict[str, str], folder: Path) -> None:
    """Write the shipped ``files`` (relative path -> source, from :func:`bundle`) into ``folder``."""
    for name, text in files.items():
        relative = Path(name)
        if relative.is_absolute() or ".." in relative.parts or relative.suffix != ".py":
            raise ConfigError(
                f"The run config ships {name!r}, which is not a relative .py path: write the app "
                "again with `fedlit flower-app`."
            )
        target = folder / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


def ship(recipe_entries: Iterable[Entry], option_entries: Iterable[Entry]) -> str:
    """The code a recipe's ``imports`` and its ``--import`` options name, as one text for a Flower run config
    (read back by :func:`unship`); empty when there is none."""
    files, _ = bundle(recipe_entries)
    option_files, options = bundle(option_entries)
    if not files and not option_files and not options:
        return ""
    return json.dumps({"files": {**files, **option_files}, "import": options})


def unship(text: str, folder: Path) -> list[str]:
    """Write the files of :func:`ship`'s ``text`` into ``folder`` (where the recipe's text is rebuilt, so that its
    relative ``imports`` find them) and return the ``--import`` options to add to the command line."""
    if not text.strip():
        return []
    try:
        shipped = json.loads(text)
        files, options = dict(shipped["files"]), list(shipped["import"])
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError(
            f"The run config's imports are not readable ({err}): write the app again with `fedlit flower-app`."
        ) from None
    unpack(files, folder)
    return [arg for value in options for arg in (OPTION, str(folder / value) if value.endswith(".py") else value)]
