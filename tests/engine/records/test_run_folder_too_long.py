"""A run folder whose name or path is too long for the file system (ENAMETOOLONG) is refused with one line naming
``--out_dir``, the path and the fix, not a traceback."""

from __future__ import annotations

import pytest

from fedlit.core.errors import RunDirError
from fedlit.engine.records.run_folder import check_run_dir, claim_run_dir, new_version_dir
from tests.test_cli import QUICK, error_of

FIX = "the path is too long for the file system"


def test_a_too_long_out_dir_is_one_line_before_anything_is_built(tmp_path, capsys):
    out_dir = tmp_path / ("x" * 300)
    err = error_of(["fit", *QUICK, "--out_dir", str(out_dir), "--federation.rounds", "1"], capsys)
    assert err.startswith(f"fedlit: error: --out_dir {out_dir}: {FIX}") and err.count("\n") == 1
    assert "Choose a shorter --out_dir (or --name)." in err and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("shape", ["name", "path"])
def test_every_way_a_run_folder_is_made_names_out_dir(tmp_path, shape):
    # a folder name over 255 bytes, or a whole path over 4096
    out_dir = tmp_path / ("x" * 300) if shape == "name" else tmp_path.joinpath(*["y" * 250] * 20)
    for make in (
        lambda: check_run_dir(out_dir, resume=False),
        lambda: claim_run_dir(out_dir, resume=False),
        lambda: claim_run_dir(out_dir, resume=True),
        lambda: new_version_dir(out_dir),
    ):
        with pytest.raises(RunDirError, match=f"--out_dir .*: {FIX}"):
            make()
