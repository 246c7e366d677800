"""SyntheticSegmentation: shapes, determinism, masks that match the lesions, site shift, and refused input."""

from __future__ import annotations

import pytest
import torch

from fedlit.core.errors import DataError
from fedlit.data import SyntheticSegmentation
from fedlit.data.common.pool import PartitionedData, check_pool


def build(**kwargs) -> PartitionedData:
    return SyntheticSegmentation(**{"num_clients": 3, "samples_per_client": 30, "image_size": 16, **kwargs}).build()


def test_shapes_dtypes_and_splits():
    data = build()
    assert data.task == "segmentation" and data.num_classes == 1
    assert data.inputs.shape == (90, 1, 16, 16) and data.inputs.dtype == torch.float32
    assert data.targets.shape == (90, 1, 16, 16) and data.targets.dtype == torch.float32
    assert set(data.targets.unique().tolist()) == {0.0, 1.0}
    assert (data.targets.sum(dim=(1, 2, 3)) > 0).all()  # every image holds a lesion
    assert list(data.splits) == ["site_0", "site_1", "site_2"]
    for s, splits in enumerate(data.splits.values()):
        indices = sorted(i for split in splits.values() for i in split.tolist())
        assert indices == list(range(30 * s, 30 * (s + 1)))  # site s holds its own rows, each once
        assert [len(splits[k]) for k in ("train", "val", "test")] == [18, 6, 6]
    check_pool(data, "SyntheticSegmentation")  # passes the set-up check


def test_same_seed_same_data_other_seed_other_data():
    a, b, c = build(seed=3), build(seed=3), build(seed=4)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert all((a.splits[k][s] == b.splits[k][s]).all() for k in a.splits for s in a.splits[k])
    assert not torch.equal(a.targets, c.targets)


def test_lesions_are_brighter_than_the_background_at_every_site():
    data = build(samples_per_client=40, image_size=32)
    for s in range(3):
        rows = slice(40 * s, 40 * (s + 1))
        images, masks = data.inputs[rows], data.targets[rows].bool()
        assert images[masks].mean() > images[~masks].mean() + 0.2


def test_sites_differ_in_intensity_contrast_noise_and_blur():
    data = build(num_clients=4, samples_per_client=40, image_size=32)
    sites = data.details["sites"]
    for key in ("offset", "contrast", "blur_sigma", "noise_std"):
        assert len({round(v[key], 6) for v in sites.values()}) == 4  # four distinct values
    # the recorded offsets are the images' mean intensities (each site is centered on its own offset)
    means = [float(data.inputs[40 * s : 40 * (s + 1)].mean()) for s in range(4)]
    assert means == pytest.approx([sites[f"site_{s}"]["offset"] for s in range(4)], abs=0.05)
    assert max(means) - min(means) > 0.4


def test_bad_options_and_bad_masks_are_refused():
    with pytest.raises(ValueError, match="data.init_args.image_size must be an integer >= 16, got 8"):
        SyntheticSegmentation(image_size=8)
    with pytest.raises(ValueError, match="data.init_args.num_clients must be an integer >= 1"):
        SyntheticSegmentation(num_clients=0)
    data = build()
    soft = data.targets.clone()
    soft[4, 0, 2, 3] = 0.5
    with pytest.raises(DataError, match="masks must be 0 or 1, the mask of sample 4 holds 0.5 \\(1 such pixels\\)"):
        check_pool(PartitionedData(**{**data.__dict__, "targets": soft}), "SyntheticSegmentation")
    with pytest.raises(DataError, match="masks have 1 channels but num_classes is 2"):
        check_pool(PartitionedData(**{**data.__dict__, "num_classes": 2}), "SyntheticSegmentation")
    with pytest.raises(DataError, match="must be float masks of shape \\(N, C, H, W\\), got torch.int64"):
        check_pool(PartitionedData(**{**data.__dict__, "targets": data.targets[:, 0].long()}), "SyntheticSegmentation")
