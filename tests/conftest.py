"""Shared fixtures: a tiny tabular federation (3 clients, a few samples, fixed seed) and a tiny MLP backbone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fedlit.data import FederatedDataModule, PartitionedData
from fedlit.models import Backbone
from tests.children import tie_xdist_worker

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
INTEGRATION = Path(__file__).resolve().parent / "integration"


def pytest_configure(config: pytest.Config) -> None:
    tie_xdist_worker()  # a worker of `pytest -n 2` dies with the pytest command, its test's children with it


@pytest.hookimpl(tryfirst=True)  # before -m selects by mark
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:  # tests/integration/ holds whole runs: all `long` (make test-fast leaves them out)
        if item.path.is_relative_to(INTEGRATION):
            item.add_marker(pytest.mark.long)


class TinyMLP(Backbone):
    """Linear -> BatchNorm1d -> ReLU: small, but with a norm layer and buffers."""

    def __init__(self, *, in_features: int = 4, hidden: int = 8) -> None:
        self.in_features, self.hidden = in_features, hidden

    def build(self) -> nn.Module:
        net = nn.Sequential(nn.Linear(self.in_features, self.hidden), nn.BatchNorm1d(self.hidden), nn.ReLU())
        net.num_features = self.hidden
        return net


class TinyTabular(FederatedDataModule):
    """3 clients whose features are shifted and whose labels depend on them (classes 0..2)."""

    def __init__(
        self,
        *,
        num_clients: int = 3,
        samples: int = 30,
        batch_size: int = 8,
        seed: int = 0,
        names: list[str] | None = None,
    ) -> None:
        super().__init__(batch_size=batch_size, seed=seed)
        self.names = list(names) if names else [f"c{k}" for k in range(num_clients)]  # the client ids
        self.num_clients, self.samples = len(self.names), samples

    def build(self) -> PartitionedData:
        rng = np.random.default_rng(self.seed)
        inputs, targets, splits, start = [], [], {}, 0
        for k in range(self.num_clients):
            x = rng.normal(k * 0.5, 1.0, size=(self.samples, 4)).astype(np.float32)
            y = (x[:, 0] + x[:, 1] > k * 1.0).astype(np.int64) + (x[:, 2] > 1.0)
            inputs.append(x)
            targets.append(y)
            idx = np.arange(start, start + self.samples)
            n_train, n_val = int(0.5 * self.samples), int(0.25 * self.samples)
            splits[self.names[k]] = {
                "train": idx[:n_train],
                "val": idx[n_train : n_train + n_val],
                "test": idx[n_train + n_val :],
            }
            start += self.samples
        return PartitionedData(
            name="tiny",
            task="multiclass",
            num_classes=3,
            inputs=torch.from_numpy(np.concatenate(inputs)),
            targets=torch.from_numpy(np.concatenate(targets)),
            splits=splits,
            partitioner="natural",
        )


def make_federation(out_dir, strategy, rounds=2, roles=None, seed=0, num_clients=3, names=None, **kwargs):
    """A Federation of ``TinyMLP`` (everything trainable unless ``roles`` says otherwise) on ``TinyTabular`` with
    ``num_clients`` clients (named ``names``, default c0, c1...); ``kwargs`` go to the ``Federation``."""
    from fedlit import Federation, RoleRule
    from fedlit.tasks import ClassificationModule

    torch.manual_seed(seed)
    module = ClassificationModule(
        backbone=TinyMLP(),
        num_classes=3,
        lr=0.1,
        momentum=0.9,
        roles=roles if roles is not None else [RoleRule("backbone.*", "shared")],
    )
    kwargs.setdefault("accelerator", "cpu")  # the pinned values are CPU values, also on a machine with a GPU
    return Federation(
        module,
        TinyTabular(num_clients=num_clients, names=names),
        strategy,
        rounds=rounds,
        out_dir=out_dir,
        progress_bar=False,
        seed=seed,
        **kwargs,
    )


def assert_resume_is_exact(tmp_path, strategy_factory, **kwargs):
    """4 rounds straight == 2 rounds + resume (fresh objects, other global RNG state) + 2 rounds: final
    metrics, every client's stored state, the strategy's server state and communication totals."""
    straight = make_federation(tmp_path / "straight", strategy_factory(), rounds=4, **kwargs)
    straight_results = straight.fit()
    make_federation(tmp_path / "resumed", strategy_factory(), rounds=2, **kwargs).fit()
    torch.manual_seed(1234)
    second = make_federation(tmp_path / "resumed", strategy_factory(), rounds=4, **kwargs)
    resumed_results = second.fit(ckpt_path=tmp_path / "resumed" / "checkpoints" / "last.ckpt")
    assert resumed_results["last"] == straight_results["last"]
    assert resumed_results.get("best") == straight_results.get("best")
    for client in straight.client_ids:
        a, b = straight.store.tensors(client), second.store.tensors(client)
        assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
        assert _equal(straight.store.state_dict()["extra"].get(client), second.store.state_dict()["extra"].get(client))
    assert _equal(straight.strategy.state_dict(), second.strategy.state_dict())
    if kwargs.get("eval_every", 1) == 1:
        assert straight.state.comm == second.state.comm
    else:  # the 2-round leg evaluated its last round (round 2), which the straight run skipped
        assert {k: v for k, v in straight.state.comm.items() if not k.startswith("eval")} == {
            k: v for k, v in second.state.comm.items() if not k.startswith("eval")
        }
    return straight, second


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        same_length = isinstance(b, (list, tuple)) and len(a) == len(b)
        return same_length and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data folder {SHARED_DATA} is absent (it sits beside the repository as shared/data)")
    return SHARED_DATA


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def accelerator(request: pytest.FixtureRequest):
    """The device a test runs on: ``cpu`` in the default suite; also ``cuda`` under the ``gpu`` marker (``make
    test-gpu``), skipped without CUDA. On CUDA, TF32 is off while the test runs: its equalities hold to the CPU's
    float32 tolerances."""
    if request.param == "cpu":
        yield "cpu"
        return
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA: run `make test-gpu` on a machine with an NVIDIA GPU")
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield "cuda"
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn
