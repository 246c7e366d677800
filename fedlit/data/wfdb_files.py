"""PhysioNet WFDB records (a ``.hea`` header and its signal files), read with the ``wfdb`` package.

PTB-XL, MIT-BIH and PTB store their ECGs in this format (Goldberger et al., "PhysioBank, PhysioToolkit, and
PhysioNet", Circulation 2000). ``wfdb`` is an optional dependency (``pip install 'fedlit[signals]'``), imported
when a record is first read.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedlit.core.errors import ConfigError, DataError


def wfdb_module() -> Any:
    """The ``wfdb`` package, imported on first use.

    Raises:
        ConfigError: saying how to install it when it is missing.
    """
    try:
        import wfdb
    except ImportError:
        raise ConfigError(
            "reading WFDB records (PTB-XL, PhysioNet ECGs) needs the wfdb package: pip install 'fedlit[signals]' "
            "(or pip install wfdb)"
        ) from None
    return wfdb


def record_name(path: str | os.PathLike) -> Path:
    """The record a path names: ``records100/00000/00001_lr``, with or without its ``.hea`` or ``.dat`` suffix."""
    path = Path(path)
    return path.with_suffix("") if path.suffix in (".hea", ".dat") else path


def read_wfdb(path: str | os.PathLike, channels: Sequence[int] | None = None) -> tuple[np.ndarray, float]:
    """One WFDB record as physical values (the header's units, mV for ECGs) and its sampling frequency.

    Args:
        path: the record (its header without ``.hea``, or the header or ``.dat`` file itself).
        channels: the signal indices to read (default all, in the header's order).

    Returns:
        ``(signal, fs)``: float32 array (channels, samples), and samples per second. Samples the format marks
        as missing are NaN (``wfdb``'s physical conversion).

    Raises:
        DataError: naming the header when the record is missing or cannot be read.
        ConfigError: when the ``wfdb`` package is not installed.
    """
    wfdb = wfdb_module()
    record = record_name(path)
    header = record.with_name(record.name + ".hea")
    if not header.is_file():
        raise DataError(f"{header}: WFDB header not found; the record {record} needs its .hea and signal files")
    try:
        read = wfdb.rdrecord(str(record), channels=None if channels is None else list(channels), physical=True)
    except (OSError, ValueError, IndexError, EOFError) as err:
        raise DataError(
            f"{header}: the WFDB record cannot be read ({type(err).__name__}: {err}); download it again"
        ) from None
    signal = read.p_signal
    if signal is None:
        raise DataError(f"{header}: the WFDB record holds no signal; download it again")
    return np.ascontiguousarray(signal.T, dtype=np.float32), float(read.fs)


@dataclass(frozen=True)
class WFDBRecord:
    """Reads ``root / identity`` (a WFDB record name) as a float32 tensor (channels, samples) of physical values.

    Picklable (it runs in DataLoader workers). Checks each record's length and sampling frequency when read, so a
    record of another rate (a ``records500`` file among ``records100``) is refused naming it rather than batched
    with the others.

    Attributes:
        root: folder the identities are relative to.
        fs: the sampling frequency every record must have (None: any).
        samples: the length every record must have (None: any).
    """

    root: str
    fs: float | None = None
    samples: int | None = None

    def __call__(self, identity: str) -> torch.Tensor:
        signal, fs = read_wfdb(Path(self.root) / identity)
        path = Path(self.root) / f"{identity}.hea"
        if self.fs is not None and fs != self.fs:
            raise DataError(f"{path}: sampled at {fs:g} Hz, expected {self.fs:g} Hz like the data set's others")
        if self.samples is not None and signal.shape[1] != self.samples:
            raise DataError(f"{path}: {signal.shape[1]} samples, expected {self.samples} like the data set's others")
        return torch.from_numpy(signal)

    def missing(self, identities: Sequence[str]) -> list[str]:
        """The identities whose header (``.hea``) does not exist under ``root``."""
        return [i for i in identities if not (Path(self.root) / f"{i}.hea").is_file()]
