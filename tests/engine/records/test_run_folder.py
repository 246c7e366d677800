"""Run folders: a fresh run never overwrites another, two live runs never share one, a killed run's lock is taken
over, and version numbers are handed out exclusively."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest

from fedlit.core.errors import RunDirError
from fedlit.engine.records import run_folder as rundir
from fedlit.engine.records.run_folder import (
    LOCK_NAME,
    check_run_dir,
    claim_run_dir,
    lock_holder,
    new_version_dir,
    run_files,
    run_versions,
)
from tests.children import popen_child, run_child


def dead_pid() -> int:
    """The pid of a process that has already exited."""
    done = run_child([sys.executable, "-c", "import os; print(os.getpid())"])
    return int(done.stdout)


def finished_run(folder):
    folder.mkdir(parents=True)
    (folder / "results.json").write_text("{}")
    (folder / "checkpoints").mkdir()
    return folder


def test_a_run_holds_its_lock_until_the_end(tmp_path):
    out = tmp_path / "a" / "run"
    with claim_run_dir(out, resume=False) as lock:
        assert out.is_dir() and lock.held
        record = json.loads((out / LOCK_NAME).read_text())
        assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
        assert lock_holder(out)["pid"] == os.getpid()
    assert not lock.held and not (out / LOCK_NAME).exists() and lock_holder(out) is None


def test_the_lock_goes_when_the_run_raises(tmp_path):
    with pytest.raises(KeyError), claim_run_dir(tmp_path, resume=False):
        raise KeyError("boom")
    assert not (tmp_path / LOCK_NAME).exists()
    claim_run_dir(tmp_path, resume=False).release()


def test_a_fresh_run_refuses_a_folder_holding_a_run_and_a_resume_continues_it(tmp_path):
    out = finished_run(tmp_path / "run")
    with pytest.raises(RunDirError) as error:
        claim_run_dir(out, resume=False)
    message = str(error.value)
    assert f"out_dir {out} already holds a run (results.json, checkpoints/)" in message
    assert "Choose another out_dir" in message and "--ckpt_path last" in message
    assert not (out / LOCK_NAME).exists()  # the refused claim left no lock behind
    with pytest.raises(RunDirError, match="already holds a run"):
        check_run_dir(out, resume=False)
    with claim_run_dir(out, resume=True):
        assert (out / LOCK_NAME).is_file()


def killed_run(folder):
    """The folder of a run killed before its first checkpoint: its first files written, its lock left behind."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "manifest.json", "class_counts.json"):
        (folder / name).write_text("{}")
    (folder / "metrics.csv").write_text("round,client,split,metric,value\n1,c0,train,loss,0.5\n")
    (folder / "tensorboard").mkdir()
    (folder / "tensorboard" / "events.out.tfevents.1").write_bytes(b"the killed run's events")
    (folder / "checkpoints").mkdir()
    (folder / LOCK_NAME).write_text(json.dumps({"pid": dead_pid(), "host": socket.gethostname()}))
    return folder


def test_a_fresh_run_takes_over_the_folder_of_a_run_killed_before_its_first_checkpoint(tmp_path):
    out = killed_run(tmp_path / "run")
    (out / "notes.txt").write_text("mine")
    check_run_dir(out, resume=False)
    with pytest.warns(UserWarning) as said:
        lock = claim_run_dir(out, resume=False)
    messages = [str(w.message) for w in said]
    assert any("taking over the lock of a run that ended" in m for m in messages)
    assert (
        f"out_dir {out} holds a run that stopped before its first checkpoint (config.json, manifest.json, "
        "class_counts.json, metrics.csv, checkpoints/, tensorboard/): it has nothing to resume, so this run "
        "starts it again from round 1 and replaces its files."
    ) in messages
    assert run_files(out) == [] and (out / "notes.txt").read_text() == "mine" and lock.held
    lock.release()


def test_a_folder_with_a_checkpoint_or_results_or_a_live_run_is_never_taken_over(tmp_path):
    with_checkpoint = killed_run(tmp_path / "ckpt")
    (with_checkpoint / "checkpoints" / "best.ckpt").write_bytes(b"a checkpoint to resume")
    with_results = killed_run(tmp_path / "results")
    (with_results / "results.json").write_text("{}")
    for out in (with_checkpoint, with_results):
        for check in (check_run_dir, claim_run_dir):
            with pytest.raises(RunDirError, match="already holds a run"), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the stale lock is taken over before the folder is refused
                check(out, resume=False)
        assert (out / "config.json").is_file() and (out / "tensorboard").is_dir()
    live = killed_run(tmp_path / "live")
    with pytest.warns(UserWarning, match="taking over the lock"):
        holder = claim_run_dir(live, resume=True)  # a run of this process, not yet at its first checkpoint
    with holder:
        for check in (check_run_dir, claim_run_dir):
            with pytest.raises(RunDirError, match="is in use by another run"):
                check(live, resume=False)
    assert (live / "config.json").is_file()


def test_an_empty_existing_folder_or_unrelated_files_are_fine(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    check_run_dir(tmp_path, resume=False)
    claim_run_dir(tmp_path, resume=False).release()
    assert run_files(tmp_path) == [] and (tmp_path / "notes.txt").read_text() == "mine"


def test_a_second_run_into_a_locked_folder_is_refused(tmp_path):
    with claim_run_dir(tmp_path, resume=False):
        for resume in (False, True):
            with pytest.raises(RunDirError) as error:
                claim_run_dir(tmp_path, resume=resume)
            message = str(error.value)
            assert f"out_dir {tmp_path} is in use by another run (pid {os.getpid()} on host" in message
            assert "Choose another out_dir (--out_dir), or wait for that run to end." in message
        with pytest.raises(RunDirError, match=f"pid {os.getpid()}"):
            check_run_dir(tmp_path, resume=True)
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()  # the holder's record kept


def test_the_lock_of_a_dead_run_is_taken_over_with_a_warning(tmp_path):
    pid = dead_pid()
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": pid, "host": socket.gethostname()}))
    assert lock_holder(tmp_path) is None
    check_run_dir(tmp_path, resume=False)
    with pytest.warns(UserWarning, match=f"taking over the lock of a run that ended without releasing it \\(pid {pid}"):
        lock = claim_run_dir(tmp_path, resume=False)
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    lock.release()


HOLDER = """
import sys, time, types
package = types.ModuleType("fedlit")  # import run_folder alone: the package would load torch (seconds)
package.__path__ = [sys.argv[1]]
sys.modules["fedlit"] = package
from fedlit.engine.records.run_folder import claim_run_dir
lock = claim_run_dir(sys.argv[2], resume=False)
print("holding", flush=True)
time.sleep(60)
"""


def test_a_live_run_in_another_process_holds_the_folder_until_it_is_killed(tmp_path):
    child = popen_child(
        [sys.executable, "-c", HOLDER, str(Path(rundir.__file__).parent), str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "holding"
        with pytest.raises(RunDirError, match=f"in use by another run \\(pid {child.pid} on host"):
            claim_run_dir(tmp_path, resume=True)
        with pytest.raises(RunDirError, match=f"pid {child.pid}"):
            check_run_dir(tmp_path, resume=True)
    finally:
        child.kill()  # SIGKILL: the run ends without releasing its lock
        child.wait()
    assert (tmp_path / LOCK_NAME).is_file() and lock_holder(tmp_path) is None
    with pytest.warns(UserWarning, match=f"taking over the lock .*pid {child.pid}"):
        claim_run_dir(tmp_path, resume=True).release()


def test_without_flock_the_recorded_pid_decides(tmp_path, monkeypatch):
    monkeypatch.setattr(rundir, "_flock", lambda fd, shared: None)  # a file system without flock
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
    with pytest.raises(RunDirError, match=f"in use by another run \\(pid {os.getpid()}"):
        claim_run_dir(tmp_path, resume=False)
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": 1, "host": "elsewhere"}))
    with pytest.raises(RunDirError, match=f"If that run has ended, delete {tmp_path / LOCK_NAME}"):
        check_run_dir(tmp_path, resume=False)
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": dead_pid(), "host": socket.gethostname()}))
    with pytest.warns(UserWarning, match="taking over"):
        claim_run_dir(tmp_path, resume=False).release()


def test_a_file_is_not_a_run_folder(tmp_path):
    (tmp_path / "f").write_text("")
    for check in (claim_run_dir, check_run_dir):
        with pytest.raises(RunDirError, match="is a file, not a folder"):
            check(tmp_path / "f", resume=False)


def test_version_folders_are_handed_out_exclusively(tmp_path, monkeypatch):
    root = tmp_path / "runs" / "recipe"
    assert [new_version_dir(root).name for _ in range(2)] == ["version_0", "version_1"]
    # a listing that is out of date (another run created a folder since) still gives a new folder
    monkeypatch.setattr(rundir, "_versions", lambda root: [])
    assert new_version_dir(root).name == "version_2"
    monkeypatch.undo()
    made: list = []
    threads = [threading.Thread(target=lambda: made.append(new_version_dir(root))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(made)) == 8 and all(p.is_dir() for p in made)


def test_run_versions_are_numbered_and_skip_empty_folders(tmp_path):
    for n in (2, 10, 9):
        finished_run(tmp_path / f"version_{n}")
    (tmp_path / "version_11").mkdir()  # a run that stopped before writing anything
    (tmp_path / "version_12").mkdir()
    (tmp_path / "version_12" / LOCK_NAME).write_text("{}")  # a run that has only taken its lock
    (tmp_path / "other").mkdir()
    assert [p.name for p in run_versions(tmp_path)] == ["version_2", "version_9", "version_10", "version_12"]
    assert run_versions(tmp_path / "absent") == []
