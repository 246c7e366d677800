"""``fedlit node-state``: what SuperNodes keep in their state-dir, listed and deleted by age or by server run."""

from __future__ import annotations

import hashlib
import os
from types import SimpleNamespace

import pytest

pytest.importorskip("flwr.app", reason="flwr is not installed (pip install 'fedlit[flower]')")

from fedlit.cli import main  # noqa: E402
from fedlit.flower.client import snapshots_of  # noqa: E402
from fedlit.flower.node_state import run_key  # noqa: E402

DAY = 86400


def _run(state_dir, out_dir, clients, rounds, age_days):
    """Snapshots as a node writes them, last written ``age_days`` ago."""
    for client in clients:
        context = SimpleNamespace(
            run_config={"out-dir": out_dir}, node_config={"state-dir": str(state_dir), "client-id": client}, run_id=1
        )
        snapshots = snapshots_of(context)
        for r in rounds:
            snapshots.save(r, b"x" * 1000)
    folder = state_dir / hashlib.sha256(out_dir.encode()).hexdigest()[:16]
    stamp = os.path.getmtime(folder) - age_days * DAY
    for path in folder.rglob("*"):
        os.utime(path, (stamp, stamp))
    return folder


def test_the_run_folder_is_the_nodes(tmp_path):
    folder = _run(tmp_path, "/abs/runs/study", ["site_0"], [1], 0)
    assert folder.name == run_key("/abs/runs/study") and (folder / "site_0" / "round_1.pt").is_file()


def test_list_then_delete_old_runs(tmp_path, capsys):
    old = _run(tmp_path, "/abs/runs/old", ["site_0", "site_1"], [1, 2], 40)
    recent = _run(tmp_path, "/abs/runs/recent", ["site_0"], [3], 2)
    main(["node-state", "--state_dir", str(tmp_path)])
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed] == [old.name, recent.name]  # oldest first
    assert "clients site_0,site_1  rounds 1,2  0.0 MB  last written 40.0 days ago" in listed[0]
    main(["node-state", "--state_dir", str(tmp_path), "--older_than", "30"])  # a dry run
    assert capsys.readouterr().out.split()[0] == old.name and old.is_dir()
    main(["node-state", "--state_dir", str(tmp_path), "--older_than", "30", "--delete"])
    assert capsys.readouterr().out.startswith(f"deleted {old.name}")
    assert not old.exists() and (recent / "site_0" / "round_3.pt").is_file()


def test_delete_one_server_runs_state(tmp_path, capsys):
    one = _run(tmp_path, "/abs/runs/one", ["site_0"], [1], 0)
    two = _run(tmp_path, "/abs/runs/two", ["site_0"], [1], 0)
    main(["node-state", "--state_dir", str(tmp_path), "--out_dir", "/abs/runs/one", "--delete"])
    assert not one.exists() and two.is_dir()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--delete"], "--delete needs --older_than DAYS or --out_dir RUN_FOLDER"),
        (["--older_than", "-1"], "--older_than -1: must be >= 0 days"),
    ],
)
def test_refused(tmp_path, capsys, argv, message):
    kept = _run(tmp_path, "/abs/runs/one", ["site_0"], [1], 100)
    with pytest.raises(SystemExit):
        main(["node-state", "--state_dir", str(tmp_path), *argv])
    assert message in capsys.readouterr().err and kept.is_dir()


def _aged(path, age_days):
    stamp = os.path.getmtime(path) - age_days * DAY
    for p in [path, *path.rglob("*")]:
        os.utime(p, (stamp, stamp))


def test_only_folders_fedlit_wrote_are_deleted(tmp_path, capsys):
    run = _run(tmp_path, "/abs/runs/old", ["site_0"], [1], 40)
    assert (run / ".fedlit-node-state").is_file()  # written with the run's first snapshot
    images = tmp_path / "images"
    images.mkdir()
    for i in range(12):
        (images / f"scan_{i}.png").write_bytes(b"\x89PNG" + bytes(100))
    lookalike = tmp_path / ("0123456789abcdef")  # a run's name, but a file no node writes
    (lookalike / "site_0").mkdir(parents=True)
    (lookalike / "site_0" / "notes.txt").write_text("mine")
    worker = tmp_path / ".fedlit-worker"  # the ClientApp worker's socket folder: neither a run nor listed
    worker.mkdir()
    for folder in (images, lookalike, worker):
        _aged(folder, 40)
    main(["node-state", "--state_dir", str(tmp_path), "--older_than", "30", "--delete"])
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "kept 0123456789abcdef: not a node state (no .fedlit-node-state file, nor fedlit's snapshot layout)",
        "kept images: not a node state (no .fedlit-node-state file, nor fedlit's snapshot layout)",
        out[2],
    ]
    assert out[2].startswith(f"deleted {run.name}  clients site_0  rounds 1")
    assert not run.exists() and len(list(images.iterdir())) == 12 and (lookalike / "site_0" / "notes.txt").is_file()
    main(["node-state", "--state_dir", str(tmp_path), "--older_than", "0", "--delete"])
    assert capsys.readouterr().out.splitlines()[-1] == f"fedlit node-state: no run selected in {tmp_path}."
    assert sorted(p.name for p in tmp_path.iterdir()) == [".fedlit-worker", "0123456789abcdef", "images"]


def test_runs_written_before_the_marker_are_recognised_by_their_layout_only(tmp_path, capsys):
    legacy = _run(tmp_path, "/abs/runs/legacy", ["site_0", "site_1"], [2], 40)
    (legacy / ".fedlit-node-state").unlink()
    extra = _run(tmp_path, "/abs/runs/extra", ["site_0"], [2], 40)
    (extra / ".fedlit-node-state").unlink()
    (extra / "site_0" / "round_2.png").write_bytes(b"x")  # one file fedlit never writes: not its layout
    _aged(extra, 40)
    main(["node-state", "--state_dir", str(tmp_path), "--older_than", "30", "--delete"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"kept {extra.name}: not a node state") and out[1].startswith(f"deleted {legacy.name}")
    assert len(out) == 2 and not legacy.exists() and (extra / "site_0" / "round_2.pt").is_file()
