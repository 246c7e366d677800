"""How a federation setting is declared (:func:`setting`) and how its declaration becomes documentation.

:class:`~fedlit.engine.loop.settings.Settings` declares each field with :func:`setting`; from those declarations
come the class's documentation that jsonargparse reads for ``fedlit fit --help`` (:func:`class_doc`) and the table
of ``docs/runs.md`` (:func:`markdown_table`, through :func:`~fedlit.engine.loop.settings.settings_table`). The
bounds and choices a declaration carries are checked by :meth:`~fedlit.engine.loop.settings.Settings.problems`.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Iterable
from dataclasses import Field, field
from typing import Any


def setting(
    default: Any,
    doc: str,
    *,
    low: float | None = None,
    above: float | None = None,
    integer: bool = False,
    unit: str = "",
    note: str = "",
    resumable: bool = False,
) -> Any:
    """Declare one federation setting (a field of :class:`~fedlit.engine.loop.settings.Settings`). None passes the
    bounds where the field's type allows it; a ``Literal`` type gives the choices
    :meth:`~fedlit.engine.loop.settings.Settings.problems` checks.

    Args:
        default: Its default value.
        doc: Its help text (``--help``, the class documentation, the docs' table).
        low: The least value allowed (``>= low``), checked by :meth:`~fedlit.engine.loop.settings.Settings.problems`.
        above: A bound the value must exceed (``> above``).
        integer: Whether only an int (not a bool, not a float) is allowed.
        unit: The unit of the bound, in the message (``seconds``).
        note: What the message adds in parentheses (``or null: no limit``).
        resumable: Whether a resumed run may change it (:data:`~fedlit.engine.loop.settings.RESUMABLE`); a change
            of another one would make another experiment.
    """
    return field(
        default=default,
        metadata={
            "doc": doc,
            "low": low,
            "above": above,
            "integer": integer,
            "unit": unit,
            "note": note,
            "resumable": resumable,
        },
    )


def class_doc(declared: Iterable[Field[Any]]) -> str:
    """The documentation of the settings class whose fields are ``declared``, in the Google style jsonargparse reads
    for ``--help``."""
    lines = ["The federated loop's settings (each declared once, by :func:`setting`).", "", "Args:"]
    for each in declared:
        lines += textwrap.wrap(
            f"{each.name}: {each.metadata['doc']}",
            width=116,
            initial_indent="    ",
            subsequent_indent="        ",
            break_long_words=False,
            break_on_hyphens=False,
        )
    return "\n".join(lines) + "\n"


def markdown_table(declared: Iterable[Field[Any]]) -> str:
    """The Markdown table of the settings ``declared``: name, default, whether a resume may change it, and its help
    text."""
    rows = ["| setting | default | on resume | what it does |", "|---|---|---|---|"]
    for each in declared:
        default = each.default
        shown = default if isinstance(default, str) else json.dumps(default)
        doc = re.sub(r":\w+:`~?([^`]+)`", r"``\1``", each.metadata["doc"]).replace("``", "`").replace("|", "\\|")
        change = "may change" if each.metadata["resumable"] else "fixed"
        rows.append(f"| `{each.name}` | `{shown}` | {change} | {doc} |")
    return "\n".join(rows) + "\n"
