"""FedBN, FedPxN and SiloBN on every kind of normalization (the FedPxN paper's BatchNorm / GroupNorm / LayerNorm
comparison): after a real round, what each keeps on the clients and what the server averages."""

import warnings

import numpy as np
import pytest
import torch
import torchvision
from torch import nn

from fedlit import Federation, RoleRule
from fedlit.data import FederatedDataModule, PartitionedData
from fedlit.models import MLP, Backbone, SmallCNN
from fedlit.models.norms import swap_norms
from fedlit.strategies import FedBN, FedPxN, SiloBN
from fedlit.tasks import ClassificationModule

# Independent of fedlit.core.roles: the layer types each kind builds.
NORM_LAYERS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.GroupNorm, nn.LayerNorm)


class Images(FederatedDataModule):
    """3 clients of 12 samples of ``shape``, shifted per client, 2 classes."""

    def __init__(self, *, shape: tuple[int, ...], batch_size: int = 4, seed: int = 0) -> None:
        super().__init__(batch_size=batch_size, seed=seed)
        self.shape = tuple(shape)

    def build(self) -> PartitionedData:
        rng = np.random.default_rng(self.seed)
        n, splits = 12, {}
        inputs = np.concatenate([rng.normal(k, 1.0 + k, size=(n, *self.shape)) for k in range(3)]).astype(np.float32)
        targets = (inputs.reshape(3 * n, -1).mean(1) > np.repeat(np.arange(3), n)).astype(np.int64)
        for k in range(3):
            idx = np.arange(k * n, (k + 1) * n)
            splits[f"c{k}"] = {"train": idx[:8], "val": idx[8:10], "test": idx[10:]}
        return PartitionedData(
            name="images",
            task="multiclass",
            num_classes=2,
            inputs=torch.from_numpy(inputs),
            targets=torch.from_numpy(targets),
            splits=splits,
            partitioner="natural",
        )


class EfficientNetB0(Backbone):
    """torchvision's EfficientNet-B0 (random weights) with its BatchNorm layers swapped for ``norm``."""

    def __init__(self, *, norm: str = "batch") -> None:
        self.norm = norm

    def build(self) -> nn.Module:
        model = swap_norms(torchvision.models.efficientnet_b0(weights=None), self.norm, groups=8)
        model.classifier = nn.Identity()
        model.num_features = 1280
        return model


BACKBONES = {
    "SmallCNN": (lambda norm: SmallCNN(in_channels=3, width=8, depth=2, norm=norm, groups=4), (3, 8, 8)),
    "MLP": (lambda norm: MLP(num_features=4, hidden=[8], norm=norm, groups=4), (4,)),
    "efficientnet_b0": (lambda norm: EfficientNetB0(norm=norm), (3, 16, 16)),
}


def _norm_tensors(module: nn.Module) -> tuple[set[str], set[str]]:
    """The parameters and the buffers of the normalization layers of ``module``."""
    params, buffers = set(), set()
    for name, layer in module.named_modules():
        if isinstance(layer, NORM_LAYERS):
            params |= {f"{name}.{n}" for n, _ in layer.named_parameters(recurse=False)}
            buffers |= {f"{name}.{n}" for n, _ in layer.named_buffers(recurse=False)}
    return params, buffers


# EfficientNet-B0 takes about 20 s of CPU per run: marked slow (`-m slow`), the two small backbones run by default.
@pytest.mark.parametrize("backbone", ["SmallCNN", "MLP", pytest.param("efficientnet_b0", marks=pytest.mark.slow)])
@pytest.mark.parametrize("norm", ["batch", "group", "layer"])
@pytest.mark.parametrize("strategy", [FedBN, FedPxN, SiloBN])
def test_normalization_stays_local_after_a_round(tmp_path, strategy, norm, backbone):
    spec, shape = BACKBONES[backbone]
    torch.manual_seed(0)
    module = ClassificationModule(
        backbone=spec(norm), num_classes=2, lr=0.01, momentum=0.9, roles=[RoleRule("backbone.*", "shared")]
    )
    params, buffers = _norm_tensors(module)
    assert params, "every kind has affine normalization parameters"
    assert bool(buffers) == (norm == "batch")  # only BatchNorm keeps running statistics
    fed = Federation(
        module,
        Images(shape=shape),
        strategy(),
        rounds=1,
        out_dir=tmp_path,
        progress_bar=False,
        seed=0,
        accelerator="cpu",
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fed.fit()
    # The paper's FedBN and FedPxN keep every normalization tensor local; SiloBN only the statistics, so on
    # GroupNorm/LayerNorm (no statistics) it keeps nothing and says it is FedAvg.
    local = params | buffers if strategy in (FedBN, FedPxN) else buffers
    averaged = params - local
    server = fed.strategy.global_state
    assert not local & set(server)
    assert averaged <= set(server)
    assert any(n.endswith("conv.weight") or ".linear." in n or "features.0.0" in n for n in server)
    said_fedavg = any("keeps nothing personal" in str(w.message) for w in caught)
    assert said_fedavg == (strategy is SiloBN and norm != "batch")
    stored = {c: fed.store.tensors(c) for c in fed.client_ids}
    for name in local - {n for n in buffers if n.endswith("num_batches_tracked")}:
        values = [stored[c][name] for c in fed.client_ids]
        # kept per client: each client trained its own copy on its own data (averaged, the three would be equal)
        assert all(not torch.equal(values[i], values[j]) for i in range(3) for j in range(i + 1, 3)), name
    for name in averaged:
        # averaged: what the clients evaluate with is the server's one value
        for c in fed.client_ids:
            assert name not in stored[c] or torch.equal(stored[c][name], server[name]), name
