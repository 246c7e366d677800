"""Macro AUROC and AUPRC over the classes (labels) a split can rank: those with positives, and for AUROC negatives.

torchmetrics' macro averages score a class without positives in the split as 0 (multi-class AUROC; multilabel
AUROC and AUPRC), so a site whose test split lacks a class (a site of a label-skewed federation, a hospital that
never sees a rare diagnosis) had its AUROC capped at (present classes) / (all classes). fedlit averages over the
classes where the figure is defined, as scikit-learn's ``roc_auc_score`` asks for and as the multi-class AUPRC of
torchmetrics already does; a split where no class is defined gives NaN (then ``_ranking_undefined`` names it).
"""

from __future__ import annotations

import torch
import torchmetrics
from torch import Tensor
from torchmetrics.utilities import dim_zero_cat
from typing_extensions import override


def present_mean(values: Tensor, defined: Tensor) -> Tensor:
    """The mean of ``values`` where ``defined`` holds; NaN when it holds nowhere."""
    if not bool(defined.any()):
        return torch.tensor(float("nan"))
    return values[defined].float().mean()


class MulticlassAUROC(torchmetrics.classification.MulticlassAUROC):
    """One-vs-rest AUROC, the mean over the classes with both positives and negatives in the split."""

    def __init__(self, num_classes: int) -> None:
        super().__init__(num_classes=num_classes, average=None)

    @override
    def compute(self) -> Tensor:  # type: ignore[override]  # one value, as the macro average
        per_class = super().compute()
        target = dim_zero_cat(self.target).long().reshape(-1)
        counts = torch.bincount(target, minlength=self.num_classes)[: self.num_classes]
        return present_mean(per_class, (counts > 0) & (counts < len(target)))


class MultilabelAUROC(torchmetrics.classification.MultilabelAUROC):
    """AUROC per label, the mean over the labels with both positives and negatives in the split."""

    def __init__(self, num_labels: int) -> None:
        super().__init__(num_labels=num_labels, average=None)

    @override
    def compute(self) -> Tensor:  # type: ignore[override]  # one value, as the macro average
        per_label = super().compute()
        target = dim_zero_cat(self.target).reshape(-1, self.num_labels)
        positives = (target == 1).sum(0)
        return present_mean(per_label, (positives > 0) & (positives < len(target)))


class MultilabelAveragePrecision(torchmetrics.classification.MultilabelAveragePrecision):
    """Average precision per label, the mean over the labels with positives in the split."""

    def __init__(self, num_labels: int) -> None:
        super().__init__(num_labels=num_labels, average=None)

    @override
    def compute(self) -> Tensor:  # type: ignore[override]  # one value, as the macro average
        per_label = super().compute()
        target = dim_zero_cat(self.target).reshape(-1, self.num_labels)
        return present_mean(per_label, (target == 1).sum(0) > 0)
