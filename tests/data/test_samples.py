"""The file-backed path: ``build_samples()`` subclasses, ``SiteDataset`` (laziness, sites, targets) and checks."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import Dataset

from fedlit.core.errors import DataError
from fedlit.data import FederatedDataModule, ImageFile, SampleList, SiteDataset, split_samples
from fedlit.data.site_dataset import DatasetInput


class Counting(Dataset):
    """Sample i is (a 2-vector filled with i, i % 3); counts how many inputs were read."""

    def __init__(self, n: int = 30, with_targets: bool = True) -> None:
        self.n, self.reads = n, 0
        if with_targets:
            self.targets = [i % 3 for i in range(n)]
        self.hospital = [f"h{i % 2}" for i in range(n)]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        self.reads += 1
        return torch.full((2,), float(i)), i % 3


def test_site_dataset_builds_counts_and_manifest_without_reading_inputs() -> None:
    dataset = Counting()
    data = SiteDataset(dataset=dataset, sites="hospital", split_fractions=(0.6, 0.2, 0.2), batch_size=4)
    assert data.client_ids == ["h0", "h1"] and data.num_classes == 3
    counts = data.class_counts()
    manifest = data.manifest()
    assert dataset.reads == 0
    for site, parity in (("h0", 0), ("h1", 1)):
        members = [i for i in range(30) if i % 2 == parity]
        held = manifest["clients"][site]
        assert sorted(held["train"] + held["val"] + held["test"]) == members
        assert [len(held[s]) for s in ("train", "val", "test")] == [9, 3, 3]
        assert np.sum([counts[site][s] for s in held], axis=0).tolist() == [
            sum(1 for i in members if i % 3 == c) for c in range(3)
        ]
    x, y = next(iter(data.test_dataloader("h1")))
    indices = x[:, 0].long().tolist()
    assert indices == manifest["clients"]["h1"]["test"] and y.tolist() == [i % 3 for i in indices]
    assert dataset.reads == 3


def test_site_dataset_sites_as_sequence_or_function_and_targets_by_label_fn() -> None:
    dataset = Counting(with_targets=False)
    sites = torch.tensor([i // 10 for i in range(30)])
    by_tensor = SiteDataset(dataset=dataset, sites=sites, label_fn=lambda i: i % 3, seed=5)
    by_function = SiteDataset(dataset=dataset, sites=lambda i: i // 10, label_fn=lambda i: i % 3, seed=5)
    assert by_tensor.client_ids == ["0", "1", "2"]
    assert by_tensor.manifest()["clients"] == by_function.manifest()["clients"]
    assert dataset.reads == 0
    with pytest.warns(UserWarning, match="every sample is read once"):
        read_all = SiteDataset(dataset=dataset, sites=sites, seed=5)
        read_all.setup()
    assert dataset.reads == 30 and read_all.manifest()["clients"] == by_tensor.manifest()["clients"]
    with pytest.raises(DataError, match="sites gives 29 site ids for a dataset of 30 samples"):
        SiteDataset(dataset=dataset, sites=sites[:29], label_fn=lambda i: 0).setup()


def test_site_dataset_refuses_bad_labels_naming_sample_and_client() -> None:
    dataset = Counting()
    dataset.targets[7] = 5
    with pytest.raises(DataError, match=r"sample 7 of client 'h1' has target 5, outside the 3 classes 0..2"):
        SiteDataset(dataset=dataset, sites="hospital", num_classes=3).setup()


def test_site_ids_that_are_not_file_names_are_refused_naming_the_attribute() -> None:
    dataset = Counting()
    dataset.hospital = ["..", "-h1", "h\ni"] * 10
    with pytest.raises(DataError) as info:
        SiteDataset(dataset=dataset, sites="hospital").setup()
    assert str(info.value).startswith(
        "data.init_args.sites (attribute 'hospital' of Counting): client ids that are not safe as file names: "
        "'-h1' starts with '-' (it would read as an option); '..' names a folder itself; 'h\\ni' holds a control "
        "character."
    )
    with pytest.raises(DataError, match=r"^data.init_args.sites: client ids .*: '/h' holds a path separator"):
        SiteDataset(dataset=dataset, sites=lambda i: "/h" if i % 2 else "h").setup()


def test_train_and_eval_transforms_are_separate() -> None:
    data = SiteDataset(
        dataset=Counting(),
        sites="hospital",
        train_transform=[lambda x: x + 100, lambda x: -x],
        eval_transform=lambda x: x * 0,
    )
    x_train, _ = next(iter(data.train_dataloader("h0", torch.Generator().manual_seed(0))))
    assert (x_train <= -100).all()
    assert (next(iter(data.val_dataloader("h0")))[0] == 0).all()


class Scans(FederatedDataModule):
    """A user's file-backed data set: PNG files listed by hand, split with ``split_samples``."""

    def __init__(self, root: Path, files: dict[str, list[tuple[str, int]]], **kwargs) -> None:
        super().__init__(batch_size=2, **kwargs)
        self.root, self.files = root, files

    def build_samples(self) -> SampleList:
        targets = {c: torch.tensor([y for _, y in rows]) for c, rows in self.files.items()}
        return SampleList(
            name="scans",
            task="multiclass",
            num_classes=2,
            samples={c: [f for f, _ in rows] for c, rows in self.files.items()},
            targets=targets,
            splits=split_samples(targets, (0.5, 0.0, 0.5), np.random.default_rng(self.seed), "multiclass"),
            read=ImageFile(root=str(self.root), channels=1, image_size=4),
        )


def test_a_user_subclass_of_the_file_backed_path(tmp_path: Path) -> None:
    files = {"a": [(f"a{i}.png", i % 2) for i in range(4)], "b": [(f"b{i}.png", i % 2) for i in range(4)]}
    for rows in files.values():
        for name, y in rows:
            Image.new("L", (6, 6), 255 * y).save(tmp_path / name)
    data = Scans(tmp_path, files)
    assert data.class_counts()["a"] == {"train": [1, 1], "val": [0, 0], "test": [1, 1]}
    assert data.val_dataloader("a") is None
    x, y = next(iter(data.test_dataloader("b")))
    assert x.shape == (2, 1, 4, 4) and torch.equal(x.mean(dim=(1, 2, 3)), y.float())
    (tmp_path / "b1.png").unlink()
    with pytest.raises(DataError, match=re.escape(f"client 'b': 1 listed files do not exist ({tmp_path / 'b1.png'})")):
        Scans(tmp_path, files).setup()


def test_a_data_set_must_implement_one_hook() -> None:
    class Nothing(FederatedDataModule):
        pass

    with pytest.raises(TypeError, match=r"Nothing must implement build\(\) .* or build_samples\(\)"):
        Nothing()


class Given(FederatedDataModule):
    def __init__(self, samples: SampleList) -> None:
        super().__init__(batch_size=2)
        self.samples = samples

    def build_samples(self) -> SampleList:
        return self.samples


def test_empty_test_split_and_bad_binary_targets_name_the_client() -> None:
    def listing(task, targets, test):
        return SampleList(
            name="given",
            task=task,
            num_classes=1,
            samples={"c0": [0, 1, 2], "c1": [3, 4]},
            targets={"c0": targets, "c1": torch.zeros(2)},
            splits={
                "c0": {"train": np.array([0, 1]), "val": np.array([], dtype=int), "test": test},
                "c1": {"train": np.array([0]), "val": np.array([], dtype=int), "test": np.array([1])},
            },
            read=DatasetInput(Counting()),
        )

    with pytest.raises(DataError, match=r"client 'c0' has 0 test samples in Given \(given\) \(train 2, val 0, test 0"):
        Given(listing("binary", torch.zeros(3), np.array([], dtype=int))).setup()
    with pytest.raises(DataError, match=r"binary targets must be 0 or 1: sample 2 of client 'c0' has target 2.0"):
        Given(listing("binary", torch.tensor([0.0, 1.0, 2.0]), np.array([2]))).setup()
    survival = Given(listing("survival", torch.tensor([5.0, 1.5, 2.0]), np.array([2])))
    assert survival.task == "survival" and survival.class_counts() is None


def test_image_file_scales_8_and_16_bit_images(tmp_path: Path) -> None:
    Image.fromarray(np.full((4, 4), 51, dtype=np.uint8)).save(tmp_path / "8.png")
    Image.fromarray(np.full((4, 4), 13107, dtype=np.uint16)).save(tmp_path / "16.png")
    for channels in (1, 3):
        read = ImageFile(root=str(tmp_path), channels=channels, image_size=2)
        for name in ("8.png", "16.png"):
            x = read(name)
            assert x.shape == (channels, 2, 2) and torch.allclose(x, torch.full_like(x, 0.2)), name
