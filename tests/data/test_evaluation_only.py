"""Evaluation-only clients: listed in a file-backed data set, never selected for training, evaluated each round
with what the strategy sends a client that has not trained (FedAvg: the global model)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from fedlit import FedAvg, Federation
from fedlit.core.errors import DataError
from fedlit.data import FederatedDataModule, SampleList
from fedlit.data.site_dataset import DatasetInput
from fedlit.models import MLP
from fedlit.tasks import ClassificationModule


class Points(Dataset):
    """Sample i: a 2-vector (i, -i) / 10 with class i % 2."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.tensor([i / 10, -i / 10]), i % 2


class Sites(FederatedDataModule):
    """Sites a, b train on samples 0-7 / 8-15; site c holds samples 16-23 and only tests."""

    def __init__(self, evaluation_only: frozenset[str] = frozenset({"c"})) -> None:
        super().__init__(batch_size=4)
        self.evaluation_only_sites = evaluation_only

    def build_samples(self) -> SampleList:
        samples = {site: list(range(8 * k, 8 * k + 8)) for k, site in enumerate("abc")}
        none = np.array([], dtype=int)
        splits = {site: {"train": np.arange(6), "val": none, "test": np.array([6, 7])} for site in "ab"}
        splits["c"] = {"train": none, "val": none, "test": np.arange(8)}
        return SampleList(
            name="points",
            task="multiclass",
            num_classes=2,
            samples=samples,
            targets={s: torch.tensor([i % 2 for i in ids]) for s, ids in samples.items()},
            splits=splits,
            read=DatasetInput(Points()),
            evaluation_only=self.evaluation_only_sites,
        )


def test_an_evaluation_only_client_is_tested_with_the_global_model_and_never_trained(tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = ClassificationModule(backbone=MLP(num_features=2, hidden=[4], norm="none"), num_classes=2, lr=0.1)
    data = Sites()
    trained: list[str] = []

    class Recording(FedAvg):
        def on_client_fit_start(self, server_round: int, client_id: str, received: dict) -> None:
            trained.append(client_id)

    fed = Federation(module, data, Recording(), rounds=2, out_dir=tmp_path, progress_bar=False)
    results = fed.fit()
    assert sorted(set(trained)) == ["a", "b"] and len(trained) == 4
    assert fed.strategy.client_ids == ["a", "b"]
    assert set(results["last"]["clients"]) == {"a", "b", "c"}
    # c's test accuracy is the global model's on samples 16-23, recomputed here by hand
    module.load_state_dict({**module.state_dict(), **fed.strategy.global_state})
    with torch.no_grad():
        x = torch.stack([Points()[i][0] for i in range(16, 24)])
        accuracy = (module(x).argmax(1) == torch.arange(16, 24) % 2).float().mean().item()
    assert results["last"]["clients"]["c"]["accuracy"] == pytest.approx(accuracy)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["evaluation_only"] == ["c"] and results["evaluation_only"] == ["c"]


def test_an_empty_train_split_is_refused_unless_the_client_is_evaluation_only() -> None:
    with pytest.raises(DataError, match=r"client 'c' has 0 train samples"):
        Sites(evaluation_only=frozenset()).setup()
    with pytest.raises(DataError, match=r"every client is evaluation-only"):
        Sites(evaluation_only=frozenset("abc")).setup()
