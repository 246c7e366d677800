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

Only the folders fedlit wrote are ever listed as runs, or deleted: those holding the file ``.fedlit-node-state``
(:data:`fedlit.flower.snapshots.MARKER`, written with a run's first snapshot), and, written before that file
existed, those laid out exactly as fedlit lays them out (a name of 16 hex digits or ``run<N>``, holding only client
folders, which hold only ``round_<r>.pt`` files, at least one). Any other folder of ``--state_dir`` is listed as
"not a node state" and kept.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from fedlit.core.errors import ConfigError, InputFileError
from fedlit.flower.snapshots import MARKER

DAY = 86400.0
#: A run folder's name as :func:`fedlit.flower.client.snapshots_of` writes it, and a snapshot's file name.
_RUN_NAME = re.compile(r"[0-9a-f]{16}|run\d+")
_SNAPSHOT = re.compile(r"round_\d+\.(pt|tmp)")
#: Folders fedlit itself keeps in a state-dir that are no run (the ClientApp worker's socket folder).
_OWN_OTHER = (".fedlit-worker",)


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


def is_node_state(folder: Path) -> bool:
    """Whether fedlit wrote ``folder`` as a run's snapshots: it holds the :data:`MARKER` file or (written before the
    marker existed) has exactly fedlit's layout, ``<run>/<client-id>/round_<r>.pt``. A link is never one."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    if (folder / MARKER).is_file():
        return True
    clients = list(folder.iterdir())
    if not _RUN_NAME.fullmatch(folder.name) or not clients:
        return False
    for client in clients:
        if client.is_symlink() or not client.is_dir():
            return False
        files = list(client.iterdir())
        if not files or not all(f.is_file() and not f.is_symlink() and _SNAPSHOT.fullmatch(f.name) for f in files):
            return False
    return True


def not_node_states(state_dir: Path) -> list[Path]:
    """The folders of ``state_dir`` fedlit did not write as runs (never listed as runs, never deleted)."""
    return sorted(p for p in state_dir.iterdir() if p.is_dir() and p.name not in _OWN_OTHER and not is_node_state(p))


def runs(state_dir: Path) -> list[RunState]:
    """The runs kept in ``state_dir`` (folders fedlit wrote, :func:`is_node_state`), oldest last write first."""
    found = []
    for folder in sorted(p for p in state_dir.iterdir() if is_node_state(p)):
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
    for other in not_node_states(state_dir):
        print(f"kept {other.name}: not a node state (no {MARKER} file, nor fedlit's snapshot layout)", flush=True)
    chosen = select(state_dir, older_than=args.older_than, out_dir=args.out_dir, now=now)
    for run in chosen:
        print(("deleted " if args.delete else "") + run.line(now), flush=True)
        if args.delete:
            shutil.rmtree(run.folder)
    if not chosen:
        print(f"fedlit node-state: no run selected in {state_dir}.", flush=True)
    return chosen
