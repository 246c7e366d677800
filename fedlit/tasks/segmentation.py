"""Segmentation: a dense network trained on binary masks (one sigmoid per channel), judged by Dice and IoU.

Masks are float (N, C, H, W) of 0/1, one channel per structure; channels may overlap (the optic disc and the
cup inside it), so each channel is its own binary problem: sigmoid per channel, never a softmax over channels.

Losses: ``bce`` (binary cross-entropy with logits, positives weighted by ``pos_weight`` as lesions are small),
``dice`` (the soft Dice loss of Milletari, Navab, Ahmadi, "V-Net", 3DV 2016, as MONAI's ``DiceLoss`` computes
it per image and channel), or ``bce+dice``, their sum. Metrics (on the masks predicted at probability 0.5;
:mod:`fedlit.tasks.segmentation_metrics`): the Dice coefficient 2|A n B| / (|A| + |B|) and IoU |A n B| / |A u B|
of every image and channel, averaged over the split's images per channel (``dice_reduction: image``; or from the
split's summed pixel counts, ``pooled``) (``dice_<c>``, ``iou_<c>``, given with two channels or more) and then
over channels (``dice``, ``iou``). Empty masks count as ``empty`` says: ``penalize`` (default; both empty = 1,
a prediction on an empty truth = 0, HD95 of a miss = the image diagonal) or ``ignore`` (such images left out).

With ``log_images`` > 0 the first images that validation sees (per client and split) are kept and drawn by
:meth:`SegmentationModule.validation_images` side by side: the image in grey, the true mask's outline in green
and the predicted mask tinted red (all channels merged); the federation logs that picture per client.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor
from torch.nn import functional as F
from typing_extensions import override

from fedlit.core.errors import ConfigError
from fedlit.core.roles import RoleRule
from fedlit.models.unet import SegmentationNetwork
from fedlit.module import FederatedModule
from fedlit.tasks.segmentation_metrics import EMPTY, REDUCTIONS, SegmentationScores, mean_over_channels

LOSSES = ("bce", "dice", "bce+dice")


class SegmentationModule(FederatedModule):
    """A dense network with ``num_classes`` sigmoid mask channels, every trainable tensor shared by default.

    Parameter names: ``network.*`` (the built network). Default roles: those of the built network when it
    defines ``default_role_rules(prefix)`` (``SamAdapter``: adapters and mask decoder shared, the rest frozen),
    else ``network.*`` shared (a segmentation network trains from end to end; add rules with ``roles``, e.g.
    BatchNorm personal through FedBN).

    Args:
        network: The dense network (a :class:`~fedlit.models.SegmentationNetwork` spec: ``TinyUNet``,
            ``SmpUnet``, ``SamAdapter``), built with ``num_classes`` output channels.
        num_classes: Mask channels: 1 for one structure, 2 for two overlapping ones (optic disc and cup)...
        loss: ``bce``, ``dice`` or ``bce+dice`` (their sum).
        pos_weight: Weight of the foreground pixels in the BCE term (> 0; 1 = unweighted).
        roles: Role rules applied after the defaults.
        optimizer: Local optimizer (see :class:`~fedlit.module.FederatedModule`).
        lr: Local learning rate of the shorthands.
        momentum: SGD momentum of the shorthands.
        weight_decay: Weight decay of the shorthands.
        lr_scheduler: A ``torch.optim.lr_scheduler`` class_path, or None.
        lr_scheduler_interval: ``round`` or ``step``.
        log_images: Validation examples drawn per client and evaluation (:meth:`validation_images`); 0 keeps
            none and draws nothing.
        hd95: Also report the 95th-percentile Hausdorff distance between the predicted and true mask boundaries
            (MONAI's ``compute_hausdorff_distance``, in pixels; lower is better), per image and channel, averaged
            over images; empty masks count as ``empty`` says.
        empty: ``penalize``: both masks empty = Dice and IoU 1, HD95 0; a prediction on an empty truth = Dice and
            IoU 0; a miss or a spurious prediction = HD95 sqrt(H^2 + W^2), the image diagonal (MONAI's
            ``ignore_empty=False``). ``ignore``: an image whose true mask is empty is left out of Dice and IoU,
            one whose true or predicted mask is empty out of HD95 (``ignore_empty=True``).
        dice_reduction: ``image``: Dice and IoU are the mean of the per-image values; ``pooled``: computed once
            from the pixel counts summed over the split's images (dataset-level).
        class_names: A name per mask channel (``[disc, cup]``), used in the per-channel metric names
            (``dice_disc``); default the channel index (``dice_0``).
    """

    accepted_tasks = frozenset({"segmentation"})
    default_selection_metric = "dice"
    task = "segmentation"

    def __init__(
        self,
        *,
        network: SegmentationNetwork,
        num_classes: int = 1,
        loss: Literal["bce", "dice", "bce+dice"] = "bce+dice",
        pos_weight: float = 2.0,
        roles: list[RoleRule] | None = None,
        optimizer: Literal["sgd", "adam", "adamw"] | OptimizerCallable = "adam",
        lr: float = 0.001,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        lr_scheduler: LRSchedulerCallable | None = None,
        lr_scheduler_interval: Literal["round", "step"] = "round",
        log_images: int = 4,
        hd95: bool = False,
        class_names: list[str] | None = None,
        empty: Literal["penalize", "ignore"] = "penalize",
        dice_reduction: Literal["image", "pooled"] = "image",
    ) -> None:
        super().__init__(
            roles=roles,
            optimizer=optimizer,
            lr=lr,
            momentum=momentum,
            weight_decay=weight_decay,
            lr_scheduler=lr_scheduler,
            lr_scheduler_interval=lr_scheduler_interval,
        )
        problems = []
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            problems.append(f"model.init_args.num_classes={num_classes!r} must be an integer >= 1 (mask channels)")
        if loss not in LOSSES:
            problems.append(f"model.init_args.loss={loss!r} is not one of {list(LOSSES)}")
        if not (isinstance(pos_weight, int | float) and math.isfinite(pos_weight) and pos_weight > 0):
            problems.append(f"model.init_args.pos_weight={pos_weight!r} must be a number > 0 (1 = unweighted)")
        if isinstance(log_images, bool) or not isinstance(log_images, int) or log_images < 0:
            problems.append(f"model.init_args.log_images={log_images!r} must be an integer >= 0 (0 = no images)")
        if class_names is not None and (
            len(class_names) != num_classes
            or len(set(class_names)) != len(class_names)
            or not all(isinstance(n, str) and n for n in class_names)
        ):
            problems.append(
                f"model.init_args.class_names={class_names!r} must be {num_classes} distinct non-empty "
                "names, one per mask channel (e.g. [disc, cup])"
            )
        if empty not in EMPTY:
            problems.append(f"model.init_args.empty={empty!r} is not one of {list(EMPTY)}")
        if dice_reduction not in REDUCTIONS:
            problems.append(f"model.init_args.dice_reduction={dice_reduction!r} is not one of {list(REDUCTIONS)}")
        if problems:
            raise ConfigError("; ".join(problems) + ".")
        from monai.losses import DiceLoss

        self.num_classes, self.loss_name, self.pos_weight = num_classes, loss, float(pos_weight)
        self.network = network.build(num_classes)
        self._dice_loss = DiceLoss(sigmoid=True)
        self.hd95, self.empty, self.dice_reduction = bool(hd95), empty, dice_reduction
        self._scores = SegmentationScores(empty=empty, dice_reduction=dice_reduction, hd95=self.hd95)
        self.channel_names = [str(c) for c in range(num_classes)] if class_names is None else list(class_names)
        self._loss_sum, self._loss_count = 0.0, 0
        self.log_images = log_images
        self._examples: list[tuple[Tensor, Tensor, Tensor]] = []  # (image, true mask, predicted mask), on the CPU

    @override
    def default_role_rules(self) -> list[RoleRule]:
        """The network's own rules when it has them (``SamAdapter``: adapters shared, the rest mostly frozen),
        else ``network.*`` shared."""
        network_rules = getattr(self.network, "default_role_rules", None)
        if callable(network_rules):
            return list(network_rules("network."))
        return [RoleRule("network.*", "shared")]

    @override
    def forward(self, inputs: Tensor, masks: Tensor | None = None) -> Tensor:
        """(B, num_classes, H, W) logits. ``masks`` reach a network that draws prompts from them now (its
        ``needs_masks``: ``SamAdapter`` with click prompts) and no other."""
        if masks is not None and getattr(self.network, "needs_masks", False):
            return self.network(inputs, masks)
        return self.network(inputs)

    def loss(self, logits: Tensor, masks: Tensor) -> Tensor:
        """The configured loss of ``logits`` against 0/1 ``masks``, both (B, C, H, W)."""
        if logits.shape != masks.shape:
            raise ConfigError(
                f"the network gives logits of shape {tuple(logits.shape)} but the masks have shape "
                f"{tuple(masks.shape)}; set model.init_args.num_classes to the mask channels "
                f"({masks.shape[1] if masks.ndim == 4 else '?'})"
            )
        masks = masks.to(logits.dtype)
        total = logits.new_zeros(())
        if self.loss_name in ("bce", "bce+dice"):
            weight = logits.new_full((logits.shape[1], 1, 1), self.pos_weight)
            total = total + F.binary_cross_entropy_with_logits(logits, masks, pos_weight=weight)
        if self.loss_name in ("dice", "bce+dice"):
            total = total + self._dice_loss(logits, masks)
        return total

    @override
    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """``{"loss", "logits", "targets"}``."""
        inputs, masks = batch
        logits = self(inputs, masks)
        return {"loss": self.loss(logits, masks), "logits": logits, "targets": masks}

    @override
    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """Add the batch's per-image Dice and IoU (masks predicted at probability 0.5) and its loss."""
        inputs, masks = batch
        logits = self(inputs, masks)
        loss = self.loss(logits, masks)
        self._loss_sum += loss.item() * len(masks)
        self._loss_count += len(masks)
        predicted = (logits.detach() > 0).float().cpu()
        self.update_metrics(predicted, masks.detach().float().cpu())
        self._keep_examples(inputs, masks, predicted)
        return loss

    def _keep_examples(self, inputs: Tensor, masks: Tensor, predicted: Tensor) -> None:
        """Keep the first ``log_images`` examples (of the size of the first one) for :meth:`validation_images`."""
        wanted = self.log_images - len(self._examples)
        if wanted <= 0:
            return
        size = self._examples[0][0].shape[-2:] if self._examples else inputs.shape[-2:]
        if inputs.shape[-2:] != size:
            return
        for image, mask, pred in zip(inputs[:wanted], masks[:wanted], predicted[:wanted], strict=True):
            self._examples.append((image.detach().float().cpu(), mask.detach().float().cpu(), pred))

    @override
    def validation_images(self) -> Tensor | None:
        """The kept examples side by side, 2 pixels apart: each image in grey (scaled to [0, 1] by itself), the
        true mask's outline in green and the predicted mask tinted red; None when none is kept."""
        if not self._examples:
            return None
        panels = [overlay(image, mask, pred) for image, mask, pred in self._examples]
        height = panels[0].shape[1]
        gap = torch.ones(3, height, 2)
        return torch.cat([t for panel in panels for t in (panel, gap)][:-1], dim=2)

    def update_metrics(self, predicted: Tensor, masks: Tensor) -> None:
        """Add (B, C, H, W) 0/1 predicted masks and true masks to the Dice and IoU of the split."""
        self._scores.update(predicted, masks)

    @override
    def reset_metrics(self) -> None:
        self._examples = []
        self._scores.reset()
        self._loss_sum, self._loss_count = 0.0, 0

    @override
    def compute_metrics(self) -> dict[str, float]:
        """``dice``, ``iou`` (means over channels), ``dice_<c>``, ``iou_<c>`` (with two channels or more; ``<c>``
        the channel's name from ``class_names``, else its index), ``hd95`` and ``hd95_<c>`` (with ``hd95``) and
        ``loss`` (the loss per image) since the last reset, under the ``empty`` and ``dice_reduction``
        conventions; a channel with no defined value (``empty: ignore``, no true mask) is NaN."""
        if self._scores.empty_split:
            return {}
        return self._metrics(self._scores, self._loss_sum, self._loss_count)

    @override
    def pooled_predictions(self) -> dict[str, Any] | None:
        """The split's per-image pixel counts (and HD95s, with ``hd95``), its summed loss and image count: a few
        numbers per image, never the masks."""
        if self._scores.empty_split:
            return None
        return {**self._scores.samples(), "loss_sum": self._loss_sum, "count": self._loss_count}

    @override
    def pooled_metrics(self, predictions: list[Any]) -> dict[str, float]:
        """The metrics over the clients' images together, under the same ``empty`` and ``dice_reduction``
        conventions (with ``pooled``: Dice from the pixel counts summed over every client's images)."""
        if not predictions:
            return {}
        scores = SegmentationScores(empty=self.empty, dice_reduction=self.dice_reduction, hd95=self.hd95)
        for samples in predictions:
            scores.extend(samples)
        return self._metrics(scores, sum(p["loss_sum"] for p in predictions), sum(p["count"] for p in predictions))

    def _metrics(self, scores: SegmentationScores, loss_sum: float, loss_count: int) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, per_channel in scores.per_channel().items():
            if self.num_classes > 1:
                out.update(
                    {f"{name}_{c}": float(value) for c, value in zip(self.channel_names, per_channel, strict=True)}
                )
            out[name] = mean_over_channels(per_channel)
        out["loss"] = loss_sum / loss_count if loss_count else float("nan")
        return out

    @override
    @property
    def higher_is_better(self) -> dict[str, bool]:
        channels = self.channel_names if self.num_classes > 1 else ()
        names = {"dice": True, "iou": True, **({"hd95": False} if self.hd95 else {})}
        per_channel = {f"{name}_{c}": better for name, better in names.items() for c in channels}
        return {**names, **per_channel, "loss": False}


def overlay(image: Tensor, mask: Tensor, predicted: Tensor, alpha: float = 0.5) -> Tensor:
    """One (3, H, W) picture in [0, 1]: ``image`` (C, H, W; its channels averaged) in grey, scaled to [0, 1] by its
    own minimum and maximum; ``predicted`` (C, H, W, 0/1, channels merged) tinted red with weight ``alpha``; the
    outline of ``mask`` (C, H, W, 0/1, channels merged: the mask pixels with a background 4-neighbour) in green."""
    grey = image.float().mean(dim=0)
    low, high = grey.min(), grey.max()
    grey = (grey - low) / (high - low) if high > low else torch.zeros_like(grey)
    picture = grey.expand(3, -1, -1).clone()
    red = torch.tensor([1.0, 0.0, 0.0]).view(3, 1, 1)
    tint = (predicted > 0.5).any(dim=0)
    picture = torch.where(tint, (1 - alpha) * picture + alpha * red, picture)
    true = (mask > 0.5).any(dim=0).float()
    # erosion by a 3x3 cross: a pixel stays inside when it and its 4 neighbours are in the mask
    padded = F.pad(true[None, None], (1, 1, 1, 1), value=0.0)[0, 0]
    inside = (padded[1:-1, 1:-1] * padded[:-2, 1:-1] * padded[2:, 1:-1] * padded[1:-1, :-2] * padded[1:-1, 2:]) > 0
    outline = (true > 0) & ~inside
    green = torch.tensor([0.0, 1.0, 0.0]).view(3, 1, 1)
    return torch.where(outline, green, picture)
