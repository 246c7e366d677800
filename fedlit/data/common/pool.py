"""The tensor pool: what ``FederatedDataModule.build()`` returns (:class:`PartitionedData`: one pool of samples
and, per client and split, the indices of its samples), the ``Dataset`` that reads a client's split of it
(:class:`PoolSubset`), and the checks a pool must pass before any client trains on it (:func:`check_pool`).

The file-backed path (``build_samples()``) has its counterpart in :mod:`fedlit.data.common.samples`; both are served
by :class:`~fedlit.data.common.datamodule.FederatedDataModule`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset
from typing_extensions import override

from fedlit.core.errors import DataError
from fedlit.data.common.splits import split_problems

#: A data set's task: one of :data:`CLASSIFICATION_TASKS`, ``"survival"``, ``"regression"`` or any other name
#: that a module accepts (``FederatedModule.accepted_tasks``).
TaskType = str
#: Tasks whose targets are classes: they have per-class counts (``class_counts``) and checked labels.
CLASSIFICATION_TASKS = frozenset({"multiclass", "binary", "multilabel"})
Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class PartitionedData:
    """What a data set builds once: the pool and every client's splits.

    Attributes:
        name: data set name, recorded in the manifest.
        task: ``"multiclass"`` (int64 targets (N,)), ``"binary"`` (float32 0/1 (N,)), ``"multilabel"``
            (float32 (N, L)), ``"survival"`` (float32 (N, 2): time >= 0, event 0/1), ``"segmentation"`` (float32
            (N, C, H, W) masks of 0/1, C = num_classes), or any other name (e.g.
            ``"regression"``: targets of any shape, not checked beyond being finite) that a module accepts.
        num_classes: classes (multiclass), 1 (binary) or labels (multilabel); 0 for tasks without classes.
        inputs: the pool's inputs, first dimension = samples; may be stored compactly (e.g. uint8) if
            ``transform`` turns a batch of them into float tensors.
        targets: the pool's targets, with the dtype and shape the task documents.
        splits: client id -> split name -> sorted pool indices; every client has all three splits (an empty
            ``val`` means the data set has no validation split).
        partitioner: how clients were formed (the partitioner's repr), recorded in the manifest.
        transform: applied to a batch of ``inputs`` (first dimension kept) when it is read; must be picklable.
        details: extra JSON-serializable facts for the manifest (source file, pool layout, fractions).
        finite_targets: whether ``setup()`` refuses NaN/Inf targets (the default, for every task); a task whose
            targets mark a missing value with NaN (its loss masks them) sets it False.
    """

    name: str
    task: TaskType
    num_classes: int
    inputs: torch.Tensor
    targets: torch.Tensor
    splits: dict[str, dict[str, np.ndarray]]
    partitioner: str
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None
    details: dict[str, Any] = field(default_factory=dict)
    finite_targets: bool = True


class PoolSubset(Dataset[Batch]):
    """The samples of a pool at ``indices``; reads whole batches at once through ``__getitems__``."""

    def __init__(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        indices: np.ndarray,
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        self.inputs = inputs
        self.targets = targets
        self.indices = torch.as_tensor(np.asarray(indices, dtype=np.int64))
        self.transform = transform

    def __len__(self) -> int:
        return len(self.indices)

    def __getitems__(self, positions: list[int]) -> list[Batch]:
        """Read a batch in one indexing call (the DataLoader uses this when it exists)."""
        rows = self.indices[torch.as_tensor(positions, dtype=torch.int64)]
        x = self.inputs[rows]
        if self.transform is not None:
            x = self.transform(x)
        return list(zip(x.unbind(0), self.targets[rows].unbind(0), strict=True))

    @override
    def __getitem__(self, position: int) -> Batch:
        return self.__getitems__([position])[0]


def check_pool(data: PartitionedData, owner: str) -> None:
    """Refuse a pool no client could train or be evaluated on; ``owner`` (the data set class) names it.

    Raises:
        DataError: Listing every problem found (see :class:`~fedlit.data.common.datamodule.FederatedDataModule`).
    """
    where = f"{owner} ({data.name})"
    problems = []
    inputs, targets = data.inputs, data.targets
    if len(inputs) != len(targets):
        problems.append(f"{where} has {len(inputs)} input samples but {len(targets)} targets")
    # One pass over the pool; the per-sample search only runs when something is wrong.
    if inputs.is_floating_point() and not torch.isfinite(inputs).all():
        problems.append(_non_finite(where, "input", inputs))
    # Classification labels are always finite; another task may declare NaN/Inf meaningful (finite_targets=False).
    must_be_finite = data.finite_targets or data.task in CLASSIFICATION_TASKS
    if must_be_finite and targets.is_floating_point() and not torch.isfinite(targets).all():
        problems.append(_non_finite(where, "target", targets))
    elif data.task == "survival":
        problems += _survival_problems(where, targets)
    elif data.task == "segmentation":
        problems += _segmentation_problems(where, inputs, targets, data.num_classes)
    elif data.task == "multiclass":
        if targets.is_floating_point() or targets.dtype == torch.bool:
            problems.append(
                f"{where}: multiclass targets must be integers (int64), got {targets.dtype}; convert them "
                "with .long(), or declare the task binary or multilabel"
            )
        else:
            bad = (targets < 0) | (targets >= data.num_classes)
            if bad.any():
                first = int(bad.reshape(len(targets), -1).any(dim=1).nonzero()[0, 0])
                problems.append(
                    f"{where}: target of sample {first} is {targets[first].tolist()}, outside the "
                    f"{data.num_classes} classes 0..{data.num_classes - 1} ({int(bad.sum())} such targets); "
                    "fix the labels or raise num_classes"
                )
    if data.task in ("binary", "multilabel") and torch.isfinite(targets.float()).all():
        bad = (targets != 0) & (targets != 1)
        if bad.any():
            first = int(bad.reshape(len(targets), -1).any(dim=1).nonzero()[0, 0])
            problems.append(
                f"{where}: {data.task} targets must be 0 or 1, target of sample {first} is "
                f"{targets[first].tolist()} ({int(bad.sum())} such values); binarize the labels or use the "
                "multiclass task"
            )
    if not data.splits:
        problems.append(f"{where} builds no client: its splits are empty")
    for client_id, splits in data.splits.items():
        problems += split_problems(
            where,
            client_id,
            splits,
            len(targets),
            unit="index",
            fix="lower num_clients or change the partition (or split_fractions)",
        )
    if problems:
        raise DataError("; ".join(problems))


def _non_finite(where: str, kind: str, values: torch.Tensor) -> str:
    bad = ~torch.isfinite(values.reshape(len(values), -1))
    rows = bad.any(dim=1).nonzero()[:, 0]
    first = int(rows[0])
    value = values.reshape(len(values), -1)[first][bad[first]][0].item()
    return (
        f"{where}: {kind} of sample {first} holds {value} ({len(rows)} samples with a non-finite {kind}); "
        "fix or drop those samples in the source data"
    )


def _survival_problems(where: str, targets: torch.Tensor) -> list[str]:
    """Survival targets are float (N, 2) rows (time, event): time >= 0, event 0 (censored) or 1 (event)."""
    if not targets.is_floating_point() or targets.ndim != 2 or targets.shape[1] != 2:
        return [
            f"{where}: survival targets must be a float tensor of shape (N, 2) holding (time, event) rows, got "
            f"{targets.dtype} of shape {tuple(targets.shape)}"
        ]
    problems = []
    for column, bad, allowed in (
        (0, targets[:, 0] < 0, "a time >= 0"),
        (1, (targets[:, 1] != 0) & (targets[:, 1] != 1), "an event 0 (censored) or 1"),
    ):
        if bad.any():
            first = int(bad.nonzero()[0, 0])
            problems.append(
                f"{where}: survival target of sample {first} is {targets[first].tolist()}; column "
                f"{column} must be {allowed} ({int(bad.sum())} such samples)"
            )
    return problems


def _segmentation_problems(where: str, inputs: torch.Tensor, targets: torch.Tensor, num_classes: int) -> list[str]:
    """Segmentation targets are float (N, C, H, W) masks of 0/1, C = num_classes, H and W those of the inputs."""
    if not targets.is_floating_point() or targets.ndim != 4:
        return [
            f"{where}: segmentation targets must be float masks of shape (N, C, H, W), got {targets.dtype} of "
            f"shape {tuple(targets.shape)}; convert them with .float() and add the channel dimension"
        ]
    problems = []
    if targets.shape[1] != num_classes:
        problems.append(
            f"{where}: segmentation masks have {targets.shape[1]} channels but num_classes is "
            f"{num_classes}; they must be equal (one channel per structure)"
        )
    if inputs.ndim == 4 and inputs.shape[-2:] != targets.shape[-2:]:
        problems.append(
            f"{where}: images are {tuple(inputs.shape[-2:])} pixels but masks "
            f"{tuple(targets.shape[-2:])}; resize both to the same size"
        )
    bad = (targets != 0) & (targets != 1)
    if bad.any():
        first = int(bad.reshape(len(targets), -1).any(dim=1).nonzero()[0, 0])
        problems.append(
            f"{where}: segmentation masks must be 0 or 1, the mask of sample {first} holds "
            f"{targets[first][bad[first]][0].item()} ({int(bad.sum())} such pixels); binarize the masks "
            "(e.g. mask > 0.5)"
        )
    return problems
