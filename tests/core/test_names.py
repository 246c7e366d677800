"""Client ids as names (:mod:`fedlit.core.names`): which ids are refused and why, one error naming them all, and
Markdown cells that a ``|`` cannot end."""

from __future__ import annotations

import pytest

from fedlit.core.errors import DataError
from fedlit.core.names import (
    MAX_LENGTH,
    case_collisions,
    check_client_id,
    check_client_ids,
    client_id_problem,
    table_cell,
)

REFUSED = {
    "": "is empty",
    ".": "names a folder itself",
    "..": "names a folder itself",
    "../../x": "holds a path separator",
    "/etc/passwd": "holds a path separator",
    "C:\\sites\\a": "holds a path separator",
    "a/b": "holds a path separator",
    "$\\frac{x$": "holds a path separator",  # a backslash (a report still draws it)
    "site\x00a": "holds a control character",
    "site\na": "holds a control character",
    "site\ta": "holds a control character",
    "site\u2028a": "holds a control character",  # a Unicode line separator
    "-rf": "starts with '-' (it would read as an option)",
    "--clients": "starts with '-' (it would read as an option)",
    "x" * (MAX_LENGTH + 1): f"is {MAX_LENGTH + 1} characters long (at most {MAX_LENGTH})",
    "\U0001f3e5" * 64: "is 256 bytes long in UTF-8 (at most 255)",  # 64 characters, 4 bytes each
    7: "is a int, not a string",
    "CON": "is a device name Windows reserves (no folder can have it there)",
    "nul": "is a device name Windows reserves (no folder can have it there)",
    "Com1": "is a device name Windows reserves (no folder can have it there)",
    "LPT9.site": "is a device name Windows reserves (no folder can have it there)",
    "aux .x": "is a device name Windows reserves (no folder can have it there)",
}
ALLOWED = [
    "site_0",
    "site a 50%",
    "$x_1$",
    "{x$",
    "Zürich",
    "東京",
    'O\'Brien "north"',
    "a,b;c",
    "a|b",
    "x-1",
    "...",
    ".hidden",
    "CONSOLE",
    "COM0",
    "COM10",
    "site.NUL",
    "LPT",
    "x" * MAX_LENGTH,
    "\U0001f3e5" * 63,
]


@pytest.mark.parametrize(("client_id", "why"), list(REFUSED.items()), ids=[repr(c)[:20] for c in REFUSED])
def test_unsafe_ids_are_refused_with_the_reason(client_id: object, why: str) -> None:
    assert client_id_problem(client_id) == why


@pytest.mark.parametrize("client_id", ALLOWED, ids=[repr(c)[:20] for c in ALLOWED])
def test_ids_that_are_data_are_allowed(client_id: str) -> None:
    assert client_id_problem(client_id) is None
    check_client_id(client_id, "here")


def test_one_error_names_every_refused_id_the_source_and_the_fix() -> None:
    with pytest.raises(DataError) as err:
        check_client_ids(["north", "../../x", "/abs", "ok", "a\nb"], "column 'site' of t.csv")
    message = str(err.value)
    assert message.startswith("column 'site' of t.csv: client ids that are not safe as file names: ")
    assert "'../../x' holds a path separator; '/abs' holds a path separator; 'a\\nb' holds a control character" in (
        message
    )
    assert "'north'" not in message and "'ok'" not in message
    assert "Rename these sites" in message
    with pytest.raises(DataError, match=r"and 5 more\. .*do this"):
        check_client_ids([f"../{i}" for i in range(15)], "src", fix="do this")


def test_table_cell_escapes_the_pipe() -> None:
    assert table_cell("a|b") == "a\\|b"
    assert table_cell(3) == "3" and table_cell("a\nb|c") == "a b\\|c"


def test_ids_that_differ_only_by_case_are_refused_together() -> None:
    assert case_collisions(["SiteA", "b", "sitea", "B", "c", "SITEA", "c"]) == [["SITEA", "SiteA", "sitea"], ["B", "b"]]
    assert case_collisions(["a", "a", "b"]) == []  # the same id twice is one folder, not a collision
    with pytest.raises(DataError) as err:
        check_client_ids(["SiteA", "north", "sitea"], "folders of /data")
    assert str(err.value).startswith(
        "folders of /data: client ids that are not safe as file names: 'SiteA' and "
        "'sitea' differ only by case (one folder on Windows and macOS). "
    )
    assert "Rename these sites" in str(err.value)
