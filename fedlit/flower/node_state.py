"""``fedlit node-state``: list, and delete, what SuperNodes keep in their ``state-dir`` for each run.

::

    fedlit node-state --state_dir /var/lib/fedlit                                 # list the runs kept
    fedlit node-state --state_dir /var/lib/fedlit --older_than 30 [--delete]     # those not written for 30 days
    fedlit node-state --state_dir /var/lib/fedlit --out_dir /abs/runs/study [--delete]   # one server run's

A node with the node config ``state-dir`` keeps its client's store entry (personal tensors, optimizer and
strategy state) in ``<state-dir>/<run>/<client-id>/round_<r>.pt`` (:mod:`fedlit.flower.snapshots`), ``<run>`` the
first 16 hex digits of the SHA-256 of the server's run folder (the run config's ``out-dir``). During a run only the
snapshots a resume can need are kept, but a finished run's stay until deleted. Without ``--delete`` the runs that
would be deleted are listed only. Delete a run's folder only when the server's run is finished or abandoned: a
resumed server whose nodes lost their snapshots gets clients without their personal state.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from fedlit.core.errors import ConfigError, InputFileError

DAY = 86400.0


def run_key(out_dir: str) -> str:
    """The folder name under ``state-dir`` of the run whose server run folder is ``out_dir`` (as the nodes name it,
    :func:`fedlit.flower.client.snapshots_of`)."""
    return hashlib.sha256(out_dir.encode()).hexdigest()[:16]


@dataclass
class RunState:
    """One run's folder under a node's ``state-dir``."""

    folder: Path
    clients: list[str]
    rounds: list[int]
    nbytes: int
    last_written: float  # seconds since the epoch, the newest file's modification time (the folder's when empty)

    def line(self, now: float) -> str:
        """One line for the listing."""
        rounds = ",".join(map(str, self.rounds)) or "-"
        return (
            f"{self.folder.name}  clients {','.join(self.clients) or '-'}  rounds {rounds}  "
            f"{self.nbytes / 1e6:.1f} MB  last written {(now - self.last_written) / DAY:.1f} days ago"
        )


def runs(state_dir: Path) -> list[RunState]:
    """The runs kept in ``state_dir``, oldest last write first."""
    found = []
    for folder in sorted(p for p in state_dir.iterdir() if p.is_dir()):
        files = [p for p in folder.rglob("*") if p.is_file()]
        snapshots = [p for p in files if p.suffix == ".pt" and p.stem.startswith("round_")]
        found.append(
            RunState(
                folder,
                sorted({p.parent.name for p in snapshots}),
                sorted(
                    {int(p.stem.removeprefix("round_")) for p in snapshots if p.stem.removeprefix("round_").isdigit()}
                ),
                sum(p.stat().st_size for p in files),
                max([p.stat().st_mtime for p in files], default=folder.stat().st_mtime),
            )
        )
    return sorted(found, key=lambda r: r.last_written)


def select(
    state_dir: Path, *, older_than: float | None = None, out_dir: str | None = None, now: float | None = None
) -> list[RunState]:
    """The runs of ``state_dir`` not written for ``older_than`` days and/or of the server run folder ``out_dir``
    (all with neither)."""
    now = time.time() if now is None else now
    chosen = runs(state_dir)
    if older_than is not None:
        chosen = [r for r in chosen if now - r.last_written > older_than * DAY]
    if out_dir is not None:
        chosen = [r for r in chosen if r.folder.name == run_key(out_dir)]
    return chosen


def main(argv: list[str]) -> list[RunState]:
    """``fedlit node-state``: list the selected runs of ``--state_dir``; delete them with ``--delete``."""
    parser = argparse.ArgumentParser(prog="fedlit node-state", description=__doc__.splitlines()[0].split(": ", 1)[1])
    parser.add_argument("--state_dir", required=True, help="The SuperNode's node config state-dir.")
    parser.add_argument(
        "--older_than",
        type=float,
        default=None,
        help="Only runs none of whose files was written in the last DAYS days.",
    )
    parser.add_argument(
        "--out_dir",
        default=None,
        help="Only the run whose server run folder (the run config's out-dir, absolute) is this.",
    )
    parser.add_argument("--delete", action="store_true", help="Delete the selected runs (default: list them).")
    args = parser.parse_args(argv)
    state_dir = Path(args.state_dir)
    if not state_dir.is_dir():
        raise InputFileError(f"--state_dir {state_dir}: no such folder (the SuperNode's node config state-dir).")
    if args.older_than is not None and args.older_than < 0:
        raise ConfigError(f"--older_than {args.older_than:g}: must be >= 0 days.")
    if args.delete and args.older_than is None and args.out_dir is None:
        raise ConfigError("--delete needs --older_than DAYS or --out_dir RUN_FOLDER: it never deletes every run.")
    now = time.time()
    chosen = select(state_dir, older_than=args.older_than, out_dir=args.out_dir, now=now)
    for run in chosen:
        print(("deleted " if args.delete else "") + run.line(now), flush=True)
        if args.delete:
            shutil.rmtree(run.folder)
    if not chosen:
        print(f"fedlit node-state: no run selected in {state_dir}.", flush=True)
    return chosen
