"""Listing the files of :class:`~fedlit.data.folders.SiteFolders`: its folders, images and labels CSVs, each
problem named by folder, file or CSV line; and the check that images kept at their own size all share one."""

from __future__ import annotations

import csv
import io
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from fedlit.core.errors import DataError
from fedlit.data.common.samples import image_errors, is_image
from fedlit.data.common.text import decode_utf8

_OPTION = "data.init_args"


def sub_folders(folder: Path, skipped: list[str] | None = None) -> list[str]:
    """The names of the sub-folders of ``folder`` (sorted; those starting with ``.`` or ``_`` left out), each
    entry that is neither a folder nor a regular file (a FIFO, a link that cannot be followed) added to
    ``skipped`` when it is given.

    Raises:
        DataError: naming ``folder`` when it cannot be listed (no read permission), as an unreadable file is.
    """
    try:
        entries = list(folder.iterdir())
    except OSError as err:
        raise unreadable_folder(folder, err) from None
    names = []
    for path in entries:
        if path.name.startswith((".", "_")):
            continue
        if path.is_dir():
            names.append(path.name)
        elif skipped is not None and not path.is_file():
            skipped.append(f"{path} ({_kind(path)})")
    return sorted(names)


def image_files(folder: Path, skipped: list[str]) -> list[Path]:
    """Every image file under ``folder`` (at any depth), sorted. Links to files are read; links to folders are not
    followed (a loop would never end). What is skipped but might be meant as data is added to ``skipped``: links to
    folders and entries that are neither folders nor regular files (a FIFO, a socket, a link to nowhere or to
    itself).

    Raises:
        DataError: naming a folder that cannot be listed (no read permission): its images would be lost silently.
    """
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as err:
        raise unreadable_folder(folder, err) from None
    found = []
    for entry in entries:
        path = Path(entry.path)
        try:
            if entry.is_dir(follow_symlinks=False):
                found += image_files(path, skipped)
                continue
            if entry.is_file():  # a regular file, or a link to one
                found += [path] if is_image(path) else []
                continue
            if entry.is_dir():
                skipped.append(f"{path} (a link to a folder, not followed)")
                continue
        except OSError:
            pass  # a link that cannot be followed: named below
        skipped.append(f"{path} ({_kind(path)})")
    return sorted(found)


def unreadable_folder(folder: Path, error: OSError) -> DataError:
    """The error for a folder that cannot be listed, naming it (as :func:`unreadable_image` names a file)."""
    return DataError(
        f"{folder}: cannot be read as a folder ({type(error).__name__}: {error.strerror or error}); make it "
        f"readable (chmod u+rx), or move it out of {_OPTION}.root"
    )


def _kind(path: Path) -> str:
    """What an entry that is neither a folder nor a regular file is, in words."""
    try:
        mode = path.stat().st_mode
    except OSError as err:
        return f"a link that cannot be followed: {err.strerror or err}"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe), not a file"
    if stat.S_ISSOCK(mode):
        return "a socket, not a file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device, not a file"
    return "not a regular file"


def read_labels(
    table: Path, root: Path, file_column: str, label_column: str, seen: dict[str, str]
) -> list[tuple[str, str]]:
    """(path relative to ``root``, label) of every line of a site's labels CSV, in file order; each label's
    first line is added to ``seen``.

    Raises:
        DataError: naming ``table`` and the lines: unreadable or invalid CSV, missing columns, an empty field, a
            file that does not exist or is no regular file, a file listed twice (its split would be drawn twice).
    """
    try:
        text = decode_utf8(table, table.read_bytes())
    except OSError as err:
        raise DataError(f"{table}: cannot be read ({type(err).__name__}: {err})") from None
    reader = csv.reader(io.StringIO(text, newline=""), skipinitialspace=True, strict=True)
    try:
        lines = [(reader.line_num, row) for row in reader if any(field.strip() for field in row)]
    except csv.Error as err:
        raise DataError(
            f"{table}: line {reader.line_num}: not valid CSV ({err}); close the quoted field or remove the stray quote"
        ) from None
    if not lines:
        raise DataError(f"{table} is empty; give it a header line {file_column},{label_column} and one line per image")
    header_line, header = lines[0][0], [c.strip() for c in lines[0][1]]
    missing = [
        (option, c) for option, c in (("file_column", file_column), ("label_column", label_column)) if c not in header
    ]
    if missing:
        raise DataError(
            f"{table}: line {header_line} (the header) has no column "
            f"{', '.join(repr(c) for _, c in missing)} (its columns: {header}); name the right ones "
            f"with {', '.join(f'{_OPTION}.{o}' for o, _ in missing)}"
        )
    at_file, at_label = header.index(file_column), header.index(label_column)
    folder, rows, problems = table.parent, [], []
    listed: dict[str, int] = {}  # file (normalized) -> its first line
    for line, fields in lines[1:]:
        if len(fields) > len(header) and any(f.strip() for f in fields[len(header) :]):
            problems.append(f"line {line}: {len(fields)} fields, but the header has {len(header)}")
            continue
        fields = [f.strip() for f in fields] + [""] * (len(header) - len(fields))
        name, label = fields[at_file], fields[at_label]
        path = folder / name
        key = os.path.normpath(name)
        if not name or not label:
            problems.append(f"line {line}: column {file_column if not name else label_column!r} is empty")
        elif key in listed:
            problems.append(
                f"line {line}: file {name} is listed again (first at line {listed[key]}); a file listed twice "
                "can land in both the train and the test split: keep one line per file"
            )
        elif not path.exists():
            problems.append(f"line {line}: file {path} does not exist")
        elif not path.is_file():
            problems.append(f"line {line}: {path} is {'a folder' if path.is_dir() else _kind(path)}, not an image file")
        else:
            listed[key] = line
            rows.append((path.relative_to(root).as_posix(), label))
            seen.setdefault(label, f"{table}, line {line}")
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise DataError(f"{table}: {shown}. Fix the rows (paths are relative to {folder})")
    if not rows:
        raise DataError(f"{table} lists no image; add rows or remove the file")
    return rows


def check_sizes(root: Path, identities: Sequence[str]) -> None:
    """Refuse images of different sizes (read from their headers, not decoded): with ``image_size`` null they are
    not resized, and a batch cannot stack them. A file PIL cannot open is left to the loader, which names it.

    Raises:
        DataError: naming two files of different sizes, their sizes, and the option that resizes them.
    """
    from PIL import Image

    first: dict[tuple[int, int], str] = {}  # (width, height) -> the first file of that size
    for identity in identities:
        try:
            with Image.open(root / identity) as image:
                size = image.size
        except image_errors():
            continue
        first.setdefault(size, identity)
        if len(first) > 1:
            (a, size_a), (b, size_b) = [(root / f, s) for s, f in first.items()]
            raise DataError(
                f"{_OPTION}.image_size is null (each image kept at its own size), but {a} is "
                f"{size_a[0]}x{size_a[1]} and {b} is {size_b[0]}x{size_b[1]} (width x height); a batch stacks "
                f"images of one size: set {_OPTION}.image_size (e.g. 224) to resize them all, or resize the files"
            )
