"""FedPolyp on tiny PNGs written in PraNet's layout and in per-site folders: sites, pairing, masks, splits."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedlit.core.errors import ConfigError, DataError
from fedlit.data import FedPolyp

WIDTH, HEIGHT = 12, 8


def _pair(images: Path, masks: Path, stem: str, image_ext: str = ".png", colour: tuple = (10, 20, 30)) -> None:
    """An RGB image and its mask: grey 255 (polyp) in columns 0..2, 128 (polyp) in 3..5, 127 (not) in 6..8."""
    images.mkdir(parents=True, exist_ok=True)
    masks.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (WIDTH, HEIGHT), colour).save(images / f"{stem}{image_ext}")
    grey = np.zeros((HEIGHT, WIDTH), dtype=np.uint8)
    grey[:, 0:3], grey[:, 3:6], grey[:, 6:9] = 255, 128, 127
    Image.fromarray(grey).save(masks / f"{stem}.png")


@pytest.fixture
def pranet(tmp_path: Path) -> Path:
    train = tmp_path / "TrainDataset"
    for stem in ("cju0qkwl35piu0993l0dewei2", "cju0roawvklrq0799vmjorwfv", "cju0rx1idathl0835detmsp84", "1", "2", "3"):
        _pair(train / "image", train / "mask", stem)
    test = tmp_path / "TestDataset"
    for site, stems in (
        ("Kvasir", ["cju0s2a9ekvms080138tjjpxr", "cju0s690hkp960855tjuaqvv0"]),
        ("CVC-ClinicDB", ["600", "601"]),
        ("CVC-ColonDB", [str(i) for i in range(1, 6)]),
        ("ETIS-LaribPolypDB", [str(i) for i in range(1, 6)]),
        ("CVC-300", ["150", "151"]),
    ):
        for stem in stems:
            _pair(test / site / "images", test / site / "masks", stem)
    return tmp_path


def test_pranet_layout_gives_four_sites_with_the_train_files_sorted_by_name(pranet: Path) -> None:
    data = FedPolyp(root=pranet, image_size=16)
    assert data.client_ids == ["Kvasir", "ETIS-LaribPolypDB", "CVC-ColonDB", "CVC-ClinicDB"]  # FedSCA's C1-C4
    assert data.task == "segmentation" and data.num_classes == 1 and data.class_counts() is None
    manifest = json.loads(json.dumps(data.manifest()))
    held = {
        site: sorted(image for split in ("train", "val", "test") for image, _ in manifest["clients"][site][split])
        for site in data.client_ids
    }
    assert held["Kvasir"] == sorted(
        [
            "TrainDataset/image/cju0qkwl35piu0993l0dewei2.png",
            "TrainDataset/image/cju0roawvklrq0799vmjorwfv.png",
            "TrainDataset/image/cju0rx1idathl0835detmsp84.png",
            "TestDataset/Kvasir/images/cju0s2a9ekvms080138tjjpxr.png",
            "TestDataset/Kvasir/images/cju0s690hkp960855tjuaqvv0.png",
        ]
    )
    assert held["CVC-ClinicDB"] == sorted(
        [
            *(f"TrainDataset/image/{i}.png" for i in (1, 2, 3)),
            "TestDataset/CVC-ClinicDB/images/600.png",
            "TestDataset/CVC-ClinicDB/images/601.png",
        ]
    )
    assert held["CVC-ColonDB"] == sorted(f"TestDataset/CVC-ColonDB/images/{i}.png" for i in range(1, 6))
    for site in data.client_ids:  # 5 pairs split 8:0:2
        assert [data.num_examples(site, s) for s in ("train", "val", "test")] == [4, 0, 1]
        for image, mask in manifest["clients"][site]["test"]:
            assert Path(image).stem == Path(mask).stem
    assert manifest["details"]["pairs_from"]["Kvasir"] == {"TrainDataset": 3, "TestDataset/Kvasir": 2}
    assert FedPolyp(root=pranet, sites=["CVC-300"]).client_ids == ["CVC-300"]  # not a default site, but allowed


def test_split_is_seeded_per_site(pranet: Path) -> None:
    first = FedPolyp(root=pranet, seed=3, split_fractions=(0.6, 0.2, 0.2)).manifest()["clients"]
    assert first == FedPolyp(root=pranet, seed=3, split_fractions=(0.6, 0.2, 0.2)).manifest()["clients"]
    tested = {FedPolyp(root=pranet, seed=s).manifest()["clients"]["ETIS-LaribPolypDB"]["test"][0][0] for s in range(6)}
    assert len(tested) > 1
    assert [len(first["CVC-ColonDB"][s]) for s in ("train", "val", "test")] == [3, 1, 1]


def test_masks_are_grey_above_127_and_images_rgb_resized(pranet: Path) -> None:
    data = FedPolyp(root=pranet, image_size=None, sites=["ETIS-LaribPolypDB"])
    image, mask = data.test_dataloader("ETIS-LaribPolypDB").dataset[0]
    assert image.shape == (3, HEIGHT, WIDTH) and mask.shape == (1, HEIGHT, WIDTH)
    assert torch.allclose(image[:, 0, 0], torch.tensor([10.0, 20.0, 30.0]) / 255)
    expected = torch.zeros(HEIGHT, WIDTH)
    expected[:, 0:6] = 1  # 255 and 128 are polyp, 127 and 0 are not
    assert torch.equal(mask[0], expected)
    image, mask = next(iter(FedPolyp(root=pranet, image_size=16).test_dataloader("Kvasir")))
    assert image.shape == (1, 3, 16, 16) and mask.shape == (1, 1, 16, 16)
    assert set(mask.unique().tolist()) == {0.0, 1.0}


def test_site_folders_pair_by_name_without_extension_and_crop_train_only(tmp_path: Path) -> None:
    for stem in ("a", "b", "c", "d", "e"):
        _pair(tmp_path / "Kvasir" / "images", tmp_path / "Kvasir" / "masks", stem, image_ext=".jpg")
        _pair(tmp_path / "ETIS-LaribPolypDB" / "image", tmp_path / "ETIS-LaribPolypDB" / "mask", stem)
    data = FedPolyp(root=tmp_path, image_size=16, crop_size=8)
    assert data.client_ids == ["Kvasir", "ETIS-LaribPolypDB"]
    assert data.manifest()["clients"]["Kvasir"]["test"][0][0].endswith(".jpg")
    image, mask = next(iter(data.train_dataloader("Kvasir", torch.Generator().manual_seed(0))))
    assert image.shape == (4, 3, 8, 8) and mask.shape == (4, 1, 8, 8)
    image, _ = next(iter(data.test_dataloader("Kvasir")))
    assert image.shape == (1, 3, 16, 16)


def test_unmatched_files_are_named_or_skipped(pranet: Path) -> None:
    Image.new("RGB", (WIDTH, HEIGHT)).save(pranet / "TrainDataset" / "image" / "7.png")
    Image.new("L", (WIDTH, HEIGHT)).save(pranet / "TestDataset" / "Kvasir" / "masks" / "cju1.png")
    with pytest.raises(DataError) as err:
        FedPolyp(root=pranet).setup()
    message = str(err.value)
    assert "TrainDataset/image/7.png (no mask)" in message and "TestDataset/Kvasir/masks/cju1.png (no image)" in message
    assert "data.init_args.unmatched skip" in message
    with pytest.warns(UserWarning, match=r"TrainDataset/image/7\.png"):
        data = FedPolyp(root=pranet, unmatched="skip")
        assert data.num_examples("CVC-ClinicDB", "train") == 4
    with pytest.raises(DataError, match=r"Kvasir/masks/cju1\.png"):  # the same mask, once the ClinicDB file is gone
        FedPolyp(root=pranet, sites=["Kvasir"]).setup()
    FedPolyp(root=pranet, sites=["CVC-ColonDB"]).setup()  # the other sites' files do not concern it


def test_missing_folders_sizes_and_options_are_named(pranet: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"data\.init_args\.root: no folder .*TestDataset/<site>.*DengPingFan/PraNet"):
        FedPolyp(root=tmp_path / "absent")
    with pytest.raises(DataError, match=r"data\.init_args\.sites: \['Endoscene'\] are not found"):
        FedPolyp(root=pranet, sites=["Endoscene"])
    with pytest.raises(ConfigError, match=r"data\.init_args\.split_fractions"):
        FedPolyp(root=pranet, split_fractions=(0.5, 0.5, 0.0))
    Image.new("L", (5, 5)).save(pranet / "TestDataset" / "CVC-ColonDB" / "masks" / "3.png")
    data = FedPolyp(root=pranet, sites=["CVC-ColonDB"])
    with pytest.raises(DataError, match=r"CVC-ColonDB/masks/3\.png: mask is 5x5 but its image .*3\.png is 12x8"):
        for split in ("train", "test"):
            list(data._loader("CVC-ColonDB", split, 1, shuffle=False))
    (pranet / "TestDataset" / "CVC-ColonDB" / "images" / "4.jpg").write_bytes(b"")
    with pytest.raises(DataError, match=r"share the name '4'"):
        FedPolyp(root=pranet, sites=["CVC-ColonDB"]).setup()


def test_a_site_built_alone_is_the_site_built_among_all(pranet: Path) -> None:
    """A Flower node builds its own site only (``only_site``): the same pairs and the same split as among all."""
    together = FedPolyp(root=pranet, seed=3, split_fractions=(0.6, 0.2, 0.2)).manifest()["clients"]
    for site in ("CVC-ColonDB", "ETIS-LaribPolypDB"):
        alone = FedPolyp(root=pranet, seed=3, split_fractions=(0.6, 0.2, 0.2))
        alone.only_site(site)
        assert alone.client_ids == [site]
        assert alone.manifest()["clients"][site] == together[site]
