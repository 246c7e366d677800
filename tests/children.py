"""Processes that tests start, tied to the test process: each dies with it, even when pytest is killed.

On Linux the child asks the kernel for SIGKILL when its parent dies (``prctl(PR_SET_PDEATHSIG)``), so a test run
stopped by a CI timeout or a cancel (SIGKILL included, where no ``finally`` runs) leaves no child behind; the
``timeout`` bounds a child that hangs while its test still runs.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
from typing import Any

_PR_SET_PDEATHSIG = 1
#: A generous bound on one child (a shared, loaded machine can be slow; no test depends on the time taken).
TIMEOUT = 3600


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def popen_child(args: list[str], **kwargs: Any) -> subprocess.Popen:
    """:class:`subprocess.Popen` of a child that is killed when the test process dies."""
    return subprocess.Popen(args, preexec_fn=_die_with_parent, **kwargs)  # noqa: PLW1509 (no threads start it)


def run_child(args: list[str], *, timeout: float = TIMEOUT, **kwargs: Any) -> subprocess.CompletedProcess:
    """:func:`subprocess.run` of a child that is killed when the test process dies; output captured as text."""
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    return subprocess.run(args, preexec_fn=_die_with_parent, timeout=timeout, check=False, **kwargs)  # noqa: PLW1509
