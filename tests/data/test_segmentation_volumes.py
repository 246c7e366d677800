"""FedProstateVolumes on tiny NIfTI volumes written in the SAML layout: slices kept, normalization, case split."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import nibabel
import numpy as np
import pytest
import torch

from fedlit.core.errors import ConfigError, DataError
from fedlit.data import FedProstateVolumes
from fedlit.data.prostate_volumes import VolumeSlice

SIDE, SLICES = 16, 4
# The voxels 0..1023 in nibabel's (x, y, slice) order. Their 99th percentile (NumPy's linear interpolation)
# lies at rank 0.99 * 1023 = 1012.77 of the sorted values, i.e. the value 1012.77.
RAMP = np.arange(SIDE * SIDE * SLICES, dtype=np.float64).reshape(SIDE, SIDE, SLICES)
P99 = 1012.77


def _save(volume: np.ndarray, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    nibabel.save(nibabel.Nifti1Image(volume, np.eye(4)), path)


def _case(root: Path, site: str, case: int, suffix: str = "_segmentation", scale: float = 1.0) -> None:
    """Case<case>: the ramp times ``scale`` plus 7; prostate (a 2 x 2 square) in slices 0, 1, 3, none in 2;
    slice 3 uses label 2 (SAML volumes hold other labels than 1)."""
    _save((RAMP * scale + 7).astype(np.float32), root / site / f"Case{case:02d}.nii.gz")
    labels = np.zeros((SIDE, SIDE, SLICES), dtype=np.uint8)
    labels[3:5, 6:8, 0] = labels[4:6, 6:8, 1] = 1
    labels[10:12, 2:4, 3] = 2
    _save(labels, root / site / f"Case{case:02d}{suffix}.nii.gz")


@pytest.fixture
def saml(tmp_path: Path) -> Path:
    for case in range(5):
        _case(tmp_path, "BIDMC", case, scale=case + 1)
        _case(tmp_path, "HK", case + 10, suffix="_Segmentation")
    return tmp_path


def test_slices_with_foreground_kept_and_split_by_whole_case(saml: Path) -> None:
    data = FedProstateVolumes(root=saml, image_size=None, seed=1)
    assert data.client_ids == ["BIDMC", "HK"] and data.task == "segmentation" and data.num_classes == 1
    manifest = json.loads(json.dumps(data.manifest()))
    for site in data.client_ids:
        # 5 cases split 8:0:2 -> 4 train cases, 1 test case; 3 of the 4 slices of each case hold prostate.
        assert [data.num_examples(site, split) for split in ("train", "val", "test")] == [12, 0, 3]
        cases = manifest["details"]["cases"][site]
        assert [len(cases[split]) for split in ("train", "val", "test")] == [4, 0, 1]
        for split in ("train", "test"):
            held = {c["image"] for c in cases[split]}
            slices = manifest["clients"][site][split]
            assert {image for image, _, _ in slices} == held  # a case's slices all lie in its split
            for image, mask, index in slices:
                assert index in (0, 1, 3) and mask.startswith(image[: -len(".nii.gz")])
        assert all(c["slices"] == 3 and c["foreground_pixels"] == 12 for c in cases["train"] + cases["test"])
    assert manifest["details"]["cases"]["HK"]["test"][0]["mask"].endswith("_Segmentation.nii.gz")
    again = FedProstateVolumes(root=saml, image_size=None, seed=1).manifest()["clients"]
    assert again == manifest["clients"]
    tested = {
        FedProstateVolumes(root=saml, seed=s).manifest()["details"]["cases"]["BIDMC"]["test"][0]["image"]
        for s in range(6)
    }
    assert len(tested) > 1  # the seed picks the test case


def test_each_volume_is_clipped_at_its_99th_percentile_and_scaled(saml: Path) -> None:
    data = FedProstateVolumes(
        root=saml, image_size=None, sites=["BIDMC"], split_fractions=(0.6, 0.2, 0.2), augment=False
    )
    expected = np.minimum(RAMP, P99) / P99  # (ramp * s + 7 - 7) / (P99 * s): the same for every scale s
    for split in ("train", "val", "test"):
        dataset = data._loader("BIDMC", split, 1, shuffle=False).dataset
        for (_, _, index), (image, mask) in zip(dataset.identities, dataset, strict=True):
            assert image.shape == mask.shape == (1, SIDE, SIDE) and image.dtype == torch.float32
            np.testing.assert_allclose(image[0].numpy(), expected[:, :, index].T, rtol=1e-5, atol=1e-6)
            assert float(image.max()) == 1.0 and float(image.min()) == pytest.approx(index / P99, rel=1e-5)
    _, mask = data._loader("BIDMC", "test", 1, shuffle=False).dataset[0]  # slice 0: x 3..4, y 6..7
    square = torch.zeros(SIDE, SIDE)
    square[6:8, 3:5] = 1  # rows are y, columns x
    assert torch.equal(mask[0], square)
    *_, (_, label_two) = data._loader("BIDMC", "test", 1, shuffle=False).dataset  # slice 3, label 2
    assert label_two.sum() == 4 and set(label_two.unique().tolist()) == {0.0, 1.0}


def test_resize_crop_and_flips_touch_train_only(saml: Path) -> None:
    data = FedProstateVolumes(root=saml, image_size=12, crop_size=8, sites=["HK"])
    image, mask = next(iter(data.test_dataloader("HK")))
    assert image.shape == mask.shape == (3, 1, 12, 12) and set(mask.unique().tolist()) <= {0.0, 1.0}

    def first_batch(seed: int) -> torch.Tensor:
        torch.manual_seed(seed)
        return next(iter(data.train_dataloader("HK", torch.Generator().manual_seed(seed))))[0]

    assert first_batch(0).shape == (8, 1, 8, 8)
    assert torch.equal(first_batch(3), first_batch(3)) and not torch.equal(first_batch(3), first_batch(4))
    assert "PairRandomCrop(size=8)" in data.manifest()["details"]["train_transform"]


def test_reader_caches_cases_per_process_and_pickles_empty(saml: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import fedlit.data.prostate_volumes as module

    reads = []
    original = module.voxels
    monkeypatch.setattr(module, "voxels", lambda path, *args: reads.append(Path(path).name) or original(path, *args))
    reader = VolumeSlice(root=str(saml), image_size=None, cache_size=1)
    ids = [["HK/Case10.nii.gz", "HK/Case10_Segmentation.nii.gz", k] for k in (0, 1)]
    first, second = reader(ids[0]), reader(ids[1])
    assert reads == ["Case10.nii.gz", "Case10_Segmentation.nii.gz"]  # the second slice came from the cache
    assert len(pickle.dumps(reader)) < 1000  # a worker's copy carries no volume
    reader(["HK/Case11.nii.gz", "HK/Case11_Segmentation.nii.gz", 0])
    reader(ids[0])  # evicted by Case11 (cache_size 1): read again
    assert len(reads) == 6 and not torch.equal(first[0], second[0])


def test_unmatched_volumes_are_named_or_skipped(saml: Path) -> None:
    _save(RAMP.astype(np.float32), saml / "BIDMC" / "Case07.nii.gz")
    _save(np.ones((SIDE, SIDE, SLICES), np.uint8), saml / "HK" / "Case30_segmentation.nii.gz")
    with pytest.raises(DataError) as err:
        FedProstateVolumes(root=saml).setup()
    message = str(err.value)
    assert "BIDMC/Case07.nii.gz (no segmentation)" in message and "HK/Case30_segmentation.nii.gz (no image)" in message
    assert "data.init_args.unmatched skip" in message
    data = FedProstateVolumes(root=saml, unmatched="skip")
    with pytest.warns(UserWarning, match=r"BIDMC/Case07\.nii\.gz.*HK/Case30_segmentation\.nii\.gz"):
        skipped = data.manifest()["details"]["unmatched_skipped"]
    assert skipped == ["BIDMC/Case07.nii.gz (no segmentation)", "HK/Case30_segmentation.nii.gz (no image)"]
    assert data.num_examples("BIDMC", "train") + data.num_examples("BIDMC", "test") == 15


def test_missing_folders_shape_mismatch_and_bad_options_are_named(saml: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"data\.init_args\.root: no folder .*CaseXX_segmentation.*liuquande"):
        FedProstateVolumes(root=tmp_path / "absent")
    with pytest.raises(DataError, match=r"data\.init_args\.sites: \['UCL'\] are not found under"):
        FedProstateVolumes(root=saml, sites=["UCL"])
    with pytest.raises(DataError, match=r"holds none of the sites .*Shape-aware Meta-learning"):
        FedProstateVolumes(root=saml / "BIDMC")
    with pytest.raises(ConfigError, match=r"crop_size=20 is larger than data\.init_args\.image_size=16"):
        FedProstateVolumes(root=saml, image_size=16, crop_size=20)
    _save(np.zeros((SIDE, 8, SLICES), np.uint8) + 1, saml / "HK" / "Case10_Segmentation.nii.gz")
    with pytest.raises(
        DataError,
        match=r"HK/Case10_Segmentation\.nii\.gz: a volume of shape \(16, 8, 4\) but its "
        r"image .*HK/Case10\.nii\.gz has \(16, 16, 4\)",
    ):
        FedProstateVolumes(root=saml).setup()
    (saml / "BIDMC" / "Case02.nii.gz").write_bytes(b"not a volume")
    with pytest.raises(DataError, match=r"BIDMC/Case02\.nii\.gz: cannot be read as a NIfTI volume"):
        FedProstateVolumes(root=saml, sites=["BIDMC"]).setup()


def test_volumes_with_train_crops_go_through_the_cli(saml: Path, tmp_path: Path) -> None:
    from fedlit.cli import run

    recipe = Path(__file__).resolve().parents[2] / "recipes" / "prostate_samples_tiny_unet.yaml"
    results = run(
        [
            "fit",
            "--config",
            str(recipe),
            "--data",
            "fedlit.data.FedProstateVolumes",
            "--data.init_args.root",
            str(saml),
            "--data.init_args.sites",
            "[BIDMC, HK]",
            "--data.init_args.image_size",
            "16",
            "--data.init_args.crop_size",
            "8",
            "--out_dir",
            str(tmp_path / "run"),
            "--federation.rounds",
            "1",
            "--federation.progress_bar",
            "false",
        ]
    )
    assert list(results["last"]["clients"]) == ["BIDMC", "HK"]
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["class"] == "FedProstateVolumes" and manifest["details"]["crop_size"] == 8
    assert len(manifest["clients"]["HK"]["test"]) == 3  # one case of 3 slices with prostate


def test_fed_prostate_reads_either_layout_and_names_both_when_neither(
    saml: Path, shared_data: Path, tmp_path: Path
) -> None:
    from fedlit.data import FedProstate

    volumes = FedProstate(root=str(saml), image_size=8)
    assert volumes.layout == "volumes" and volumes.expected_num_clients() == 2
    assert isinstance(volumes.reader, FedProstateVolumes)
    assert volumes.client_ids == FedProstateVolumes(root=str(saml), image_size=8).client_ids
    assert volumes.manifest()["details"]["layout"] == "volumes"
    slices = FedProstate(root=str(shared_data / "site_samples" / "ProstateSlice"), image_size=8, sites=["BIDMC", "UCL"])
    assert slices.expected_num_clients() == 2
    assert slices.layout == "slices" and slices.client_ids == ["BIDMC", "UCL"]
    assert slices.num_examples("UCL", "train") == 1 and slices.num_examples("UCL", "test") == 1
    with pytest.raises(
        DataError,
        match=r"data\.init_args\.root: no folder .*CaseXX\.nii\.gz.*train,test.*"
        r"liuquande\.github\.io/SAML",
    ):
        FedProstate(root=str(tmp_path / "absent"))
    (tmp_path / "empty" / "UCL").mkdir(parents=True)
    with pytest.raises(DataError, match=r"holds neither layout"):
        FedProstate(root=str(tmp_path / "empty"))


def test_a_site_built_alone_is_the_site_built_among_all(saml: Path) -> None:
    """A Flower node builds its own site only (``only_site``): the same cases and the same split as among all, even
    when its folder holds that site alone."""
    together = FedProstateVolumes(root=saml, image_size=None, seed=1).manifest()["clients"]
    alone = FedProstateVolumes(root=saml, image_size=None, seed=1)
    alone.only_site("HK")
    assert alone.client_ids == ["HK"] and alone.manifest()["clients"]["HK"] == together["HK"]
    own = saml.parent / "hk_only"
    for case in range(5):
        _case(own, "HK", case + 10, suffix="_Segmentation")
    by_itself = FedProstateVolumes(root=own, image_size=None, seed=1)
    by_itself.only_site("HK")
    assert by_itself.manifest()["clients"]["HK"] == together["HK"]


def test_saml_folder_names_give_all_six_sites_and_other_folders_are_named(tmp_path: Path) -> None:
    # The SAML download's folders: ISBI is RUNMC and ISBI_1.5 is BMC; the clients keep the folders' names, in
    # the sites' order (BIDMC, BMC, HK, I2CVB, RUNMC, UCL).
    for site in ("HK", "ISBI", "ISBI_1.5", "I2CVB", "UCL", "BIDMC"):
        for case in range(2):
            _case(tmp_path, site, case)
    (tmp_path / "Prostate_notes").mkdir()
    (tmp_path / ".cache").mkdir()
    with pytest.warns(UserWarning, match=r"not sites, left out: Prostate_notes \(sites are") as caught:
        data = FedProstateVolumes(root=tmp_path, image_size=None)
    assert ".cache" not in str(caught[0].message)
    assert data.client_ids == ["BIDMC", "ISBI_1.5", "HK", "I2CVB", "ISBI", "UCL"]
    data.setup()
    # 2 cases split 8:0:2 -> 1 train case, 1 test case, 3 slices with prostate each
    assert [data.num_examples("ISBI", split) for split in ("train", "val", "test")] == [3, 0, 3]


def test_one_site_under_both_names_is_refused(tmp_path: Path) -> None:
    for site in ("RUNMC", "ISBI", "UCL"):
        for case in range(2):
            _case(tmp_path, site, case)
    with pytest.raises(DataError, match=r"one site under two names: RUNMC and ISBI \(both RUNMC\)"):
        FedProstateVolumes(root=tmp_path)
    assert FedProstateVolumes(root=tmp_path, sites=["ISBI", "UCL"]).client_ids == ["ISBI", "UCL"]
