"""The engine's index (``fedlit/engine/__init__.py``) names every module of its three parts, so it cannot rot."""

from __future__ import annotations

from pathlib import Path

import fedlit.engine

ENGINE = Path(fedlit.engine.__file__).parent
PARTS = ("loop", "records", "speedups")


def test_every_engine_module_is_in_the_index() -> None:
    index = fedlit.engine.__doc__ or ""
    missing = [
        f"{part}.{path.stem}"
        for part in PARTS
        for path in sorted((ENGINE / part).glob("*.py"))
        if path.stem != "__init__" and f"~.{part}.{path.stem}`" not in index
    ]
    assert not missing, f"fedlit/engine/__init__.py's index does not name: {missing}"


def test_the_engine_has_three_parts_and_no_other_code() -> None:
    folders = sorted(p.name for p in ENGINE.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert folders == sorted(PARTS)
    # the modules directly under fedlit/engine are the old paths, each only a forward to its new home
    for path in ENGINE.glob("*.py"):
        if path.name != "__init__.py":
            assert "moved_module(__name__" in path.read_text(encoding="utf-8"), path.name
