"""``SiteFolders``' bad folders: images of several sizes kept at their size, a labels CSV listing a file twice,
entries that are no file (a FIFO, a link to itself), an unreadable class folder, a rare class, and an unreadable
image read by DataLoader workers (one line on stderr)."""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import pytest
from PIL import Image

from fedlit.cli import main
from fedlit.core.errors import DataError
from fedlit.data import SiteFolders, folders_read


def _png(path: Path, width: int = 8, height: int = 8, value: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (width, height), (value, 0, 0)).save(path)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """Sites s1 and s2, classes a and b, 6 images 8x8 each."""
    for site in ("s1", "s2"):
        for c, name in enumerate("ab"):
            for i in range(6):
                _png(tmp_path / "sites" / site / name / f"{i}.png", value=100 * c + i)
    return tmp_path / "sites"


def _built(root: Path, **kwargs) -> tuple[SiteFolders, list[str]]:
    data = SiteFolders(root=root, **{"image_size": 8, "split_fractions": (0.5, 0.25, 0.25), "batch_size": 4, **kwargs})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data.setup()
    return data, [str(w.message) for w in caught]


def test_images_of_two_sizes_without_image_size_are_refused_naming_two_files(root: Path) -> None:
    data, _ = _built(root, image_size=None)  # one size: kept as it is
    assert tuple(next(iter(data.test_dataloader("s1")))[0].shape[1:]) == (3, 8, 8)
    _png(root / "s2" / "b" / "3.png", width=10, height=6)
    expected = f"{root / 's1' / 'a' / '0.png'} is 8x8 and {root / 's2' / 'b' / '3.png'} is 10x6 (width x height)"
    with pytest.raises(DataError, match=re.escape(expected)):
        _built(root, image_size=None)
    resized, _ = _built(root)  # image_size 8 resizes them all
    assert resized.num_examples("s2", "train") == 6


def test_a_file_listed_again_in_a_labels_csv_is_refused_naming_its_lines(root: Path) -> None:
    table = root / "s1" / "labels.csv"
    table.write_text("file,label\na/0.png,a\nb/0.png,b\na/1.png,a\n./a/0.png,a\na/0.png,b\nb/1.png,b\n")
    with pytest.raises(DataError) as info:
        _built(root)
    message = str(info.value)
    assert message.startswith(f"{table}: line 5: file ./a/0.png is listed again (first at line 2)")
    assert "; line 6: file a/0.png is listed again (first at line 2)" in message
    assert "line 7" not in message


def test_a_fifo_and_a_link_to_itself_are_named_in_a_warning(root: Path) -> None:
    os.mkfifo(root / "s1" / "a" / "pipe.png")
    (root / "s2" / "b" / "loop.png").symlink_to("loop.png")
    (root / "s2" / "b" / "more").symlink_to(root / "s1" / "b")
    os.mkfifo(root / "s2" / "pipe")  # beside the class folders
    data, messages = _built(root)
    (message,) = [m for m in messages if "skipped" in m]
    assert "skipped 4 entries, not read as images" in message
    assert f"{root / 's1' / 'a' / 'pipe.png'} (a FIFO (named pipe), not a file)" in message
    assert (
        f"{root / 's2' / 'b' / 'loop.png'} (a link that cannot be followed: Too many levels of symbolic links)"
        in message
    )
    assert f"{root / 's2' / 'b' / 'more'} (a link to a folder, not followed)" in message
    assert f"{root / 's2' / 'pipe'} (a FIFO (named pipe), not a file)" in message
    assert data.class_counts() is not None and data.num_examples("s1", "train") == 6  # the images are all kept


def test_an_unreadable_class_folder_is_refused_as_an_unreadable_file(root: Path, monkeypatch) -> None:
    # root reads every folder: the listing's PermissionError is made here (the chmod test below runs as a user)
    locked, scandir = root / "s2" / "b", os.scandir

    def refuse(path: os.PathLike) -> object:
        if Path(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    monkeypatch.setattr(folders_read.os, "scandir", refuse)
    with pytest.raises(
        DataError, match=re.escape(f"{locked}: cannot be read as a folder (PermissionError: Permission denied)")
    ):
        _built(root)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a folder of mode 000; the test above covers it")
def test_a_class_folder_of_mode_000_is_refused(root: Path) -> None:
    locked = root / "s2" / "b"
    locked.chmod(0)
    try:
        with pytest.raises(DataError, match=re.escape(f"{locked}: cannot be read as a folder (PermissionError")):
            _built(root)
    finally:
        locked.chmod(0o755)


def test_a_class_of_one_image_warns_naming_it(root: Path) -> None:
    _png(root / "s2" / "c" / "0.png")
    _, messages = _built(root)
    (message,) = [m for m in messages if "whole pool" in m]
    assert f"a class has fewer than 5 samples in the whole pool: 'c': 1 (first at {root / 's2' / 'c'})" in message


RECIPE = """
model:
  class_path: fedlit.tasks.ClassificationModule
  init_args:
    backbone: {class_path: fedlit.models.SmallCNN, init_args: {in_channels: 3, width: 4, depth: 2}}
    num_classes: 2
    roles: [{pattern: "backbone.*", role: shared}]
data:
  class_path: fedlit.data.SiteFolders
  init_args: {root: ROOT, image_size: 8, split_fractions: [0.5, 0.25, 0.25], batch_size: 4, num_workers: 2}
strategy: {class_path: FedAvg}
federation: {rounds: 1, local_epochs: 1, seed: 0, progress_bar: false}
"""


def test_a_bad_image_read_by_workers_gives_one_line_on_stderr(root: Path, tmp_path: Path, capfd) -> None:
    data = SiteFolders(root=root, image_size=8, split_fractions=(0.5, 0.25, 0.25))  # the recipe's split
    for name in data.manifest()["clients"]["s1"]["train"]:  # train images only: the export record reads a test one
        (root / name).write_bytes(b"not a png")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE.replace("ROOT", str(root)))
    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", str(recipe), "--out_dir", str(tmp_path / "run")])
    assert info.value.code == 2
    err = capfd.readouterr().err
    assert "Traceback" not in err and "worker process" not in err
    (line,) = [line for line in err.splitlines() if line.startswith("fedlit: error:")]
    assert re.fullmatch(
        rf"fedlit: error: {re.escape(str(root / 's1'))}/[ab]/\d\.png: cannot be read as an image .*", line
    )
