"""The asymmetric loss (Ridnik et al., ICCV 2021) and ClassificationModule's ``loss`` option."""

import math

import pytest
import torch
from torch.nn import functional as F

from fedlit.core.errors import ConfigError
from fedlit.tasks import ClassificationModule
from fedlit.tasks.losses import asymmetric_loss
from tests.conftest import TinyMLP

# p = sigmoid(logit): ln 3 -> 0.75, -ln 3 -> 0.25, 0 -> 0.5, -ln 49 -> 1/50 = 0.02.
LOGITS = torch.tensor(
    [[math.log(3), 0.0, -math.log(3)], [-math.log(49), math.log(3), -math.log(3)]], dtype=torch.float64
)
TARGETS = torch.tensor([[1, 0, 0], [0, 1, 1]])


def _by_hand() -> float:
    """gamma_neg 4, gamma_pos 1, margin 0.05: a positive costs -(1 - p) ln p, a negative -p_m^4 ln(1 - p_m) with
    p_m = max(p - 0.05, 0); summed over the 3 labels, averaged over the 2 samples."""
    sample_1 = (
        -(1 - 0.75) * math.log(0.75)  # positive, p 0.75: 0.0719205
        - 0.45**4 * math.log(1 - 0.45)  # negative, p 0.5 -> p_m 0.45: 0.0245150
        - 0.20**4 * math.log(1 - 0.20)  # negative, p 0.25 -> p_m 0.20: 0.0003570
    )
    sample_2 = (
        0.0  # negative, p 0.02 below the margin: p_m 0, no loss
        - (1 - 0.75) * math.log(0.75)  # positive, p 0.75: 0.0719205
        - (1 - 0.25) * math.log(0.25)  # positive, p 0.25: 1.0397208
    )
    return (sample_1 + sample_2) / 2


def test_asymmetric_loss_by_hand():
    assert _by_hand() == pytest.approx(0.6042169, abs=1e-6)  # the sums in the comments
    loss = asymmetric_loss(LOGITS.double(), TARGETS)
    assert loss.item() == pytest.approx(_by_hand(), rel=1e-9)
    # the authors' reduction (a sum over the batch) is twice this on 2 samples
    assert asymmetric_loss(LOGITS.float(), TARGETS).item() * 2 == pytest.approx(2 * 0.6042169, abs=1e-5)


def test_without_focusing_or_margin_it_is_bce_summed_over_labels():
    loss = asymmetric_loss(LOGITS.double(), TARGETS, gamma_neg=0, gamma_pos=0, clip=0)
    bce = F.binary_cross_entropy_with_logits(LOGITS.double(), TARGETS.double(), reduction="sum") / 2
    assert loss.item() == pytest.approx(bce.item(), rel=1e-9)


def test_eps_clamps_the_logarithm():
    # p = sigmoid(-200) underflows to 0 in float32: the positive's log is ln(1e-8), weighted by (1 - 0) = 1.
    loss = asymmetric_loss(torch.tensor([[-200.0]]), torch.tensor([[1]]), clip=0)
    assert loss.item() == pytest.approx(-math.log(1e-8), rel=1e-6)


def test_gradient_flows_and_binary_targets_of_one_column():
    logits = torch.tensor([0.0, math.log(3)], requires_grad=True)
    loss = asymmetric_loss(logits, torch.tensor([0, 1]))
    loss.backward()
    assert logits.grad is not None and logits.grad[0] > 0 > logits.grad[1]  # push the negative down, positive up


def _module(**kwargs):
    return ClassificationModule(backbone=TinyMLP(in_features=4, hidden=3), **kwargs)


def test_module_loss_option():
    module = _module(num_classes=3, task="multilabel", loss="asymmetric")
    assert module.loss_options == {"gamma_neg": 4.0, "gamma_pos": 1.0, "clip": 0.05, "eps": 1e-8}
    assert module.loss(LOGITS.double(), TARGETS).item() == pytest.approx(_by_hand(), rel=1e-9)
    # gamma_neg 0 and no margin: the first sample's negatives cost -ln(0.5) and -ln(0.75) each, unweighted
    plain_negatives = _module(
        num_classes=3, task="multilabel", loss="asymmetric", loss_options={"gamma_neg": 0, "clip": 0}
    )
    first = plain_negatives.loss(LOGITS[:1].double(), TARGETS[:1]).item()
    assert first == pytest.approx(-(0.25) * math.log(0.75) - math.log(0.5) - math.log(0.75), rel=1e-9)
    binary = _module(num_classes=1, task="binary", loss="asymmetric")
    assert binary.loss(torch.zeros(2, 1), torch.tensor([1, 0])).item() == pytest.approx(
        (-0.5 * math.log(0.5) - 0.45**4 * math.log(0.55)) / 2, rel=1e-6
    )
    default = _module(num_classes=3, task="multilabel")
    assert default.loss_name == "default"
    expected = F.binary_cross_entropy_with_logits(LOGITS, TARGETS.double())  # mean over all 6 labels
    assert default.loss(LOGITS, TARGETS).item() == pytest.approx(expected.item())


def test_module_refuses_bad_loss_options():
    with pytest.raises(ConfigError, match=r"loss='asymmetric' is for binary and multilabel .* set task: multilabel"):
        _module(num_classes=3, loss="asymmetric")
    with pytest.raises(ConfigError, match=r"loss_options has unknown keys \['gamma', 'margin'\]; .*'clip', 'eps'"):
        _module(num_classes=3, task="multilabel", loss="asymmetric", loss_options={"gamma": 2, "margin": 0.1})
    with pytest.raises(ConfigError, match=r"loss_options.clip must be in \[0, 1\), got 1.5"):
        _module(num_classes=3, task="multilabel", loss="asymmetric", loss_options={"clip": 1.5})
    with pytest.raises(ConfigError, match=r"loss_options=\{'clip': 0.1\} is given but loss is 'default'"):
        _module(num_classes=3, task="multilabel", loss_options={"clip": 0.1})
    with pytest.raises(ConfigError, match=r"loss='focal' is not one of \['default', 'asymmetric'\]"):
        _module(num_classes=3, task="multilabel", loss="focal")
