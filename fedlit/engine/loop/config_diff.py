"""What differs between two run configurations, for a resume's check and its record.

A key one side lacks is an option that did not exist when the other was written (a fedlit upgrade between the
run and its resume adds an option with its default, e.g. a module's ``loss: default``): it counts as unchanged
when the side that has it holds the parameter's default of the class named by the enclosing ``class_path``, and
as a change otherwise (or when that class cannot be imported or has no such parameter).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import Any

_MISSING = object()


def config_changes(before: Mapping[str, Any], now: Mapping[str, Any], prefix: str = "", owner: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested configurations (``owner``: the ``class_path`` whose
    ``init_args`` these are, if any)."""
    keys: list[str] = []
    class_path = str(now.get("class_path") or before.get("class_path") or "")
    for key in sorted(set(before) | set(now)):
        a, b, name = before.get(key, _MISSING), now.get(key, _MISSING), f"{prefix}{key}"
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            keys += config_changes(a, b, f"{name}.", class_path if key == "init_args" else "")
            continue
        if a is _MISSING or b is _MISSING:
            present = b if a is _MISSING else a
            if owner and _is_default(owner, key, present):
                continue
            keys.append(name)
        elif a != b:
            keys.append(name)
    return keys


def _is_default(class_path: str, parameter: str, value: Any) -> bool:
    """Whether ``value`` is the default of ``parameter`` of the class at ``class_path``."""
    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
        default = inspect.signature(cls).parameters[parameter].default
    except (ImportError, AttributeError, KeyError, ValueError, TypeError):
        return False
    if default is inspect.Parameter.empty:
        return False
    return bool(default == value) or (isinstance(default, tuple) and list(default) == value)
