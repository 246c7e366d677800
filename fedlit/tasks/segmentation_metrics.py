"""Dice, IoU and HD95 of binary masks, with a stated convention for empty masks and for the reduction.

Per image and channel, with A the predicted and B the true mask: Dice = 2|A n B| / (|A| + |B|), IoU =
|A n B| / |A u B|. They are undefined when both masks are empty, and a mask predicted on an empty truth scores 0
whatever its size. ``empty`` says what these cases count for:

- ``penalize`` (the default; MONAI's ``DiceMetric(ignore_empty=False)``, and what the Medical-SAM-Adapter code
  computes with its smoothing term): both empty = 1 (a correct "nothing here"), a prediction on an empty truth
  = 0. HD95 of both empty = 0; of a complete miss (truth, no prediction) or a spurious prediction (prediction, no
  truth) = the image's diagonal sqrt(H^2 + W^2) in pixels, larger than any distance between two pixels of the
  image, so a miss always scores worse than any hit (challenges penalize such cases with the largest distance
  the image allows).
- ``ignore`` (MONAI's ``ignore_empty=True``): an image whose true mask of a channel is empty is left out of
  that channel's Dice and IoU, and an image whose true or predicted mask is empty is left out of its HD95.
  A false positive on an empty image then costs nothing.

``dice_reduction`` says how a split's images are combined (Dice and IoU; HD95 is always a mean of images):

- ``image`` (the default; MONAI's ``DiceMetric`` then a mean, as the Medical-SAM-Adapter and FedSCA code do):
  the mean over images of the per-image values;
- ``pooled`` (dataset-level, global Dice): the pixel counts of all images summed first, Dice =
  2 sum|A n B| / (sum|A| + sum|B|), so large structures weigh more. With ``ignore`` the images whose truth is
  empty are left out of the sums; a split whose sums are all 0 gives 1 (``penalize``) or NaN (``ignore``).
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import Tensor

EMPTY = ("penalize", "ignore")
REDUCTIONS = ("image", "pooled")


def overlap_counts(predicted: Tensor, masks: Tensor) -> Tensor:
    """(B, C, 3) pixel counts of (B, C, H, W) 0/1 masks: |A n B|, |A| (predicted) and |B| (true), float64."""
    predicted, masks = predicted.detach().double() > 0.5, masks.detach().double() > 0.5
    return torch.stack(
        [(predicted & masks).sum(dim=(-2, -1)), predicted.sum(dim=(-2, -1)), masks.sum(dim=(-2, -1))], dim=-1
    ).double()


def dice_iou_per_image(counts: Tensor, empty: str = "penalize") -> tuple[Tensor, Tensor]:
    """Dice and IoU, each (N, C), of the :func:`overlap_counts` of N images; NaN where ``empty`` leaves one out."""
    inter, pred, true = counts.unbind(-1)
    total = pred + true
    dice = torch.where(total > 0, 2 * inter / total.clamp(min=1), torch.ones_like(total))
    iou = torch.where(total > 0, inter / (total - inter).clamp(min=1), torch.ones_like(total))
    if empty == "ignore":
        dice, iou = (torch.where(true > 0, v, torch.full_like(v, math.nan)) for v in (dice, iou))
    return dice, iou


def dice_iou_pooled(counts: Tensor, empty: str = "penalize") -> tuple[Tensor, Tensor]:
    """Dice and IoU, each (C,), of the pixel counts of N images summed per channel (dataset-level)."""
    if empty == "ignore":
        counts = counts * (counts[..., 2:3] > 0)  # images with an empty truth leave the sums
    inter, pred, true = counts.sum(dim=0).unbind(-1)
    total = pred + true
    both_empty = 1.0 if empty == "penalize" else math.nan
    dice = torch.where(total > 0, 2 * inter / total.clamp(min=1), torch.full_like(total, both_empty))
    iou = torch.where(total > 0, inter / (total - inter).clamp(min=1), torch.full_like(total, both_empty))
    return dice, iou


def hd95_per_image(predicted: Tensor, masks: Tensor, empty: str = "penalize") -> Tensor:
    """(B, C) 95th-percentile Hausdorff distances (pixels) between the boundaries of (B, C, H, W) 0/1 masks.

    MONAI's ``compute_hausdorff_distance`` where both masks hold foreground; elsewhere ``empty`` decides:
    ``penalize``: 0 when both are empty, the diagonal sqrt(H^2 + W^2) when one is; ``ignore``: NaN.
    """
    from monai.metrics import compute_hausdorff_distance

    predicted, masks = (predicted.detach().float() > 0.5).float(), (masks.detach().float() > 0.5).float()
    with warnings.catch_warnings():  # MONAI warns for every empty mask; those entries are replaced below
        warnings.simplefilter("ignore")
        values = compute_hausdorff_distance(predicted, masks, include_background=True, percentile=95).double()
    has_pred, has_true = predicted.sum(dim=(-2, -1)) > 0, masks.sum(dim=(-2, -1)) > 0
    if empty == "ignore":
        return torch.where(has_pred & has_true, values, torch.full_like(values, math.nan))
    height, width = masks.shape[-2:]
    diagonal = math.hypot(height, width)
    penalty = torch.where(has_pred | has_true, torch.full_like(values, diagonal), torch.zeros_like(values))
    return torch.where(has_pred & has_true, values, penalty)


def mean_over_channels(per_channel: list[float]) -> float:
    """The mean of the channels' values that are defined (not NaN); NaN when none is."""
    defined = [v for v in per_channel if not math.isnan(v)]
    return sum(defined) / len(defined) if defined else math.nan


class SegmentationScores:
    """Accumulates a split's masks batch by batch and gives its Dice, IoU (and HD95) per channel.

    Args:
        empty: ``penalize`` or ``ignore`` (see the module docstring).
        dice_reduction: ``image`` (mean of per-image values) or ``pooled`` (dataset-level counts).
        hd95: also compute the 95th-percentile Hausdorff distance per image.
    """

    def __init__(self, empty: str = "penalize", dice_reduction: str = "image", hd95: bool = False) -> None:
        self.empty, self.dice_reduction, self.hd95 = empty, dice_reduction, hd95
        self.reset()

    def reset(self) -> None:
        self._counts: list[Tensor] = []
        self._hd95: list[Tensor] = []

    def update(self, predicted: Tensor, masks: Tensor) -> None:
        """Add (B, C, H, W) 0/1 predicted and true masks."""
        self._counts.append(overlap_counts(predicted, masks))
        if self.hd95:
            self._hd95.append(hd95_per_image(predicted, masks, self.empty))

    @property
    def empty_split(self) -> bool:
        return not self._counts

    def samples(self) -> dict[str, Tensor]:
        """The split's per-image pixel counts (and HD95s), which :meth:`extend` adds to other scores."""
        out = {"counts": torch.cat(self._counts)}
        if self.hd95:
            out["hd95"] = torch.cat(self._hd95)
        return out

    def extend(self, samples: dict[str, Tensor]) -> None:
        """Add the images of another split's :meth:`samples` (computed under the same conventions)."""
        self._counts.append(samples["counts"])
        if self.hd95:
            self._hd95.append(samples["hd95"])

    def per_channel(self) -> dict[str, list[float]]:
        """``dice``, ``iou`` (and ``hd95``): one value per channel, NaN for a channel with no defined image."""
        counts = torch.cat(self._counts)
        if self.dice_reduction == "pooled":
            dice, iou = dice_iou_pooled(counts, self.empty)
        else:
            dice, iou = (torch.nanmean(v, dim=0) for v in dice_iou_per_image(counts, self.empty))
        out = {"dice": dice.tolist(), "iou": iou.tolist()}
        if self.hd95:
            out["hd95"] = torch.nanmean(torch.cat(self._hd95), dim=0).tolist()
        return out
