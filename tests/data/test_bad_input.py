"""Bad input data is refused when a data set is built, naming the file and row (or the client) and the fix.

Corrupted copies of the real files are written into ``tmp_path``; the shared data is never modified.
"""

from __future__ import annotations

import re
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from fedlit.data import FederatedDataModule, FedHeartDisease, MedMNIST, PartitionedData
from fedlit.data.heart_disease import FILES
from fedlit.errors import DataError

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
HEART = SHARED_DATA / "heart_disease"
PNEUMONIA = SHARED_DATA / "pneumoniamnist" / "pneumoniamnist.npz"
KEYS = [f"{s}_{k}" for s in ("train", "val", "test") for k in ("images", "labels")]


# FederatedDataModule: the generic checks of the pool and the splits --------------------------------------------


class Pool(FederatedDataModule):
    """A data set made of given tensors and splits, to check what ``setup()`` refuses."""

    def __init__(self, inputs, targets, splits, task="multiclass", num_classes=3) -> None:
        super().__init__(batch_size=2)
        self.parts = PartitionedData(name="pool", task=task, num_classes=num_classes, inputs=inputs,
                                     targets=targets, splits=splits, partitioner="given")  # fmt: skip

    def _build(self) -> PartitionedData:
        return self.parts


def _splits(*sizes: tuple[int, int, int]) -> dict[str, dict[str, np.ndarray]]:
    """Consecutive pool indices for clients c0, c1, ... with (train, val, test) sizes."""
    splits, start = {}, 0
    for k, client_sizes in enumerate(sizes):
        splits[f"c{k}"] = {}
        for split, n in zip(("train", "val", "test"), client_sizes, strict=True):
            splits[f"c{k}"][split] = np.arange(start, start + n)
            start += n
    return splits


def test_pool_non_finite_input_names_class_and_sample() -> None:
    inputs = torch.zeros(12, 4)
    inputs[7, 2] = float("nan")
    inputs[9, 0] = float("inf")
    data = Pool(inputs, torch.zeros(12, dtype=torch.int64), _splits((2, 1, 1), (4, 2, 2)))
    message = "Pool (pool): input of sample 7 holds nan (2 samples with a non-finite input)"
    with pytest.raises(DataError, match=re.escape(message)):
        data.setup()
    with pytest.raises(DataError, match="input of sample 7"):
        _ = data.data  # the lazy accessor checks too


def test_pool_non_finite_float_target() -> None:
    targets = torch.tensor([0.0, 1.0, 1.0, float("inf"), 0.0, 1.0])
    data = Pool(torch.zeros(6, 4), targets, _splits((2, 1, 1), (1, 0, 1)), task="binary", num_classes=1)
    with pytest.raises(DataError, match=re.escape("Pool (pool): target of sample 3 holds inf")):
        data.setup()


@pytest.mark.parametrize(("bad", "index"), [(-1, 2), (3, 5)])
def test_pool_multiclass_target_out_of_range(bad: int, index: int) -> None:
    targets = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    targets[index] = bad
    data = Pool(torch.zeros(8, 4), targets, _splits((4, 0, 4)))
    with pytest.raises(
        DataError, match=re.escape(f"Pool (pool): target of sample {index} is {bad}, outside the 3 classes 0..2")
    ):
        data.setup()


def test_pool_binary_target_not_0_1() -> None:
    targets = torch.tensor([0.0, 1.0, 1.0, 0.0, 2.0, 0.5])
    data = Pool(torch.zeros(6, 4), targets, _splits((4, 0, 2)), task="binary", num_classes=1)
    with pytest.raises(
        DataError, match=re.escape("Pool (pool): binary targets must be 0 or 1, target of sample 4 is 2.0 (2 such")
    ):
        data.setup()


def test_pool_multiclass_float_targets_are_refused() -> None:
    data = Pool(torch.zeros(4, 4), torch.zeros(4), _splits((2, 0, 2)))
    with pytest.raises(DataError, match=r"multiclass targets must be integers \(int64\), got torch.float32"):
        data.setup()


def test_empty_train_or_test_split_names_every_client_and_split() -> None:
    data = Pool(torch.zeros(15, 4), torch.zeros(15, dtype=torch.int64),
                _splits((3, 1, 1), (2, 1, 0), (3, 1, 1), (0, 1, 1)))  # fmt: skip
    with pytest.raises(DataError) as info:
        data.setup()
    message = str(info.value)
    assert "client 'c1' has 0 test samples in Pool (pool) (train 2, val 1, test 0)" in message
    assert "client 'c3' has 0 train samples in Pool (pool) (train 0, val 1, test 1)" in message
    assert "lower num_clients or change the partition" in message
    assert "'c0'" not in message and "'c2'" not in message


def test_empty_val_split_is_allowed() -> None:
    data = Pool(torch.zeros(8, 4), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1]), _splits((3, 0, 1), (2, 0, 2)))
    data.setup()
    assert data.val_dataloader("c0") is None and data.num_examples("c1", "train") == 2


def test_split_index_outside_the_pool() -> None:
    splits = _splits((2, 0, 2))
    splits["c0"]["test"] = np.array([2, 4])
    data = Pool(torch.zeros(4, 4), torch.zeros(4, dtype=torch.int64), splits)
    with pytest.raises(DataError, match=re.escape("client 'c0''s test split holds index 4, outside the pool of 4")):
        data.setup()


def test_no_client_at_all() -> None:
    data = Pool(torch.zeros(0, 4), torch.zeros(0, dtype=torch.int64), {})
    with pytest.raises(DataError, match=re.escape("Pool (pool) builds no client")):
        data.setup()
