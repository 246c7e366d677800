"""``fedlit.core.processes.pid_alive``: a running process is alive, a reaped one is not."""

from __future__ import annotations

import os
import sys

from fedlit.core.processes import pid_alive
from tests.children import run_child


def test_this_process_is_alive_and_a_finished_child_is_not():
    done = run_child([sys.executable, "-c", "import os; print(os.getpid())"])
    assert pid_alive(os.getpid())
    assert not pid_alive(int(done.stdout))  # exited and reaped by run()


def test_a_process_of_another_user_counts_as_alive():
    assert pid_alive(1)  # init: signalling it is refused (PermissionError) unless root, alive either way
