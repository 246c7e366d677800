"""A run's record files are written atomically: a temporary file in the same folder renamed over the target, so a
run killed (or a disk filled) mid-write leaves the old file or the new one, never a truncated one."""

from __future__ import annotations

import os
import stat

import pytest

from fedlit.cli import run
from fedlit.core import files
from fedlit.core.files import write_text_atomic
from tests.test_cli import QUICK


def test_write_text_atomic_replaces_the_file_whole(tmp_path):
    path = tmp_path / "results.json"
    path.write_text("old")
    write_text_atomic(path, '{"new": "é"}')
    assert path.read_text(encoding="utf-8") == '{"new": "é"}' and os.listdir(tmp_path) == ["results.json"]
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask  # as a plain write, not mkstemp's 0600


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    path.write_text("old")

    def full_disk(*_args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "replace", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_text_atomic(path, "new")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["results.json"]


def test_a_run_writes_its_record_files_atomically(tmp_path, monkeypatch):
    replaced = []
    real = os.replace

    def spy(src, dst):
        assert os.path.dirname(src) == os.path.dirname(dst)  # same folder: a rename, never a copy
        replaced.append(os.path.relpath(dst, tmp_path))
        real(src, dst)

    monkeypatch.setattr(files.os, "replace", spy)
    run(["fit", *QUICK, "--out_dir", str(tmp_path), "--federation.rounds", "1"])
    assert {"results.json", "results.md", "config.json", "manifest.json", "class_counts.json"} <= set(replaced)
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]
