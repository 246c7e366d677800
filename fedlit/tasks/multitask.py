"""Several classification tasks on one backbone: a head per task, binary (one logit, BCE) or multi-class (softmax
cross-entropy), judged by the AUROC of each task and their mean.

The eICU benchmark of Yang et al., "Towards the Practical Utility of Federated Learning in the Medical Domain"
(CHIL 2023) has six tasks per ICU stay: three binary (mort_24h, mort_48h, LOS) and three multi-class (disch_24h,
disch_48h: 10 classes; acuity: 12), some unknown for a given stay. Targets are float (N, T) rows, one column per
task in ``task_classes`` order: 0/1 for a binary task, the class index for a multi-class one, and a negative value
where the label is unknown (that task's loss and metrics skip the sample).

Loss: the mean over the trained tasks that have a known label in the batch of each task's mean loss over those
samples (one task: that task's loss, the authors' single-task training).

AUROC as the FedPxN authors' code computes it (scikit-learn's ``roc_auc_score``): binary, the positive logit's
AUROC over the known labels; multi-class, one-vs-rest on the raw logits, macro-averaged over the classes that
have both positives and negatives in the split. Metrics: ``auroc_<task>`` per task (NaN where undefined: no
positive or no negative), ``auroc`` = the mean of the defined ones (the six-task mean), and ``loss``.
"""

from __future__ import annotations

import math
from typing import Any, Literal, cast

import numpy as np
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn
from torch.nn import functional as F
from typing_extensions import override

from fedlit.core.errors import ConfigError
from fedlit.core.roles import RoleRule
from fedlit.models import Backbone
from fedlit.module import FederatedModule


def binary_auroc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve of ``scores`` for 0/1 ``labels`` (Mann-Whitney: tied scores count one half); NaN
    without a positive or a negative."""
    scores, labels = np.asarray(scores, dtype=np.float64), np.asarray(labels) > 0.5
    positives, negatives = int(labels.sum()), int((~labels).sum())
    if positives == 0 or negatives == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    start = 0
    while start < len(scores):  # average ranks (1-based) over each run of tied scores
        end = start
        while end + 1 < len(scores) and sorted_scores[end + 1] == sorted_scores[start]:
            end += 1
        ranks[order[start : end + 1]] = (start + end) / 2 + 1
        start = end + 1
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def task_auroc(logits: np.ndarray, target: np.ndarray, classes: int) -> float:
    """One task's AUROC over its known labels (``target >= 0``): binary on the logit, multi-class one-vs-rest on the
    raw logits, macro over the classes with both positives and negatives; NaN when none is defined."""
    known = target >= 0
    logits, target = logits[known], target[known].astype(np.int64)
    if classes == 1:
        return binary_auroc(logits[:, 0], target)
    values = [binary_auroc(logits[:, c], target == c) for c in range(classes)]
    defined = [v for v in values if not math.isnan(v)]
    return float(np.mean(defined)) if defined else float("nan")


class MultiTaskModule(FederatedModule):
    """A backbone with one linear head per task (parameters ``backbone.*`` and ``heads.<task>.*``).

    Default roles: backbone frozen, heads shared (as :class:`~fedlit.tasks.ClassificationModule`); train a backbone
    from scratch with ``roles: [{pattern: "backbone.*", role: shared}]``.

    Args:
        backbone: What to build the feature extractor from (a :class:`~fedlit.models.Backbone` spec).
        task_classes: Every target column, in order: task name -> classes (1: binary). The data's columns.
        tasks: The tasks trained and reported (default: all of ``task_classes``); one task gives the FedPxN
            paper's single-task models.
        roles: Role rules applied after the defaults.
        optimizer: Local optimizer (see :class:`~fedlit.module.FederatedModule`).
        lr: Local learning rate.
        momentum: SGD momentum.
        weight_decay: Weight decay.
        lr_scheduler: A ``torch.optim.lr_scheduler`` class_path, or None.
        lr_scheduler_interval: ``round`` or ``step``.
    """

    accepted_tasks = frozenset({"multitask"})
    default_selection_metric = "auroc"
    feature_extractor = "backbone"
    task = "multitask"

    def __init__(
        self,
        *,
        backbone: Backbone,
        task_classes: dict[str, int],
        tasks: list[str] | None = None,
        roles: list[RoleRule] | None = None,
        optimizer: Literal["sgd", "adam", "adamw"] | OptimizerCallable = "adam",
        lr: float = 0.001,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        lr_scheduler: LRSchedulerCallable | None = None,
        lr_scheduler_interval: Literal["round", "step"] = "round",
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
        if not isinstance(task_classes, dict) or not task_classes:
            problems.append(f"model.init_args.task_classes must map task names to classes, got {task_classes!r}")
            task_classes = {}
        bad = {k: v for k, v in task_classes.items() if isinstance(v, bool) or not isinstance(v, int) or v < 1}
        if bad:
            problems.append(f"model.init_args.task_classes: classes must be integers >= 1 (1: binary), got {bad}")
        chosen = list(task_classes) if tasks is None else list(tasks)
        unknown = [t for t in chosen if t not in task_classes]
        if unknown or not chosen or len(set(chosen)) < len(chosen):
            problems.append(
                f"model.init_args.tasks={tasks!r} must list distinct tasks of task_classes {list(task_classes)}"
            )
        if problems:
            raise ConfigError("; ".join(problems) + ".")
        self.task_classes = dict(task_classes)
        self.tasks = chosen
        self.num_classes = len(task_classes)  # target columns, as the data set counts them
        self._columns = [list(task_classes).index(t) for t in chosen]
        self.backbone = backbone.build()
        width = cast(int, self.backbone.num_features)  # Backbone.build's contract
        self.heads = nn.ModuleDict({t: nn.Linear(width, task_classes[t]) for t in chosen})
        self._logits: list[Tensor] = []
        self._targets: list[Tensor] = []

    @override
    def default_role_rules(self) -> list[RoleRule]:
        return [RoleRule("backbone.*", "frozen"), RoleRule("heads.*", "shared")]

    @override
    def forward(self, inputs: Any) -> Tensor:
        """(B, sum of the trained tasks' classes): the heads' logits side by side, in ``tasks`` order."""
        features = self.extract_features(inputs)
        return torch.cat([self.heads[t](features) for t in self.tasks], dim=1)

    def loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        """Mean over the tasks with a known label in the batch of their mean loss (BCE or cross-entropy); 0
        (connected to ``logits``) when no label is known."""
        losses = []
        for task, column, part in zip(self.tasks, self._columns, self._split(logits), strict=True):
            target = targets[:, column]
            known = target >= 0
            if not bool(known.any()):
                continue
            if self.task_classes[task] == 1:
                losses.append(F.binary_cross_entropy_with_logits(part[known, 0], target[known].float()))
            else:
                losses.append(F.cross_entropy(part[known], target[known].long()))
        return torch.stack(losses).mean() if losses else logits.sum() * 0.0

    def _split(self, logits: Tensor) -> tuple[Tensor, ...]:
        return torch.split(logits, [self.task_classes[t] for t in self.tasks], dim=1)

    @override
    def training_step(self, batch: tuple[Any, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """``{"loss", "logits", "targets"}``."""
        inputs, targets = batch
        logits = self(inputs)
        return {"loss": self.loss(logits, targets), "logits": logits, "targets": targets}

    @override
    def validation_step(self, batch: tuple[Any, Tensor], batch_idx: int) -> Tensor:
        """Keep the batch's logits and targets (AUROC needs the whole split); its loss."""
        inputs, targets = batch
        logits = self(inputs)
        self._logits.append(logits.detach().float().cpu())
        self._targets.append(targets.detach().float().cpu())
        return self.loss(logits, targets)

    @override
    def reset_metrics(self) -> None:
        self._logits, self._targets = [], []

    @override
    def compute_metrics(self) -> dict[str, float]:
        """``auroc_<task>``, ``auroc`` (their mean) and ``loss`` over the split since the last reset."""
        if not self._logits:
            return {}
        return self.metrics_of(torch.cat(self._logits), torch.cat(self._targets))

    def metrics_of(self, logits: Tensor, targets: Tensor) -> dict[str, float]:
        """The metrics of ``logits`` (N, sum of classes) against ``targets`` (N, columns); ``loss`` is :meth:`loss`
        over the whole split at once."""
        out = {}
        for task, column, part in zip(self.tasks, self._columns, self._split(logits), strict=True):
            out[f"auroc_{task}"] = task_auroc(part.numpy(), targets[:, column].numpy(), self.task_classes[task])
        defined = [v for k, v in out.items() if not math.isnan(v)]
        out["auroc"] = float(np.mean(defined)) if defined else float("nan")
        out["loss"] = float(self.loss(logits, targets))
        return out

    @override
    def pooled_predictions(self) -> dict[str, Tensor] | None:
        """The split's logits and targets since the last reset (CPU tensors)."""
        if not self._logits:
            return None
        return {"logits": torch.cat(self._logits), "targets": torch.cat(self._targets)}

    @override
    def pooled_metrics(self, predictions: list[Any]) -> dict[str, float]:
        """Every metric over the clients' samples together."""
        if not predictions:
            return {}
        logits = torch.cat([p["logits"] for p in predictions])
        return self.metrics_of(logits, torch.cat([p["targets"] for p in predictions]))

    @override
    @property
    def higher_is_better(self) -> dict[str, bool]:
        return {**{f"auroc_{t}": True for t in self.tasks}, "auroc": True, "loss": False}
