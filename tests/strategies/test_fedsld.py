"""FedSLD (Luo & Wu): the shared label distribution P and the per-batch re-weighted loss, by hand."""

import math

import pytest
import torch
from torch.nn import functional as TF

from fedlit.strategies import FedSLD
from fedlit.strategies.fedsld import class_prior, sld_weights
from tests.conftest import assert_resume_is_exact

LN2 = math.log(2.0)


def client_side(counts):
    """A FedSLD whose server saw ``counts`` and whose client received P."""
    strategy = FedSLD()
    strategy.initialize({}, list(counts), counts)
    strategy.on_client_fit_start(received_extras=strategy.configure_client_extras(1, next(iter(counts))))
    return strategy


def test_prior_from_the_reported_counts():
    strategy = FedSLD()
    strategy.initialize({}, ["a", "b"], {"a": [1, 5], "b": [2, 4]})
    # P = ([1, 5] + [2, 4]) / (6 + 6) = [3, 9] / 12 = [0.25, 0.75]
    assert strategy.prior.tolist() == [0.25, 0.75]
    assert strategy.configure_client_extras(1, "a")["prior"].tolist() == [0.25, 0.75]
    assert class_prior([[0, 2, 2], [4, 0, 0]]).tolist() == [0.5, 0.25, 0.25]


def test_loss_on_a_batch_with_known_class_counts():
    strategy = client_side({"a": [1, 5], "b": [2, 4]})  # P = [0.25, 0.75]
    targets = torch.tensor([0, 0, 0, 1])  # p_b = [3/4, 1/4]
    # weights P(y) / p_b(y): class 0 -> 0.25 / 0.75 = 1/3, class 1 -> 0.75 / 0.25 = 3
    assert sld_weights(targets, strategy.prior).tolist() == pytest.approx([1 / 3, 1 / 3, 1 / 3, 3.0])
    logits = torch.tensor([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [math.log(3.0), 0.0]], requires_grad=True)
    # log softmax: samples 1-3 -> log(1/2) = -ln 2; sample 4 (softmax [3/4, 1/4]) -> log(1/4) = -2 ln 2
    # L = -(1/4) [3 * (1/3) * (-ln 2) + 3 * (-2 ln 2)] = 7/4 ln 2 ~ 1.2130 (plain CE: 5/4 ln 2)
    outputs = {"loss": TF.cross_entropy(logits, targets), "logits": logits, "targets": targets}
    loss = strategy.training_loss(None, outputs["loss"], None, outputs)
    assert loss.item() == pytest.approx(7 / 4 * LN2)
    assert outputs["loss"].item() == pytest.approx(5 / 4 * LN2)
    loss.backward()
    # dL/dz_4 = -(1/4) * 3 * (onehot(1) - softmax) = -(3/4) * ([0, 1] - [3/4, 1/4]) = [9/16, -9/16]
    assert logits.grad[3].tolist() == pytest.approx([9 / 16, -9 / 16])


def test_equals_cross_entropy_when_the_batch_matches_the_prior():
    strategy = client_side({"a": [0, 2, 2], "b": [4, 0, 0]})  # P = [0.5, 0.25, 0.25]
    targets = torch.tensor([0, 1, 0, 2])  # p_b = [0.5, 0.25, 0.25] = P
    logits = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    outputs = {"loss": None, "logits": logits, "targets": targets}
    assert strategy.training_loss(None, None, None, outputs).item() == pytest.approx(
        TF.cross_entropy(logits, targets).item(), abs=1e-6
    )


def test_binary_is_the_two_class_softmax_over_zero_and_the_logit():
    strategy = client_side({"a": [1, 5], "b": [2, 4]})  # [negatives, positives] -> P = [0.25, 0.75]
    logits = torch.tensor([[0.0], [0.0], [0.0], [math.log(3.0)]])
    targets = torch.tensor([0.0, 0.0, 0.0, 1.0])
    # BCE: negatives at z = 0 -> ln 2 (weight 1/3); the positive at z = ln 3 -> -log(3/4) (weight 3)
    # L = (1/4) [3 * (1/3) * ln 2 + 3 * ln(4/3)]
    expected = (LN2 + 3 * math.log(4 / 3)) / 4
    loss = strategy.training_loss(None, None, None, {"logits": logits, "targets": targets})
    assert loss.item() == pytest.approx(expected)


def test_clear_errors():
    strategy = client_side({"a": [1, 5]})
    with pytest.raises(TypeError, match=r"Plain.training_step must return a dict with 'logits'.*'targets'"):
        strategy.training_loss(type("Plain", (), {})(), torch.tensor(1.0), None, torch.tensor(1.0))
    with pytest.raises(ValueError, match="multilabel"):
        strategy.training_loss(None, None, None, {"logits": torch.zeros(2, 2), "targets": torch.zeros(2, 2)})
    with pytest.raises(ValueError, match="model.init_args.num_classes"):
        strategy.training_loss(None, None, None, {"logits": torch.zeros(2, 3), "targets": torch.tensor([0, 1])})
    with pytest.raises(ValueError, match="class_counts"):
        FedSLD().initialize({}, ["a"], None)
    with pytest.raises(RuntimeError, match="before on_client_fit_start"):
        FedSLD().training_loss(None, None, None, {"logits": torch.zeros(2, 2), "targets": torch.tensor([0, 1])})
    assert repr(FedSLD()) == "FedSLD(weighting='num_examples')"


def test_resume_is_exact_and_p_is_downloaded_every_round(tmp_path):
    straight, _ = assert_resume_is_exact(tmp_path, FedSLD)
    counts = straight.datamodule.class_counts()
    totals = [sum(counts[c]["train"][k] for c in straight.client_ids) for k in range(3)]
    assert straight.strategy.prior.tolist() == pytest.approx([t / sum(totals) for t in totals])
    shared = sum(t.numel() * t.element_size() for t in straight.module.named_tensors("shared").values())
    # 4 rounds x 3 clients, each receiving the shared tensors and P (3 float32 = 12 bytes)
    assert straight.state.comm["download_bytes"] == 4 * 3 * (shared + 12)
