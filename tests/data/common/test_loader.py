"""``Loader``: a fedlit error raised in a DataLoader worker process reaches the caller with its own message."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset

from fedlit.core.errors import DataError
from fedlit.data.common.loader import Loader, worker_message


class _Broken(Dataset):
    """Sample 3 cannot be read; the others are their index."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == 3:
            raise DataError("img/3.png: cannot be read as an image; replace the file")
        return torch.tensor(float(i))


class _Buggy(_Broken):
    def __getitem__(self, i: int) -> torch.Tensor:
        raise ZeroDivisionError("a bug in user code")


def test_a_worker_data_error_keeps_only_its_own_message() -> None:
    loader = Loader(_Broken(), batch_size=2, num_workers=2)
    with pytest.raises(DataError) as info:
        list(loader)
    assert str(info.value) == "img/3.png: cannot be read as an image; replace the file"
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_without_workers_and_for_other_errors_nothing_changes() -> None:
    assert next(iter(Loader(_Broken(), batch_size=2))).tolist() == [0.0, 1.0]
    with pytest.raises(DataError, match=r"^img/3\.png: cannot be read"):
        list(Loader(_Broken(), batch_size=2))
    with pytest.raises(ZeroDivisionError, match="Caught ZeroDivisionError in DataLoader worker process"):
        list(Loader(_Buggy(), batch_size=2, num_workers=1))  # user code keeps torch's worker traceback
    assert len(iter(Loader(_Broken(), batch_size=4))) == 2


def test_worker_message_reads_the_last_exception_of_torch_text() -> None:
    text = (
        "Caught DataError in DataLoader worker process 1.\nOriginal Traceback (most recent call last):\n"
        '  File "a.py", line 3, in f\n    raise KeyError(1)\nKeyError: 1\n\nDuring handling of the above exception, '
        'another exception occurred:\n\nTraceback (most recent call last):\n  File "b.py", line 9, in g\n'
        "    raise DataError(msg) from err\n    ^^^^^^^^^^^^^\nfedlit.core.errors.DataError: x.png: bad: see a: b\n"
    )
    assert worker_message(text) == "x.png: bad: see a: b"
    assert worker_message("x.png: cannot be read as an image") is None
