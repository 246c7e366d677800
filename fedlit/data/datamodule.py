"""``FederatedDataModule``: per-client train/val/test data for the federated loop.

Two ways to give the data, behind one interface (loaders, sizes, class counts, manifest):

- the *tensor pool*: ``build()`` returns a :class:`PartitionedData`, one pool of samples (inputs and targets
  tensors) plus, per client and split, the indices of its samples in the pool (tabular data, MedMNIST);
- *file-backed samples*: ``build_samples()`` returns a :class:`~fedlit.data.samples.SampleList`, per client the
  identities (file paths) and targets of its samples, read lazily one by one in the DataLoader workers, with
  separate train and evaluation transforms (image folders, anything larger than memory).

A subclass implements exactly one of the two hooks.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from fedlit.core.errors import ConfigError, DataError
from fedlit.data.samples import CLASSIFICATION, SampleList, SampleSubset, check_samples
from fedlit.data.splits import SPLITS, split_problems

#: A data set's task: one of :data:`CLASSIFICATION_TASKS`, ``"survival"``, ``"regression"`` or any other name
#: that a module accepts (``FederatedModule.accepted_tasks``).
TaskType = str
#: Tasks whose targets are classes: they have per-class counts (``class_counts``) and checked labels.
CLASSIFICATION_TASKS = frozenset({"multiclass", "binary", "multilabel"})
SplitName = Literal["train", "val", "test"]
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

    def __getitem__(self, position: int) -> Batch:
        return self.__getitems__([position])[0]


class FederatedDataModule:
    """Per-client data: loaders, sizes, class counts and a manifest of who holds which sample.

    Everything is built once, lazily, by ``setup()`` (called for you by every accessor), from ``seed`` alone:
    the same seed gives the same clients and splits. Client ids are strings in a stable order.

    ``setup()`` refuses a pool it cannot train on, naming the data set class, the sample index and the value:
    non-finite inputs (floating pools; compact pools such as uint8 images are checked by their data set when
    read) or targets (unless the data set declares ``finite_targets=False`` for a task without classes),
    multiclass targets outside ``[0, num_classes)``, binary or multilabel targets other than 0/1, survival
    targets other than (time >= 0, event 0/1) rows, split indices outside the pool, and a client with an empty
    train or test split (an empty val split is allowed: the data set then has no validation split). Targets of
    other tasks (regression...) may have any dtype and shape.
    File-backed data gets the same checks of its targets and splits, plus the existence of the files it lists
    (:func:`~fedlit.data.samples.check_samples`).

    Args:
        batch_size: training batch size.
        eval_batch_size: batch size of the val/test loaders (default: ``batch_size``).
        num_workers: DataLoader worker processes.
        seed: seed of the partition, the per-client splits and any generated data.
    """

    def __init__(
        self, *, batch_size: int = 32, eval_batch_size: int | None = None, num_workers: int = 0, seed: int = 0
    ) -> None:
        problems = []
        if not is_int(batch_size) or batch_size < 1:
            problems.append(f"data.init_args.batch_size must be an integer >= 1, got {batch_size!r}")
        if eval_batch_size is not None and (not is_int(eval_batch_size) or eval_batch_size < 1):
            problems.append(
                f"data.init_args.eval_batch_size must be null or an integer >= 1, got {eval_batch_size!r}"
            )
        if not is_int(num_workers) or num_workers < 0:
            problems.append(f"data.init_args.num_workers must be an integer >= 0, got {num_workers!r}")
        if not is_int(seed):
            problems.append(f"data.init_args.seed must be an integer, got {seed!r}")
        if problems:
            raise ConfigError("; ".join(problems))
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size if eval_batch_size is not None else batch_size
        self.num_workers = num_workers
        self.seed = seed
        self._data: PartitionedData | SampleList | None = None
        if not (_overrides(type(self), "build") or _overrides(type(self), "build_samples")):
            raise TypeError(
                f"{type(self).__name__} must implement build() (an in-memory tensor pool) or build_samples() "
                "(file-backed samples read lazily)"
            )

    def build(self) -> PartitionedData:
        """Tensor-pool path: load or generate the pool and form the clients' splits; called once by ``setup()``.

        Implement this or :meth:`build_samples`, not both.
        """
        raise TypeError(f"{type(self).__name__} implements build_samples(), not build()")

    def build_samples(self) -> SampleList:
        """File-backed path: list every client's samples (identities, targets, splits, reader, transforms);
        called once by ``setup()``. Inputs are only read by the loaders, one sample at a time.

        Implement this or :meth:`build`, not both.
        """
        raise TypeError(f"{type(self).__name__} implements build(), not build_samples()")

    def setup(self) -> None:
        """Build the pool and the clients' splits, and check them (only the first call does work).

        Raises:
            DataError: if the pool holds a non-finite value or an out-of-range target, or a client has an empty
                train or test split (every problem found is listed).
        """
        self._checked()

    @property
    def data(self) -> PartitionedData | SampleList:
        """The built and checked pool or sample list, and splits (built by ``setup()`` on first access)."""
        return self._checked()

    def _checked(self) -> PartitionedData | SampleList:
        if self._data is None:
            if _overrides(type(self), "build_samples"):
                samples = self.build_samples()
                check_samples(samples, type(self).__name__)
                self._data = samples
            else:
                data = self.build()
                _check(data, type(self).__name__)
                self._data = data
        return self._data

    @property
    def task(self) -> TaskType:
        """What the targets are: ``"multiclass"``, ``"binary"``, ``"multilabel"``, ``"survival"``, ..."""
        return self.data.task

    @property
    def num_classes(self) -> int:
        """Number of classes (multiclass), 1 (binary) or number of labels (multilabel)."""
        return self.data.num_classes

    @property
    def client_ids(self) -> list[str]:
        """Client ids in a stable order: every client evaluated, including evaluation-only ones."""
        return list(self.data.splits)

    @property
    def evaluation_only(self) -> frozenset[str]:
        """Clients that never train, only evaluated (:attr:`SampleList.evaluation_only`); none for a pool."""
        return getattr(self.data, "evaluation_only", frozenset())

    @property
    def train_client_ids(self) -> list[str]:
        """The clients that train (rounds select among them), in :attr:`client_ids` order."""
        return [c for c in self.client_ids if c not in self.evaluation_only]

    def expected_num_clients(self) -> int | None:
        """The number of clients, known from the constructor's arguments without building the data (for cost
        estimates before a run: ``fedlit cost``); None when only ``setup()`` can tell. Default: the clients of the
        built data if ``setup()`` has run, else an integer attribute ``num_clients``, else None. A data set whose
        clients are listed by its arguments (sites) overrides it."""
        if self._data is not None:
            return len(self._data.splits)
        count = getattr(self, "num_clients", None)
        return count if is_int(count) else None

    def train_dataloader(self, client_id: str, generator: torch.Generator) -> DataLoader:
        """A shuffled loader over the client's train split; ``generator`` drives the shuffle."""
        return self._loader(client_id, "train", self.batch_size, shuffle=True, generator=generator)

    def val_dataloader(self, client_id: str) -> DataLoader | None:
        """The client's validation loader, or ``None`` when the data set has no validation split."""
        if self.num_examples(client_id, "val") == 0:
            return None
        return self._loader(client_id, "val", self.eval_batch_size, shuffle=False)

    def test_dataloader(self, client_id: str) -> DataLoader:
        """The client's test loader, in pool order."""
        return self._loader(client_id, "test", self.eval_batch_size, shuffle=False)

    def num_examples(self, client_id: str, split: SplitName) -> int:
        """Number of samples of ``client_id`` in ``split``."""
        return len(self._indices(client_id, split))

    def class_counts(self) -> dict[str, dict[str, list[int]]] | None:
        """Client -> split -> samples per class ([negatives, positives] if binary; positives per label if
        multilabel); None for a task without classes (survival, regression...). Computed from the targets
        alone: no input is read."""
        data = self.data
        if data.task not in CLASSIFICATION_TASKS:
            return None
        counts: dict[str, dict[str, list[int]]] = {}
        for client_id, splits in data.splits.items():
            counts[client_id] = {}
            for split in SPLITS:
                positions = torch.as_tensor(splits[split], dtype=torch.int64)
                targets = data.targets[client_id] if isinstance(data, SampleList) else data.targets
                counts[client_id][split] = _count(targets[positions], data.task, data.num_classes)
        return counts

    def manifest(self) -> dict[str, Any]:
        """A JSON-serializable record of the data a run used: data set, seed, partitioner and, per client and
        split, the sample indices into the pool (``details`` says how the pool is laid out) or, for file-backed
        data, the sample identities (file paths relative to the data set's root)."""
        data = self.data
        if isinstance(data, SampleList):
            return {
                "dataset": data.name,
                "class": type(self).__name__,
                "seed": self.seed,
                "partitioner": data.partitioner,
                "task": data.task,
                "num_classes": data.num_classes,
                "storage": "files",
                "class_names": data.class_names,
                "details": data.details,
                "evaluation_only": sorted(data.evaluation_only),
                "clients": {
                    client_id: {split: [data.samples[client_id][int(i)] for i in splits[split]] for split in SPLITS}
                    for client_id, splits in data.splits.items()
                },
            }
        return {
            "dataset": data.name,
            "class": type(self).__name__,
            "seed": self.seed,
            "partitioner": data.partitioner,
            "task": data.task,
            "num_classes": data.num_classes,
            "pool_size": len(data.targets),
            "details": data.details,
            "clients": {
                client_id: {split: [int(i) for i in splits[split]] for split in SPLITS}
                for client_id, splits in data.splits.items()
            },
        }

    def _indices(self, client_id: str, split: str) -> np.ndarray:
        splits = self.data.splits
        if client_id not in splits:
            close = difflib.get_close_matches(str(client_id), list(splits), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise KeyError(f"unknown client id {client_id!r}; valid ids: {list(splits)}{hint}")
        if split not in SPLITS:
            raise ConfigError(f"unknown split {split!r}; valid splits: {list(SPLITS)}")
        return splits[client_id][split]

    def _loader(
        self,
        client_id: str,
        split: str,
        batch_size: int,
        *,
        shuffle: bool,
        generator: torch.Generator | None = None,
    ) -> DataLoader:
        data = self.data
        dataset: Dataset
        if isinstance(data, SampleList):
            transform = data.train_transform if split == "train" else data.eval_transform
            dataset = SampleSubset(data.samples[client_id], data.targets[client_id],
                                   self._indices(client_id, split), data.read, transform)
        else:
            dataset = PoolSubset(data.inputs, data.targets, self._indices(client_id, split), data.transform)
        return DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            generator=generator,
            drop_last=False,
            num_workers=self.num_workers,
        )


def _check(data: PartitionedData, owner: str) -> None:
    """Refuse a pool no client could train or be evaluated on; ``owner`` (the data set class) names it."""
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
        problems += split_problems(where, client_id, splits, len(targets), unit="index",
                                   fix="lower num_clients or change the partition (or split_fractions)")
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
        return [f"{where}: survival targets must be a float tensor of shape (N, 2) holding (time, event) rows, got "
                f"{targets.dtype} of shape {tuple(targets.shape)}"]
    problems = []
    for column, bad, allowed in ((0, targets[:, 0] < 0, "a time >= 0"),
                                 (1, (targets[:, 1] != 0) & (targets[:, 1] != 1), "an event 0 (censored) or 1")):
        if bad.any():
            first = int(bad.nonzero()[0, 0])
            problems.append(f"{where}: survival target of sample {first} is {targets[first].tolist()}; column "
                            f"{column} must be {allowed} ({int(bad.sum())} such samples)")
    return problems


def _segmentation_problems(where: str, inputs: torch.Tensor, targets: torch.Tensor, num_classes: int) -> list[str]:
    """Segmentation targets are float (N, C, H, W) masks of 0/1, C = num_classes, H and W those of the inputs."""
    if not targets.is_floating_point() or targets.ndim != 4:
        return [f"{where}: segmentation targets must be float masks of shape (N, C, H, W), got {targets.dtype} of "
                f"shape {tuple(targets.shape)}; convert them with .float() and add the channel dimension"]
    problems = []
    if targets.shape[1] != num_classes:
        problems.append(f"{where}: segmentation masks have {targets.shape[1]} channels but num_classes is "
                        f"{num_classes}; they must be equal (one channel per structure)")
    if inputs.ndim == 4 and inputs.shape[-2:] != targets.shape[-2:]:
        problems.append(f"{where}: images are {tuple(inputs.shape[-2:])} pixels but masks "
                        f"{tuple(targets.shape[-2:])}; resize both to the same size")
    bad = (targets != 0) & (targets != 1)
    if bad.any():
        first = int(bad.reshape(len(targets), -1).any(dim=1).nonzero()[0, 0])
        problems.append(f"{where}: segmentation masks must be 0 or 1, the mask of sample {first} holds "
                        f"{targets[first][bad[first]][0].item()} ({int(bad.sum())} such pixels); binarize the masks "
                        "(e.g. mask > 0.5)")
    return problems


def is_int(value: object) -> bool:
    """Whether ``value`` is an integer (Python or NumPy), not a bool: the check behind every integer option."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _overrides(cls: type, hook: str) -> bool:
    return getattr(cls, hook) is not getattr(FederatedDataModule, hook)


def _count(targets: torch.Tensor, task: str, num_classes: int) -> list[int]:
    if task not in CLASSIFICATION:
        return []
    if task == "multilabel":
        return [int(v) for v in targets.reshape(-1, num_classes).sum(dim=0).round().long()]
    length = 2 if task == "binary" else num_classes
    return [int(v) for v in torch.bincount(targets.long().reshape(-1), minlength=length)]
