"""Processes that tests start, tied to the test process: each dies with it, even when pytest is killed.

On Linux the child asks the kernel for SIGKILL when its parent dies (``prctl(PR_SET_PDEATHSIG)``), so a test run
stopped by a CI timeout or a cancel (SIGKILL included, where no ``finally`` runs) leaves no child behind; the
``timeout`` bounds a child that hangs while its test still runs.

Under pytest-xdist the test process is a worker that the ``pytest`` command started: :func:`tie_xdist_worker`
(called by ``tests/conftest.py``) ties each worker to that command the same way, so a killed ``pytest -n 2`` takes
its workers with it, and they their children. (The kernel's "parent" is the thread that started the process:
xdist runs the tests in each worker's main thread, and starts the workers from the command's main thread.)
"""

from __future__ import annotations

import ctypes
import os
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


def tie_xdist_worker() -> None:
    """In a pytest-xdist worker (``PYTEST_XDIST_WORKER`` set), have the kernel kill this process when the
    ``pytest`` command that started it dies; exits at once if that command is already gone."""
    if not os.environ.get("PYTEST_XDIST_WORKER") or not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    _die_with_parent()
    if os.getppid() != parent:  # the command died before the request was made: nothing would kill this worker
        os._exit(1)


def popen_child(args: list[str], **kwargs: Any) -> subprocess.Popen:
    """:class:`subprocess.Popen` of a child that is killed when the test process dies."""
    return subprocess.Popen(args, preexec_fn=_die_with_parent, **kwargs)  # noqa: PLW1509 (no threads start it)


def run_child(args: list[str], *, timeout: float = TIMEOUT, **kwargs: Any) -> subprocess.CompletedProcess:
    """:func:`subprocess.run` of a child that is killed when the test process dies; output captured as text."""
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    return subprocess.run(args, preexec_fn=_die_with_parent, timeout=timeout, check=False, **kwargs)  # noqa: PLW1509
