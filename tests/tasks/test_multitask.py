"""MultiTaskModule: per-task AUROC, the six-task mean and the masked loss, against values worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from fedlit.core.errors import ConfigError
from fedlit.models import Backbone
from fedlit.tasks import MultiTaskModule
from fedlit.tasks.multitask import binary_auroc, task_auroc


class Flat(Backbone):
    """Identity on (B, 2) inputs (num_features 2)."""

    def build(self) -> nn.Module:
        net = nn.Identity()
        net.num_features = 2
        return net


def module(**kw) -> MultiTaskModule:
    return MultiTaskModule(backbone=Flat(), task_classes={"a": 1, "b": 3}, **kw)


def test_binary_auroc_counts_pairs_and_halves_ties():
    # positives 0.35 and 0.8 against negatives 0.1 and 0.4: 0.35 beats 0.1 only, 0.8 beats both -> 3 of 4 pairs
    assert binary_auroc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1])) == 0.75
    assert binary_auroc(np.array([0.5, 0.5, 0.9]), np.array([0, 1, 1])) == 0.75  # (0.5 tie + 1) / 2
    assert math.isnan(binary_auroc(np.array([0.1, 0.2]), np.array([1, 1])))


def test_multiclass_auroc_is_one_vs_rest_on_logits_over_the_classes_present():
    logits = np.array([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [1.0, 0.5, 0.0], [0.0, 0.0, 9.0]])
    target = np.array([0, 1, 1, -1])  # the last label is unknown: skipped; class 2 never occurs: left out
    # class 0: positive 2.0 vs negatives 0.0, 1.0 -> 1; class 1: positives 1.0, 0.5 vs negative 0.0 -> 1
    assert task_auroc(logits, target, 3) == 1.0
    target = np.array([0, 0, 1, -1])
    # class 0: positives 2.0, 0.0 vs negative 1.0 -> 1/2; class 1: positive 0.5 vs 0.0, 1.0 -> 1/2
    assert task_auroc(logits, target, 3) == 0.5


def test_loss_is_the_mean_over_tasks_of_the_known_labels_loss():
    m = module()
    logits = torch.zeros(2, 4)
    targets = torch.tensor([[1.0, 2.0], [-1.0, -1.0]])
    # a: BCE(0, 1) = ln 2 on the first sample; b: CE of uniform logits = ln 3 on the first sample
    assert m.loss(logits, targets).item() == pytest.approx((math.log(2) + math.log(3)) / 2)
    assert m.loss(logits, torch.full((2, 2), -1.0)).item() == 0.0
    only_b = module(tasks=["b"])
    assert only_b.loss(torch.zeros(2, 3), targets).item() == pytest.approx(math.log(3))


def test_metrics_per_task_their_mean_and_directions():
    m = module()
    m.heads["a"].weight.data = torch.tensor([[1.0, 0.0]])
    m.heads["a"].bias.data.zero_()
    m.heads["b"].weight.data = torch.tensor([[0.0, 1.0], [0.0, -1.0], [0.0, 0.0]])
    m.heads["b"].bias.data.zero_()
    x = torch.tensor([[0.1, 1.0], [0.4, -1.0], [0.35, 0.5], [0.8, 0.0]])
    y = torch.tensor([[0.0, 0.0], [0.0, 1.0], [1.0, -1.0], [1.0, 2.0]])
    m.reset_metrics()
    m.validation_step((x[:2], y[:2]), 0)
    m.validation_step((x[2:], y[2:]), 1)
    out = m.compute_metrics()
    assert out["auroc_a"] == 0.75  # the scores of the binary example above
    # b, known rows 0, 1, 3: class 0 scores x1 = 1, -1, 0 (positive 1.0) -> 1; class 1 scores -1, 1, 0 (positive
    # 1.0) -> 1; class 2 scores all 0 (positive row 3) -> ties: 1/2. Mean 5/6.
    assert out["auroc_b"] == pytest.approx(5 / 6)
    assert out["auroc"] == pytest.approx((0.75 + 5 / 6) / 2)
    assert out["loss"] == pytest.approx(m.loss(m(x), y).item())
    assert m.pooled_metrics([m.pooled_predictions()]) == pytest.approx(out)
    assert m.higher_is_better == {"auroc_a": True, "auroc_b": True, "auroc": True, "loss": False}
    assert m.default_selection_metric == "auroc" and m.num_classes == 2


def test_a_subset_of_tasks_has_only_their_heads():
    m = module(tasks=["b"])
    assert list(m.heads) == ["b"] and m(torch.zeros(5, 2)).shape == (5, 3)
    assert set(m.compute_metrics()) == set()


def test_bad_options_are_named():
    with pytest.raises(ConfigError, match=r"tasks=\['c'\] must list distinct tasks of task_classes \['a', 'b'\]"):
        module(tasks=["c"])
    with pytest.raises(ConfigError, match=r"classes must be integers >= 1 .* \{'b': 0\}"):
        MultiTaskModule(backbone=Flat(), task_classes={"a": 1, "b": 0})
