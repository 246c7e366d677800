"""SyntheticImages: shapes, determinism, feature and label shift between sites, and learnability."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from torch import nn

from fedlit.data import SyntheticImages


@pytest.fixture(scope="module")
def synthetic() -> SyntheticImages:
    data = SyntheticImages(seed=0)
    data.setup()
    return data


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Tiny convolutions run fastest on one thread: two threads spin against each other on a busy CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _site_rows(data: SyntheticImages, client_id: str) -> torch.Tensor:
    splits = data.data.splits[client_id]
    return torch.from_numpy(np.concatenate([splits[s] for s in ("train", "val", "test")]))


def test_shapes_sizes_and_batches(synthetic: SyntheticImages) -> None:
    assert synthetic.client_ids == ["site_0", "site_1", "site_2", "site_3"]
    assert synthetic.task == "multiclass" and synthetic.num_classes == 3
    assert synthetic.data.inputs.shape == (800, 1, 16, 16)
    for client_id in synthetic.client_ids:
        assert [synthetic.num_examples(client_id, s) for s in ("train", "val", "test")] == [120, 40, 40]
    x, y = next(iter(synthetic.train_dataloader("site_1", torch.Generator().manual_seed(0))))
    assert x.shape == (32, 1, 16, 16) and x.dtype == torch.float32
    assert y.shape == (32,) and y.dtype == torch.int64 and set(y.tolist()) <= {0, 1, 2}
    last = list(synthetic.test_dataloader("site_1"))[-1]
    assert len(last[1]) == 40 - 32  # drop_last=False


@pytest.mark.usefixtures("one_thread")
def test_generation_is_fast() -> None:
    start = time.perf_counter()
    SyntheticImages(seed=5).setup()
    assert time.perf_counter() - start < 1.0


def test_same_seed_same_data_other_seed_different(synthetic: SyntheticImages) -> None:
    again, other = SyntheticImages(seed=0), SyntheticImages(seed=1)
    assert torch.equal(again.data.inputs, synthetic.data.inputs)
    assert torch.equal(again.data.targets, synthetic.data.targets)
    assert again.manifest() == synthetic.manifest()
    assert not torch.equal(other.data.inputs, synthetic.data.inputs)


def test_train_loader_order_follows_the_generator(synthetic: SyntheticImages) -> None:
    def first_targets(seed: int) -> list[int]:
        return next(iter(synthetic.train_dataloader("site_0", torch.Generator().manual_seed(seed))))[1].tolist()

    assert first_targets(3) == first_targets(3)
    assert first_targets(3) != first_targets(4)


def test_sites_differ_in_mean_intensity(synthetic: SyntheticImages) -> None:
    means = sorted(synthetic.data.inputs[_site_rows(synthetic, c)].mean().item() for c in synthetic.client_ids)
    # Offsets are spread evenly over [0, 0.6]: 4 sites sit 0.2 apart, up to the noise's mean.
    assert np.allclose(means, [0.0, 0.2, 0.4, 0.6], atol=0.02)
    sites = synthetic.manifest()["details"]["sites"]
    assert len({round(s["noise_std"], 6) for s in sites.values()}) == 4
    assert len({round(s["blur_sigma"], 6) for s in sites.values()}) == 4


def _label_shares(data: SyntheticImages) -> np.ndarray:
    counts = data.class_counts()
    return np.array([np.sum([counts[c][s] for s in ("train", "val", "test")], axis=0) for c in data.client_ids]) / 200


def test_label_mixes_differ_between_sites_and_follow_label_alpha(synthetic: SyntheticImages) -> None:
    shares = _label_shares(synthetic)
    distances = [0.5 * np.abs(shares[i] - shares[j]).sum() for i in range(4) for j in range(i + 1, 4)]
    assert min(distances) > 0.05
    near_uniform = _label_shares(SyntheticImages(label_alpha=1e4, seed=0))
    assert np.abs(near_uniform - 1 / 3).max() < 0.12


def test_splits_are_disjoint_stratified_and_in_the_manifest(synthetic: SyntheticImages) -> None:
    manifest = json.loads(json.dumps(synthetic.manifest()))
    assert manifest["dataset"] == "synthetic_images" and manifest["seed"] == 0
    everything = sorted(i for client in manifest["clients"].values() for ids in client.values() for i in ids)
    assert everything == list(range(800))
    counts = synthetic.class_counts()["site_2"]
    total = np.sum([counts[s] for s in ("train", "val", "test")], axis=0)
    assert np.all(np.abs(np.array(counts["train"]) - 0.6 * total) <= 1)


def test_zero_val_fraction_means_no_val_loader() -> None:
    data = SyntheticImages(num_clients=2, samples_per_client=20, split_fractions=(0.5, 0.0, 0.5), seed=0)
    assert data.val_dataloader("site_0") is None
    assert data.num_examples("site_0", "val") == 0
    assert data.class_counts()["site_0"]["val"] == [0, 0, 0]


@pytest.mark.usefixtures("one_thread")
def test_a_small_cnn_learns_it() -> None:
    data = SyntheticImages(seed=0)
    d = data.data
    train = torch.from_numpy(np.concatenate([d.splits[c]["train"] for c in data.client_ids]))
    test = torch.from_numpy(np.concatenate([d.splits[c]["test"] for c in data.client_ids]))
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(32, 3),
    )  # fmt: skip
    optimizer = torch.optim.Adam(net.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(5):
        for batch in train[torch.randperm(len(train), generator=generator)].split(32):
            loss = nn.functional.cross_entropy(net(d.inputs[batch]), d.targets[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        accuracy = (net(d.inputs[test]).argmax(1) == d.targets[test]).float().mean().item()
    majority = np.bincount(d.targets[test].numpy()).max() / len(test)
    assert accuracy > 0.8 > majority + 0.3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_classes": 7}, r"data\.init_args\.num_classes must be between 2 and 6"),
        ({"label_alpha": 0.0}, r"data\.init_args\.label_alpha must be > 0"),
        ({"image_size": 4}, r"data\.init_args\.image_size must be an integer >= 8"),
        ({"samples_per_client": 2}, r"data\.init_args\.samples_per_client must be an integer >= 3"),
        ({"split_fractions": (0.5, 0.5, 0.5)}, r"data\.init_args\.split_fractions"),
        ({"batch_size": 0}, r"data\.init_args\.batch_size must be an integer >= 1"),
    ],
)
def test_bad_options_name_themselves(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SyntheticImages(**kwargs)


def test_unknown_client_id_suggests_the_closest(synthetic: SyntheticImages) -> None:
    with pytest.raises(KeyError, match="did you mean 'site_1'"):
        synthetic.num_examples("site1", "train")
