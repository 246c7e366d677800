"""MedMNIST: the real PneumoniaMNIST file, a tiny multilabel file, and the error messages."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedlit.data import IID, MedMNIST, Natural, Pathological

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
PNEUMONIA = SHARED_DATA / "pneumoniamnist" / "pneumoniamnist.npz"


@pytest.fixture(scope="module")
def pneumonia_path() -> Path:
    if not PNEUMONIA.is_file():
        pytest.skip(f"real PneumoniaMNIST file {PNEUMONIA} is absent (shared/data beside the repository)")
    return PNEUMONIA


@pytest.fixture(scope="module")
def pneumonia(pneumonia_path: Path) -> MedMNIST:
    data = MedMNIST(path=pneumonia_path, num_clients=5, channels=3, image_size=32, seed=0)
    data.setup()
    return data


def test_pools_the_official_splits_and_covers_them_once(pneumonia: MedMNIST) -> None:
    manifest = json.loads(json.dumps(pneumonia.manifest()))
    assert manifest["dataset"] == "pneumoniamnist"
    assert manifest["partitioner"] == "Dirichlet(alpha=0.5, min_size=2)"
    assert manifest["details"]["pool"] == {"train": [0, 3882], "val": [3882, 4406], "test": [4406, 5030]}
    everything = sorted(i for client in manifest["clients"].values() for ids in client.values() for i in ids)
    assert everything == list(range(5030))
    total = sum(pneumonia.num_examples(c, s) for c in pneumonia.client_ids for s in ("train", "val", "test"))
    assert total == 3882 + 524 + 624


def test_task_classes_and_counts_match_the_file(pneumonia: MedMNIST, pneumonia_path: Path) -> None:
    assert pneumonia.task == "multiclass" and pneumonia.num_classes == 2
    assert pneumonia.client_ids == [f"client_{i}" for i in range(5)]
    with np.load(pneumonia_path) as f:
        positives = sum(int(f[f"{s}_labels"].sum()) for s in ("train", "val", "test"))
    counts = pneumonia.class_counts()
    assert sum(counts[c][s][1] for c in counts for s in ("train", "val", "test")) == positives
    assert sum(counts[c][s][0] for c in counts for s in ("train", "val", "test")) == 5030 - positives


def test_each_client_is_split_4_3_3(pneumonia: MedMNIST) -> None:
    for client_id in pneumonia.client_ids:
        sizes = np.array([pneumonia.num_examples(client_id, s) for s in ("train", "val", "test")])
        assert np.all(np.abs(sizes - sizes.sum() * np.array([0.4, 0.3, 0.3])) <= 1)


def test_batches_have_documented_shapes_dtypes_and_values(pneumonia: MedMNIST, pneumonia_path: Path) -> None:
    loader = pneumonia.test_dataloader("client_0")
    x, y = next(iter(loader))
    assert x.shape == (32, 3, 32, 32) and x.dtype == torch.float32
    assert y.shape == (32,) and y.dtype == torch.int64
    assert torch.equal(x[:, 0], x[:, 2])  # grey repeated into 3 channels
    assert -1.0 <= x.min() and x.max() <= 1.0
    # The first test image equals the file's image, scaled, resized (bilinear) and normalized by hand.
    first = int(pneumonia.data.splits["client_0"]["test"][0])
    with np.load(pneumonia_path) as f:
        images = np.concatenate([f["train_images"], f["val_images"], f["test_images"]])
        labels = np.concatenate([f["train_labels"], f["val_labels"], f["test_labels"]])[:, 0]
    raw = torch.from_numpy(images[first]).float().div(255).view(1, 1, 28, 28)
    expected = (F.interpolate(raw, size=(32, 32), mode="bilinear", antialias=True) - 0.5) / 0.5
    assert torch.allclose(x[0, :1], expected[0], atol=1e-6)
    assert y[0].item() == labels[first]


def test_native_size_and_channels_are_kept_by_default(pneumonia_path: Path) -> None:
    data = MedMNIST(path=pneumonia_path, num_clients=3, partitioner=IID(), normalize=False, batch_size=8)
    x, y = next(iter(data.train_dataloader("client_2", torch.Generator().manual_seed(0))))
    assert x.shape == (8, 1, 28, 28) and 0.0 <= x.min() and x.max() <= 1.0
    assert [data.num_examples(f"client_{i}", "train") for i in range(3)] == [671, 671, 670]


def test_binary_task_gives_float_targets(pneumonia_path: Path) -> None:
    data = MedMNIST(path=pneumonia_path, num_clients=2, task="binary", batch_size=16)
    assert data.task == "binary" and data.num_classes == 1
    _, y = next(iter(data.val_dataloader("client_1")))
    assert y.dtype == torch.float32 and y.shape == (16,) and set(y.tolist()) <= {0.0, 1.0}
    assert len(data.class_counts()["client_1"]["val"]) == 2


def test_same_seed_same_clients_other_seed_different(pneumonia: MedMNIST, pneumonia_path: Path) -> None:
    again = MedMNIST(path=pneumonia_path, num_clients=5, channels=3, image_size=32, seed=0)
    other = MedMNIST(path=pneumonia_path, num_clients=5, channels=3, image_size=32, seed=1)
    assert again.manifest() == pneumonia.manifest()
    assert other.manifest()["clients"] != pneumonia.manifest()["clients"]


def _write_tiny(path: Path, *, labels_per_split: dict[str, np.ndarray], rgb: bool = True) -> Path:
    rng = np.random.default_rng(0)
    arrays = {}
    for split, labels in labels_per_split.items():
        shape = (len(labels), 8, 8, 3) if rgb else (len(labels), 8, 8)
        arrays[f"{split}_images"] = rng.integers(0, 256, shape, dtype=np.uint8)
        arrays[f"{split}_labels"] = labels
    np.savez(path, **arrays)
    return path


@pytest.fixture
def tiny_multilabel(tmp_path: Path) -> Path:
    rng = np.random.default_rng(1)
    labels = {s: (rng.random((n, 4)) < [0.5, 0.3, 0.2, 0.05]).astype(np.uint8)
              for s, n in (("train", 40), ("val", 10), ("test", 10))}  # fmt: skip
    return _write_tiny(tmp_path / "tinychestmnist.npz", labels_per_split=labels)


def test_multilabel_file(tiny_multilabel: Path) -> None:
    data = MedMNIST(path=tiny_multilabel, num_clients=3, partitioner=IID(), batch_size=4)
    assert data.task == "multilabel" and data.num_classes == 4
    x, y = next(iter(data.train_dataloader("client_0", torch.Generator().manual_seed(0))))
    assert x.shape == (4, 3, 8, 8) and x.dtype == torch.float32
    assert y.shape == (4, 4) and y.dtype == torch.float32
    with np.load(tiny_multilabel) as f:
        column_sums = sum(f[f"{s}_labels"].sum(axis=0) for s in ("train", "val", "test"))
    counts = data.class_counts()
    pooled = np.sum([counts[c][s] for c in counts for s in ("train", "val", "test")], axis=0)
    assert pooled.tolist() == column_sums.tolist()
    grey = MedMNIST(path=tiny_multilabel, num_clients=3, channels=1, batch_size=4)
    assert next(iter(grey.test_dataloader("client_1")))[0].shape == (4, 1, 8, 8)


def test_multilabel_partition_follows_the_rarest_positive_label(tiny_multilabel: Path) -> None:
    with np.load(tiny_multilabel) as f:
        labels = np.concatenate([f[f"{s}_labels"] for s in ("train", "val", "test")])
    frequency = labels.sum(axis=0)
    rarest = [min(np.flatnonzero(row), key=lambda j: frequency[j], default=4) for row in labels]
    data = MedMNIST(path=tiny_multilabel, num_clients=5, partitioner=Pathological(classes_per_client=1),
                    split_fractions=(0.5, 0.0, 0.5))  # fmt: skip
    # 5 strata (4 labels + "none") over 5 clients with one class each: a client holds exactly one stratum.
    held = [{rarest[i] for s in ("train", "test") for i in data.data.splits[c][s]} for c in data.client_ids]
    assert sorted(len(h) for h in held) == [1] * 5
    assert sorted(h.pop() for h in held) == [0, 1, 2, 3, 4]


def test_missing_file_says_where_to_get_it(tmp_path: Path) -> None:
    missing = tmp_path / "organamnist.npz"
    with pytest.raises(FileNotFoundError, match="data.init_args.path") as info:
        MedMNIST(path=missing)
    assert str(missing) in str(info.value)
    assert "download organamnist.npz from https://zenodo.org/records/10519652" in str(info.value)
    (tmp_path / "x.npz").touch()
    with pytest.raises(FileNotFoundError, match=r"it is a folder; give the \.npz file inside it \(\['x\.npz'\]\)"):
        MedMNIST(path=tmp_path)


def test_missing_keys_are_listed(tmp_path: Path) -> None:
    path = tmp_path / "broken.npz"
    np.savez(path, train_images=np.zeros((4, 8, 8), np.uint8), train_labels=np.zeros((4, 1), np.uint8))
    data = MedMNIST(path=path, num_clients=2)
    with pytest.raises(ValueError, match=r"lacks keys \['val_images', 'val_labels', 'test_images', 'test_labels'\]"):
        data.setup()


def test_task_that_does_not_fit_the_labels_is_refused(tiny_multilabel: Path) -> None:
    with pytest.raises(ValueError, match=r"data\.init_args\.task='multiclass' does not fit labels of shape"):
        MedMNIST(path=tiny_multilabel, num_clients=2, task="multiclass").setup()
    multiclass = _write_tiny(
        tiny_multilabel.with_name("tiny3.npz"),
        labels_per_split={s: np.arange(n).reshape(-1, 1) % 3 for s, n in (("train", 12), ("val", 3), ("test", 3))},
        rgb=False,
    )
    with pytest.raises(ValueError, match=r"task='binary' needs 0/1 labels"):
        MedMNIST(path=multiclass, num_clients=2, task="binary").setup()


def test_bad_options_are_collected(tiny_multilabel: Path) -> None:
    with pytest.raises(ValueError, match=r"task must be one of .*; data\.init_args\.channels must be null, 1 or 3"):
        MedMNIST(path=tiny_multilabel, task="segmentation", channels=2)  # type: ignore[arg-type]


def test_natural_partitioner_needs_sites(tiny_multilabel: Path) -> None:
    with pytest.raises(ValueError, match="Natural\\(\\) needs the site of each sample"):
        MedMNIST(path=tiny_multilabel, num_clients=2, partitioner=Natural()).setup()
