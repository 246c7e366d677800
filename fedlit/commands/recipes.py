"""``fedlit recipes``: list the recipes that ship with fedlit, or copy some into a folder to run or edit.

::

    fedlit recipes                                     # list them, each with its description
    fedlit recipes quickstart.yaml [NAME ...] [--out recipes]   # copy them: recipes/quickstart.yaml

An installed package holds the recipes as package data (``fedlit/recipes``, a link to the checkout's ``recipes/``),
so ``fedlit recipes quickstart.yaml`` followed by ``fedlit fit --config recipes/quickstart.yaml`` works in any
folder, as it does from the checkout's root. A name is a recipe's path under the recipes folder
(``flamby_heart/heart_disease_fedadam.yaml``; ``.yaml`` may be left out) or a folder of recipes
(``fedsca_baselines``); copies keep that path under ``--out``. A file that exists with other content is never
overwritten. The listing gives each recipe's description: the first sentence of its header comment, shortened to
one line.
"""

from __future__ import annotations

import argparse
import re
import shutil
from difflib import get_close_matches
from importlib import resources
from pathlib import Path

from fedlit.core.errors import ConfigError


def recipes_folder() -> Path:
    """The folder of the shipped recipes (inside the installed package, or the checkout's ``recipes/``)."""
    folder = Path(str(resources.files("fedlit") / "recipes"))
    if not folder.is_dir():  # a checkout whose link was not kept (an archive without symlinks)
        folder = Path(__file__).resolve().parents[2] / "recipes"
    return folder


def shipped() -> list[str]:
    """The shipped recipes, as paths under :func:`recipes_folder` (``quickstart.yaml``, ``flamby_heart/...``)."""
    folder = recipes_folder()
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.yaml"))


# words whose period ends no sentence: "Li et al. (2021)", "e.g. 0.1", an initial ("T. Dinh")
_ABBREVIATION = re.compile(r"(\bal|\be\.g|\bi\.e|\bvs|\bcf|\bFig|\bNo|\b[A-Z])\.$")


def description(text: str, width: int = 100) -> str:
    """A recipe's one-line description: the first sentence of its header comment (the ``#`` lines it starts with,
    up to a blank comment line or its ``Run:`` line) without the titles of the papers it cites, cut at a word to
    ``width`` characters; "" without one."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        line = line.lstrip("#").strip()
        if not line or line.startswith("Run:"):
            break
        lines.append(line)
    header = " ".join(lines)
    end = next(
        (
            m.start() + 1
            for m in re.finditer(r"\.(\s|$)", header)
            if not _ABBREVIATION.search(header[: m.end()].rstrip())
        ),
        len(header),
    )
    sentence = re.sub(r'"[^"]*",\s*', "", header[:end].strip())  # a cited paper's title: its venue stays
    if len(sentence) <= width:
        return sentence
    return sentence[: width - 3].rsplit(" ", 1)[0].rstrip(",;:(") + "..."


def _select(name: str, names: list[str]) -> list[str]:
    name = name.strip("/")
    for candidate in (name, f"{name}.yaml"):
        if candidate in names:
            return [candidate]
    inside = [n for n in names if n.startswith(f"{name}/")]
    if inside:
        return inside
    close = get_close_matches(name, names + sorted({n.split("/")[0] for n in names if "/" in n}), 3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise ConfigError(f"fedlit recipes {name}: no such recipe or folder of recipes.{hint} `fedlit recipes` lists them.")


def copy_recipes(names: list[str], out: Path) -> list[Path]:
    """Copy the recipes ``names`` (files or folders under :func:`recipes_folder`) into ``out``, keeping their
    paths; return the files written or already there with the same content. Nothing is written when a target
    exists with other content."""
    available, folder = shipped(), recipes_folder()
    chosen = [n for name in names for n in _select(name, available)]
    clashes = [out / n for n in chosen if (out / n).exists() and (out / n).read_bytes() != (folder / n).read_bytes()]
    if clashes:
        raise ConfigError(
            f"fedlit recipes --out {out}: {', '.join(map(str, clashes[:5]))} exist with other "
            "content; move them away or choose another --out."
        )
    paths = []
    for n in dict.fromkeys(chosen):
        target = out / n
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((folder / n).read_bytes())
        paths.append(target)
    return paths


def main(argv: list[str]) -> list[Path]:
    """``fedlit recipes``: list the shipped recipes (no name), or copy the named ones into ``--out``."""
    parser = argparse.ArgumentParser(prog="fedlit recipes", description=__doc__.splitlines()[0].split(": ", 1)[1])
    parser.add_argument("names", nargs="*", help="Recipes (paths under the recipes folder) or folders of them.")
    parser.add_argument("--out", default="recipes", help="Where to copy them (default: recipes).")
    args = parser.parse_args(argv)
    if not args.names:
        names, folder = shipped(), recipes_folder()
        column = max(map(len, names)) + 2
        width = max(40, shutil.get_terminal_size((160, 24)).columns - column)
        lines = [f"{n:<{column}}{description((folder / n).read_text(encoding='utf-8'), width)}".rstrip() for n in names]
        print("\n".join(lines), flush=True)
        return []
    paths = copy_recipes(args.names, Path(args.out))
    print("\n".join(str(p) for p in paths), flush=True)
    return paths
