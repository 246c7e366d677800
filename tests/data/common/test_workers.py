"""DataLoader workers started once per run: the same batches and metrics as a loader of one's own, far fewer forks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fedlit import FedAvg, Federation, RoleRule
from fedlit.data.common.datamodule import FederatedDataModule
from fedlit.data.common.samples import SampleList
from fedlit.tasks import ClassificationModule
from tests.conftest import TinyMLP

CLIENTS, SAMPLES = ("a", "b", "c"), 12


class _Read:
    """Sample i of the table; appends the reading process's id to ``log`` (one line per sample read)."""

    def __init__(self, table: torch.Tensor, log: Path) -> None:
        self.table, self.log = table, log

    def __call__(self, identity: int) -> torch.Tensor:
        with self.log.open("a", encoding="utf-8") as f:
            f.write(f"{os.getpid()}\n")
        return self.table[identity].clone()


class _Jitter(nn.Module):
    """Random train augmentation: its draws depend on how each worker was seeded."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 0.3 * torch.randn(x.shape)


class _Files(FederatedDataModule):
    """3 clients of 12 'files' (rows of a table read one by one): 6 train, 3 val, 3 test."""

    def __init__(self, log: Path, *, jitter: bool, num_workers: int) -> None:
        super().__init__(batch_size=2, eval_batch_size=2, num_workers=num_workers, seed=0)
        self.log, self.jitter = log, jitter

    def build_samples(self) -> SampleList:
        rng = np.random.default_rng(0)
        table = torch.from_numpy(rng.normal(size=(len(CLIENTS) * SAMPLES, 4)).astype(np.float32))
        targets = (table[:, 0] + table[:, 1] > 0).long() + (table[:, 2] > 1).long()
        samples, splits = {}, {}
        for k, client in enumerate(CLIENTS):
            samples[client] = list(range(k * SAMPLES, (k + 1) * SAMPLES))
            splits[client] = {"train": np.arange(6), "val": np.arange(6, 9), "test": np.arange(9, 12)}
        return SampleList(
            name="files",
            task="multiclass",
            num_classes=3,
            samples=samples,
            targets={c: targets[samples[c]] for c in CLIENTS},
            splits=splits,
            read=_Read(table, self.log),
            train_transform=_Jitter() if self.jitter else None,
        )


def _fit(tmp_path: Path, name: str, *, jitter: bool, num_workers: int) -> tuple[str, list[int]]:
    log = tmp_path / f"{name}.pids"
    log.touch()
    torch.manual_seed(0)
    module = ClassificationModule(
        backbone=TinyMLP(), num_classes=3, lr=0.1, momentum=0.9, roles=[RoleRule("backbone.*", "shared")]
    )
    data = _Files(log, jitter=jitter, num_workers=num_workers)
    federation = Federation(
        module, data, FedAvg(), rounds=2, out_dir=tmp_path / name, progress_bar=False, seed=0, accelerator="cpu"
    )
    last = json.dumps(federation.fit()["last"], sort_keys=True)  # as text: NaN (an undefined AUROC) equals NaN
    return last, [int(line) for line in log.read_text().split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_two_workers_give_the_metrics_of_none_and_fork_once_per_kind_of_split(tmp_path, monkeypatch):
    monkeypatch.delenv("FEDLIT_WORKER_POOLS", raising=False)
    none, pids_none = _fit(tmp_path, "none", jitter=False, num_workers=0)
    two, pids = _fit(tmp_path, "two", jitter=False, num_workers=2)
    assert two == none
    assert set(pids_none) == {os.getpid()}  # no worker: every sample read here
    # every loader iteration (2 rounds x 3 clients x train, val and test) used to fork 2 workers: now one pool of 2
    # reads every train split, another of 2 every val and test split
    assert len(pids) == len(pids_none) and os.getpid() not in pids
    assert len(set(pids)) == 4
    assert not any(_alive(pid) for pid in set(pids))  # the run ended its workers


def test_random_augmentations_repeat_exactly_with_the_pool(tmp_path, monkeypatch):
    """Workers re-seeded per iteration as torch seeds new ones: the jitter, hence the metrics, are the same."""
    monkeypatch.setenv("FEDLIT_WORKER_POOLS", "0")  # a new pair of workers for every loader iteration
    own, own_pids = _fit(tmp_path, "own", jitter=True, num_workers=2)
    monkeypatch.setenv("FEDLIT_WORKER_POOLS", "1")
    pooled, pids = _fit(tmp_path, "pooled", jitter=True, num_workers=2)
    assert pooled == own
    assert len(set(pids)) == 4 and len(set(own_pids)) > 20


@pytest.mark.parametrize("pools", ["0", "1"])
def test_a_loader_iterated_inside_another_gets_its_own_workers(tmp_path, monkeypatch, pools):
    """Two loaders of one kind iterated together, one abandoned half way: each gives its own batches."""
    monkeypatch.setenv("FEDLIT_WORKER_POOLS", pools)
    data = _Files(tmp_path / "pids", jitter=True, num_workers=2)
    seen = []
    try:
        outer = iter(data.train_dataloader("a", torch.Generator().manual_seed(1)))
        seen.append(next(outer)[0])
        for batch in data.train_dataloader("b", torch.Generator().manual_seed(2)):
            seen.append(batch[0])
        seen.extend(batch[0] for batch in outer)
        for batch in data.train_dataloader("c", torch.Generator().manual_seed(3)):
            seen.append(batch[0])
            break  # abandoned: the next iteration still starts clean
        seen.extend(batch[0] for batch in data.train_dataloader("a", torch.Generator().manual_seed(4)))
    finally:
        data.close_workers()
    expected = _expected(tmp_path, monkeypatch)
    assert len(seen) == len(expected) == 3 + 3 + 1 + 3
    assert all(torch.equal(x, y) for x, y in zip(seen, expected, strict=True))
    assert data._workers.starts == (1 if pools == "1" else 0)


def _expected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """The same batches, each loader iterated on its own, one after the other (no pool)."""
    monkeypatch.setenv("FEDLIT_WORKER_POOLS", "0")
    data = _Files(tmp_path / "pids", jitter=True, num_workers=2)
    a = [b[0] for b in data.train_dataloader("a", torch.Generator().manual_seed(1))]
    b = [b[0] for b in data.train_dataloader("b", torch.Generator().manual_seed(2))]
    c = next(iter(data.train_dataloader("c", torch.Generator().manual_seed(3))))[0]
    again = [b[0] for b in data.train_dataloader("a", torch.Generator().manual_seed(4))]
    return [a[0], *b, *a[1:], c, *again]
