"""Checks of a command line and its recipes that come before jsonargparse, whose own answers to these are unclear.

- A negative float written after its option (``--model.init_args.lr -1e-3``, ``-inf``) reads to argparse as an
  option of its own ("expected one argument"): :func:`join_negative_values` passes it as ``--option=-1e-3``.
- A top-level key that is no option of the command (``base: &b {...}``, kept only for its YAML anchor, or
  ``.common:``) would be read as a section: :func:`check_top_level_keys` refuses it naming the file and the key,
  with the closest option and, for an anchor, where to put it instead.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from fedlit.core.errors import ConfigError

# argparse reads a token after an option as its value when it matches this (its own negative-number pattern)
_ARGPARSE_NEGATIVE = re.compile(r"^-\d+$|^-\d*\.\d+$")


def join_negative_values(argv: list[str]) -> list[str]:
    """``argv`` with each negative float that argparse would take for an option (``-1e-3``, ``-inf``, ``-nan``)
    joined to the option before it: ``--model.init_args.lr -1e-3`` -> ``--model.init_args.lr=-1e-3``."""
    out: list[str] = []
    for arg in argv:
        previous = out[-1] if out else ""
        if _is_misread_number(arg) and previous.startswith("--") and "=" not in previous:
            out[-1] = f"{previous}={arg}"
        else:
            out.append(arg)
    return out


def _is_misread_number(arg: str) -> bool:
    if not arg.startswith("-") or arg.startswith("--") or _ARGPARSE_NEGATIVE.match(arg):
        return False
    try:
        float(arg)
    except ValueError:
        return False
    return True


def check_top_level_keys(recipes: Iterable[tuple[Path | None, Any]], valid: Iterable[str]) -> None:
    """Refuse a top-level key of a recipe file that is not one of ``valid`` (the command's options): the file, the
    key, the closest option; for a key that only holds a YAML anchor, where to put the anchor instead. Recipes
    given as text (a run's ``config.json``, ``path`` None) are left to the parser."""
    options = sorted(set(valid) - {"help", "print_config", "config"})
    if not options:  # no parser to compare with: jsonargparse's own message stays
        return
    for path, recipe in recipes:
        if path is None or not isinstance(recipe, dict):
            continue
        unknown = [key for key in recipe if not isinstance(key, str) or key not in options]
        if not unknown:
            continue
        key = str(unknown[0])
        anchors = top_level_anchors(path.read_text())
        close = difflib.get_close_matches(key.lstrip("."), options, n=1)
        hint = f" Did you mean {close[0]!r}?" if close and key not in anchors else ""
        message = (
            f"{path}: top-level key {key!r} is not a fedlit section.{hint} The top-level keys of a recipe are "
            f"its sections and options: {', '.join(options)}."
        )
        if key in anchors:
            message += (
                f" {key!r} holds the YAML anchor &{anchors[key]}: put the anchor where the value is first used "
                f"(e.g. `init_args: &{anchors[key]} {{...}}`) and keep the aliases *{anchors[key]} where it is "
                "repeated. To share settings between recipes, keep them in a recipe file of their own and give "
                "both: --config common.yaml --config this.yaml (the later file overrides the earlier one)."
            )
        raise ConfigError(message)


def top_level_anchors(text: str) -> dict[str, str]:
    """The anchors (``&name``) set on the values of the top-level keys of the YAML ``text``: key -> anchor."""
    anchors: dict[str, str] = {}
    depth, key, expect_key = 0, "", True
    try:
        events = list(yaml.parse(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError:
        return anchors
    for event in events:
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            if depth == 1 and not expect_key and event.anchor:
                anchors[key] = event.anchor
            depth += 1
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
            expect_key = expect_key or depth == 1
        elif isinstance(event, (yaml.ScalarEvent, yaml.AliasEvent)) and depth == 1:
            if expect_key:
                key = str(getattr(event, "value", ""))
            elif event.anchor and isinstance(event, yaml.ScalarEvent):
                anchors[key] = event.anchor
            expect_key = not expect_key
    return anchors
