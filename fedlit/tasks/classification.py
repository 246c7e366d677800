"""Classification: multi-class (cross-entropy), binary and multilabel (BCE), with torchmetrics metrics."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Literal, cast

import torch
import torchmetrics
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn
from torch.nn import functional as F
from torchmetrics.utilities import dim_zero_cat
from typing_extensions import override

from fedlit.core.errors import ConfigError, broken
from fedlit.core.roles import RoleRule
from fedlit.models import Backbone
from fedlit.module import FederatedModule
from fedlit.tasks import ranking
from fedlit.tasks.losses import ASL_DEFAULTS, asymmetric_loss, check_asymmetric_options
from fedlit.tasks.metric_registry import METRICS, build_metric, metric_entry

Task = Literal["multiclass", "binary", "multilabel"]


class _BalancedAccuracy(torchmetrics.Metric):
    """Mean over labels of (sensitivity + specificity) / 2, for binary (one label) and multilabel targets."""

    full_state_update = False
    tp: Tensor  # the states add_state registers, summed over processes
    fn: Tensor
    tn: Tensor
    fp: Tensor

    def __init__(self, num_labels: int) -> None:
        super().__init__()
        for name in ("tp", "fn", "tn", "fp"):
            self.add_state(name, default=torch.zeros(num_labels), dist_reduce_fx="sum")

    @override
    def update(self, probs: Tensor, target: Tensor) -> None:
        pred, target = probs.reshape(len(probs), -1) >= 0.5, target.reshape(len(target), -1) >= 0.5
        self.tp += (pred & target).sum(0)
        self.fn += (~pred & target).sum(0)
        self.tn += (~pred & ~target).sum(0)
        self.fp += (pred & ~target).sum(0)

    @override
    def compute(self) -> Tensor:
        # Per label, the mean recall over the classes present (a split without negatives is judged on its
        # positives alone, as multi-class balanced accuracy ignores absent classes).
        positives, negatives = self.tp + self.fn, self.tn + self.fp
        recalls = torch.stack([self.tp / positives.clamp(min=1), self.tn / negatives.clamp(min=1)])
        present = torch.stack([positives > 0, negatives > 0]).float()
        return ((recalls * present).sum(0) / present.sum(0).clamp(min=1)).mean()


def build_metrics(task: Task, num_classes: int, extra: Sequence[str] = ()) -> torchmetrics.MetricCollection:
    """Accuracy, balanced accuracy, macro F1, AUROC and AUPRC for ``task``, and the registered metrics ``extra``
    (:mod:`fedlit.tasks.metric_registry`).

    Binary: F1 is the macro F1 over both classes; AUROC/AUPRC are those of the positive class. Multi-class:
    balanced accuracy is the macro-averaged recall, AUROC/AUPRC are one-vs-rest macro averages. Multi-class and
    multilabel AUROC/AUPRC average over the classes the split can rank (:mod:`fedlit.tasks.ranking`), not over
    every class with an absent one counted as 0.
    """
    metrics = _builtin_metrics(task, num_classes)
    metrics.add_metrics({name: build_metric(name, task, num_classes) for name in extra})
    return metrics


def _builtin_metrics(task: Task, num_classes: int) -> torchmetrics.MetricCollection:
    if task == "multiclass":
        kw: dict[str, Any] = {"num_classes": num_classes}
        return torchmetrics.MetricCollection(
            {
                "accuracy": torchmetrics.classification.MulticlassAccuracy(average="micro", **kw),
                "balanced_accuracy": torchmetrics.classification.MulticlassAccuracy(average="macro", **kw),
                "f1": torchmetrics.classification.MulticlassF1Score(average="macro", **kw),
                "auroc": ranking.MulticlassAUROC(num_classes),
                "auprc": torchmetrics.classification.MulticlassAveragePrecision(average="macro", **kw),
            }
        )
    if task == "binary":
        return torchmetrics.MetricCollection(
            {
                "accuracy": torchmetrics.classification.BinaryAccuracy(),
                "balanced_accuracy": _BalancedAccuracy(1),
                "f1": _BinaryMacroF1(),
                "auroc": torchmetrics.classification.BinaryAUROC(),
                "auprc": torchmetrics.classification.BinaryAveragePrecision(),
            }
        )
    kw = {"num_labels": num_classes}
    return torchmetrics.MetricCollection(
        {
            "accuracy": torchmetrics.classification.MultilabelAccuracy(average="micro", **kw),
            "balanced_accuracy": _BalancedAccuracy(num_classes),
            "f1": torchmetrics.classification.MultilabelF1Score(average="macro", **kw),
            "auroc": ranking.MultilabelAUROC(num_classes),
            "auprc": ranking.MultilabelAveragePrecision(num_classes),
        }
    )


class _BinaryMacroF1(torchmetrics.classification.MulticlassF1Score):
    """Macro F1 over the two classes of a binary problem, from positive-class probabilities."""

    def __init__(self) -> None:
        super().__init__(num_classes=2, average="macro")

    @override
    def update(self, probs: Tensor, target: Tensor) -> None:
        super().update((probs >= 0.5).long(), target.long())


def _ranking_undefined(task: str, positives: Tensor, seen: int) -> bool:
    """Whether AUROC and AUPRC are undefined on a split with these positives per class (multi-class: fewer than
    two classes present) or per label (binary, multilabel: no label with both positives and negatives)."""
    if task == "multiclass":
        return bool((positives > 0).sum() < 2)
    return bool(((positives == 0) | (positives == seen)).all())


class ClassificationModule(FederatedModule):
    """A backbone (frozen by default) with a linear head, trained with cross-entropy or BCE.

    Parameter names: ``backbone.*`` (the built backbone, LoRA tensors included) and ``head.*``. Default roles:
    the backbone is frozen, the head shared; add rules with ``roles`` (e.g. ``backbone.*lora_*`` shared,
    ``head.*`` personal).

    Args:
        backbone: What to build the feature extractor from (a :class:`~fedlit.models.Backbone` spec).
        num_classes: Number of classes (multiclass), labels (multilabel) or 1 (binary).
        task: ``multiclass`` (softmax + cross-entropy), ``binary`` (one logit + BCE) or ``multilabel`` (BCE per
            label).
        roles: Role rules applied after the defaults.
        optimizer: Local optimizer: ``sgd``, ``adam``, ``adamw`` or a ``torch.optim`` class_path (see
            :class:`~fedlit.module.FederatedModule`).
        lr: Local learning rate of the shorthands.
        momentum: SGD momentum of the shorthands.
        weight_decay: Weight decay of the shorthands.
        lr_scheduler: A ``torch.optim.lr_scheduler`` class_path, or None.
        lr_scheduler_interval: ``round`` (one schedule over server rounds) or ``step`` (per local step).
        loss: ``default`` (cross-entropy or BCE, as ``task`` says) or ``asymmetric``: Ridnik et al.'s asymmetric
            loss (ICCV 2021, :mod:`fedlit.tasks.losses`), for ``binary`` and ``multilabel`` tasks.
        loss_options: Options of the ``asymmetric`` loss: ``gamma_neg`` (4), ``gamma_pos`` (1), ``clip`` (0.05),
            ``eps`` (1e-8); None: those defaults.
        extra_metrics: Names of metrics registered with
            :func:`fedlit.tasks.metric_registry.register_metric`, computed beside the built-in ones.
    """

    accepted_tasks = frozenset({"multiclass", "binary", "multilabel"})
    default_selection_metric = "accuracy"
    feature_extractor = "backbone"
    # What a subclass that builds itself without this constructor (CLIPPromptModule) gets: the default loss.
    loss_name: str = "default"
    loss_options: Mapping[str, float] = MappingProxyType({})
    extra_metrics: tuple[str, ...] = ()

    def __init__(
        self,
        *,
        backbone: Backbone,
        num_classes: int,
        task: Task = "multiclass",
        roles: list[RoleRule] | None = None,
        optimizer: Literal["sgd", "adam", "adamw"] | OptimizerCallable = "sgd",
        lr: float = 0.01,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        lr_scheduler: LRSchedulerCallable | None = None,
        lr_scheduler_interval: Literal["round", "step"] = "round",
        loss: Literal["default", "asymmetric"] = "default",
        loss_options: dict[str, float] | None = None,
        extra_metrics: list[str] | None = None,
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
        if task not in ("multiclass", "binary", "multilabel"):
            raise ConfigError(f"model.init_args.task={task!r} is not one of ['multiclass', 'binary', 'multilabel'].")
        if task == "binary" and num_classes != 1:
            raise ConfigError(f"model.init_args.num_classes={num_classes}: a binary task has one output; set it to 1.")
        if task != "binary" and num_classes < 2:
            raise ConfigError(f"model.init_args.num_classes={num_classes} must be >= 2 for task {task!r}.")
        self.task = task
        self.num_classes = num_classes
        self.loss_name, self.loss_options = _check_loss(task, loss, loss_options)
        self.extra_metrics = _check_extra_metrics(extra_metrics)
        self.backbone = backbone.build()
        self.head = nn.Linear(cast(int, self.backbone.num_features), num_classes)  # Backbone.build's contract
        self.metrics = build_metrics(task, num_classes, self.extra_metrics)
        self._loss_sum, self._loss_count = 0.0, 0
        self._positives: Tensor | None = None
        self._seen = 0

    @override
    def default_role_rules(self) -> list[RoleRule]:
        return [RoleRule("backbone.*", "frozen"), RoleRule("head.*", "shared")]

    @override
    def forward(self, inputs: Any) -> Tensor:
        return self.head(self.extract_features(inputs))

    def loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        """Cross-entropy (multiclass) or BCE with logits (binary, multilabel); with ``loss: asymmetric``, the
        asymmetric loss (summed over labels, averaged over samples)."""
        if self.loss_name == "asymmetric":
            return asymmetric_loss(logits.reshape(targets.shape), targets, **self.loss_options)
        if self.task == "multiclass":
            return F.cross_entropy(logits, targets.long())
        return F.binary_cross_entropy_with_logits(logits.reshape(targets.shape), targets.float())

    @override
    def training_step(self, batch: tuple[Any, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """``{"loss", "logits", "targets"}``: a strategy may re-weight the loss from the logits (FedSLD)."""
        inputs, targets = batch
        logits = self(inputs)
        return {"loss": self.loss(logits, targets), "logits": logits, "targets": targets}

    @override
    def validation_step(self, batch: tuple[Any, Tensor], batch_idx: int) -> Tensor:
        inputs, targets = batch
        return self.update_metrics(self(inputs), targets)

    def update_metrics(self, logits: Tensor, targets: Tensor) -> Tensor:
        """Add one batch's ``logits`` and ``targets`` to the metrics since :meth:`reset_metrics`; its mean loss.
        :meth:`validation_step` is the forward pass and this (fused evaluation computes the logits of several
        clients in one pass, then calls this per client)."""
        loss = self.loss(logits, targets)
        self._loss_sum += loss.item() * len(targets)
        self._loss_count += len(targets)
        self._record_classes(targets)
        if self.task == "multiclass":
            self.metrics.update(logits.softmax(-1).float(), targets.long())
        else:
            probs = logits.sigmoid().float().reshape(targets.shape)
            self.metrics.update(probs, targets.long())
        return loss

    def _record_classes(self, targets: Tensor) -> None:
        """Count positives per class/label (and samples) to know when AUROC/AUPRC are undefined."""
        if self.task == "multiclass":
            counts = torch.bincount(targets.long().reshape(-1).cpu(), minlength=self.num_classes)
        else:
            counts = targets.reshape(len(targets), -1).float().sum(0).cpu()
        self._positives = counts if self._positives is None else self._positives + counts
        self._seen += len(targets)

    @override
    def reset_metrics(self) -> None:
        self.metrics.reset()
        self._loss_sum, self._loss_count = 0.0, 0
        self._positives, self._seen = None, 0

    @override
    def compute_metrics(self) -> dict[str, float]:
        """Metrics since the last reset. AUROC and AUPRC are NaN (left out of the means, never 0) on a split
        where they are undefined: a binary/multilabel split without positives or negatives, a multi-class
        split with fewer than two classes."""
        if self._loss_count == 0:
            return {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torchmetrics' "no positive samples" notes
            out = {name: float(value) for name, value in self.metrics.compute().items()}
        out["loss"] = self._loss_sum / self._loss_count
        positives = self._positives
        if not (positives is not None):  # counted by every batch that counted the loss
            raise broken("counted by every batch that counted the loss")
        if _ranking_undefined(self.task, positives, self._seen):
            out["auroc"] = out["auprc"] = float("nan")
        return out

    @override
    def pooled_predictions(self) -> dict[str, Any] | None:
        """The split's probabilities and targets since the last reset (those the AUROC keeps: no second copy), on
        the CPU, with its summed loss and sample count."""
        if self._loss_count == 0:
            return None
        auroc: Any = self.metrics["auroc"]  # a torchmetrics AUROC without thresholds: it keeps every sample
        return {
            "probs": dim_zero_cat(auroc.preds).cpu(),
            "targets": dim_zero_cat(auroc.target).cpu(),
            "loss_sum": self._loss_sum,
            "count": self._loss_count,
        }

    @override
    def pooled_metrics(self, predictions: list[Any]) -> dict[str, float]:
        """Every metric over the clients' samples together (fresh metrics: those being accumulated are left as they
        are); the loss is the mean over all the samples."""
        if not predictions:
            return {}
        probs, targets = torch.cat([p["probs"] for p in predictions]), torch.cat([p["targets"] for p in predictions])
        metrics = build_metrics(self.task, self.num_classes, self.extra_metrics)
        metrics.update(probs, targets)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            out = {name: float(value) for name, value in metrics.compute().items()}
        out["loss"] = sum(p["loss_sum"] for p in predictions) / sum(p["count"] for p in predictions)
        if self.task == "multiclass":
            positives = torch.bincount(targets.long().reshape(-1), minlength=self.num_classes)
        else:
            positives = targets.reshape(len(targets), -1).float().sum(0)
        if _ranking_undefined(self.task, positives, len(targets)):
            out["auroc"] = out["auprc"] = float("nan")
        return out

    @override
    @property
    def higher_is_better(self) -> dict[str, bool]:
        extra = {name: metric_entry(name).higher_is_better for name in self.extra_metrics}
        return {**dict.fromkeys(METRICS, True), **extra, "loss": False}


def _check_loss(task: str, loss: object, options: object) -> tuple[str, dict[str, float]]:
    """The loss's name and its options (the asymmetric loss's defaults filled in), or a ConfigError naming the
    option."""
    if loss not in ("default", "asymmetric"):
        raise ConfigError(f"model.init_args.loss={loss!r} is not one of ['default', 'asymmetric'].")
    if loss == "default":
        if options:
            raise ConfigError(
                f"model.init_args.loss_options={options!r} is given but loss is 'default' (which has no options); "
                "set loss: asymmetric or leave loss_options out."
            )
        return "default", {}
    if task == "multiclass":
        raise ConfigError(
            "model.init_args.loss='asymmetric' is for binary and multilabel tasks (one sigmoid per label), not "
            "task 'multiclass'; set task: multilabel with one-hot targets, or loss: default."
        )
    problems = check_asymmetric_options(options)
    if problems:
        raise ConfigError("model.init_args." + "; ".join(problems) + ".")
    given = cast(dict[str, float], options or {})  # a mapping of numbers: checked above
    return "asymmetric", {**ASL_DEFAULTS, **{k: float(v) for k, v in given.items()}}


def _check_extra_metrics(names: object) -> tuple[str, ...]:
    """The registered metric names of ``extra_metrics``, or a ConfigError (unknown names list the registered ones)."""
    if names is None:
        return ()
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"model.init_args.extra_metrics must be a list of metric names, got {names!r}.")
    for name in names:
        metric_entry(name, "model.init_args.extra_metrics")
    if len(set(names)) != len(names):
        raise ConfigError(f"model.init_args.extra_metrics={list(names)} names a metric twice.")
    return tuple(names)
