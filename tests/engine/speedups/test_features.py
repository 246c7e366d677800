"""Frozen features computed once (``federation.cache_features``): the same results as without the cache, the
extractor run once per sample, a disk cache a resumed run reads back, and a warning (the run uncached) where the
features would change from pass to pass. The equality with the uncached run holds on the CPU and, under the ``gpu``
marker (``make test-gpu``), on CUDA (the ``accelerator`` fixture)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fedlit import FedAvg, Federation, RoleRule
from fedlit.core.errors import ConfigError
from fedlit.data import FederatedDataModule, SampleList
from fedlit.data.site_dataset import DatasetInput
from fedlit.engine.speedups.features import FOLDER, FeatureCache
from fedlit.models import Backbone
from fedlit.strategies.fedavg_ft import FedAvgFT
from fedlit.strategies.fedper import FedPer
from fedlit.strategies.fedrep import FedRep
from fedlit.tasks import ClassificationModule
from tests.conftest import TinyMLP, TinyTabular, _equal, make_federation

FROZEN = []  # the module's default roles: backbone frozen, head shared


def _count_calls(fed: Federation) -> list[int]:
    calls = [0]
    fed.module.backbone.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def _same_run(a: Federation, b: Federation, a_results: dict, b_results: dict) -> None:
    assert a_results["last"] == b_results["last"] and a_results.get("best") == b_results.get("best")
    assert _equal(a.history.state_dict(), b.history.state_dict())
    assert _equal(a.module.state_dict(), b.module.state_dict())
    assert _equal(a.store.state_dict(), b.store.state_dict())
    assert _equal(a.strategy.state_dict(), b.strategy.state_dict())


@pytest.mark.parametrize(
    "strategy, kwargs",
    [
        (FedAvg, {}),
        (lambda: FedPer(head="head.bias"), {}),
        (lambda: FedRep(head="head.bias", head_steps=1), {"local_steps": 3}),
        (lambda: FedAvgFT(finetune_steps=2), {}),
    ],
    ids=["fedavg", "fedper", "fedrep", "fedavg_ft"],
)
def test_cached_features_give_the_results_of_the_uncached_run(tmp_path: Path, strategy, kwargs, accelerator) -> None:
    runs, results, calls = {}, {}, {}
    for mode in ("off", "memory"):
        runs[mode] = make_federation(
            tmp_path / mode, strategy(), rounds=3, roles=FROZEN, cache_features=mode, accelerator=accelerator, **kwargs
        )
        runs[mode].setup()
        calls[mode] = _count_calls(runs[mode])
        results[mode] = runs[mode].fit()
    _same_run(runs["off"], runs["memory"], results["off"], results["memory"])
    assert runs["off"].client_data is None
    # Each of 3 clients: 15 train samples (2 batches of 8), 7 val and 8 test (1 batch each): 4 batches, once.
    assert isinstance(runs["memory"].client_data, FeatureCache) and runs["memory"].client_data.computed == 9
    assert calls["memory"][0] == 12 < calls["off"][0]  # uncached: FedAvg's 3 rounds run these 12 batches 3 times


def test_a_disk_cache_is_read_back_by_a_resumed_run(tmp_path: Path) -> None:
    straight = make_federation(tmp_path / "straight", FedAvg(), rounds=4, roles=FROZEN)
    straight_results = straight.fit()
    make_federation(tmp_path / "resumed", FedAvg(), rounds=2, roles=FROZEN, cache_features="disk").fit()
    files = sorted(
        p.relative_to(tmp_path / "resumed" / FOLDER).parts[0] for p in (tmp_path / "resumed" / FOLDER).rglob("*.pt")
    )
    assert files == ["c0"] * 3 + ["c1"] * 3 + ["c2"] * 3
    torch.manual_seed(1234)
    second = make_federation(tmp_path / "resumed", FedAvg(), rounds=4, roles=FROZEN, cache_features="disk")
    second_results = second.fit(ckpt_path=tmp_path / "resumed" / "checkpoints" / "last.ckpt")
    assert second.client_data.computed == 0  # every split read back from the disk
    _same_run(straight, second, straight_results, second_results)


def test_a_disk_cache_of_another_backbone_is_not_read(tmp_path: Path) -> None:
    make_federation(tmp_path / "a", FedAvg(), rounds=1, roles=FROZEN, cache_features="disk").fit()
    other = make_federation(tmp_path / "b", FedAvg(), rounds=1, roles=FROZEN, cache_features="disk", seed=1)
    other.out_dir = tmp_path / "a"  # the first run's folder: its files are keyed by another backbone
    other.setup()
    other.client_data.train_dataloader("c0", torch.Generator())
    assert other.client_data.computed == 1
    assert len(list((tmp_path / "a" / FOLDER / "c0").glob("train-*.pt"))) == 2


def test_a_trained_backbone_turns_the_cache_off_with_a_warning(tmp_path: Path) -> None:
    fed = make_federation(
        tmp_path, FedAvg(), rounds=1, roles=[RoleRule("backbone.0.*", "shared")], cache_features="memory"
    )
    with pytest.warns(
        UserWarning,
        match=r"cache_features='memory' is off for this run: 2 tensors of the backbone "
        r"train \('backbone.0.weight' is 'shared'\)",
    ):
        fed.setup()
    assert fed.client_data is None


class _Dropping(Backbone):
    def __init__(self, *, p: float) -> None:
        self.p = p

    def build(self) -> nn.Module:
        net = nn.Sequential(nn.Linear(4, 8), nn.Dropout(self.p))
        net.num_features = 8
        return net


def test_dropout_in_the_frozen_backbone_turns_the_cache_off(tmp_path: Path) -> None:

    for p, warns in ((0.5, True), (0.0, False)):
        module = ClassificationModule(backbone=_Dropping(p=p), num_classes=3)
        fed = Federation(
            module,
            TinyTabular(),
            FedAvg(),
            rounds=1,
            out_dir=tmp_path / str(p),
            progress_bar=False,
            accelerator="cpu",
            cache_features="memory",
        )
        if warns:
            with pytest.warns(UserWarning, match=r"the layers \['1'\] of the backbone are random in training"):
                fed.setup()
        else:
            fed.setup()
        assert (fed.client_data is None) == warns


class _Shift(nn.Module):
    def __init__(self, by: float) -> None:
        super().__init__()
        self.by = by

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.by

    def extra_repr(self) -> str:
        return f"by={self.by}"


class _Vectors(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.tensor([i / 10, -i / 10, (i % 3) / 3, 1.0]), i % 3


class _Files(FederatedDataModule):
    """File-backed data (2 sites) with separate train and evaluation transforms."""

    def __init__(self, train_shift: float) -> None:
        super().__init__(batch_size=4)
        self.train_shift = train_shift

    def build_samples(self) -> SampleList:
        samples = {site: list(range(12 * k, 12 * k + 12)) for k, site in enumerate("ab")}
        splits = {s: {"train": np.arange(6), "val": np.arange(6, 9), "test": np.arange(9, 12)} for s in "ab"}
        return SampleList(
            name="vectors",
            task="multiclass",
            num_classes=3,
            samples=samples,
            targets={s: torch.tensor([i % 3 for i in ids]) for s, ids in samples.items()},
            splits=splits,
            read=DatasetInput(_Vectors()),
            train_transform=_Shift(self.train_shift),
            eval_transform=_Shift(0.0),
        )


def test_a_train_transform_other_than_the_evaluation_one_turns_the_cache_off(tmp_path: Path) -> None:

    for shift, warns in ((0.5, True), (0.0, False)):
        torch.manual_seed(0)
        module = ClassificationModule(backbone=TinyMLP(), num_classes=3)
        fed = Federation(
            module,
            _Files(shift),
            FedAvg(),
            rounds=2,
            out_dir=tmp_path / str(shift),
            progress_bar=False,
            accelerator="cpu",
            cache_features="memory",
        )
        if warns:
            with pytest.warns(
                UserWarning,
                match=r"the train split's transform _Shift\(by=0.5\) differs from the "
                r"evaluation one _Shift\(by=0.0\)",
            ):
                fed.setup()
        else:
            fed.setup()
        assert (fed.client_data is None) == warns


def test_file_backed_data_cached_gives_the_uncached_results(tmp_path: Path) -> None:

    runs, results = {}, {}
    for mode in ("off", "memory"):
        torch.manual_seed(0)
        module = ClassificationModule(backbone=TinyMLP(), num_classes=3, lr=0.1)
        runs[mode] = Federation(
            module,
            _Files(0.0),
            FedAvg(),
            rounds=2,
            out_dir=tmp_path / mode,
            progress_bar=False,
            accelerator="cpu",
            cache_features=mode,
        )
        results[mode] = runs[mode].fit()
    assert runs["memory"].client_data.computed == 6
    _same_run(runs["off"], runs["memory"], results["off"], results["memory"])


def test_an_unknown_cache_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"federation.cache_features='yes' is not one of \['off', 'memory', 'disk'\]"):
        make_federation(tmp_path, FedAvg(), roles=FROZEN, cache_features="yes")


def test_a_cox_module_cached_gives_the_uncached_results(tmp_path: Path) -> None:
    from fedlit.data import SyntheticSurvival
    from fedlit.models import MLP
    from fedlit.tasks.survival import CoxModule

    runs, results = {}, {}
    for mode in ("off", "memory"):
        torch.manual_seed(0)
        module = CoxModule(backbone=MLP(num_features=8, hidden=[16]), lr=0.05)
        data = SyntheticSurvival(num_clients=2, samples_per_client=60, batch_size=16)
        runs[mode] = Federation(
            module,
            data,
            FedAvg(),
            rounds=2,
            out_dir=tmp_path / mode,
            progress_bar=False,
            accelerator="cpu",
            cache_features=mode,
        )
        results[mode] = runs[mode].fit()
    assert runs["memory"].client_data.computed == 6
    _same_run(runs["off"], runs["memory"], results["off"], results["memory"])
