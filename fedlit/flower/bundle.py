"""Nothing of a run in the bundle ``flwr run`` ships to every node.

``flwr run APP`` zips the app folder's ``*.py``, ``*.toml``, ``*.md``, ``*.json``, ``*.yaml`` files (Flower's
``build_fab_from_disk``) and sends the bundle to the SuperLink, which hands it to every SuperNode. A server run
folder inside the app folder would be bundled by the next ``flwr run``: ``results.json``, ``manifest.json`` and every
site's class counts, sent to every site. Two guards:

- :func:`check_out_dir`: the ServerApp refuses, before round 1, a run folder inside a Flower app folder (a folder
  whose ``pyproject.toml`` has ``[tool.flwr.app]``), however the folder was given: the run config's ``out-dir``
  (``flwr run ... --run-config "out-dir='...'"``), the recipe's ``out_dir``, or the default ``runs/<name>/...``
  under the ServerApp's working folder.
- :func:`write_ignore`: ``fedlit flower-app`` writes the app folder's ``.gitignore``, which Flower applies when it
  builds the bundle (flwr 1.41 and 1.42: ``filter_paths_for_publish``), keeping every file but ``pyproject.toml``
  out of it: fedlit's app is its ``pyproject.toml`` alone (the recipe and its code travel in the run config).
"""

from __future__ import annotations

from pathlib import Path

import tomli  # a dependency of flwr (tomllib is Python 3.11+)

from fedlit.core.errors import ConfigError

#: The file of the app folder whose patterns Flower leaves out of the bundle (gitignore syntax).
IGNORE_FILE = ".gitignore"
#: What ``fedlit flower-app`` writes there: everything out but the app's ``pyproject.toml``.
IGNORE_TEXT = (
    "# Written by `fedlit flower-app`. `flwr run` leaves out of the bundle it sends to every node what this file\n"
    "# ignores: fedlit's app is its pyproject.toml alone, so a run folder or any other file put here stays here.\n"
    "*\n"
    "!/pyproject.toml\n"
)


def flower_app_holding(path: Path) -> Path | None:
    """The nearest folder at or above ``path`` (made absolute, links resolved) that is a Flower app, i.e. holds a
    ``pyproject.toml`` with a ``[tool.flwr.app]`` table; None when there is none."""
    for folder in [path.resolve(), *path.resolve().parents]:
        project = folder / "pyproject.toml"
        try:
            config = tomli.loads(project.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomli.TOMLDecodeError):
            continue
        tool = config.get("tool", {})
        if isinstance(tool, dict) and isinstance(tool.get("flwr"), dict) and "app" in tool["flwr"]:
            return folder
    return None


def check_out_dir(out_dir: Path, given_as: str) -> None:
    """Refuse the server's run folder ``out_dir`` when it lies inside a Flower app folder.

    Args:
        out_dir: The run folder (relative: to the current folder, the ServerApp's).
        given_as: Where it came from, for the message (e.g. ``the run config's out-dir``).

    Raises:
        ConfigError: naming the folder, the app folder and the fix.
    """
    app = flower_app_holding(out_dir)
    if app is not None:
        raise ConfigError(
            f"{given_as} {out_dir.resolve()} is inside the Flower app folder {app}: the next `flwr run` of that "
            "app would bundle the run's files (results.json, manifest.json, class_counts.json, ...) and send them "
            "to every node. Put the run folder outside it, e.g. flwr run APP CONNECTION --run-config "
            f"\"out-dir='{app.parent / (app.name + '-run')}'\"."
        )


def write_ignore(app: Path) -> Path:
    """Write :data:`IGNORE_TEXT` as the app folder's :data:`IGNORE_FILE` and return its path."""
    path = app / IGNORE_FILE
    path.write_text(IGNORE_TEXT)
    return path
