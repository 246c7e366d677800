"""``FederatedDataModule``: per-client train/val/test data for the federated loop.

Two ways to give the data, behind one interface (loaders, sizes, class counts, manifest):

- the *tensor pool*: ``build()`` returns a :class:`~fedlit.data.common.pool.PartitionedData`, one pool of samples
  (inputs and targets tensors) plus, per client and split, the indices of its samples in the pool (tabular data,
  MedMNIST), defined with its reader and checks in :mod:`fedlit.data.common.pool`;
- *file-backed samples*: ``build_samples()`` returns a :class:`~fedlit.data.common.samples.SampleList`, per client the
  identities (file paths) and targets of its samples, read lazily one by one in the DataLoader workers, with
  separate train and evaluation transforms (image folders, anything larger than memory).

A subclass implements exactly one of the two hooks.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeGuard

import numpy as np
import torch
from torch.utils.data import DataLoader

from fedlit.core.errors import ConfigError, DataError
from fedlit.core.names import check_client_ids
from fedlit.data.common.loader import Loader
from fedlit.data.common.pool import CLASSIFICATION_TASKS, PartitionedData, PoolSubset, TaskType, check_pool
from fedlit.data.common.samples import CLASSIFICATION, SampleList, check_samples
from fedlit.data.common.splits import SPLITS
from fedlit.data.common.workers import WorkerPools, pools_enabled, split_dataset

__all__ = [
    "CLASSIFICATION_TASKS",
    "FederatedDataModule",
    "PartitionedData",
    "PoolSubset",
    "SplitName",
    "TaskType",
    "is_int",
]

SplitName = Literal["train", "val", "test"]


class FederatedDataModule:
    """Per-client data: loaders, sizes, class counts and a manifest of who holds which sample.

    Everything is built once, lazily, by ``setup()`` (called for you by every accessor), from ``seed`` alone:
    the same seed gives the same clients and splits. Client ids are strings in a stable order.

    ``setup()`` refuses client ids that are not safe as file names (:mod:`fedlit.core.names`: empty, ``.``, ``..``,
    a path separator, a control character, a leading ``-``, over 128 characters), naming them and where they came
    from (:meth:`client_id_source`). It refuses a pool it cannot train on, naming the data set class, the sample
    index and the value: non-finite inputs (floating pools; compact pools such as uint8 images are checked by their
    data set when read) or targets (unless the data set declares ``finite_targets=False`` for a task without
    classes), multiclass targets outside ``[0, num_classes)``, binary or multilabel targets other than 0/1, survival
    targets other than (time >= 0, event 0/1) rows, split indices outside the pool, and a client with an empty train
    or test split (an empty val split is allowed: the data set then has no validation split). Targets of other tasks
    (regression...) may have any dtype and shape.
    File-backed data gets the same checks of its targets and splits, plus the existence of the files it lists
    (:func:`~fedlit.data.common.samples.check_samples`).

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
            problems.append(f"data.init_args.eval_batch_size must be null or an integer >= 1, got {eval_batch_size!r}")
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
        #: The one client to build (:meth:`only_site`), or None: every client.
        self.only_client: str | None = None
        self._workers = WorkerPools()
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
            DataError: if a client id is not a safe file name, or the pool holds a non-finite value or an
                out-of-range target, or a client has an empty train or test split (every problem found is listed).
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
                check_client_ids(samples.splits, self.client_id_source())
                check_samples(samples, type(self).__name__)
                self._data = samples
            else:
                data = self.build()
                check_client_ids(data.splits, self.client_id_source())
                check_pool(data, type(self).__name__)
                self._data = data
        return self._data

    def client_id_source(self) -> str:
        """Where the client ids come from, as an error message names it (a data set whose ids come from a file
        or an option overrides it: ``column 'site' of /data/t.csv (data.init_args.site_column)``)."""
        hook = "build_samples" if _overrides(type(self), "build_samples") else "build"
        return f"{type(self).__name__}.{hook}() (the data module's clients)"

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
        evaluation_only = self.evaluation_only  # once: a property, read per client it made this O(N^2)
        return [c for c in self.client_ids if c not in evaluation_only]

    def expected_num_clients(self) -> int | None:
        """The number of clients, known from the constructor's arguments without building the data (for cost
        estimates before a run: ``fedlit cost``); None when only ``setup()`` can tell. Default: the clients of the
        built data if ``setup()`` has run, else an integer attribute ``num_clients``, else None. A data set whose
        clients are listed by its arguments (sites) overrides it."""
        if self._data is not None:
            return len(self._data.splits)
        count = getattr(self, "num_clients", None)
        return int(count) if is_int(count) else None

    @classmethod
    def clients_in_options(cls, options: Mapping[str, Any]) -> int | None:
        """The number of clients the constructor's options give, without constructing the data module (a Flower
        server, which holds no data, waits for that many nodes): the length of a ``sites`` list, else an integer
        ``num_clients``, else None (the run config must then name the clients)."""
        sites, count = options.get("sites"), options.get("num_clients")
        if isinstance(sites, list | tuple):
            return len(sites)
        return int(count) if is_int(count) else None

    def only_site(self, client_id: str) -> None:
        """Build only ``client_id``'s data: what a Flower node holding one site calls before :meth:`setup`.

        A site data set (one client per file, folder or site value: ``FedHeartDisease``, ``SiteTable``,
        ``SiteFolders``, the segmentation sites) then reads that site's files alone, and builds it exactly as it
        would among all the sites (its split, encoding and standardization depend on that site's rows only). A data
        set that generates or partitions every client from one seed (``SyntheticImages``, MedMNIST partitions)
        still builds them all: the node uses its own client only.
        """
        if self._data is not None:
            raise ConfigError(f"{type(self).__name__}.only_site({client_id!r}) after setup(): call it before")
        self.only_client = client_id

    def sites_to_build(self, sites: Sequence[str], option: str = "data.init_args.sites") -> list[str]:
        """``sites``, or the one of :meth:`only_site` (for a site data set's ``build``).

        Raises:
            DataError: when the site of :meth:`only_site` is not one of ``sites``.
        """
        if self.only_client is None:
            return list(sites)
        if self.only_client not in sites:
            raise DataError(
                f"node config client-id={self.only_client!r} is not a site of {type(self).__name__} "
                f"({option}: {list(sites)}); give the node the id of its site"
            )
        return [self.only_client]

    def client_position(self, client_id: str) -> int:
        """The client's place in the data set's client order, known on a node that built only that client: its
        place in a ``sites`` list when the data set has one, else in :attr:`client_ids`."""
        sites = getattr(self, "sites", None)
        if isinstance(sites, list | tuple) and client_id in sites:
            return list(sites).index(client_id)
        return self.client_ids.index(client_id)

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

    def preprocessing(self, client_id: str) -> dict[str, Any]:
        """What a model trained on this data expects of one input and what its outputs mean, for inference
        outside fedlit (``fedlit export`` writes it as each client's ``preprocessing.json``).

        Default: the task, the number of classes and their names, and the input as the model receives it (after
        the data set's evaluation transform), read from the client's first test sample: ``kind`` (``image``
        for a (C, H, W) tensor, ``volume`` for (C, D, H, W), ``features`` for a vector, ``tokens`` for a mapping
        of tensors), ``shape``, ``channels`` and ``size`` for images and volumes, ``dtype``. ``normalization`` is
        None here: a data set whose loader turns raw data (files, table rows) into those inputs overrides this
        method and adds what it does (per-channel ``mean``/``std``, per-site standardization...).
        """
        data = self.data
        task = data.task
        names = data.class_names if isinstance(data, SampleList) else (data.details or {}).get("class_names")
        if task == "binary" and not names:
            names = ["negative", "positive"]
        elif task == "multiclass" and not names:
            names = [str(i) for i in range(data.num_classes)]
        dataset = self._loader(client_id, "test", 1, shuffle=False).dataset
        getitems = getattr(dataset, "__getitems__", None)
        first = getitems([0])[0] if getitems is not None else dataset[0]
        return {
            "task": task,
            "num_classes": data.num_classes,
            "class_names": None if names is None else [str(n) for n in names],
            "input": _describe(first[0]),
            "normalization": None,
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
        self, client_id: str, split: str, batch_size: int, *, shuffle: bool, generator: torch.Generator | None = None
    ) -> DataLoader:
        self._indices(client_id, split)  # an unknown client or split is named
        data = self.data
        loader = Loader(  # a DataError raised in a worker keeps its own message
            split_dataset(data, client_id, split),
            batch_size=batch_size,
            shuffle=shuffle,
            generator=generator,
            drop_last=False,
            num_workers=self.num_workers,
        )
        if self.num_workers > 0 and pools_enabled():  # workers forked once per run, not per client
            loader.route = lambda own: self._workers.batches(data, own, client_id, split)
        return loader

    def close_workers(self) -> None:
        """Stop the DataLoader worker processes its loaders share (:mod:`fedlit.data.common.workers`); a run calls
        it when it ends. A later loader starts them again."""
        self._workers.close()


def is_int(value: object) -> TypeGuard[int | np.integer[Any]]:
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


def _describe(inputs: Any) -> dict[str, Any]:
    """One input as the model receives it: kind, shape and dtype (see ``FederatedDataModule.preprocessing``)."""
    if isinstance(inputs, dict):
        return {
            "kind": "tokens",
            "keys": sorted(inputs),
            "shape": {k: list(v.shape) for k, v in inputs.items() if isinstance(v, torch.Tensor)},
        }
    if not isinstance(inputs, torch.Tensor):
        return {"kind": type(inputs).__name__}
    shape = list(inputs.shape)
    kind = {1: "features", 3: "image", 4: "volume"}.get(inputs.dim(), "tensor")
    described: dict[str, Any] = {"kind": kind, "shape": shape, "dtype": str(inputs.dtype).removeprefix("torch.")}
    if kind in ("image", "volume"):
        described.update(channels=shape[0], size=shape[1:])
    return described
