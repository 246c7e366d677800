"""The DataLoader of fedlit's data modules: a fedlit error raised in a worker process reaches the caller as it was
raised, not inside torch's "Caught DataError in DataLoader worker process 0. Original Traceback ..." text."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader
from typing_extensions import override

from fedlit.core.errors import FedlitError


class Loader(DataLoader):
    """A ``torch.utils.data.DataLoader`` whose batches raise a worker's :class:`~fedlit.core.errors.FedlitError`
    (a ``DataError`` naming an unreadable image) with its own message, as with ``num_workers: 0``. Other errors
    keep torch's text: their worker traceback points into user code.

    ``route``, when set, is asked first for the batches of each ``iter()`` (a persistent worker pool shared by every
    client's loaders: :mod:`fedlit.data.common.workers`); when it gives None the loader iterates on its own."""

    route: Callable[[Loader], Iterator[Any] | None] | None = None

    @override
    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # a wrapper, not torch's private iterator class
        if self.route is not None:
            batches = self.route(self)
            if batches is not None:
                return batches
        return _Batches(super().__iter__())


class _Batches:
    """Iterates a DataLoader's iterator, re-raising a worker's fedlit error with its own message."""

    def __init__(self, batches: Iterator[Any]) -> None:
        self._batches = batches

    def __iter__(self) -> _Batches:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._batches)
        except FedlitError as err:
            message = worker_message(str(err))
            if message is None:
                raise
            error = type(err)
            # torch's re-raise leaves the error in a cycle with its frames, which hold the worker processes: left
            # to the garbage collector, they may be collected in a later loader's forked worker, which then prints
            # "can only test a child process". Dropping the traceback frees them here.
            err.__traceback__ = None
        raise error(message) from None

    def __len__(self) -> int:
        return len(self._batches)  # type: ignore[arg-type]  # torch's loader iterators have a length

    def __getattr__(self, name: str) -> Any:
        return getattr(self._batches, name)


def worker_message(text: str) -> str | None:
    """The message of the exception that torch's ``ExceptionWrapper.reraise`` wrapped in ``text`` ("Caught X in
    DataLoader worker process N.", then the worker's traceback, whose last exception line is ``module.X: message``),
    or None when ``text`` is no such wrapper."""
    first, _, rest = text.partition("\n")
    if not (first.startswith("Caught ") and "DataLoader worker process" in first):
        return None
    lines = rest.rpartition("Traceback (most recent call last):\n")[2].splitlines()
    while lines and (not lines[0] or lines[0][0].isspace()):  # the frames and their source lines are indented
        lines.pop(0)
    _, colon, message = "\n".join(lines).partition(": ")
    return message.rstrip("\n") if colon else None
