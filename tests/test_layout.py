"""The package's layout: files stay small, every module imports on its own, imports point down only.

- No ``fedlit/**/*.py`` file is over :data:`MAX_LINES` lines, except those in :data:`ALLOWED_LONG`, each with the
  reason; an entry that no longer applies (the file is gone or short now) fails too, so the list cannot rot.
- Every module of fedlit imports in a fresh interpreter, each as the first fedlit module imported: an import
  circle shows up as an ImportError naming the module that enters it.
- ``lint-imports`` keeps the import contracts of ``pyproject.toml`` (the layers, and no circle between the
  modules of any package).
- ``tests/`` mirrors ``fedlit/``: every folder of test code is the folder of a ``fedlit`` package (or one of
  :data:`TEST_FOLDERS_OF_NO_PACKAGE`), and no two test files share a name (tests/README.md says what goes where).
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
TESTS = ROOT / "tests"
MAX_LINES = 400

#: Files allowed over MAX_LINES, path relative to the repository -> why. Remove an entry once its file is split.
ALLOWED_LONG: dict[str, str] = {}


def _line_counts() -> dict[str, int]:
    return {
        path.relative_to(ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def test_no_module_is_over_the_line_limit() -> None:
    long = {path: n for path, n in _line_counts().items() if n > MAX_LINES and path not in ALLOWED_LONG}
    assert not long, (
        f"over {MAX_LINES} lines: "
        + ", ".join(f"{path} ({n} lines)" for path, n in long.items())
        + f". Split each into modules of one topic, or add it to ALLOWED_LONG in {Path(__file__).name} with the "
        "reason it is one piece by nature (one model, one data set)."
    )


def test_allowed_long_files_are_still_long() -> None:
    counts = _line_counts()
    stale = [
        f"{path} ({'no longer exists' if path not in counts else f'{counts[path]} lines now'})"
        for path in ALLOWED_LONG
        if counts.get(path, 0) <= MAX_LINES
    ]
    assert not stale, (
        f"allowed over {MAX_LINES} lines but not over them: "
        + ", ".join(stale)
        + f". Remove these entries from ALLOWED_LONG in {Path(__file__).name}."
    )


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


@pytest.mark.long
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


@pytest.mark.skipif(
    _lint_imports() is None,
    reason="import-linter is not installed (a dev dependency: "
    "pip install -e '.[dev]'); the layer and no-circle contracts are not checked",
)
def test_import_contracts_are_kept() -> None:
    # lint-imports reads [tool.importlinter] from pyproject.toml in its working directory and imports nothing.
    # It finds fedlit on sys.path: this checkout first, not an installed copy of another one.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = run_child([str(_lint_imports()), "--no-cache", "--no-logo"], cwd=ROOT, env=env)
    broken = done.returncode != 0
    assert not broken, f"lint-imports found broken import contracts:\n{done.stdout}{done.stderr}"


#: Folders of tests/ that test no one package of fedlit -> what they hold.
TEST_FOLDERS_OF_NO_PACKAGE: dict[str, str] = {
    "integration": "whole runs across the layers: recipes, the CLI end to end, benchmarks, start-up cost",
    "docs": "the documentation: its links, examples and the names it cites",
}


def _shared_test_names(tests: Path) -> dict[str, list[str]]:
    """Test file names used more than once under ``tests``, each with its paths."""
    paths: dict[str, list[str]] = {}
    for path in sorted(tests.rglob("test_*.py")):
        paths.setdefault(path.name, []).append(path.relative_to(tests).as_posix())
    return {name: where for name, where in paths.items() if len(where) > 1}


def _unmirrored_folders(tests: Path, package: Path) -> list[str]:
    """Folders of ``tests`` holding Python files that are neither a folder of ``package`` nor under an allowed one."""
    folders = {path.parent.relative_to(tests) for path in tests.rglob("*.py")} - {Path(".")}
    return sorted(
        folder.as_posix()
        for folder in folders
        if folder.parts[0] not in TEST_FOLDERS_OF_NO_PACKAGE and not (package / folder).is_dir()
    )


def test_no_two_test_files_share_a_name() -> None:
    shared = _shared_test_names(TESTS)
    assert not shared, "test files that share a name (rename each after what it tests): " + "; ".join(
        f"{name}: {', '.join(where)}" for name, where in shared.items()
    )


def test_every_test_folder_is_a_folder_of_fedlit() -> None:
    stray = _unmirrored_folders(TESTS, PACKAGE)
    assert not stray, (
        f"tests/ folders with no fedlit/ folder of the same path: {stray}. Move their files to the "
        f"folder of the module they test, or add the folder to TEST_FOLDERS_OF_NO_PACKAGE in "
        f"{Path(__file__).name}."
    )


def test_the_layout_checks_find_a_shared_name_and_a_stray_folder(tmp_path: Path) -> None:
    package, tests = tmp_path / "pkg", tmp_path / "tests"
    for folder in (
        "pkg/core",
        "pkg/engine/loop",
        "tests/core",
        "tests/engine/loop",
        "tests/engine/speedups",
        "tests/integration/deep",
        "tests/core/__pycache__",
    ):
        (tmp_path / folder).mkdir(parents=True)
    for name in (
        "core/test_a.py",
        "engine/loop/test_a.py",
        "engine/loop/test_b.py",
        "engine/speedups/helpers.py",
        "integration/deep/test_c.py",
        "test_d.py",
    ):
        (tests / name).write_text("", encoding="utf-8")
    (tests / "core" / "__pycache__" / "test_b.cpython-310.pyc").write_bytes(b"")
    assert _shared_test_names(tests) == {"test_a.py": ["core/test_a.py", "engine/loop/test_a.py"]}
    assert _unmirrored_folders(tests, package) == ["engine/speedups"]
