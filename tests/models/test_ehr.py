"""The eICU encoders: padding never changes a stay's features, the norm kinds are the layers asked for, and the
position encodings and masked mean match values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fedlit.core.errors import ConfigError
from fedlit.core.roles import is_norm_module
from fedlit.models import EHRGRU, EHRTransformer
from fedlit.models.ehr import masked_mean, positions

S, D = 3, 2


def transformer(norm: str = "layer", groups: int = 2) -> EHRTransformer:
    return EHRTransformer(
        series_features=S, static_features=D, d_model=8, heads=2, feedforward=8, fc=[8, 6], out_features=4,
        dropout=0.0, norm=norm, groups=groups,
    )  # fmt: skip


def gru(norm: str = "layer") -> EHRGRU:
    return EHRGRU(
        series_features=S, static_features=D, hidden=8, layers=2, fc=[6], out_features=4, norm=norm, dropout=0.0
    )


def stays(hours: list[int], total: int, padding: float = 0.0) -> torch.Tensor:
    """Packed stays with ``hours[i]`` real hours of random values, the rest ``padding``."""
    gen = torch.Generator().manual_seed(0)
    x = torch.full((len(hours), total, 1 + S + D), padding)
    for i, n in enumerate(hours):
        x[i, :n, 0] = 1.0
        x[i, :n, 1 : 1 + S] = torch.randn(n, S, generator=gen)
        x[i, :, 1 + S :] = torch.randn(D, generator=gen)
    return x


@pytest.mark.parametrize(
    "spec",
    [transformer("layer"), transformer("group"), transformer("batch"), gru("layer"), gru("group"), gru("batch")],
    ids=["tf-layer", "tf-group", "tf-batch", "gru-layer", "gru-group", "gru-batch"],
)
def test_padding_hours_do_not_change_the_features(spec):
    torch.manual_seed(0)
    net = spec.build().eval()
    short = stays([3, 5], 5)
    long = stays([3, 5], 9, padding=7.0)  # same stays, 4 more padding hours full of garbage
    long[:, :, 0] = torch.cat([short[:, :, 0], torch.zeros(2, 4)], dim=1)
    long[:, :5, 1:] = short[:, :, 1:]
    long[0, 3:5, 1 : 1 + S] = 7.0  # stay 0's own padding differs too
    out = net(short)
    assert out.shape == (2, net.num_features) == (2, 4)
    assert torch.allclose(net(long), out, atol=1e-5)
    net.train()  # BatchNorm's batch statistics leave padding out as well
    assert torch.allclose(net(long), net(short), atol=1e-5)


def test_the_norm_kind_builds_those_layers_and_norm_aware_strategies_see_them():
    kinds = {"layer": nn.LayerNorm, "group": nn.GroupNorm, "batch": nn.BatchNorm1d}
    for norm, kind in kinds.items():
        net = transformer(norm).build()
        found = [n for n, m in net.named_modules() if isinstance(m, kind)]
        # 2 per encoder layer, 1 per fc layer
        assert found == ["layers.0.norm1.norm", "layers.0.norm2.norm", "layers.1.norm1.norm", "layers.1.norm2.norm",
                         "fc.1", "fc.4"]  # fmt: skip
        assert all(is_norm_module(dict(net.named_modules())[n], n) for n in found)
    group = dict(transformer("group", groups=2).build().named_modules())["fc.4"]
    assert (group.num_groups, group.num_channels) == (2, 6)
    assert not [m for m in transformer("none").build().modules() if isinstance(m, (*kinds.values(),))]
    assert [n for n, m in gru("group").build().named_modules() if isinstance(m, nn.GroupNorm)] == [
        "input_norm.norm",
        "fc.1",
    ]


def test_positions_and_masked_mean_by_hand():
    # frequencies exp(-[0, 2] ln(10000) / 4) = 1 and 0.01
    expected = [[0.0, 1.0, 0.0, 1.0], [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)]]
    assert positions(2, 4).reshape(-1).tolist() == pytest.approx([v for row in expected for v in row])
    x = torch.tensor([[[1.0], [3.0], [100.0]], [[2.0], [4.0], [6.0]]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    assert masked_mean(x, mask).tolist() == [[2.0], [4.0]]


def test_a_stay_without_hours_still_gets_finite_features():
    x = stays([0, 2], 3)
    assert torch.isfinite(transformer().build().eval()(x)).all() and torch.isfinite(gru().build().eval()(x)).all()


def test_options_are_checked_and_named():
    with pytest.raises(ConfigError, match=r"groups=3 must divide the channels .*; \[8\] are not"):
        transformer("group", groups=3)
    with pytest.raises(ConfigError, match=r"norm must be one of"):
        gru("instance")
    with pytest.raises(ConfigError, match=r"series_features must be an integer >= 1, got 0"):
        EHRGRU(series_features=0, static_features=1)
    with pytest.raises(ConfigError, match=r"heads=3 must divide d_model=8"):
        EHRTransformer(series_features=1, static_features=1, d_model=8, heads=3)
