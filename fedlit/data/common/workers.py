"""DataLoader worker processes started once per run, not once per client.

A ``DataLoader`` with ``num_workers > 0`` forks its workers at every ``iter()``: once per client, split and round,
which for a federation of small sites costs more than the arithmetic (a SAM ViT-B recipe with ``num_workers: 4`` and
1-2 images per site forked 132 processes in 3 rounds). A :class:`WorkerPool` keeps one ``persistent_workers``
loader per data module and kind of split (train, evaluation): its workers hold the whole built data (forked once)
and read any client's samples. Each client's :class:`~fedlit.data.common.loader.Loader` is still built as before
(its sampler, batch size, generator and data set are the client's) and, when iterated, sends its own batches of
positions to the pool.

Batches are the same as those of a loader of its own, bit for bit: the client's batch sampler is iterated lazily by
the same prefetching iterator (so its shuffle draws from the client's generator at the same moments), the base seed
is drawn from that generator as torch draws it, batches go to workers round robin from worker 0, and each worker
re-seeds ``random``, ``torch`` and ``numpy`` as torch seeds a new worker before the first batch of each iteration
(random train augmentations repeat). While one client's iteration is still alive (two loaders of the same kind
iterated together), another gets a loader of its own, as before. ``FEDLIT_WORKER_POOLS=0`` in the environment turns
pools off (every iteration forks its workers: the behaviour to compare with). Batches are pinned on CUDA machines.
"""

from __future__ import annotations

import os
import random
import weakref
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple, cast

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, get_worker_info
from torch.utils.data._utils import worker as torch_worker
from typing_extensions import override

from fedlit.data.common.loader import _Batches
from fedlit.data.common.pool import PartitionedData, PoolSubset
from fedlit.data.common.samples import SampleList, SampleSubset

__all__ = ["WorkerPool", "WorkerPools", "close_workers", "pools_enabled", "split_dataset"]


def pools_enabled() -> bool:
    """Whether loaders share persistent workers (``FEDLIT_WORKER_POOLS`` unset or not ``0``)."""
    return os.environ.get("FEDLIT_WORKER_POOLS", "1") != "0"


def split_dataset(data: PartitionedData | SampleList, client_id: str, split: str) -> Dataset[Any]:
    """The data set of ``client_id``'s ``split``: its samples with the split's transform (train or evaluation)."""
    positions = data.splits[client_id][split]
    if isinstance(data, SampleList):
        transform = data.train_transform if split == "train" else data.eval_transform
        return SampleSubset(data.samples[client_id], data.targets[client_id], positions, data.read, transform)
    return PoolSubset(data.inputs, data.targets, positions, data.transform)


class _Token(NamedTuple):
    """One client iteration: a new value re-seeds the workers (``base_seed`` as torch's) and names the split."""

    iteration: int
    base_seed: int
    client_id: str
    split: str


class _Request(NamedTuple):
    """What a worker receives for one batch: the iteration and the positions in the client's split."""

    token: _Token
    positions: list[int]


class _Routed(Dataset[Any]):
    """Every client's splits, built in the worker on first use, each read as its own loader would read it."""

    def __init__(self, data: PartitionedData | SampleList) -> None:
        self.data = data
        self.subsets: dict[tuple[str, str], Dataset[Any]] = {}
        self.token: _Token | None = None

    def __getitems__(self, request: _Request) -> list[Any]:
        token = request.token
        key = (token.client_id, token.split)
        if key not in self.subsets:
            self.subsets[key] = split_dataset(self.data, *key)
        subset = self.subsets[key]
        if token != self.token:  # the first batch of an iteration in this worker: seeded as a new worker
            self.token = token
            _seed_worker(token.base_seed, subset)
        getitems = getattr(subset, "__getitems__", None)
        if getitems is not None:
            return list(getitems(request.positions))
        return [subset[i] for i in request.positions]

    @override
    def __getitem__(self, index: Any) -> Any:
        raise TypeError("a worker pool reads whole batches (__getitems__)")


def _seed_worker(base_seed: int, dataset: Dataset[Any]) -> None:
    """Seed this worker as torch's ``_worker_loop`` seeds a new worker from ``base_seed``."""
    info = get_worker_info()
    if info is None:
        raise RuntimeError("a worker pool's data set is read in its worker processes only")
    seed = base_seed + info.id
    random.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(torch_worker._generate_state(base_seed, info.id))
    torch_worker._worker_info = torch_worker.WorkerInfo(
        id=info.id, num_workers=info.num_workers, seed=seed, dataset=dataset
    )


class _Plan(Sampler[_Request]):
    """The pool's batch sampler: the batches of the client loader now iterated, as requests."""

    def __init__(self) -> None:
        self.token: _Token | None = None
        self.batches: Iterable[list[int]] = ()

    @override
    def __iter__(self) -> Iterator[_Request]:
        if self.token is None:
            raise RuntimeError("a worker pool is iterated through a client's loader")
        return _requests(self.token, self.batches)

    def __len__(self) -> int:
        return len(self.batches)  # type: ignore[arg-type]  # a client's batch sampler has a length


def _requests(token: _Token, batches: Iterable[list[int]]) -> Iterator[_Request]:
    for positions in batches:  # lazily: the client's shuffle draws when torch's prefetch asks, as it would
        yield _Request(token, list(positions))


class _Iteration:
    """One client's batches from the pool; marks the pool free when done (or when dropped: a weak reference)."""

    def __init__(self, batches: Iterator[Any]) -> None:
        self.batches = batches
        self.done = False

    def __iter__(self) -> _Iteration:
        return self

    def __next__(self) -> Any:
        try:
            return next(self.batches)
        except BaseException:
            self.done = True
            raise

    def __len__(self) -> int:
        return len(self.batches)  # type: ignore[arg-type]  # torch's loader iterators have a length


class WorkerPool:
    """Persistent workers holding ``data``, serving one client loader's iteration at a time.

    Attributes:
        starts: how many times workers were started (each start forks ``num_workers`` processes).
    """

    def __init__(self, data: PartitionedData | SampleList, num_workers: int) -> None:
        self._plan = _Plan()
        self._loader = DataLoader(
            _Routed(data),
            batch_sampler=cast(Any, self._plan),  # it yields requests, not lists: _Routed reads them
            num_workers=num_workers,
            persistent_workers=True,
            pin_memory=torch.cuda.is_available(),
            generator=torch.Generator(),  # its own: starting the workers draws nothing from the run's streams
        )
        self._live: weakref.ref[_Iteration] | None = None
        self._iterations = 0
        self.starts = 0

    def batches(self, loader: DataLoader, client_id: str, split: str) -> Iterator[Any] | None:
        """``loader``'s batches read by the pool's workers, or None while another iteration is alive."""
        live = self._live() if self._live is not None else None
        if live is not None and not live.done:
            return None
        # drawn as torch's loader iterator draws it (from the global generator when the loader has none)
        base_seed = int(torch.empty((), dtype=torch.int64).random_(generator=loader.generator).item())
        self._iterations += 1
        self._plan.token = _Token(self._iterations, base_seed, client_id, split)
        self._plan.batches = loader.batch_sampler  # type: ignore[assignment]  # set: batch_size is never None here
        if self._loader._iterator is None:
            self.starts += 1
        iteration = _Iteration(_Batches(iter(self._loader)))
        self._live = weakref.ref(iteration)
        return iteration

    def close(self) -> None:
        """Stop the workers (a later iteration starts them again)."""
        iterator = self._loader._iterator
        self._loader._iterator = None
        if iterator is not None:
            iterator._shutdown_workers()  # type: ignore[attr-defined]  # the multiprocessing iterator's


class WorkerPools:
    """A data module's pools, one per kind of split (train; val and test), started on first use."""

    def __init__(self) -> None:
        self._pools: dict[str, WorkerPool] = {}

    def batches(
        self, data: PartitionedData | SampleList, loader: DataLoader, client_id: str, split: str
    ) -> Iterator[Any] | None:
        """``loader``'s batches through the pool of ``split``'s kind; None: iterate it on its own."""
        kind = "train" if split == "train" else "eval"
        if kind not in self._pools:
            self._pools[kind] = WorkerPool(data, loader.num_workers)
        return self._pools[kind].batches(loader, client_id, split)

    @property
    def starts(self) -> int:
        """Worker starts over every pool."""
        return sum(pool.starts for pool in self._pools.values())

    def close(self) -> None:
        """Stop every pool's workers (a later iteration starts them again, counted in :attr:`starts`)."""
        for pool in self._pools.values():
            pool.close()


def close_workers(data: object) -> None:
    """Stop the pooled workers of ``data``'s loaders: a data module, or a wrapper of one (cached features, a node's
    one site) holding it as ``data`` or ``inner``. A run calls it when it ends."""
    for holder in (data, getattr(data, "data", None), getattr(data, "inner", None)):
        close = getattr(holder, "close_workers", None)
        if callable(close):
            close()
