"""The tasks' pooled metrics (the metrics over several clients' splits together), against values worked out by hand:
binary classification (an AUROC defined only pooled) and segmentation under both Dice reductions; a module without a
pooled form has none."""

from __future__ import annotations

import math

import pytest
import torch

from fedlit.models import Identity, TinyUNet
from fedlit.module import FederatedModule
from fedlit.tasks import ClassificationModule, SegmentationModule


def _predictions(module: FederatedModule, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> object:
    module.reset_metrics()
    for outputs, targets in batches:
        module.update_metrics(outputs, targets)  # type: ignore[attr-defined]
    module.compute_metrics()
    return module.pooled_predictions()


def test_binary_pooled_accuracy_balanced_accuracy_and_auroc_by_hand():
    module = ClassificationModule(backbone=Identity(num_features=1), num_classes=1, task="binary")
    a = _predictions(
        module,
        [(torch.tensor([[2.0], [-1.0]]), torch.tensor([[1.0], [0.0]])), (torch.tensor([[0.5]]), torch.tensor([[0.0]]))],
    )
    b = _predictions(module, [(torch.tensor([[-2.0], [1.0]]), torch.tensor([[1.0], [1.0]]))])
    alone = module.compute_metrics()
    assert math.isnan(alone["auroc"])  # client b holds positives only
    pooled = module.pooled_metrics([a, b])
    # predicted positive where the logit >= 0: a [1, 0, 1] for [1, 0, 0], b [0, 1] for [1, 1]: 3 of 5 right
    assert pooled["accuracy"] == pytest.approx(3 / 5)
    # sensitivity 2 of 3 positives, specificity 1 of 2 negatives
    assert pooled["balanced_accuracy"] == pytest.approx((2 / 3 + 1 / 2) / 2)
    # positives score 2, -2, 1 and negatives -1, 0.5: 4 of the 6 pairs ordered right
    assert pooled["auroc"] == pytest.approx(4 / 6)
    after = module.compute_metrics()  # the metrics being accumulated (client b's) are left as they were
    assert after.keys() == alone.keys() and math.isnan(after["auroc"]) and math.isnan(after["auprc"])
    ranked = ("auroc", "auprc")
    assert {k: v for k, v in after.items() if k not in ranked} == {k: v for k, v in alone.items() if k not in ranked}
    assert after["accuracy"] == pytest.approx(1 / 2)


@pytest.mark.parametrize(
    ("reduction", "dice", "iou"),
    [
        ("image", (2 / 3 + 1 + 0) / 3, (1 / 2 + 1 + 0) / 3),  # the mean over the three images of both clients
        ("pooled", 2 * 5 / (6 + 6), 5 / (6 + 6 - 5)),  # from the summed pixel counts: |A n B| 5, |A| 6, |B| 6
    ],
)
def test_segmentation_pooled_dice_over_both_clients_images_by_hand(reduction, dice, iou):
    module = SegmentationModule(network=TinyUNet(width=4, depth=2), num_classes=1, dice_reduction=reduction)
    a_pred, a_true = torch.tensor([[1.0, 1.0], [0.0, 0.0]]), torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    b_pred = torch.stack([torch.ones(2, 2), torch.zeros(2, 2)])
    b_true = torch.stack([torch.ones(2, 2), torch.tensor([[1.0, 0.0], [0.0, 0.0]])])
    a = _predictions(module, [(a_pred[None, None], a_true[None, None])])
    b = _predictions(module, [(b_pred[:, None], b_true[:, None])])
    pooled = module.pooled_metrics([a, b])
    assert pooled["dice"] == pytest.approx(dice) and pooled["iou"] == pytest.approx(iou)
    assert math.isnan(pooled["loss"])  # update_metrics alone counts no loss


def test_a_module_without_a_pooled_form_has_none():
    class Plain(FederatedModule):
        pass

    module = Plain()
    assert module.pooled_predictions() is None and module.pooled_metrics([]) == {}
