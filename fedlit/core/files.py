"""Writing a run's files whole or not at all.

A run's record files (``results.json``, ``results.md``, ``config.json``...) are read by later commands (resume,
``test --run``, ``report``); a run killed, or a disk filled, while one is written must not leave it truncated.
:func:`write_text_atomic` writes a temporary file in the same folder and renames it over the target
(``os.replace``: atomic on POSIX and Windows), so a reader sees the old file or the new one, never a part.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_text_atomic(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
    """Write ``text`` to ``path`` atomically: a temporary file beside it, flushed to disk, then renamed over it.

    On an error the temporary file is removed and ``path`` keeps what it held.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding=encoding) as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(OSError):  # keep the permissions a plain write would give (mkstemp makes 0600)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
