"""Checkpoint files: a clear error for a missing, truncated or foreign file (never advice to unpickle code), and a
full disk that keeps the previous checkpoint."""

from __future__ import annotations

import errno
import os
import pickle
import re
from pathlib import Path

import pytest
import torch

from fedlit.core import checkpoint_io as checkpoint
from fedlit.core.checkpoint_io import load_checkpoint, save_checkpoint
from fedlit.core.errors import CheckpointError, RunDirError


class NotData:
    """An arbitrary Python object: what ``weights_only=True`` refuses to unpickle."""


def saved(tmp_path) -> Path:
    return save_checkpoint(tmp_path / "checkpoints" / "last.ckpt", {"server_round": 3, "w": torch.arange(4.0)})


def chain(err: BaseException) -> str:
    """Every message Python would print for ``err``, its causes and contexts included."""
    texts, node = [], err
    while node is not None:
        texts.append(str(node))
        node = node.__cause__ or (None if node.__suppress_context__ else node.__context__)
    return "\n".join(texts)


def test_a_checkpoint_round_trips(tmp_path):
    payload = load_checkpoint(saved(tmp_path))
    assert payload["server_round"] == 3 and torch.equal(payload["w"], torch.arange(4.0))
    assert payload["format_version"] == checkpoint.FORMAT_VERSION
    assert not (tmp_path / "checkpoints" / "last.ckpt.tmp").exists()


@pytest.mark.parametrize(
    "make, reason",
    [
        (
            lambda good, bad: bad.write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2]),
            "its zip archive is incomplete",
        ),
        (lambda good, bad: bad.write_bytes(b""), "it ends before any data"),
        (lambda good, bad: bad.write_text("model: {lr: 0.1}\n"), r"\w+Error while unpickling"),
        (lambda good, bad: bad.write_bytes(pickle.dumps({"x": NotData()})), r"\w+Error while unpickling"),
        (
            lambda good, bad: torch.save({"x": NotData()}, bad),
            re.escape(f"it holds a Python object of class {__name__}.NotData, which a fedlit checkpoint never does"),
        ),
    ],
)
def test_an_unreadable_file_names_itself_and_never_suggests_unpickling(tmp_path, make, reason):
    bad = tmp_path / "bad.ckpt"
    make(saved(tmp_path), bad)
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(bad)
    assert re.match(
        re.escape(f"ckpt_path: {bad} is not a readable fedlit checkpoint (")
        + reason
        + re.escape("): the file is truncated or corrupted"),
        str(error.value),
    )
    assert "weights_only" not in chain(error.value)


@pytest.mark.parametrize(
    "payload, held", [(torch.ones(2), "a Tensor"), ({"w": torch.ones(2)}, "a dict without format_version")]
)
def test_a_foreign_torch_file_is_not_a_checkpoint(tmp_path, payload, held):
    torch.save(payload, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match=f"other.pt holds {held}, not a fedlit checkpoint"):
        load_checkpoint(tmp_path / "other.pt")


def test_another_format_version_is_refused(tmp_path):
    torch.save({"format_version": 99}, tmp_path / "future.ckpt")
    with pytest.raises(CheckpointError, match="has checkpoint format 99, this fedlit reads format 1"):
        load_checkpoint(tmp_path / "future.ckpt")


def test_a_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match=f"ckpt_path: no checkpoint at {tmp_path / 'nope.ckpt'}"):
        load_checkpoint(tmp_path / "nope.ckpt")


def test_a_full_disk_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = saved(tmp_path)
    before = path.read_bytes()

    def save_until_the_disk_is_full(obj, file):
        file.write(b"partial" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", save_until_the_disk_is_full)
    with pytest.raises(RunDirError) as error:
        save_checkpoint(path, {"server_round": 4})
    assert str(error.value).startswith(
        f"no space left on device (ENOSPC) writing {path}; the previous checkpoint is kept."
    )
    assert path.read_bytes() == before and not path.with_suffix(".ckpt.tmp").exists()
    with pytest.raises(RunDirError, match="ENOSPC.*no checkpoint was written before"):
        save_checkpoint(tmp_path / "fresh" / "last.ckpt", {"server_round": 1})


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux), a device that is always full")
def test_a_really_full_device(tmp_path):
    """torch's own writer reports a full disk as an opaque RuntimeError; the OSError behind it is found."""
    path = saved(tmp_path)
    before = path.read_bytes()
    path.with_suffix(".ckpt.tmp").symlink_to("/dev/full")  # the temporary file is written on a full device
    with pytest.raises(RunDirError, match=r"no space left on device \(ENOSPC\) writing .*previous checkpoint is kept"):
        save_checkpoint(path, {"w": torch.ones(100_000)})
    assert path.read_bytes() == before and not path.with_suffix(".ckpt.tmp").exists()


def test_an_error_that_is_not_the_disk_keeps_its_traceback(tmp_path):
    with pytest.raises((AttributeError, pickle.PicklingError), match="pickle"):
        save_checkpoint(tmp_path / "last.ckpt", {"f": lambda: 0})
    assert list(tmp_path.iterdir()) == []


def test_a_background_write_holds_the_state_of_when_it_was_asked_for_and_a_read_waits_for_it(tmp_path):
    import threading

    path, release = tmp_path / "last.ckpt", threading.Event()
    payload = {"server_round": 1, "store": {"c0": [torch.zeros(3)]}}
    frozen = checkpoint.snapshot(payload)

    def write() -> None:
        release.wait(10)
        save_checkpoint(path, frozen)

    checkpoint.write_in_background(write)
    payload["store"]["c0"][0].add_(5.0)  # the next round changes the store in place while the thread writes
    payload["server_round"] = 2
    threading.Timer(0.2, release.set).start()
    assert not path.exists()  # still held back by the event: the read below has to wait for it
    loaded = load_checkpoint(path)
    assert loaded["server_round"] == 1 and torch.equal(loaded["store"]["c0"][0], torch.zeros(3))


def test_a_failed_background_write_is_raised_at_the_next_wait_and_keeps_the_previous_checkpoint(tmp_path):
    path = saved(tmp_path)  # round 3

    def write() -> None:
        with open(path.with_suffix(".ckpt.tmp"), "wb") as file:  # killed (here: failed) half-way through
            file.write(b"PK\x03\x04 half")
        raise RunDirError("no space left on device (ENOSPC) writing last.ckpt; the previous checkpoint is kept.")

    checkpoint.write_in_background(write)
    with pytest.raises(RunDirError, match="ENOSPC"):
        checkpoint.wait_for_writes()
    checkpoint.wait_for_writes()  # raised once
    assert load_checkpoint(path)["server_round"] == 3
    checkpoint.write_in_background(write)
    with pytest.warns(UserWarning, match=r"The last checkpoint write failed: no space left"):
        checkpoint.wait_for_writes(raise_error=False)  # a run that ends on an error of its own
