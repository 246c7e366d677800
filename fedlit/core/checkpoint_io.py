"""Save and resume a whole federation.

A checkpoint is one file holding only tensors and plain containers (loaded with
``torch.load(weights_only=True)``: a checkpoint is data, never code): the round counter, the strategy's and the
callbacks' state, the client store (every client's tensors, optimizer and strategy state), the evaluation
history, communication totals, RNG states and the partition manifest. It is written atomically (temporary file
then rename), so a run killed while saving, or one that fills its disk, keeps its previous checkpoint.

A run writes its checkpoints off the critical path (:func:`write_in_background`): the payload is copied
(:func:`snapshot`) on the calling thread, then serialized, written and synced by one writer thread while the next
round trains. At most one write is in flight: the next write, the end of the run and every
:func:`load_checkpoint` wait for it (:func:`wait_for_writes`), and its error (a full disk) is raised there. A
process that dies while the thread writes keeps its previous checkpoint (the rename has not happened).
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import re
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from fedlit.core.errors import CheckpointError, RunDirError

FORMAT_VERSION = 1
LAST = "last.ckpt"
#: The checkpoint of the best-validation round, beside :data:`LAST` in ``<run>/checkpoints/``.
BEST = "best.ckpt"


def save_checkpoint(path: str | os.PathLike[str], payload: dict[str, Any]) -> Path:
    """Write ``payload`` to ``path`` atomically and return the path.

    Raises:
        RunDirError: If the file cannot be written (a full disk, no permission); the partial temporary file is
            removed and the previous checkpoint at ``path``, if any, is kept.
    """
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Through a Python file object: torch's own writer turns a full disk into an opaque RuntimeError, while
        # a file object raises (or chains) the OSError that says what happened.
        with open(tmp, "wb") as file:
            torch.save({"format_version": FORMAT_VERSION, **payload}, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        cause = _os_error(err)
        if cause is None:
            raise
        kept = "the previous checkpoint is kept" if path.is_file() else "no checkpoint was written before"
        if cause.errno == errno.ENOSPC:
            what = "no space left on device (ENOSPC)"
        elif cause.errno == errno.EDQUOT:
            what = "disk quota exceeded (EDQUOT)"
        else:
            what = f"{cause.strerror or cause} ({errno.errorcode.get(cause.errno or 0, 'OSError')})"
        raise RunDirError(
            f"{what} writing {path}; {kept}. Free space (or choose an out_dir on another disk) and resume with "
            "--ckpt_path last."
        ) from None
    return path


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (``weights_only=True``: data, never code), after the
    write in flight, if any (:func:`wait_for_writes`).

    Raises:
        CheckpointError: If the file is missing, truncated, corrupted, or not a fedlit checkpoint.
    """
    wait_for_writes()
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(
            f"ckpt_path: no checkpoint at {path}. Give the path of a `.ckpt` file, or `last` for the newest "
            "checkpoint of this recipe's out_dir."
        )
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001  (any failure to read the file means: not a usable checkpoint)
        # ``from None``: torch's own message suggests loading with pickle enabled, which is never the fix here.
        raise CheckpointError(
            f"ckpt_path: {path} is not a readable fedlit checkpoint ({_why_unreadable(err)}): the file is truncated "
            "or corrupted (a copy or a save that did not finish), or was not written by fedlit. Give another "
            "checkpoint, or start a new run without --ckpt_path."
        ) from None
    if not isinstance(payload, dict) or "format_version" not in payload:
        held = f"a {type(payload).__name__}" if not isinstance(payload, dict) else "a dict without format_version"
        raise CheckpointError(
            f"ckpt_path: {path} holds {held}, not a fedlit checkpoint. Give the path of a "
            "checkpoint written by fedlit (out_dir/checkpoints/last.ckpt)."
        )
    if payload["format_version"] != FORMAT_VERSION:
        raise CheckpointError(
            f"ckpt_path: {path} has checkpoint format {payload['format_version']}, this fedlit reads format "
            f"{FORMAT_VERSION}. Resume it with the fedlit version that wrote it, or start a new run."
        )
    return payload


class _Writer:
    """The one checkpoint write in flight (a thread) and the error of the last one that failed."""

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.lock = threading.Lock()


_WRITER = _Writer()


def write_in_background(job: Callable[[], None]) -> None:
    """Run ``job`` (writing checkpoint files from a :func:`snapshot`) in the writer thread, after the write in
    flight, if any, has ended (its error raised here).

    The thread is not a daemon: an interpreter that exits normally (an exception, Ctrl-C) still finishes the file.
    """
    wait_for_writes()

    def run() -> None:
        try:
            job()
        except BaseException as err:  # noqa: BLE001  (raised on the run's thread by wait_for_writes)
            with _WRITER.lock:
                _WRITER.error = err

    thread = threading.Thread(target=run, name="fedlit-checkpoint-writer")
    with _WRITER.lock:
        _WRITER.thread = thread
    thread.start()


def wait_for_writes(*, raise_error: bool = True) -> None:
    """Wait for the checkpoint write in flight, if any; raise its error (``raise_error=False``: warn instead, for a
    run that is already ending with an error of its own)."""
    with _WRITER.lock:
        thread, _WRITER.thread = _WRITER.thread, None
    if thread is not None:
        thread.join()
    with _WRITER.lock:
        error, _WRITER.error = _WRITER.error, None
    if error is None:
        return
    if raise_error:
        raise error
    warnings.warn(f"The last checkpoint write failed: {error}", stacklevel=2)


def last_good_checkpoint(out_dir: Path, *, yet: str = " yet") -> str:
    """What a run stopping on a bad round keeps, for its error message: "the last good checkpoint P is kept" (once
    the pending write is on disk) or "no checkpoint was written" (+ ``yet``)."""
    wait_for_writes(raise_error=False)
    checkpoint = out_dir / "checkpoints" / LAST
    if not checkpoint.is_file():
        return f"no checkpoint was written{yet}"
    return f"the last good checkpoint {checkpoint} is kept"


def snapshot(obj: Any) -> Any:
    """A copy of ``obj`` (tensors in dicts, lists and tuples) that the run's later in-place changes cannot reach:
    every tensor copied to the CPU, every container rebuilt; other values (numbers, strings) kept."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: snapshot(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [snapshot(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(snapshot(v) for v in obj)
    return obj


def _why_unreadable(err: BaseException) -> str:
    """A short reason from torch's error, without its advice (which suggests unpickling arbitrary objects)."""
    if isinstance(err, EOFError):
        return "it ends before any data"
    if isinstance(err, IsADirectoryError | PermissionError):
        return err.strerror or type(err).__name__
    text = " ".join(str(e) for e in (err, err.__context__) if e is not None)
    if found := re.search(r"Unsupported global: GLOBAL ([\w.]+)", text):
        return f"it holds a Python object of class {found.group(1)}, which a fedlit checkpoint never does"
    if "zip archive" in text or "central directory" in text:
        return "its zip archive is incomplete"
    return f"{type(err).__name__} while unpickling"


def _os_error(err: BaseException) -> OSError | None:
    """The OSError behind ``err`` (itself, or in its cause/context chain), if any."""
    seen: list[BaseException] = []
    node: BaseException | None = err
    while node is not None and node not in seen:
        if isinstance(node, OSError):
            return node
        seen.append(node)
        node = node.__cause__ or node.__context__
    return None


def rng_state() -> dict[str, Any]:
    """The global RNG states (torch, CUDA, numpy, Python) as tensors and plain values."""
    # numpy's stubs type the default (legacy=True) result as a dict or a tuple; it is always the tuple.
    np_state = cast("tuple[str, np.ndarray, int, int, float]", np.random.get_state())
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *map(float, np_state[2:])],
        "python": _to_lists(random.getstate()),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore :func:`rng_state`."""
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), int(pos), int(has_gauss), cached))
    random.setstate(_to_tuples(state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _to_lists(obj: Any) -> Any:
    return [_to_lists(v) for v in obj] if isinstance(obj, tuple) else obj


def _to_tuples(obj: Any) -> Any:
    return tuple(_to_tuples(v) for v in obj) if isinstance(obj, list) else obj
