"""``fedlit flower-wait``: wait for a Flower run to finish and exit non-zero when it did not complete.

::

    flwr run quickstart_app fedlit --stream
    fedlit flower-wait --superlink fedlit [--run_id 123]     # exit 0: completed; 1: failed or stopped

``flwr run --stream`` (flwr 1.41 and 1.42) exits 0 whatever became of the run: a ServerApp that raised (a refused
setting, a client that failed with ``on_client_error: raise``) ends the stream like a run that completed. This
command asks the SuperLink (``flwr ls CONNECTION --run-id N --format json``, every ``--poll_s`` seconds) until the
run's status is ``finished:...``, prints it, and exits 0 for ``finished:completed``, 1 for ``finished:failed`` or
``finished:stopped`` with Flower's status details (for a ServerApp that raised: ``ServerApp failed with exception:``
and fedlit's message). Without ``--run_id`` it waits for the newest run of the connection (the one ``flwr run`` just
started, when nobody else starts runs there). Errors of its own (no ``flwr``, a connection the SuperLink refuses, a
run id it does not know, ``--timeout_s`` passed) exit 2 with one line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fedlit.core.errors import ConfigError, FedlitError

#: The status ``flwr ls`` gives a run that ended well; any other ``finished:...`` is a failure.
COMPLETED = "finished:completed"
#: Consecutive failed ``flwr ls`` calls tolerated while waiting (a SuperLink restarting, a network blip).
RETRIES = 10


def flwr_program() -> str:
    """The ``flwr`` CLI beside this Python (the same installation), else the one on ``PATH``."""
    beside = Path(sys.executable).parent / "flwr"
    found = str(beside) if beside.is_file() else shutil.which("flwr")
    if found is None:
        raise ConfigError("fedlit flower-wait needs the `flwr` CLI: pip install 'fedlit[flower]'.")
    return found


def list_runs(flwr: str, superlink: str | None, run_id: str | None) -> list[dict[str, Any]]:
    """``flwr ls`` as JSON: the runs of ``superlink`` (the default connection when None), newest first, or the one
    run ``run_id``."""
    command = [flwr, "ls", *([superlink] if superlink else []), "--format", "json"]
    if run_id is not None:
        command += ["--run-id", run_id]
    done = subprocess.run(command, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL)
    try:
        answer = json.loads(done.stdout)
    except json.JSONDecodeError:
        answer = {}
    if done.returncode != 0 or not answer.get("success"):
        said = answer.get("error-message") or (done.stderr or done.stdout).strip()[-2000:]
        raise FedlitError(f"`{' '.join(command[1:])}` failed (exit code {done.returncode}): {said}")
    return list(answer.get("runs", []))


def wait(
    superlink: str | None,
    run_id: str | None = None,
    *,
    poll_s: float = 2.0,
    timeout_s: float = 0.0,
    flwr: str | None = None,
) -> dict[str, Any]:
    """Poll until run ``run_id`` (the newest run when None) has finished; return its ``flwr ls`` entry.

    Raises:
        FedlitError: ``flwr ls`` fails on the first call or :data:`RETRIES` times in a row, or ``timeout_s`` (> 0)
            seconds pass before the run finishes.
    """
    flwr = flwr or flwr_program()
    if run_id is None:
        runs = list_runs(flwr, superlink, None)
        if not runs:
            raise FedlitError(f"no run on the SuperLink of connection {superlink or '(default)'}: nothing to wait for.")
        run_id = str(runs[0]["run-id"])
    start, failures = time.monotonic(), 0
    first = True
    while True:
        try:
            found = list_runs(flwr, superlink, run_id)
            if not found:
                raise FedlitError(f"`flwr ls --run-id {run_id}` answered no run.")
            run, failures = found[0], 0
        except FedlitError:
            failures += 1
            if first or failures >= RETRIES:
                raise
            run = {}
        first = False
        if str(run.get("status", "")).startswith("finished"):
            return run
        if timeout_s > 0 and time.monotonic() - start > timeout_s:
            raise FedlitError(
                f"run {run_id} still {run.get('status', 'unknown')!r} after --timeout_s {timeout_s:g} s; "
                f"see `flwr log {run_id} {superlink or ''} --stream`."
            )
        time.sleep(poll_s)


def main(argv: list[str]) -> dict[str, Any]:
    """``fedlit flower-wait``: wait for the run, print its status; exit 1 when it failed or was stopped."""
    parser = argparse.ArgumentParser(prog="fedlit flower-wait", description=__doc__.splitlines()[0].split(": ", 1)[1])
    parser.add_argument(
        "--superlink", default=None, help="The flwr connection's name (default: the default of flwr's config.toml)."
    )
    parser.add_argument("--run_id", default=None, help="The run (as `flwr run` printed it; default: the newest).")
    parser.add_argument("--poll_s", type=float, default=2.0, help="Seconds between two `flwr ls` calls.")
    parser.add_argument("--timeout_s", type=float, default=0.0, help="Give up after this many seconds (0: never).")
    args = parser.parse_args(argv)
    if args.poll_s <= 0 or args.timeout_s < 0:
        raise ConfigError(f"--poll_s {args.poll_s:g} must be > 0 and --timeout_s {args.timeout_s:g} >= 0.")
    run = wait(args.superlink, args.run_id, poll_s=args.poll_s, timeout_s=args.timeout_s)
    line = f"fedlit flower-wait: run {run['run-id']} {run['status']}"
    if run["status"] != COMPLETED:
        print(f"{line}: {run.get('status-details') or 'no details'}", file=sys.stderr, flush=True)
        raise SystemExit(1)
    print(line, flush=True)
    return run
