"""FedFundus and FedProstateSlices with ``split_fractions``: a site's train and test folders pooled and split again."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedlit.core.errors import ConfigError, DataError
from fedlit.data import FedFundus, FedProstateSlices


def _fundus(root: Path, site: str, split: str, count: int) -> None:
    folder = root / site / split / "ROIs"
    for kind in ("image", "mask"):
        (folder / kind).mkdir(parents=True, exist_ok=True)
    for i in range(count):
        Image.new("RGB", (4, 4), (10, 20, 30)).save(folder / "image" / f"{split}_{i:03d}.png")
        Image.new("L", (4, 4), 255).save(folder / "mask" / f"{split}_{i:03d}.png")


def _slices(root: Path, site: str, split: str, count: int) -> None:
    for kind in ("image", "mask"):
        (root / site / split / kind).mkdir(parents=True, exist_ok=True)
    for i in range(count):
        Image.new("L", (4, 4), 90).save(root / site / split / "image" / f"{split}_{i}.png")
        Image.new("L", (4, 4), 0).save(root / site / split / "mask" / f"{split}_{i}.png")


def test_fundus_domain2_pooled_and_split_8_to_2(tmp_path: Path) -> None:
    # FedDG's Domain2: 99 train and 60 test images. Pooled: 159; 8:0:2 -> 127.2 and 31.8, rounded by largest
    # remainder (0.8 > 0.2) to 127 train and 32 test.
    _fundus(tmp_path, "Domain2", "train", 99)
    _fundus(tmp_path, "Domain2", "test", 60)
    folders = FedFundus(root=tmp_path, image_size=None)
    assert [folders.num_examples("Domain2", s) for s in ("train", "val", "test")] == [99, 0, 60]
    data = FedFundus(root=tmp_path, image_size=None, split_fractions=(0.8, 0.0, 0.2), seed=4)
    assert [data.num_examples("Domain2", s) for s in ("train", "val", "test")] == [127, 0, 32]
    clients = data.manifest()["clients"]["Domain2"]
    names = [image for split in ("train", "test") for image, _ in clients[split]]
    assert len(set(names)) == 159  # every pair once
    tested = {image.split("/")[1] for image, _ in clients["test"]}
    assert tested == {"train", "test"}  # the new test split draws from both folders
    assert data.manifest()["details"]["split_fractions"] == [0.8, 0.0, 0.2]
    again = FedFundus(root=tmp_path, image_size=None, split_fractions=(0.8, 0.0, 0.2), seed=4)
    assert again.manifest()["clients"] == data.manifest()["clients"]


def test_prostate_slices_split_is_the_sites_own_and_checked(tmp_path: Path) -> None:
    # 5 + 3 pairs pooled: 8 split 2:1:1 -> 4 train, 2 val, 2 test.
    for site in ("BIDMC", "UCL"):
        _slices(tmp_path, site, "train", 5)
        _slices(tmp_path, site, "test", 3)
    full = FedProstateSlices(root=tmp_path, image_size=None, split_fractions=(0.5, 0.25, 0.25), seed=1)
    assert [full.num_examples("UCL", s) for s in ("train", "val", "test")] == [4, 2, 2]
    alone = FedProstateSlices(root=tmp_path, image_size=None, split_fractions=(0.5, 0.25, 0.25), seed=1, sites=["UCL"])
    assert alone.manifest()["clients"]["UCL"] == full.manifest()["clients"]["UCL"]
    seeds = {
        tuple(
            np.ravel(
                FedProstateSlices(root=tmp_path, image_size=None, split_fractions=(0.5, 0.25, 0.25), seed=s).manifest()[
                    "clients"
                ]["UCL"]["test"]
            )
        )
        for s in range(5)
    }
    assert len(seeds) > 1  # the seed picks the split
    with pytest.raises(ConfigError, match=r"val_fraction=0\.1 and data\.init_args\.split_fractions are both given"):
        FedProstateSlices(root=tmp_path, val_fraction=0.1, split_fractions=(0.8, 0.0, 0.2))
    with pytest.raises(ConfigError, match=r"split_fractions must be three fractions"):
        FedProstateSlices(root=tmp_path, split_fractions=(0.8, 0.0, 0.1))
    _slices(tmp_path, "HK", "test", 1)
    (tmp_path / "HK" / "train" / "image").mkdir(parents=True)
    (tmp_path / "HK" / "train" / "mask").mkdir(parents=True)
    with pytest.raises(DataError, match=r"site HK has 1 \(image, mask\) pairs .* fewer than the non-empty splits"):
        FedProstateSlices(root=tmp_path, split_fractions=(0.8, 0.0, 0.2)).setup()
