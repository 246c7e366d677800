"""``SiteDataset``: any ``torch.utils.data.Dataset`` split into clients by a site assignment, from Python."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset
from typing_extensions import override

from fedlit.core.errors import ConfigError, DataError
from fedlit.data.common.datamodule import FederatedDataModule
from fedlit.data.common.samples import SampleList, TransformSpec, class_sort_key, make_transform, split_samples
from fedlit.data.common.splits import check_split_fractions

_OPTION = "data.init_args"


class DatasetInput:
    """Reads the input of sample ``i`` of ``dataset`` (``dataset[i][0]``); picklable if the dataset is."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __call__(self, index: int) -> Any:
        return self.dataset[index][0]


class SiteDataset(FederatedDataModule):
    """A ``torch.utils.data.Dataset`` of ``(input, target)`` pairs whose samples belong to sites (clients).

    The file-backed path for Python users: inputs are read by ``dataset[i]`` in the DataLoader workers, only when
    a loader asks for them. Targets are found without reading inputs where possible, in this order: ``targets``
    given here, the dataset's ``targets`` attribute (as torchvision's folder and MNIST-like sets have), or
    ``label_fn(i)``; only when none exists is every ``dataset[i]`` read once (a warning says so).

    ``sites`` assigns every sample to a site: a sequence (list, array, tensor) with one site id per sample, the
    name of an attribute of ``dataset`` holding such a sequence, or a function ``i -> site id``. Client ids are
    the site ids as strings, sorted (numerically when they are numbers). Each site is split by
    ``split_fractions`` (stratified by class for classification), seeded by ``seed``; the manifest records each
    client's dataset indices per split.

    Args:
        dataset: the samples; ``dataset[i]`` returns ``(input, target)``.
        sites: site of each sample (sequence, attribute name or function of the index).
        task: ``multiclass``, ``binary``, ``multilabel`` or another task name.
        num_classes: classes (multiclass; default: largest target + 1), 1 (binary), labels (multilabel).
        targets: targets of all samples (default: ``dataset.targets``, then ``label_fn``).
        label_fn: ``i -> target`` without reading the input (e.g. from a table of file names).
        split_fractions: (train, val, test) shares of each site's samples.
        train_transform: transform (or list of transforms) applied to train inputs.
        eval_transform: transform (or list of transforms) applied to val and test inputs.
        batch_size: training batch size.
        eval_batch_size: val/test batch size (default ``batch_size``).
        num_workers: DataLoader worker processes (the dataset must then be picklable).
        seed: seed of the splits.
    """

    def __init__(
        self,
        *,
        dataset: Dataset,
        sites: Sequence[Any] | torch.Tensor | np.ndarray | str | Callable[[int], Any],
        task: str = "multiclass",
        num_classes: int | None = None,
        targets: Sequence[Any] | torch.Tensor | np.ndarray | None = None,
        label_fn: Callable[[int], Any] | None = None,
        split_fractions: tuple[float, float, float] = (0.6, 0.2, 0.2),
        train_transform: TransformSpec = None,
        eval_transform: TransformSpec = None,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, num_workers=num_workers, seed=seed)
        check_split_fractions(split_fractions, f"{_OPTION}.split_fractions")
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise ConfigError(
                f"{_OPTION}.dataset must be a map-style Dataset (with __getitem__ and __len__), got "
                f"{type(dataset).__name__}"
            )
        if isinstance(sites, str) and not hasattr(dataset, sites):
            raise ConfigError(f"{_OPTION}.sites={sites!r} names no attribute of {type(dataset).__name__}")
        self.dataset, self.sites, self.label_fn = dataset, sites, label_fn
        self.requested_task, self.requested_classes, self.given_targets = task, num_classes, targets
        self.split_fractions = tuple(float(f) for f in split_fractions)
        self.train_transform = make_transform(train_transform, f"{_OPTION}.train_transform")
        self.eval_transform = make_transform(eval_transform, f"{_OPTION}.eval_transform")

    @override
    def build_samples(self) -> SampleList:
        n = len(self.dataset)  # type: ignore[arg-type]
        site_of = self._sites(n)
        y = self._targets(n)
        task = self.requested_task
        if task == "multiclass":
            if y.is_floating_point() and bool((y == y.round()).all()):
                y = y.long()
            num_classes = self.requested_classes or (int(y.max()) + 1 if len(y) else 0)
        elif task == "binary":
            y, num_classes = y.float(), 1
        else:
            y = y.float()
            num_classes = self.requested_classes or (y.shape[1] if y.ndim == 2 else 1)
        site_ids = sorted({str(s) for s in site_of}, key=class_sort_key)
        members = {s: np.flatnonzero(site_of == s) for s in site_ids}
        targets = {s: y[torch.from_numpy(idx)] for s, idx in members.items()}
        splits = split_samples(
            targets, self.split_fractions, np.random.default_rng(self.seed), task, f"{_OPTION}.split_fractions"
        )
        return SampleList(
            name=type(self.dataset).__name__,
            task=task,
            num_classes=num_classes,
            samples={s: [int(i) for i in idx] for s, idx in members.items()},
            targets=targets,
            splits=splits,
            read=DatasetInput(self.dataset),
            train_transform=self.train_transform,
            eval_transform=self.eval_transform,
            class_names=getattr(self.dataset, "classes", None),
            details={"dataset": repr(self.dataset)[:200], "split_fractions": list(self.split_fractions)},
        )

    @override
    def client_id_source(self) -> str:
        """The ``sites`` option (and the dataset attribute it names)."""
        named = f" (attribute {self.sites!r} of {type(self.dataset).__name__})" if isinstance(self.sites, str) else ""
        return f"{_OPTION}.sites{named}"

    def _sites(self, n: int) -> np.ndarray:
        sites = self.sites
        if isinstance(sites, str):
            sites = getattr(self.dataset, sites)
        if callable(sites):
            values = [sites(i) for i in range(n)]
        else:
            values = sites.tolist() if isinstance(sites, torch.Tensor | np.ndarray) else list(sites)
        if len(values) != n:
            raise DataError(
                f"{_OPTION}.sites gives {len(values)} site ids for a dataset of {n} samples; give one per sample"
            )
        return np.array([str(v) for v in values])

    def _targets(self, n: int) -> torch.Tensor:
        source = self.given_targets
        if source is None:
            source = getattr(self.dataset, "targets", None)
        if source is None and self.label_fn is not None:
            source = [self.label_fn(i) for i in range(n)]
        if source is None:
            warnings.warn(
                f"SiteDataset: {type(self.dataset).__name__} has no `targets` and no label_fn was given, "
                "so every sample is read once to find its target; give targets= or label_fn= to avoid it",
                stacklevel=3,
            )
            source = [self.dataset[i][1] for i in range(n)]
        y = (
            source
            if isinstance(source, torch.Tensor)
            else torch.as_tensor(np.asarray([t.tolist() if isinstance(t, torch.Tensor) else t for t in source]))
        )
        if len(y) != n:
            raise DataError(f"SiteDataset: {len(y)} targets for a dataset of {n} samples; give one per sample")
        return y
