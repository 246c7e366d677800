"""Client ids as names: which ids fedlit accepts, and how they are written into markup.

A client id comes from the data (a site column of a table, a folder name, a dataset attribute, a SuperNode's
``client-id``) and becomes a folder (``fedlit export``, a node's ``state-dir``), a TensorBoard tag
(``client/<id>/...``), a ``metrics.csv`` row and a label in tables and figures. So fedlit accepts as a client id a
string that is one safe file name, and refuses (:func:`check_client_ids`, once, where the data defines its
clients) one that:

- is empty, ``.`` or ``..``;
- holds a path separator (``/`` or ``\\``): it would name a folder elsewhere (``../../x``, ``/etc``);
- holds a control character (NUL, newline, tab...; Unicode categories Cc, Zl, Zp) or a lone surrogate: it would
  cut a file name, a log line or a table row;
- starts with ``-``: it would read as an option on a command line (``--clients -x``, ``rm *`` in ``<out>``);
- is longer than :data:`MAX_LENGTH` characters or 255 bytes in UTF-8 (the longest file name of most file systems);
- is a name Windows reserves for a device (``CON``, ``PRN``, ``AUX``, ``NUL``, ``COM1``-``COM9``,
  ``LPT1``-``LPT9``, in any case, alone or before a ``.``: ``nul.txt``): no folder can have it there.

and refuses ids that differ only by case (``SiteA`` and ``sitea``): on a case-insensitive file system (Windows,
macOS by default) they would be one folder.

Anything else is data, kept as it is: spaces, unicode letters, ``$``, ``%``, quotes, commas. Where such an id is
written into markup it is escaped there: HTML with :func:`html.escape`, Markdown table cells with
:func:`table_cell`, matplotlib labels drawn as plain text (``text.parse_math`` off, see
:mod:`fedlit.commands.partition_summary`), ``metrics.csv`` quoted by the ``csv`` module.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable

from fedlit.core.errors import DataError

#: The longest client id, in characters.
MAX_LENGTH = 128
#: The longest client id, in bytes of UTF-8 (``NAME_MAX`` of ext4, XFS, APFS).
MAX_BYTES = 255
_CONTROL = {"Cc", "Zl", "Zp", "Cs"}
#: Device names Windows reserves: no file or folder can be named so, with or without an extension.
WINDOWS_RESERVED = frozenset(
    {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)), *(f"LPT{i}" for i in range(1, 10))}
)
#: What a message suggests when ids are refused.
FIX = (
    "Rename these sites in the data (letters, digits, spaces, '_', '-', '.'; no '/' or '\\'), or map them to "
    "such names before fedlit reads them"
)


def client_id_problem(client_id: object) -> str | None:
    """Why ``client_id`` is not a safe client id (see the module docstring), or None if it is one."""
    if not isinstance(client_id, str):
        return f"is a {type(client_id).__name__}, not a string"
    if client_id in ("", ".", ".."):
        return "is empty" if not client_id else "names a folder itself"
    if "/" in client_id or "\\" in client_id:
        return "holds a path separator"
    if any(unicodedata.category(ch) in _CONTROL for ch in client_id):
        return "holds a control character"
    if client_id.startswith("-"):
        return "starts with '-' (it would read as an option)"
    if len(client_id) > MAX_LENGTH:
        return f"is {len(client_id)} characters long (at most {MAX_LENGTH})"
    if len(client_id.encode("utf-8")) > MAX_BYTES:
        return f"is {len(client_id.encode('utf-8'))} bytes long in UTF-8 (at most {MAX_BYTES})"
    if client_id.split(".", 1)[0].rstrip(" ").upper() in WINDOWS_RESERVED:
        return "is a device name Windows reserves (no folder can have it there)"
    return None


def case_collisions(client_ids: Iterable[object]) -> list[list[str]]:
    """The groups of distinct ids that differ only by case (``['SiteA', 'sitea']``): one folder on a
    case-insensitive file system."""
    groups: dict[str, set[str]] = {}
    for client_id in client_ids:
        if isinstance(client_id, str):
            groups.setdefault(client_id.casefold(), set()).add(client_id)
    return [sorted(group) for group in groups.values() if len(group) > 1]


def check_client_ids(client_ids: Iterable[object], source: str, fix: str = FIX) -> None:
    """Refuse client ids that are not safe names, all of them in one error.

    Args:
        client_ids: The ids to check.
        source: Where they come from, as the user would find it (``column 'site' of /data/t.csv
            (data.init_args.site_column)``).
        fix: What to do about it.

    Raises:
        DataError: Naming each refused id (shown with ``repr``, so a control character is visible), why, the
            ``source`` and the ``fix``.
    """
    client_ids = list(client_ids)
    problems = [(_show(c), why) for c in client_ids if (why := client_id_problem(c)) is not None]
    problems += [
        (" and ".join(map(_show, group)), "differ only by case (one folder on Windows and macOS)")
        for group in case_collisions(client_ids)
    ]
    if not problems:
        return
    shown = "; ".join(f"{c} {why}" for c, why in problems[:10])
    more = f"; and {len(problems) - 10} more" if len(problems) > 10 else ""
    raise DataError(
        f"{source}: client ids that are not safe as file names: {shown}{more}. Client ids "
        f"become folders (fedlit export), TensorBoard tags and metrics.csv rows. {fix}."
    )


def check_client_id(client_id: object, source: str, fix: str = FIX) -> None:
    """:func:`check_client_ids` of one id."""
    check_client_ids([client_id], source, fix)


def table_cell(text: object) -> str:
    """``text`` as one cell of a Markdown table: its ``|`` escaped and its line breaks made spaces (a report may
    show runs older than these checks), so it cannot end the cell or the row."""
    return " ".join(str(text).splitlines()).replace("|", "\\|")


def _show(client_id: object) -> str:
    """``repr`` (a control character shows), cut only when it is far too long anyway."""
    text = repr(client_id)
    return text if len(text) <= MAX_LENGTH + 12 else text[:MAX_LENGTH] + "..."
