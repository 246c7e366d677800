"""Normalization as a choice (the FedPxN paper's BatchNorm / GroupNorm / LayerNorm comparison)."""

import pytest
import torch
import torchvision
from torch import nn

from fedlit.core.errors import ConfigError
from fedlit.core.roles import is_norm_module
from fedlit.models import MLP, SmallCNN
from fedlit.models.norms import check_norm, norm_layer, swap_norms


@pytest.mark.parametrize(
    ("norm", "dims", "kind", "shape"),
    [
        ("batch", 2, nn.BatchNorm2d, (8,)),
        ("batch", 1, nn.BatchNorm1d, (8,)),
        ("batch", 0, nn.BatchNorm1d, (8,)),
        ("group", 2, nn.GroupNorm, (8,)),
        ("group", 0, nn.GroupNorm, (8,)),
        ("layer", 0, nn.LayerNorm, (8,)),
        ("layer", 1, nn.GroupNorm, (8,)),
        ("layer", 2, nn.GroupNorm, (8,)),
        ("none", 2, nn.Identity, None),
    ],
)
def test_norm_layer_types_and_shapes(norm, dims, kind, shape):
    layer = norm_layer(norm, 8, dims=dims, groups=4)
    assert type(layer) is kind
    if shape is None:
        assert list(layer.parameters()) == []
    else:
        assert layer.weight.shape == shape and layer.bias.shape == shape
    if norm == "group":
        assert layer.num_groups == 4
    if norm == "layer" and dims:
        assert layer.num_groups == 1  # one group: every channel and position of a sample


def test_group_norm_normalizes_each_group_of_channels():
    # 2 groups of 2 channels, one position each: group 1 holds (1, 3) -> (-1, 1), group 2 holds (10, 10) -> (0, 0).
    layer = norm_layer("group", 4, dims=2, groups=2)
    out = layer(torch.tensor([1.0, 3.0, 10.0, 10.0]).reshape(1, 4, 1, 1)).flatten()
    assert torch.allclose(out, torch.tensor([-1.0, 1.0, 0.0, 0.0]), atol=1e-4)
    # layer on (N, C, L): mean and variance over every channel and position of the sample: (0, 2, 4, 6) has mean 3
    # and (biased) variance 5.
    layer = norm_layer("layer", 2, dims=1)
    out = layer(torch.tensor([[[0.0, 2.0], [4.0, 6.0]]])).flatten()
    assert torch.allclose(out, (torch.tensor([0.0, 2.0, 4.0, 6.0]) - 3) / 5**0.5, atol=1e-4)


def test_norm_layer_refuses_bad_options():
    with pytest.raises(ValueError, match=r"norm must be one of \['batch', 'group', 'layer', 'none'\], got 'instance'"):
        norm_layer("instance", 8)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"groups=3 must divide .*\[8\]"):
        norm_layer("group", 8, groups=3)
    assert check_norm("batch", 3, [8]) == []  # groups only matter to group
    assert check_norm("group", 0) == ["groups must be an integer >= 1, got 0"]
    assert check_norm("group", 4, [8, 6, 12, 6]) == [
        "groups=4 must divide the channels of every normalized layer; [6] are not multiples"
    ]


def test_swap_norms_on_efficientnet_b0_with_groups_carries_affine_weights():
    torch.manual_seed(0)
    model = torchvision.models.efficientnet_b0(weights=None)
    before = {n: m for n, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)}
    assert len(before) == 49  # torchvision's EfficientNet-B0: 16 MBConv blocks, stem and head
    with torch.no_grad():  # distinct affine values, so a fresh layer (weight 1, bias 0) would show
        for m in before.values():
            m.weight.uniform_(0.5, 1.5)
            m.bias.uniform_(-1, 1)
    weights = {n: (m.weight.clone(), m.bias.clone(), m.num_features) for n, m in before.items()}
    assert swap_norms(model, "group", groups=8) is model
    after = dict(model.named_modules())
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in after.values())
    for name, (weight, bias, channels) in weights.items():
        layer = after[name]
        assert type(layer) is nn.GroupNorm and layer.num_groups == 8 and layer.num_channels == channels
        assert torch.equal(layer.weight, weight) and torch.equal(layer.bias, bias)
        assert is_norm_module(layer, name)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 1000)


def test_swap_norms_layer_and_none():
    model = nn.Sequential(nn.Conv1d(2, 4, 1), nn.BatchNorm1d(4), nn.Sequential(nn.Conv2d(4, 6, 1), nn.BatchNorm2d(6)))
    swap_norms(model, "layer")
    assert type(model[1]) is nn.GroupNorm and model[1].num_groups == 1 and model[1].num_channels == 4
    assert type(model[2][1]) is nn.GroupNorm and model[2][1].num_channels == 6
    swap_norms(nested := nn.Sequential(nn.BatchNorm2d(3)), "none")
    assert type(nested[0]) is nn.Identity
    untouched = nn.Sequential(nn.BatchNorm2d(3))
    layer = untouched[0]
    assert swap_norms(untouched, "batch")[0] is layer


def test_swap_norms_names_the_layer_groups_do_not_divide_and_changes_nothing():
    model = torchvision.models.efficientnet_b0(weights=None)
    # features.0.1 and features.1.0.block.0.1 have 32 channels; features.1.0.block.2.1 (the first block's
    # projection) has 16, which 32 groups do not divide.
    with pytest.raises(ValueError, match=r"groups=32 does not divide the 16 channels of features\.1\.0\.block\.2\.1$"):
        swap_norms(model, "group", groups=32)
    assert type(model.features[0][1]) is nn.BatchNorm2d  # checked before any layer is replaced
    with pytest.raises(ValueError, match="groups must be an integer >= 1, got 0"):
        swap_norms(model, "group", groups=0)


def test_swap_norms_keeps_eps_dtype_and_device():
    model = nn.Sequential(nn.BatchNorm2d(4, eps=1e-3)).double()
    swap_norms(model, "group", groups=2)
    assert model[0].eps == 1e-3 and model[0].weight.dtype == torch.float64


@pytest.mark.parametrize(
    ("norm", "kind"), [("batch", nn.BatchNorm2d), ("group", nn.GroupNorm), ("layer", nn.GroupNorm)]
)
def test_small_cnn_norm_keeps_parameter_names(norm, kind):
    model = SmallCNN(in_channels=3, width=4, depth=2, norm=norm, groups=2).build()
    assert [type(b.bn) for b in model.blocks] == [kind, kind]
    names = [n for n in model.state_dict() if ".bn." in n]
    expected = ["weight", "bias"] + (["running_mean", "running_var", "num_batches_tracked"] if norm == "batch" else [])
    assert names == [f"blocks.{i}.bn.{t}" for i in range(2) for t in expected]
    assert model.blocks[1].bn.weight.shape == (8,)
    if norm != "batch":
        assert model.blocks[1].bn.num_groups == (2 if norm == "group" else 1)
    assert model(torch.randn(2, 3, 8, 8)).shape == (2, 8)
    assert not [n for n in SmallCNN(norm="none").build().state_dict() if ".bn." in n]


@pytest.mark.parametrize(
    ("norm", "kind"), [("batch", nn.BatchNorm1d), ("group", nn.GroupNorm), ("layer", nn.LayerNorm)]
)
def test_mlp_norm_keeps_parameter_names(norm, kind):
    model = MLP(num_features=3, hidden=[4, 6], norm=norm, groups=2).build()
    assert [type(layer.norm) for layer in model.layers] == [kind, kind]
    assert [n for n in model.state_dict() if ".norm.weight" in n] == ["layers.0.norm.weight", "layers.1.norm.weight"]
    if norm == "group":
        assert model.layers[1].norm.num_groups == 2 and model.layers[1].norm.num_channels == 6


def test_default_norm_is_batch_and_builds_the_same_tensors():
    torch.manual_seed(3)
    cnn = SmallCNN(in_channels=1, width=4).build()
    torch.manual_seed(3)
    conv = nn.Conv2d(1, 4, kernel_size=3, padding=1, bias=False)  # the first tensor drawn, as before the option
    assert type(cnn.blocks[0].bn) is nn.BatchNorm2d and torch.equal(cnn.blocks[0].conv.weight, conv.weight)
    assert type(MLP(num_features=2).build().layers[0].norm) is nn.BatchNorm1d


def test_bad_norm_options_name_the_option():
    with pytest.raises(ConfigError, match=r"^SmallCNN: norm must be one of \['batch', 'group', 'layer', 'none'\]"):
        SmallCNN(norm="instance")  # type: ignore[arg-type]
    # width 12, depth 2: channels 12 and 24; 8 groups divide 24 = 3 x 8, not 12.
    with pytest.raises(ConfigError, match=r"^SmallCNN: groups=8 must divide .*; \[12\] are not multiples"):
        SmallCNN(width=12, norm="group", groups=8)
    with pytest.raises(ConfigError, match=r"^MLP: groups must be an integer >= 1, got True"):
        MLP(num_features=2, hidden=[4], norm="group", groups=True)
    with pytest.raises(ConfigError, match=r"^MLP: groups=4 must divide .*\[6\] are not multiples"):
        MLP(num_features=2, hidden=[4, 6], norm="group", groups=4)
    SmallCNN(width=12, norm="batch", groups=8)  # groups are only checked for group
