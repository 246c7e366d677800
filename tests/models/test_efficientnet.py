"""``EfficientNetB0``: torchvision's EfficientNet-B0 as a headless backbone with BatchNorm or GroupNorm, random or
loaded from a local file by name or by position, nothing downloaded."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedlit.core.errors import ConfigError, InputFileError
from fedlit.core.roles import is_norm_module
from fedlit.models import EfficientNetB0

# EfficientNet-B0's normalization layers: the stem, 16 MBConv blocks (the first, of expand ratio 1, has a depthwise
# and a projection norm; the 15 others an expansion norm too) and the head: 1 + 2 + 15 * 3 + 1.
NORMS = 49


def build(**options) -> nn.Module:
    with pytest.warns(UserWarning, match="randomly initialized"):
        return EfficientNetB0(**options).build()


def test_batch_norm_backbone_gives_1280_features_and_49_batch_norms():
    model = build(dropout=0.0)
    assert model.num_features == 1280
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 1280)
    assert sum(isinstance(m, nn.BatchNorm2d) for m in model.modules()) == NORMS
    assert sum(p.numel() for p in model.parameters()) == 4_007_548  # torchvision's features, without classifier


def test_group_norm_swaps_every_batch_norm_and_keeps_the_parameter_names():
    batch, group = build(), build(norm="group", groups=2)
    groups = [m for m in group.modules() if isinstance(m, nn.GroupNorm)]
    assert len(groups) == NORMS and all(m.num_groups == 2 for m in groups)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in group.modules())
    assert [n for n, _ in group.named_parameters()] == [n for n, _ in batch.named_parameters()]
    assert not [n for n, _ in group.named_buffers()]  # no running statistics left
    assert all(is_norm_module(m) for m in groups)  # what FedBN and FedPxN keep local
    # GroupNorm normalizes each sample on its own: a batch of one gives the same features as within a batch
    group.eval()
    x = torch.randn(3, 3, 32, 32)
    assert torch.allclose(group(x)[1:2], group(x[1:2]), atol=1e-5)


def test_weights_load_by_name_and_group_norm_starts_from_the_batch_norm_affine_weights(tmp_path):
    source = build()
    with torch.no_grad():
        for m in source.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    state = {
        **source.state_dict(),
        "classifier.1.weight": torch.zeros(1000, 1280),
        "classifier.1.bias": torch.zeros(1000),
    }
    path = tmp_path / "efficientnet_b0.pth"
    torch.save(state, path)
    loaded = EfficientNetB0(weights=path).build()  # no warning: every tensor loaded, the classifier dropped
    for key, value in source.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    grouped = EfficientNetB0(weights=path, norm="group", groups=8).build()
    norm = "features.1.0.block.0.1"  # the first block's depthwise norm (32 channels)
    assert torch.equal(grouped.state_dict()[f"{norm}.weight"], state[f"{norm}.weight"])
    assert torch.equal(grouped.state_dict()[f"{norm}.bias"], state[f"{norm}.bias"])
    conv = "features.0.0.weight"
    assert torch.equal(grouped.state_dict()[conv], state[conv])


def test_weights_of_another_implementation_load_by_position(tmp_path):
    source = build()
    path = tmp_path / "renamed.pth"
    # another naming, the same order (BatchNorm counters keep their name: the loader pairs them among themselves)
    renamed = {
        f"t{i:04d}" + (".num_batches_tracked" if key.endswith("num_batches_tracked") else ""): value
        for i, (key, value) in enumerate(source.state_dict().items())
    }
    torch.save(renamed, path)
    loaded = EfficientNetB0(weights=path, key_mapping="position").build()
    assert all(
        torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), source.state_dict().values(), strict=True)
    )


def test_bad_options_and_a_missing_file_are_named(tmp_path):
    with pytest.raises(ConfigError) as err:
        EfficientNetB0(norm="group", groups=16)
    assert str(err.value) == (
        "EfficientNetB0: groups=16 must divide the channels of every normalized layer; [24, 40] are not multiples"
    )
    with pytest.raises(ConfigError, match=r"norm must be one of \['batch', 'group'\], got 'layer'"):
        EfficientNetB0(norm="layer")
    with pytest.raises(ConfigError, match=r"dropout must be in \[0, 1\), got 1.0"):
        EfficientNetB0(dropout=1.0)
    with pytest.raises(InputFileError, match="weights='/nowhere/b0.pth' is not a file"):
        EfficientNetB0(weights="/nowhere/b0.pth").build()
