"""ResNet1dSE: the FedPxN paper's ECG ResNet with squeeze-and-excitation, its shapes, norms and options."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedlit.core.errors import ConfigError
from fedlit.models import ResNet1dSE
from fedlit.models.resnet1d import SqueezeExcitation1d

TINY = dict(in_channels=2, stem_width=4, widths=[2], kernel_size=3, stride=2, expansion=2, se_reduction=2)


def test_the_paper_size_maps_a_5_s_12_lead_segment_to_1280_features():
    model = ResNet1dSE().build().eval()
    assert model.num_features == 1280
    assert model(torch.randn(2, 12, 2500)).shape == (2, 1280)
    # stage outputs 512, 768, 1024, 1280 channels, each stride 4: 2500 -> 625 -> 157 -> 40 -> 10 samples
    x = model.stem(torch.randn(1, 12, 2500))
    lengths = []
    for stage in model.stages:
        x = stage(x)
        lengths.append((x.shape[1], x.shape[2]))
    assert lengths == [(512, 625), (768, 157), (1024, 40), (1280, 10)]


@pytest.mark.parametrize("norm", ["batch", "group", "layer"])
def test_tiny_parameter_count_by_hand(norm):
    model = ResNet1dSE(**TINY, norm=norm).build()
    # stem: conv 2*4*3 = 24, norm 2*4 = 8 -> 32. Block (width 2, out 4): head conv 4*2 = 8 + norm 4; neck conv
    # 2*2*3 = 12 + norm 4; tail conv 2*4 = 8 + norm 8; SE Linear(4, 2) 10 + Linear(2, 4) 12; shortcut conv 4*4 = 16
    # + norm 8 -> 90. Every norm kind has one weight and one bias per channel.
    assert sum(p.numel() for p in model.parameters()) == 32 + 90
    assert model(torch.randn(3, 2, 9)).shape == (3, 4)  # 9 samples -> ceil(9 / 2) = 5, max-pooled


def test_norm_kinds_build_their_layers():
    def kinds(model: nn.Module) -> set[tuple[str, int]]:
        return {
            (type(m).__name__, getattr(m, "num_groups", 0))
            for m in model.modules()
            if isinstance(m, nn.BatchNorm1d | nn.GroupNorm)
        }

    assert kinds(ResNet1dSE(**TINY, norm="batch").build()) == {("BatchNorm1d", 0)}
    assert kinds(ResNet1dSE(**TINY, norm="group", groups=2).build()) == {("GroupNorm", 2)}
    assert kinds(ResNet1dSE(**TINY, norm="layer").build()) == {("GroupNorm", 1)}
    assert len([m for m in ResNet1dSE(**TINY).build().modules() if isinstance(m, nn.BatchNorm1d)]) == 5


def test_group_norm_makes_a_sample_independent_of_its_batch():
    torch.manual_seed(0)
    x = torch.randn(4, 2, 16)
    group = ResNet1dSE(**TINY, norm="group", dropout=0.0).build().train()
    assert torch.allclose(group(x)[:1], group(x[:1]), atol=1e-6)
    batch = ResNet1dSE(**TINY, norm="batch", dropout=0.0).build().train()
    assert not torch.allclose(batch(x)[:1], batch(x[:2])[:1], atol=1e-3)


def test_squeeze_excitation_gates_channels_by_hand():
    se = SqueezeExcitation1d(2, 2)
    with torch.no_grad():
        se.fc[0].weight.copy_(torch.tensor([[1.0, 1.0]]))
        se.fc[0].bias.zero_()
        se.fc[2].weight.copy_(torch.tensor([[1.0], [-1.0]]))
        se.fc[2].bias.zero_()
    x = torch.tensor([[[1.0, 3.0], [2.0, 2.0]]])
    # channel means 2 and 2 -> hidden relu(2 + 2) = 4 -> gates sigmoid(4), sigmoid(-4)
    gates = torch.sigmoid(torch.tensor([4.0, -4.0]))
    assert torch.allclose(se(x), x * gates[None, :, None])


def test_bad_options_are_named():
    with pytest.raises(ConfigError) as err:
        ResNet1dSE(kernel_size=4, widths=[8, 8], blocks=[1], dropout=1.0)
    message = str(err.value)
    assert "kernel_size must be an odd integer" in message and "blocks must be 2 integers" in message
    assert "dropout must be in [0, 1)" in message
    with pytest.raises(ConfigError, match=r"groups=3 must divide .* \[2, 4\] are not multiples"):
        ResNet1dSE(**TINY, norm="group", groups=3)
    with pytest.raises(ConfigError, match="norm must be one of \\['batch', 'group', 'layer'\\], got 'instance'"):
        ResNet1dSE(norm="instance")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"inputs \(B, 2, samples\), got \(1, 3, 9\)"):
        ResNet1dSE(**TINY).build()(torch.randn(1, 3, 9))
