"""FedProstateSlices and FedFundus: real site samples (pairs, unmatched files, mask levels), generated bad layouts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedlit.core.errors import ConfigError, DataError
from fedlit.data import FedFundus, FedPolyp, FedProstateSlices, FedProstateVolumes, PairFlip

PROSTATE_SITES = ["BIDMC", "BMC", "HK", "I2CVB", "RUNMC", "UCL"]
MATCHED_PROSTATE = [s for s in PROSTATE_SITES if s != "I2CVB"]


@pytest.fixture
def prostate_root(shared_data: Path) -> Path:
    return shared_data / "site_samples" / "ProstateSlice"


@pytest.fixture
def fundus_root(shared_data: Path) -> Path:
    return shared_data / "site_samples" / "Fundus"


def _names(folder: Path) -> set[str]:
    return {p.name for p in folder.glob("*.png")}


def test_prostate_sites_counts_and_unmatched_pair_refused_by_name(prostate_root: Path) -> None:
    data = FedProstateSlices(root=prostate_root, image_size=32, sites=MATCHED_PROSTATE)
    assert data.client_ids == MATCHED_PROSTATE and data.task == "segmentation" and data.num_classes == 1
    assert data.class_counts() is None
    for site in MATCHED_PROSTATE:
        for split in ("train", "test"):
            expected = _names(prostate_root / site / split / "image") & _names(prostate_root / site / split / "mask")
            assert data.num_examples(site, split) == len(expected) == 1
        assert data.num_examples(site, "val") == 0
    with pytest.raises(DataError) as err:
        FedProstateSlices(root=prostate_root).setup()  # all six sites, unmatched: error
    message = str(err.value)
    assert "I2CVB/train/image/00_01.png" in message and "I2CVB/train/mask/00_00.png" in message
    assert "data.init_args.unmatched skip" in message


def test_prostate_skip_warns_naming_the_files_then_refuses_the_emptied_split(prostate_root: Path) -> None:
    data = FedProstateSlices(root=prostate_root, unmatched="skip")
    with pytest.warns(UserWarning, match=r"I2CVB/train/image/00_01\.png.*I2CVB/train/mask/00_00\.png"):
        with pytest.raises(DataError, match=r"no \(image, mask\) pair in I2CVB/train .*data\.init_args\.sites"):
            data.setup()


def test_a_site_left_without_train_pairs_can_be_evaluated_only(prostate_root: Path) -> None:
    data = FedProstateSlices(root=str(prostate_root), unmatched="skip", sites_without_train="evaluate", image_size=32)
    with pytest.warns(UserWarning) as caught:
        data.setup()
    messages = " | ".join(str(w.message) for w in caught)
    assert "I2CVB/train/image/00_01.png" in messages and "I2CVB/train/mask/00_00.png" in messages
    assert "I2CVB has no (image, mask) pair to train on" in messages
    assert data.client_ids == PROSTATE_SITES and data.train_client_ids == MATCHED_PROSTATE
    assert data.num_examples("I2CVB", "train") == 0 and data.num_examples("I2CVB", "test") == 1
    assert data.manifest()["evaluation_only"] == ["I2CVB"]


def test_prostate_mask_is_the_level_0_region(prostate_root: Path) -> None:
    data = FedProstateSlices(root=prostate_root, image_size=None, sites=["BIDMC"])
    image, mask = data.test_dataloader("BIDMC").dataset[0]
    png_image = np.asarray(Image.open(prostate_root / "BIDMC/test/image/00_00.png"))
    png_mask = np.asarray(Image.open(prostate_root / "BIDMC/test/mask/00_00.png"))
    assert image.shape == (1, 384, 384) and mask.shape == (1, 384, 384)
    assert torch.equal(image[0], torch.from_numpy(png_image).float() / 255)
    assert torch.equal(mask[0], torch.from_numpy(png_mask == 0).float())
    assert 0 < mask.mean() < 0.05  # the prostate: a small region, the rest (255) background


def test_fundus_disc_and_cup_channels_follow_the_png_levels(fundus_root: Path) -> None:
    data = FedFundus(root=fundus_root, image_size=None)
    assert data.client_ids == ["Domain1", "Domain2", "Domain3", "Domain4"] and data.num_classes == 2
    png = np.asarray(Image.open(fundus_root / "Domain1/test/ROIs/mask/gdrishtiGS_001.png"))
    assert png.shape == (800, 800, 3) and set(np.unique(png)) == {0, 128, 255}
    _, mask = data.test_dataloader("Domain1").dataset[0]
    assert mask.shape == (2, 800, 800)
    for level, expected in ((0, [1.0, 1.0]), (128, [1.0, 0.0]), (255, [0.0, 0.0])):
        row, col = np.argwhere(png[..., 0] == level)[0]
        assert mask[:, row, col].tolist() == expected, level
    for site in data.client_ids:
        for split in ("train", "test"):
            for _, mask in data._loader(site, split, 1, shuffle=False).dataset:
                assert (mask[1] <= mask[0]).all()  # the disc holds the cup


def test_shapes_and_ranges_after_resize_and_manifest(fundus_root: Path, prostate_root: Path) -> None:
    fundus = FedFundus(root=fundus_root, image_size=48)
    image, mask = next(iter(fundus.test_dataloader("Domain3")))
    assert image.shape == (1, 3, 48, 48) and mask.shape == (1, 2, 48, 48)
    assert image.dtype == mask.dtype == torch.float32 and 0 <= image.min() and image.max() <= 1
    assert set(mask.unique().tolist()) == {0.0, 1.0}
    manifest = json.loads(json.dumps(fundus.manifest()))
    assert manifest["clients"]["Domain2"]["train"] == [
        ["Domain2/train/ROIs/image/G-1-L.png", "Domain2/train/ROIs/mask/G-1-L.png"]
    ]
    assert manifest["class_names"] == ["disc", "cup"] and manifest["details"]["unmatched_skipped"] == []
    image, mask = next(iter(FedProstateSlices(root=prostate_root, image_size=40, sites=["UCL"]).test_dataloader("UCL")))
    assert image.shape == mask.shape == (1, 1, 40, 40)


def test_augmentation_is_reproducible_and_moves_image_and_mask_together(fundus_root: Path) -> None:
    data = FedFundus(root=fundus_root, image_size=32, sites=["Domain1"])
    plain_image, plain_mask = data.test_dataloader("Domain1").dataset[0]  # no augmentation on test

    def draw(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(seed)
        return next(iter(data.train_dataloader("Domain1", torch.Generator().manual_seed(seed))))

    views = [draw(seed) for seed in range(8)]
    for seed, (image, mask) in enumerate(views):
        again = draw(seed)
        assert torch.equal(image, again[0]) and torch.equal(mask, again[1])
    train = data._loader("Domain1", "train", 1, shuffle=False).dataset
    train_image, train_mask = train.read(train.identities[0])  # read without the transform
    assert not torch.equal(plain_image, train_image)  # train and test are different files
    seen = set()
    for image, mask in views:
        matches = [dims for dims in ([], [-1], [-2], [-1, -2]) if torch.equal(image[0], train_image.flip(dims))]
        assert matches, "a train view is not a flip of the train image"
        assert torch.equal(mask[0], train_mask.flip(matches[0]))  # the mask moved with the image
        seen.add(tuple(matches[0]))
    assert len(seen) >= 2  # 8 seeds give more than one flip
    image, mask = PairFlip(horizontal=1.0, vertical=0.0)((train_image, train_mask))
    assert torch.equal(image, train_image.flip(-1)) and torch.equal(mask, train_mask.flip(-1))
    assert not torch.equal(plain_mask, mask)


def test_loading_through_two_workers_gives_the_same_batches(fundus_root: Path) -> None:
    serial = FedFundus(root=fundus_root, image_size=24)
    parallel = FedFundus(root=fundus_root, image_size=24, num_workers=2)
    for site in serial.client_ids:
        a, b = next(iter(serial.test_dataloader(site))), next(iter(parallel.test_dataloader(site)))
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# ---------- generated layouts


def _pair(root: Path, site: str, split: str, name: str, mask_level: int = 0, size: int = 8) -> None:
    for kind, value in (("image", 90), ("mask", None)):
        path = root / site / split / kind / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "image":
            Image.new("L", (size, size), value).save(path)
        else:
            levels = np.full((size, size), 255, dtype=np.uint8)
            levels[2:5, 2:5] = mask_level
            Image.fromarray(levels).save(path)


def test_missing_root_names_the_option_and_where_to_get_the_data(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"data\.init_args\.root: no folder .*SAML/FedDG"):
        FedProstateSlices(root=tmp_path / "absent")
    with pytest.raises(DataError, match=r"data\.init_args\.root: no folder .*ROIs/image.*FedDG's Fundus"):
        FedFundus(root=tmp_path / "absent")


def test_bad_mask_level_is_refused_naming_the_file(tmp_path: Path) -> None:
    _pair(tmp_path, "BIDMC", "train", "a.png", mask_level=0)
    _pair(tmp_path, "BIDMC", "test", "b.png", mask_level=100)
    data = FedProstateSlices(root=tmp_path, image_size=8)
    assert data.test_dataloader("BIDMC").dataset.identities == [["BIDMC/test/image/b.png", "BIDMC/test/mask/b.png"]]
    with pytest.raises(DataError, match=r"BIDMC/test/mask/b\.png: mask levels \[100\]"):
        next(iter(data.test_dataloader("BIDMC")))
    _, mask = data._loader("BIDMC", "train", 1, shuffle=False).dataset[0]
    assert mask.sum() == 9  # the 3 x 3 square at level 0


def test_empty_site_is_refused_naming_it(tmp_path: Path) -> None:
    _pair(tmp_path, "BIDMC", "train", "a.png")
    _pair(tmp_path, "BIDMC", "test", "b.png")
    (tmp_path / "HK" / "train" / "image").mkdir(parents=True)
    (tmp_path / "HK" / "test" / "mask").mkdir(parents=True)
    with pytest.raises(DataError, match=r"no \(image, mask\) pair in HK/train, HK/test .*data\.init_args\.sites"):
        FedProstateSlices(root=tmp_path).setup()


def test_skip_lists_the_unmatched_files_in_the_manifest_and_val_fraction_is_seeded(tmp_path: Path) -> None:
    for i in range(4):
        _pair(tmp_path, "UCL", "train", f"{i}.png")
    _pair(tmp_path, "UCL", "test", "t.png")
    Image.new("L", (8, 8), 3).save(tmp_path / "UCL" / "train" / "image" / "lonely.png")
    with pytest.warns(UserWarning, match=r"UCL/train/image/lonely\.png"):
        data = FedProstateSlices(root=tmp_path, unmatched="skip", val_fraction=0.25, seed=3)
        manifest = data.manifest()
    assert manifest["details"]["unmatched_skipped"] == ["UCL/train/image/lonely.png (no mask)"]
    assert (data.num_examples("UCL", "train"), data.num_examples("UCL", "val")) == (3, 1)
    val = manifest["clients"]["UCL"]["val"]
    again = FedProstateSlices(root=tmp_path, unmatched="skip", val_fraction=0.25, seed=3)
    with pytest.warns(UserWarning):
        assert again.manifest()["clients"]["UCL"]["val"] == val


def test_the_real_slices_recipe_trains_a_segmentation_model_through_the_cli(shared_data, tmp_path):
    from fedlit.cli import run

    recipe = Path(__file__).resolve().parents[2] / "recipes" / "prostate_samples_tiny_unet.yaml"
    results = run(
        [
            "fit",
            "--config",
            str(recipe),
            "--data.init_args.root",
            str(shared_data / "site_samples" / "ProstateSlice"),
            "--out_dir",
            str(tmp_path),
            "--federation.rounds",
            "1",
            "--federation.progress_bar",
            "false",
        ]
    )
    assert list(results["last"]["clients"]) == ["BIDMC", "BMC", "HK", "RUNMC", "UCL"]
    assert set(results["last"]["summary"]) >= {"dice_mean", "iou_mean", "loss_mean"}
    assert not (tmp_path / "class_counts.json").exists()
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["clients"]["HK"]["test"]


# ---------- train-time crops


def _windows(full: torch.Tensor, size: int) -> dict[tuple[int, int], torch.Tensor]:
    side = full.shape[-1]
    return {
        (top, left): full[..., top : top + size, left : left + size]
        for top in range(side - size + 1)
        for left in range(side - size + 1)
    }


def test_crops_are_windows_of_the_train_pair_reproducible_per_seed_and_test_stays_whole(prostate_root: Path) -> None:
    data = FedProstateSlices(root=prostate_root, image_size=24, crop_size=16, augment=False, sites=["BIDMC"])
    test_image, _ = next(iter(data.test_dataloader("BIDMC")))
    assert test_image.shape == (1, 1, 24, 24)  # val/test: the whole resized image, no crop
    train = data._loader("BIDMC", "train", 1, shuffle=False).dataset
    full_image, full_mask = train.read(train.identities[0])
    windows = _windows(full_image, 16)

    def crop(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(seed)
        return next(iter(data.train_dataloader("BIDMC", torch.Generator().manual_seed(seed))))

    corners = []
    for seed in range(6):
        image, mask = crop(seed)
        assert image.shape == mask.shape == (1, 1, 16, 16)
        corner = [c for c, w in windows.items() if torch.equal(w, image[0])]
        assert corner, "a train crop is not a window of the train image"
        top, left = corner[0]
        assert torch.equal(mask[0], full_mask[:, top : top + 16, left : left + 16])  # the mask is cut at the same place
        again = crop(seed)
        assert torch.equal(image, again[0]) and torch.equal(mask, again[1])
        corners.append(corner[0])
    assert len(set(corners)) > 1  # seeds draw different corners (81 possible)
    loader = data.train_dataloader("BIDMC", torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    epochs = [next(iter(loader))[0] for _ in range(4)]
    assert any(not torch.equal(epochs[0], e) for e in epochs[1:])  # later epochs draw new crops


def test_crops_through_workers_follow_the_loader_generator(prostate_root: Path) -> None:
    data = FedProstateSlices(root=prostate_root, image_size=24, crop_size=12, sites=["BIDMC"], num_workers=2)

    def epochs(seed: int) -> list[torch.Tensor]:
        loader = data.train_dataloader("BIDMC", torch.Generator().manual_seed(seed))
        return [next(iter(loader))[0] for _ in range(3)]  # each epoch draws new worker seeds from the generator

    first, again, other = epochs(5), epochs(5), epochs(6)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))
    assert not torch.equal(first[0], first[1]) or not torch.equal(first[0], first[2])


def test_crop_options_are_checked(prostate_root: Path) -> None:
    with pytest.raises(ConfigError, match=r"crop_size=400 is larger than data\.init_args\.image_size=384"):
        FedProstateSlices(root=prostate_root, crop_size=400)
    with pytest.raises(ConfigError, match=r"data\.init_args\.crop_size must be null \(no crop\) or an integer"):
        FedFundus(root=prostate_root, crop_size=0)
    data = FedProstateSlices(root=prostate_root, image_size=None, crop_size=400, sites=["UCL"])
    with pytest.raises(DataError, match=r"crop_size=400 is larger than a train image of 384x384"):
        next(iter(data.train_dataloader("UCL", torch.Generator().manual_seed(0))))
    assert (
        FedProstateSlices(root=prostate_root, crop_size=320, sites=["UCL"])
        .manifest()["details"]["train_transform"]
        .startswith("Compose([PairRandomCrop(size=320), PairFlip(")
    )


# ---------- generated fundus masks


def _fundus_pair(root: Path, split: str, name: str, mask: np.ndarray, site: str = "Domain2") -> Path:
    folder = root / site / split / "ROIs"
    (folder / "image").mkdir(parents=True, exist_ok=True)
    (folder / "mask").mkdir(parents=True, exist_ok=True)
    Image.new("RGB", mask.shape[:2][::-1], (200, 100, 50)).save(folder / "image" / name)
    Image.fromarray(mask).save(folder / "mask" / name)
    return folder / "mask" / name


def test_fundus_rgb_masks_with_equal_channels_are_grey_levels(tmp_path: Path) -> None:
    grey = np.full((6, 6), 255, dtype=np.uint8)  # background
    grey[1:5, 1:5] = 128  # disc rim: 16 pixels, the cup inside
    grey[2:4, 2:4] = 0  # cup: 4 pixels
    _fundus_pair(tmp_path, "train", "a.png", np.repeat(grey[..., None], 3, axis=2))  # RGB, three equal channels
    _fundus_pair(tmp_path, "test", "b.png", grey)  # grey PNG
    data = FedFundus(root=tmp_path, image_size=None, augment=False)
    for split in ("train", "test"):
        image, mask = data._loader("Domain2", split, 1, shuffle=False).dataset[0]
        assert image.shape == (3, 6, 6) and torch.allclose(image[:, 0, 0], torch.tensor([200, 100, 50]) / 255)
        disc, cup = torch.zeros(6, 6), torch.zeros(6, 6)
        disc[1:5, 1:5], cup[2:4, 2:4] = 1, 1
        assert torch.equal(mask[0], disc) and torch.equal(mask[1], cup), split  # disc = grey <= 128, cup = 0


def test_fundus_mask_with_unequal_channels_is_refused_naming_it(tmp_path: Path) -> None:
    colour = np.full((6, 6, 3), 255, dtype=np.uint8)
    colour[2:4, 2:4] = (0, 128, 0)  # a green cup: not a grey level
    _fundus_pair(tmp_path, "train", "a.png", np.full((6, 6, 3), 255, dtype=np.uint8))
    bad = _fundus_pair(tmp_path, "test", "b.png", colour)
    data = FedFundus(root=tmp_path, image_size=None)
    with pytest.raises(DataError, match=rf"{bad}: a colour mask needs three equal channels"):
        next(iter(data.test_dataloader("Domain2")))


def test_fundus_site_folders_named_site_are_found(tmp_path: Path) -> None:
    grey = np.full((4, 4), 255, dtype=np.uint8)
    grey[1:3, 1:3] = 0
    for site in ("Site1", "Site3"):
        _fundus_pair(tmp_path, "train", "a.png", grey, site)
        _fundus_pair(tmp_path, "test", "b.png", grey, site)
    data = FedFundus(root=tmp_path, image_size=None)
    assert data.client_ids == ["Site1", "Site3"]


@pytest.mark.parametrize("cls", [FedProstateSlices, FedFundus, FedPolyp, FedProstateVolumes])
@pytest.mark.parametrize("site", ["../outside", "/etc", "a\\b", "..", "-x"])
def test_unsafe_site_names_are_refused_before_any_file_is_looked_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cls: type, site: str
) -> None:
    root = tmp_path / "root"
    (root / "BIDMC").mkdir(parents=True)
    (tmp_path / "outside").mkdir()  # "../outside" exists: only the name can refuse it
    looked_at: list[Path] = []
    for name in ("is_dir", "exists", "iterdir", "glob"):
        original = getattr(Path, name)
        monkeypatch.setattr(Path, name, lambda self, *a, _o=original, **k: looked_at.append(self) or _o(self, *a, **k))
    with pytest.raises(
        ConfigError,
        match=r"^data\.init_args\.sites: .*; name site folders directly under "
        r"data\.init_args\.root",
    ):
        cls(root=str(root), sites=["BIDMC", site])
    assert looked_at == []


def test_a_node_builds_only_its_site_as_among_all(prostate_root: Path) -> None:
    full = FedProstateSlices(root=prostate_root, sites=MATCHED_PROSTATE, image_size=16, val_fraction=0.5)
    alone = FedProstateSlices(root=prostate_root, sites=MATCHED_PROSTATE, image_size=16, val_fraction=0.5)
    alone.only_site("RUNMC")
    assert alone.client_ids == ["RUNMC"] and alone.client_position("RUNMC") == MATCHED_PROSTATE.index("RUNMC")
    assert alone.manifest()["clients"]["RUNMC"] == full.manifest()["clients"]["RUNMC"]
    other = FedProstateSlices(root=prostate_root, sites=MATCHED_PROSTATE, image_size=16)
    other.only_site("I2CVB")  # not among the recipe's sites
    with pytest.raises(DataError, match=r"client-id='I2CVB' is not a site of FedProstateSlices"):
        other.setup()


def test_prostate_slices_read_the_saml_names_and_name_other_folders(tmp_path: Path) -> None:
    for site in ("ISBI", "ISBI_1.5", "HK"):
        _pair(tmp_path, site, "train", "a.png")
        _pair(tmp_path, site, "test", "b.png")
    (tmp_path / "RUNMC_old").mkdir()
    with pytest.warns(UserWarning, match=r"not sites, left out: RUNMC_old "):
        data = FedProstateSlices(root=tmp_path, image_size=8)
    assert data.client_ids == ["ISBI_1.5", "HK", "ISBI"]  # BMC, HK, RUNMC in the sites' order
    assert data.num_examples("ISBI_1.5", "train") == data.num_examples("ISBI_1.5", "test") == 1
