"""A node's snapshots in its ``state-dir`` are its user's alone: files 0600, the folders fedlit makes 0700, whatever
the umask, and folders or partial files left by an earlier fedlit (0755, 0644) are tightened on the next write."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

pytest.importorskip("flwr.app", reason="flwr is not installed (pip install 'fedlit[flower]'): no Flower deployment")

from fedlit.flower.snapshots import MARKER, FolderTable, Snapshots  # noqa: E402


def _modes(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): oct(stat.S_IMODE(p.stat().st_mode)) for p in sorted(root.rglob("*"))}


@pytest.fixture(params=[0o022, 0o000], ids=["umask-022", "umask-000"])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def test_snapshots_are_written_0600_in_folders_0700(tmp_path, umask):
    state = tmp_path / "state"  # the node's state-dir, missing: made private too
    run = state / "0123456789abcdef"
    snapshots = Snapshots(FolderTable(run / "site_0", marker=run / MARKER))
    snapshots.save(1, b"one")
    snapshots.save(2, b"two")
    assert oct(stat.S_IMODE(state.stat().st_mode)) == "0o700"
    assert _modes(state) == {
        "0123456789abcdef": "0o700",
        f"0123456789abcdef/{MARKER}": "0o600",
        "0123456789abcdef/site_0": "0o700",
        "0123456789abcdef/site_0/round_1.pt": "0o600",
        "0123456789abcdef/site_0/round_2.pt": "0o600",
    }
    assert snapshots.before(3) == b"two"


def test_folders_and_partial_files_of_an_earlier_fedlit_are_tightened(tmp_path, umask):
    run = tmp_path / "state" / "0123456789abcdef"
    (run / "site_0").mkdir(parents=True)
    for folder in (tmp_path / "state", run, run / "site_0"):
        os.chmod(folder, 0o755)
    (run / "site_0" / "round_1.tmp").write_bytes(b"a crash's partial file")
    os.chmod(run / "site_0" / "round_1.tmp", 0o644)
    FolderTable(run / "site_0", marker=run / MARKER)["round_1"] = b"one"
    assert _modes(run) == {
        MARKER: "0o600",
        "site_0": "0o700",
        "site_0/round_1.pt": "0o600",
    }
    assert oct(stat.S_IMODE(run.stat().st_mode)) == "0o700"
    # the state-dir is the operator's: fedlit never changes the mode of a folder it did not make
    assert oct(stat.S_IMODE((tmp_path / "state").stat().st_mode)) == "0o755"
    assert (run / "site_0" / "round_1.pt").read_bytes() == b"one"
