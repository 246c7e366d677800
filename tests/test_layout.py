"""The package's layout: files stay small, every module imports on its own, imports point down only.

- No ``fedlit/**/*.py`` file is over :data:`MAX_LINES` lines, except those in :data:`ALLOWED_LONG`, each with the
  reason; an entry that no longer applies (the file is gone or short now) fails too, so the list cannot rot.
- Every module of fedlit imports in a fresh interpreter, each as the first fedlit module imported: an import
  circle shows up as an ImportError naming the module that enters it.
- ``lint-imports`` keeps the import contracts of ``pyproject.toml`` (the layers, and no circle between the
  modules of any package).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from tests.children import run_child

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fedlit"
MAX_LINES = 400

#: Files allowed over MAX_LINES, path relative to the repository -> why. Remove an entry once its file is split.
ALLOWED_LONG: dict[str, str] = {}


def _line_counts() -> dict[str, int]:
    return {path.relative_to(ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
            for path in sorted(PACKAGE.rglob("*.py"))}


def test_no_module_is_over_the_line_limit() -> None:
    long = {path: n for path, n in _line_counts().items() if n > MAX_LINES and path not in ALLOWED_LONG}
    assert not long, (
        f"over {MAX_LINES} lines: " + ", ".join(f"{path} ({n} lines)" for path, n in long.items())
        + f". Split each into modules of one topic, or add it to ALLOWED_LONG in {Path(__file__).name} with the "
        "reason it is one piece by nature (one model, one data set).")


def test_allowed_long_files_are_still_long() -> None:
    counts = _line_counts()
    stale = [f"{path} ({'no longer exists' if path not in counts else f'{counts[path]} lines now'})"
             for path in ALLOWED_LONG if counts.get(path, 0) <= MAX_LINES]
    assert not stale, (
        f"allowed over {MAX_LINES} lines but not over them: " + ", ".join(stale)
        + f". Remove these entries from ALLOWED_LONG in {Path(__file__).name}.")


# Run in a fresh interpreter: for every module, the fedlit modules imported so far are forgotten first, so each
# one is imported as the entry point of fedlit (third-party packages stay loaded: the check stays fast). A circle
# only breaks when it is entered from one side, which this finds whichever side that is.
_IMPORT_EVERY_MODULE = """
import importlib, importlib.util, json, pkgutil, sys, traceback
import fedlit

skip = () if importlib.util.find_spec("flwr") else ("fedlit.flower",)
unwalkable = []
names = [m.name for m in pkgutil.walk_packages(fedlit.__path__, "fedlit.", onerror=unwalkable.append)]
failures = {name: "its package failed to import while walking fedlit" for name in unwalkable
            if not name.startswith(skip)}
for name in names:
    if name.startswith(skip):
        continue
    for loaded in [m for m in sys.modules if m == "fedlit" or m.startswith("fedlit.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except BaseException:
        failures[name] = traceback.format_exc(limit=-3)
print(json.dumps({"package": fedlit.__path__[0], "walked": len(names), "failures": failures}))
"""


def test_every_module_imports_on_its_own() -> None:
    done = run_child([sys.executable, "-c", _IMPORT_EVERY_MODULE], cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    # the walk found this checkout's package (run from ROOT, it comes first on sys.path), not an empty path
    assert Path(report["package"]) == PACKAGE and report["walked"] > 50
    failures = "\n".join(f"--- {name}\n{error}" for name, error in report["failures"].items())
    assert not report["failures"], f"modules that fail to import (an ImportError may be an import circle):\n{failures}"


def _lint_imports() -> Path | None:
    if importlib.util.find_spec("importlinter") is None:
        return None
    executable = Path(sys.executable).with_name("lint-imports")
    return executable if executable.exists() else None


@pytest.mark.skipif(_lint_imports() is None, reason="import-linter is not installed (a dev dependency: "
                    "pip install -e '.[dev]'); the layer and no-circle contracts are not checked")
def test_import_contracts_are_kept() -> None:
    # lint-imports reads [tool.importlinter] from pyproject.toml in its working directory and imports nothing.
    # It finds fedlit on sys.path: this checkout first, not an installed copy of another one.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = run_child([str(_lint_imports()), "--no-cache", "--no-logo"], cwd=ROOT, env=env)
    broken = done.returncode != 0
    assert not broken, f"lint-imports found broken import contracts:\n{done.stdout}{done.stderr}"
