"""Run folders: one run per folder, locked while it runs, never overwritten by another.

A run writes everything under its ``out_dir`` (results, checkpoints, configuration, TensorBoard). Two rules keep
those folders honest:

- A fresh run refuses a folder that already holds another run's files (:data:`RUN_FILES`); only a resumed run
  (one given a checkpoint) may continue in such a folder. An empty or missing folder is fine, and so is the folder
  of a run that stopped before its first checkpoint (no ``checkpoints/*.ckpt``, no results, no live lock): it has
  nothing to resume, so a fresh run takes it over, with a warning, and replaces its files.
- A run holds ``out_dir/.lock`` from start to end. The file records the holder (pid, host, start time, command)
  and is locked with ``flock``, which the operating system releases when the process dies: a lock file left by a
  killed run is stale and is taken over with a warning; a lock held by a live run is refused. Where the file
  system has no ``flock`` (some network file systems), a lock whose pid is no longer alive on this host counts
  as stale; that fallback is best effort (two runs started in the same instant may both get through).

``runs/<name>/version_<n>`` folders are numbered by :func:`new_version_dir`, which creates the next number
exclusively, so two runs started at once never share a folder.

Typical use (a fit does this, :func:`fedlit.engine.loop.lifecycle.fit`)::

    with claim_run_dir(out_dir, resume=ckpt_path is not None):
        ...  # the whole run
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import socket
import sys
import time
import warnings
from pathlib import Path
from types import TracebackType
from typing import Any

from typing_extensions import override

from fedlit.core.errors import RunDirError
from fedlit.core.processes import pid_alive

try:
    import fcntl
except ImportError:  # not POSIX: liveness falls back to the pid recorded in the file
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".lock"
#: Files and folders that only a run writes: a folder holding any of them holds a run.
RUN_FILES = (
    "results.json",
    "results.md",
    "config.json",
    "manifest.json",
    "class_counts.json",
    "metrics.csv",
    "checkpoints",
    "tensorboard",
)
#: What a run that got somewhere leaves: a fresh run never takes over a folder holding one of them.
_RESULTS = ("results.json", "results.md")
_VERSION = re.compile(r"version_(\d+)")
# flock failing with one of these means the file system does not support it (some network file systems).
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


class RunDirLock:
    """The lock of one run folder, held from :func:`claim_run_dir` until :meth:`release` or the end of a
    ``with`` block (exceptions included)."""

    def __init__(self, out_dir: Path, fd: int) -> None:
        self.out_dir = out_dir
        self.path = out_dir / LOCK_NAME
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        """Whether this object still holds the lock."""
        return self._fd is not None

    def release(self) -> None:
        """Remove the lock file and unlock it (once; later calls do nothing)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            # Unlink while still locked: a run that opened the old file sees that it was replaced and retries.
            if _same_file(self.path, fd):
                self.path.unlink()
        except OSError:
            pass  # the folder was removed or made read-only meanwhile: nothing left to clean up
        finally:
            os.close(fd)

    def __enter__(self) -> RunDirLock:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    @override
    def __repr__(self) -> str:
        return f"RunDirLock({str(self.out_dir)!r}, held={self.held})"


def claim_run_dir(out_dir: str | os.PathLike, *, resume: bool) -> RunDirLock:
    """Create ``out_dir`` if needed and lock it for one run.

    Args:
        out_dir: The run's folder.
        resume: Whether the run continues from a checkpoint; only then may the folder already hold a run (but
            for one that stopped before its first checkpoint, which a fresh run takes over and replaces).

    Returns:
        The held lock; use it as a context manager (or call ``release()``) so that the lock goes at the end.

    Raises:
        RunDirError: If another live run holds the folder, if a fresh run would overwrite a run's files, or if
            the folder cannot be created.
    """
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise RunDirError(f"out_dir {out_dir} is a file, not a folder. Choose another out_dir.") from None
    except OSError as err:
        raise too_long(out_dir, err) or RunDirError(
            f"out_dir {out_dir} cannot be created ({err.strerror}). Choose another out_dir."
        ) from None
    lock = RunDirLock(out_dir, _acquire(out_dir / LOCK_NAME))
    try:
        if not resume:
            _take_over(out_dir, _refuse_a_run_to_keep(out_dir))
    except BaseException:
        lock.release()
        raise
    return lock


def check_run_dir(out_dir: str | os.PathLike, *, resume: bool) -> None:
    """Raise what :func:`claim_run_dir` would raise, without creating or locking anything.

    The command line calls this before it builds the model and data, so that a taken folder is refused at once.
    """
    out_dir = Path(out_dir)
    try:
        if not out_dir.exists():
            return
    except OSError as err:  # a path too long to look up (over 4096 bytes) is too long to create
        raise too_long(out_dir, err) or err from None
    if not out_dir.is_dir():
        raise RunDirError(f"out_dir {out_dir} is a file, not a folder. Choose another out_dir.")
    holder, checked = _holder(out_dir)
    if holder is not None:
        raise _busy(out_dir, holder, checked=checked)
    if not resume:
        _refuse_a_run_to_keep(out_dir)


def run_files(out_dir: str | os.PathLike) -> list[str]:
    """The entries of :data:`RUN_FILES` present in ``out_dir`` (folders with a trailing ``/``)."""
    out_dir = Path(out_dir)
    return [name + "/" if (out_dir / name).is_dir() else name for name in RUN_FILES if (out_dir / name).exists()]


def lock_holder(out_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The record (``pid``, ``host``, ``started``, ``command``) of the live run that holds ``out_dir``, or None."""
    return _holder(Path(out_dir))[0]


def _holder(out_dir: Path) -> tuple[dict[str, Any] | None, bool]:
    """The live holder's record or None, and whether that came from the lock itself (else from its pid)."""
    path = out_dir / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None, True
    try:
        locked = _flock(fd, shared=True)
    finally:
        os.close(fd)  # also releases the shared lock just taken
    if locked is None:  # no flock on this file system: trust the recorded pid
        record = _read_record(path)
        return (record if _maybe_alive(record) else None), False
    return (_read_record(path) if locked is False else None), True


def is_run(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds a run: any of :data:`RUN_FILES`, or a lock (a run that has not written yet)."""
    folder = Path(folder)
    return bool(run_files(folder)) or (folder / LOCK_NAME).exists()


def run_versions(root: str | os.PathLike) -> list[Path]:
    """The ``version_<n>`` folders under ``root`` that hold a run (see :func:`is_run`), oldest (lowest n) first.

    Empty folders (a run that stopped before writing anything) are left out.
    """
    return [p for _, p in _versions(Path(root)) if is_run(p)]


def new_version_dir(root: str | os.PathLike) -> Path:
    """Create and return ``root/version_<n>`` with the next free ``n``, exclusively: two runs started at the same
    time get different folders."""
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise too_long(root, err) or RunDirError(
            f"cannot create the run folder {root} ({err.strerror}); pass --out_dir."
        ) from None
    versions = _versions(root)
    n = versions[-1][0] + 1 if versions else 0
    while True:
        folder = root / f"version_{n}"
        try:
            folder.mkdir()
        except FileExistsError:
            n += 1
            continue
        except OSError as err:
            raise too_long(folder, err) or err from None
        return folder


def too_long(path: Path, err: OSError) -> RunDirError | None:
    """The error naming ``--out_dir`` for a run folder whose name or path is too long for the file system
    (ENAMETOOLONG), or None for another ``err``."""
    if err.errno != errno.ENAMETOOLONG:
        return None
    return RunDirError(
        f"--out_dir {path}: the path is too long for the file system ({err.strerror}: a folder name "
        "may have at most 255 bytes, a whole path 4096). Choose a shorter --out_dir (or --name)."
    )


def _versions(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _VERSION.fullmatch(p.name)) and p.is_dir())


def checkpoint_files(out_dir: str | os.PathLike) -> list[Path]:
    """The checkpoints (``checkpoints/*.ckpt``) in ``out_dir``."""
    folder = Path(out_dir) / "checkpoints"
    return sorted(folder.glob("*.ckpt")) if folder.is_dir() else []


def _refuse_a_run_to_keep(out_dir: Path) -> list[str]:
    """Refuse a folder whose run a fresh run would overwrite (it has a checkpoint or results); return the files of
    a run that stopped before its first checkpoint (empty when there is no run), which a fresh run may replace."""
    found = run_files(out_dir)
    if found and (checkpoint_files(out_dir) or any((out_dir / name).exists() for name in _RESULTS)):
        raise RunDirError(
            f"out_dir {out_dir} already holds a run ({', '.join(found)}): a new run would overwrite its results. "
            "Choose another out_dir (the command line numbers runs/<name>/version_<n> itself when --out_dir is "
            "left out), resume that run with --ckpt_path last, or delete the folder."
        )
    return found


def _take_over(out_dir: Path, found: list[str]) -> None:
    """Remove the files ``found`` of a run that stopped before its first checkpoint, with a warning."""
    if not found:
        return
    warnings.warn(
        f"out_dir {out_dir} holds a run that stopped before its first checkpoint ({', '.join(found)}): it "
        "has nothing to resume, so this run starts it again from round 1 and replaces its files.",
        stacklevel=3,
    )
    for name in found:
        path = out_dir / name.rstrip("/")
        try:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError as err:
            raise RunDirError(
                f"out_dir {out_dir}: cannot remove {path} of the run that stopped there "
                f"({err.strerror}). Delete it, or choose another out_dir."
            ) from None


def _acquire(path: Path) -> int:
    """Open, lock and fill ``path``; return its descriptor. Raises RunDirError when a live run holds it."""
    for _ in range(100):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            previous = None
        except FileExistsError:
            try:
                fd = os.open(path, os.O_RDWR)
            except FileNotFoundError:
                continue  # released meanwhile: try to create it again
            previous = _read_record(path)
        except OSError as err:
            raise too_long(path.parent, err) or RunDirError(
                f"cannot write the lock file {path} ({err.strerror}). Choose another out_dir."
            ) from None
        locked = _flock(fd, shared=False)
        if locked is False:
            os.close(fd)
            raise _busy(path.parent, _read_record(path), checked=True)
        if locked is None and previous is not None and _maybe_alive(previous):
            os.close(fd)
            raise _busy(path.parent, previous, checked=False)
        if not _same_file(path, fd):
            os.close(fd)  # the holder released (unlinked) it between our open and our lock: start over
            continue
        if previous is not None:
            warnings.warn(
                f"out_dir {path.parent}: taking over the lock of a run that ended without releasing it "
                f"({_describe(previous)}).",
                stacklevel=3,
            )
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(_record()).encode())
        os.fsync(fd)
        return fd
    raise RunDirError(f"cannot lock {path}: other runs keep taking and releasing it. Choose another out_dir.")


def _flock(fd: int, *, shared: bool) -> bool | None:
    """Lock ``fd`` without waiting: True if locked, False if a live process holds it, None if unsupported."""
    if fcntl is None:
        return None
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as err:
        if err.errno in _NO_FLOCK:
            return None
        raise
    return True


def _same_file(path: Path, fd: int) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _record() -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": " ".join(sys.argv)[:300],
    }


def _read_record(path: Path) -> dict[str, Any]:
    try:
        record = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _maybe_alive(record: dict[str, Any]) -> bool:
    """Whether the recorded holder may still run: its pid lives on this host, or it ran on another host (which
    cannot be checked from here)."""
    pid, host = record.get("pid"), record.get("host")
    if not isinstance(pid, int):
        return False
    if host != socket.gethostname():
        return True
    return pid_alive(pid)


def _describe(record: dict[str, Any]) -> str:
    if not record:
        return "holder unknown"
    parts = [f"pid {record.get('pid', '?')} on host {record.get('host', '?')}"]
    if record.get("started"):
        parts.append(f"started {record['started']}")
    if record.get("command"):
        parts.append(f"command: {record['command']}")
    return ", ".join(parts)


def _busy(out_dir: Path, record: dict[str, Any], *, checked: bool) -> RunDirError:
    """The error for a folder held by a live run; ``checked``: liveness came from the lock itself, not a pid."""
    remote = record.get("host") not in (None, socket.gethostname())
    check = (
        f" If that run has ended, delete {out_dir / LOCK_NAME} (a process on another host cannot be checked from here)."
        if remote and not checked
        else ""
    )
    return RunDirError(
        f"out_dir {out_dir} is in use by another run ({_describe(record)}): two runs writing one folder would "
        f"mix their results. Choose another out_dir (--out_dir), or wait for that run to end.{check}"
    )
