"""Text input files read as UTF-8, refused with the file, byte offset and line of the first byte that is not."""

from __future__ import annotations

import codecs
from pathlib import Path

from fedlit.core.errors import DataError


def decode_utf8(path: Path, data: bytes) -> str:
    """``data`` (the bytes of ``path``) as text: UTF-8, a leading byte-order mark dropped.

    Raises:
        DataError: naming ``path``, the byte offset and the line of the first byte that is not UTF-8.
    """
    start = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[start:].decode("utf-8")
    except UnicodeDecodeError as err:
        raise not_utf8(path, data, start + err.start) from None


def not_utf8(path: Path, data: bytes | None = None, offset: int | None = None) -> DataError:
    """The error for a file that is not UTF-8 text; without ``offset`` the file is read to find the first bad
    byte (for a library's ``UnicodeDecodeError``, whose position is within a chunk, not the file)."""
    if offset is None:
        try:
            data = path.read_bytes() if data is None else data
            decode_utf8(path, data)
        except DataError as err:
            return err
        except OSError:
            pass
        return DataError(f"{path}: not UTF-8 text; save it as UTF-8")
    if data is None:  # a caller that knows the offset but not the bytes
        data = path.read_bytes()
    line = data.count(b"\n", 0, offset) + 1
    return DataError(
        f"{path}: not UTF-8 text: byte {offset} (line {line}) is 0x{data[offset]:02x}; save the file as UTF-8 "
        f"(e.g. iconv -f latin1 -t utf-8 {path.name} > utf8_{path.name}, or a spreadsheet's 'CSV UTF-8' format)"
    )
