"""tests/children.py under pytest-xdist: a ``pytest -n 1`` killed with SIGKILL takes its worker with it at once, and
the worker the child its test started (the chain ``tie_xdist_worker`` and ``popen_child`` build)."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest

from tests.children import popen_child

ROOT = Path(__file__).resolve().parents[1]

# The test the killed pytest runs: it ignores SIGINT, with which xdist's worker would otherwise end itself about
# 5 s after losing its pytest command (and it calls os._exit 10 s later), so only the kernel's tie ends it in time.
SLEEPER = """
import os, signal, sys, time
from pathlib import Path
from tests.children import popen_child

def test_sleeps():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    child = popen_child([sys.executable, "-c", "import time; time.sleep(600)"])
    Path(os.environ["FEDLIT_TEST_PIDS"]).write_text(f"{os.getpid()} {child.pid}")
    time.sleep(600)
"""


def _running(pid: int) -> bool:
    """Whether ``pid`` runs: a zombie (dead, not yet reaped by whoever inherited it) does not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


@pytest.mark.long
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.skipif(importlib.util.find_spec("xdist") is None, reason="pytest-xdist is not installed (the dev extra)")
def test_a_killed_xdist_run_takes_its_workers_and_their_children_with_it(tmp_path: Path) -> None:
    (tmp_path / "test_sleeper.py").write_text(SLEEPER)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    pids = tmp_path / "pids"
    env = {
        **os.environ,
        "FEDLIT_TEST_PIDS": str(pids),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    env.pop("PYTEST_XDIST_WORKER", None)  # the command below is not a worker, even when this test runs in one
    # -p tests.conftest: the suite's own conftest, whose pytest_configure ties each worker to the command
    command = popen_child(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "xdist",
            "-n",
            "1",
            "-p",
            "tests.conftest",
            "-p",
            "no:cacheprovider",
            "-c",
            str(tmp_path / "pytest.ini"),
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_sleeper.py"),
        ],
        cwd=tmp_path,
        env=env,
        stdout=open(tmp_path / "out.txt", "w"),
        stderr=open(tmp_path / "err.txt", "w"),
    )
    worker = child = None
    try:
        deadline = time.monotonic() + 600  # a loaded machine: two interpreters import torch first
        while not (pids.exists() and len(pids.read_text().split()) == 2) and command.poll() is None:
            assert time.monotonic() < deadline, "the worker's test never started"
            time.sleep(0.2)
        assert command.poll() is None, (tmp_path / "out.txt").read_text() + (tmp_path / "err.txt").read_text()
        worker, child = map(int, pids.read_text().split())
        assert worker != command.pid and _running(worker) and _running(child)
        command.kill()
        command.wait(timeout=60)
        deadline = time.monotonic() + 10
        while (_running(worker) or _running(child)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(worker), "the xdist worker outlived its killed pytest command"
        assert not _running(child), "a test's child outlived its killed xdist worker"
    finally:
        command.kill()
        command.wait(timeout=60)
        for pid in (worker, child):
            if pid is not None and _running(pid):
                os.kill(pid, 9)
