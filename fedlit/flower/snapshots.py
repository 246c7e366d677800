"""Where a node keeps its client's store entry between messages: one snapshot per round.

A SuperNode starts a fresh process for every message, so :class:`~fedlit.flower.client.ClientRuntime`
(:mod:`fedlit.flower.client`) restores the client's store entry before each turn or evaluation and saves it after,
as :class:`Snapshots` (one per round, so a resumed server finds the state of its checkpoint's round). The snapshots
live in the node's ``context.state`` or, with the node config ``state-dir``, in a :class:`FolderTable`;
:func:`~fedlit.flower.client.snapshots_of` picks where.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, MutableMapping
from pathlib import Path

from typing_extensions import override

#: The file fedlit writes in each run folder it creates under a node's ``state-dir`` (``<state-dir>/<run>/``), so
#: that ``fedlit node-state --delete`` deletes only folders fedlit wrote (:mod:`fedlit.flower.node_state`).
MARKER = ".fedlit-node-state"


class FolderTable(MutableMapping[str, bytes]):
    """Files ``<folder>/<key>.pt`` as a mapping (written whole, then renamed: a crash keeps the previous file), each
    readable by the node's user only (mode 0600, the folders it makes 0700): they hold a client's personal state.

    Args:
        folder: The folder (created on the first write).
        marker: A file written (once, with its own text) when the folder is first written, e.g. the :data:`MARKER`
            of the run folder above it.
    """

    def __init__(self, folder: Path, *, marker: Path | None = None) -> None:
        self.folder = folder
        self.marker = marker

    @override
    def __getitem__(self, key: str) -> bytes:
        path = self.folder / f"{key}.pt"
        if not path.is_file():
            raise KeyError(key)
        return path.read_bytes()

    @override
    def __setitem__(self, key: str, value: bytes) -> None:
        private_folder(self.folder)
        for own in {self.folder, *([self.marker.parent] if self.marker is not None else [])}:
            if stat.S_IMODE(own.stat().st_mode) != 0o700:  # made before fedlit kept these folders private
                os.chmod(own, 0o700)
        if self.marker is not None and not self.marker.is_file():
            _private_file(self.marker, b"A run's client snapshots, written by fedlit (fedlit node-state lists them).\n")
        partial = self.folder / f"{key}.tmp"
        _private_file(partial, value)
        partial.replace(self.folder / f"{key}.pt")

    @override
    def __delitem__(self, key: str) -> None:
        (self.folder / f"{key}.pt").unlink()

    @override
    def __iter__(self) -> Iterator[str]:
        return iter(sorted(p.stem for p in self.folder.glob("*.pt"))) if self.folder.is_dir() else iter(())

    @override
    def __len__(self) -> int:
        return len(list(iter(self)))


def private_folder(folder: Path) -> None:
    """Make ``folder`` and the missing folders above it with mode 0700 (only the node's user may enter them); those
    that exist keep their mode."""
    missing = [p for p in [folder, *folder.parents] if not p.exists()]
    for path in reversed(missing):
        path.mkdir(mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)  # whatever the umask: a client's personal state is the node's user's alone


def _private_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` with mode 0600 (only the node's user may read it), a file left before included."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(data)


class Snapshots:
    """The client's store entry after each round it took part in, so that a resumed server gets from every node
    exactly the state its checkpoint expects: a turn of round r starts from the newest snapshot of a round before r,
    an evaluation of round r from the newest up to r. Snapshots older than the newest one at or before the server's
    last checkpoint are deleted.

    Args:
        table: Where the snapshots live, by key ``round_<r>`` (a dict, a :class:`FolderTable`, a ConfigRecord).
    """

    def __init__(self, table: MutableMapping[str, bytes]) -> None:
        self.table = table

    def _rounds(self) -> list[int]:
        return sorted(int(k.removeprefix("round_")) for k in self.table if k.startswith("round_"))

    def before(self, server_round: int, *, inclusive: bool = False) -> bytes | None:
        """The newest snapshot of a round before ``server_round`` (or equal, with ``inclusive``), or None."""
        rounds = [r for r in self._rounds() if r < server_round or (inclusive and r == server_round)]
        return bytes(self.table[f"round_{rounds[-1]}"]) if rounds else None

    def save(self, server_round: int, blob: bytes, checkpointed: int | None = None) -> None:
        """Keep ``blob`` as the snapshot of ``server_round``; drop those a resume from ``checkpointed`` can't need."""
        for r in self._rounds():
            if r > server_round:  # a resumed server redoes these rounds
                del self.table[f"round_{r}"]
        self.table[f"round_{server_round}"] = blob
        if checkpointed is not None:
            kept = [r for r in self._rounds() if r <= checkpointed]
            for r in kept[:-1]:
                del self.table[f"round_{r}"]
