"""Old import paths that keep working for one release after a module moved, with a ``DeprecationWarning``.

A module left at its old path calls :func:`moved_module`: importing the old path warns once, naming the new one,
and gives the very module object of the new path (so ``from old import name`` and a test's ``monkeypatch`` of
``old.name`` act on the module the code uses).
"""

from __future__ import annotations

import importlib
import sys
import warnings


def moved_module(old: str, new: str) -> None:
    """Make the module being imported as ``old`` the module ``new`` (imported now), warning that it moved."""
    warnings.warn(
        f"{old} moved to {new}; import it from there ({old} goes in the next release).",
        DeprecationWarning,
        stacklevel=3,
    )
    sys.modules[old] = importlib.import_module(new)
