"""Macro AUROC/AUPRC over the classes a split can rank (fedlit.tasks.ranking), on values worked out by hand."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from fedlit.tasks.classification import build_metrics

# Four samples, three classes; class 2 never occurs in the split.
PROBS = torch.tensor([[0.7, 0.2, 0.1], [0.2, 0.7, 0.1], [0.3, 0.4, 0.3], [0.6, 0.3, 0.1]])
CLASSES = torch.tensor([0, 1, 0, 1])


def compute(task: str, probs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    metrics = build_metrics(task, 3)
    metrics.update(probs, targets)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return {name: float(value) for name, value in metrics.compute().items()}


def test_multiclass_auroc_leaves_an_absent_class_out():
    # Class 0: positives score 0.7, 0.3; negatives 0.2, 0.6: of the 4 pairs, 0.3 < 0.6 is the one wrong: 3/4.
    # Class 1: positives 0.7, 0.3; negatives 0.2, 0.4: again 3/4. Class 2 has no positive: left out (it used to
    # count as 0, giving (0.75 + 0.75 + 0) / 3 = 0.5).
    assert compute("multiclass", PROBS, CLASSES)["auroc"] == pytest.approx(0.75)


def test_multilabel_auroc_and_auprc_leave_a_label_without_positives_out():
    targets = torch.nn.functional.one_hot(CLASSES, 3)  # label 2 never positive
    probs = PROBS.clone()
    probs[:, 1] = torch.tensor([0.1, 0.9, 0.2, 0.8])  # label 1 ranked perfectly: AUROC 1, AP 1
    out = compute("multilabel", probs, targets)
    # Label 0: AUROC 3/4 as above. AP: ranked 0.7 (pos), 0.6 (neg), 0.3 (pos), 0.2 (neg): precision 1/1 at the
    # first positive, 2/3 at the second: (1 + 2/3) / 2 = 5/6.
    assert out["auroc"] == pytest.approx((0.75 + 1.0) / 2)
    assert out["auprc"] == pytest.approx((5 / 6 + 1.0) / 2)


def test_a_split_where_no_class_can_be_ranked_gives_nan():
    out = compute("multiclass", PROBS[:2], torch.tensor([0, 0]))  # one class only: no negatives for it
    assert math.isnan(out["auroc"])
