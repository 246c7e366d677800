"""ADFTD: resting-state EEG of Alzheimer's disease, frontotemporal dementia and control subjects, in windows."""

from __future__ import annotations

import csv
import os
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from typing_extensions import override

from fedlit.core.errors import ConfigError, DataError, broken
from fedlit.data.common.datamodule import FederatedDataModule, is_int
from fedlit.data.common.partition import Dirichlet, Natural, Partitioner
from fedlit.data.common.samples import SampleList
from fedlit.data.common.splits import SPLITS, check_split_fractions, stratified_split
from fedlit.data.common.text import not_utf8

URL = "https://openneuro.org/datasets/ds004504"
PARTICIPANTS = "participants.tsv"
#: participants.tsv's Group codes in target order: A (Alzheimer's disease), F (frontotemporal dementia), C (control).
GROUPS = ("A", "F", "C")
CLASS_NAMES = ("AD", "FTD", "CN")


def recording(subject: str, derivatives: bool) -> str:
    """A subject's EEGLAB file, relative to the data set's root."""
    folder = f"derivatives/{subject}" if derivatives else subject
    return f"{folder}/eeg/{subject}_task-eyesclosed_eeg.set"


def layout(derivatives: bool = True) -> str:
    """The files an ADFTD folder must hold, as error messages name them."""
    return (
        f"{PARTICIPANTS} (participant_id, Group A/F/C) and {recording('sub-XXX', derivatives)} per subject, "
        f"as OpenNeuro ships ds004504 ({URL})"
    )


def mne_module() -> Any:
    """The ``mne`` package, imported on first use.

    Raises:
        ConfigError: saying how to install it when it is missing.
    """
    try:
        import mne
    except ImportError:
        raise ConfigError(
            "reading EEGLAB .set files (ADFTD) needs the mne package: pip install 'fedlit[signals]' "
            "(or pip install mne)"
        ) from None
    return mne


class ADFTD(FederatedDataModule):
    """OpenNeuro ds004504's eyes-closed EEGs, cut into fixed-length windows labelled with the subject's diagnosis.

    Source: Miltiadou et al., "A Dataset of EEG Recordings from: Alzheimer's Disease, Frontotemporal Dementia and
    Healthy Subjects", Data 2023 (https://openneuro.org/datasets/ds004504, CC0): 88 subjects (36 AD, 23 FTD,
    29 CN), 19 scalp channels at 500 Hz, about 13 minutes each; the EEG set of FHBench (Wang et al., arXiv 2025).
    ``derivatives: true`` (default, as FHBench) reads the authors' preprocessed recordings under ``derivatives/``
    (band-pass 0.5-45 Hz, re-referenced, artefacts removed); false reads the raw ones.

    Samples: every recording is cut into windows of ``window_seconds`` taken every ``stride_seconds`` (a trailing
    part shorter than a window is dropped); each window is a float32 (channels, window samples) tensor in
    microvolts, read lazily (an opened recording is kept per worker, up to ``open_files`` of them, so a window costs
    a slice, not a file open). Targets: 0 AD, 1 FTD, 2 CN (``participants.tsv``'s Group A, F, C). FHBench's
    window length is not stated in its paper as far as we could check: 4 s without overlap is fedlit's default.

    Clients: ``unit: subject`` (default) deals subjects to clients (every window of a subject stays with it, as a
    hospital holds its patients' whole recordings): ``partitioner`` sees one label per subject, and ``Natural()``
    makes one client per subject (``num_clients`` = the number of subjects), named after it. ``unit: window``
    deals windows (a subject's windows may spread across clients). Splits: every client's windows by
    ``split_fractions`` (FHBench: 4:3:3), stratified by label; a subject's windows may so fall in train and test.
    The manifest lists every client's windows (file and first sample) and subjects.

    Args:
        root: the ds004504 folder (``participants.tsv``, ``sub-XXX/``, ``derivatives/``).
        derivatives: read ``derivatives/sub-XXX/eeg/`` (preprocessed) rather than ``sub-XXX/eeg/`` (raw).
        window_seconds: window length in seconds.
        stride_seconds: seconds between window starts (default ``window_seconds``: no overlap).
        num_clients: number of clients (with ``Natural()`` and ``unit: subject``: the number of subjects).
        partitioner: how subjects (or windows) are dealt to clients (default ``Dirichlet(alpha=0.1)``).
        unit: ``subject`` or ``window``: what the partitioner deals.
        split_fractions: (train, val, test) fractions of every client's windows.
        open_files: recordings kept open per worker.
        batch_size: training batch size.
        eval_batch_size: val/test batch size (default ``batch_size``).
        num_workers: DataLoader worker processes.
        seed: seed of the partition and the splits.
    """

    def __init__(
        self,
        *,
        root: str | os.PathLike,
        derivatives: bool = True,
        window_seconds: float = 4.0,
        stride_seconds: float | None = None,
        num_clients: int = 20,
        partitioner: Partitioner | None = None,
        unit: Literal["subject", "window"] = "subject",
        split_fractions: tuple[float, float, float] = (0.4, 0.3, 0.3),
        open_files: int = 8,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, num_workers=num_workers, seed=seed)
        check_split_fractions(split_fractions)
        problems = []
        for option, value in (("window_seconds", window_seconds), ("stride_seconds", stride_seconds)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value <= 0):
                problems.append(f"data.init_args.{option} must be a number of seconds > 0, got {value!r}")
        if unit not in ("subject", "window"):
            problems.append(f"data.init_args.unit must be one of ['subject', 'window'], got {unit!r}")
        for option, value in (("num_clients", num_clients), ("open_files", open_files)):
            if not is_int(value) or value < 1:
                problems.append(f"data.init_args.{option} must be an integer >= 1, got {value!r}")
        if partitioner is not None and not isinstance(partitioner, Partitioner):
            problems.append(
                f"data.init_args.partitioner must be a Partitioner (IID, Dirichlet, Pathological, "
                f"Shards, Natural), got {partitioner!r}"
            )
        if problems:
            raise ConfigError("; ".join(problems))
        self.root = Path(root).expanduser()
        if not (self.root / PARTICIPANTS).is_file():
            where = f"folder {self.root} lacks {PARTICIPANTS}" if self.root.is_dir() else f"no folder {self.root}"
            raise DataError(f"data.init_args.root: {where}. It must hold {layout(derivatives)}")
        self.derivatives = bool(derivatives)
        self.window_seconds = float(window_seconds)
        self.stride_seconds = float(stride_seconds if stride_seconds is not None else window_seconds)
        self.num_clients = num_clients
        self.partitioner: Partitioner = partitioner if partitioner is not None else Dirichlet(alpha=0.1)
        self.unit = unit
        self.split_fractions = tuple(float(f) for f in split_fractions)
        self.open_files = open_files

    @override
    @property
    def task(self) -> str:
        """Always ``multiclass``."""
        return "multiclass"

    @override
    def build_samples(self) -> SampleList:
        subjects = read_participants(self.root / PARTICIPANTS)
        files = {s: recording(s, self.derivatives) for s in subjects}
        absent = [f for f in files.values() if not (self.root / f).is_file()]
        if absent:
            raise DataError(
                f"{self.root}: {len(absent)} of the {len(files)} recordings listed in {PARTICIPANTS} are "
                f"missing ({', '.join(absent[:3])}{', ...' if len(absent) > 3 else ''}); the folder must "
                f"hold {layout(self.derivatives)}"
            )
        read = EEGWindows(str(self.root), open_files=self.open_files)
        rate, channels, lengths = None, None, {}
        for subject, file in files.items():
            header = read.header(file)
            if rate is None:
                rate, channels = header
            elif header != (rate, channels):
                raise DataError(
                    f"{self.root / file}: {header[1]} channels at {header[0]:g} Hz, but "
                    f"{self.root / files[next(iter(files))]} has {channels} at {rate:g} Hz"
                )
            lengths[subject] = read.length(file)
        if not (rate is not None):  # read_participants refuses a file that lists no participant
            raise broken("read_participants refuses a file that lists no participant")
        window, stride = round(self.window_seconds * rate), round(self.stride_seconds * rate)
        read = EEGWindows(str(self.root), window=window, open_files=self.open_files)
        windows = [(s, [files[s], start]) for s in subjects for start in range(0, lengths[s] - window + 1, stride)]
        short = [s for s in subjects if lengths[s] < window]
        if short:
            warnings.warn(
                f"ADFTD: {len(short)} recordings are shorter than window_seconds={self.window_seconds:g} "
                f"and give no window: {short[:5]}",
                stacklevel=2,
            )
        labels = np.asarray([GROUPS.index(subjects[s]) for s, _ in windows], dtype=np.int64)
        owner = np.asarray([s for s, _ in windows])
        part_rng, split_rng = np.random.default_rng(self.seed).spawn(2)
        if self.unit == "subject":
            names = np.asarray([s for s in subjects if lengths[s] >= window])
            subject_labels = np.asarray([GROUPS.index(subjects[s]) for s in names], dtype=np.int64)
            groups = names if isinstance(self.partitioner, Natural) else None
            subject_parts = self.partitioner(subject_labels, self.num_clients, part_rng, groups=groups)
            parts = [np.flatnonzero(np.isin(owner, names[p])) for p in subject_parts]
        else:
            groups = owner if isinstance(self.partitioner, Natural) else None
            parts = self.partitioner(labels, self.num_clients, part_rng, groups=groups)
        natural = isinstance(self.partitioner, Natural)
        client_ids = [str(owner[p[0]]) if natural else f"client_{i}" for i, p in enumerate(parts)]
        splits = {}
        for client_id, part in zip(client_ids, parts, strict=True):
            needed = sum(f > 0 for f in self.split_fractions)
            if len(part) < needed:
                raise DataError(
                    f"client {client_id!r} has {len(part)} windows, fewer than the {needed} non-empty "
                    f"splits of data.init_args.split_fractions={self.split_fractions}: lower num_clients "
                    "or window_seconds"
                )
            positions = stratified_split(np.arange(len(part)), labels[part], self.split_fractions, split_rng)
            splits[client_id] = dict(zip(SPLITS, positions, strict=True))
        y = torch.from_numpy(labels)
        return SampleList(
            name="adftd",
            task="multiclass",
            num_classes=len(CLASS_NAMES),
            samples={c: [windows[i][1] for i in part] for c, part in zip(client_ids, parts, strict=True)},
            targets={c: y[torch.from_numpy(part)] for c, part in zip(client_ids, parts, strict=True)},
            splits=splits,
            read=read,
            partitioner=repr(self.partitioner),
            class_names=list(CLASS_NAMES),
            details={
                "root": str(self.root),
                "derivatives": self.derivatives,
                "sampling_rate": rate,
                "channels": channels,
                "window_samples": window,
                "stride_samples": stride,
                "unit": self.unit,
                "split_fractions": list(self.split_fractions),
                "subjects": {c: sorted(set(owner[part].tolist())) for c, part in zip(client_ids, parts, strict=True)},
            },
        )


def read_participants(path: Path) -> dict[str, str]:
    """participant_id -> Group (A, F or C) from ``participants.tsv``, in the file's order.

    Raises:
        DataError: naming the file, and the line of an unknown group.
    """
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle, delimiter="\t")
            columns = reader.fieldnames or []
            if "participant_id" not in columns or "Group" not in columns:
                raise DataError(
                    f"{path}: no participant_id and Group columns (columns: {columns}); this is not "
                    f"ds004504's {PARTICIPANTS} ({URL})"
                )
            subjects = {}
            for row in reader:
                group = (row["Group"] or "").strip()
                if group not in GROUPS:
                    raise DataError(
                        f"{path}, line {reader.line_num}: Group {group!r} is not one of {list(GROUPS)} "
                        f"(A Alzheimer's, F frontotemporal dementia, C control); download it from {URL}"
                    )
                subjects[row["participant_id"].strip()] = group
    except UnicodeDecodeError:
        raise not_utf8(path) from None
    if not subjects:
        raise DataError(f"{path} lists no participant; download ds004504 again from {URL}")
    return subjects


class EEGWindows:
    """Reads a window ``[file, start]`` (relative to ``root``) of an EEGLAB recording as float32 (channels,
    ``window``) microvolts, keeping up to ``open_files`` recordings open (not loaded) per process.

    Picklable: the open recordings are not pickled, each DataLoader worker opens its own.
    """

    def __init__(self, root: str, *, window: int | None = None, open_files: int = 8) -> None:
        self.root, self.window, self.open_files = root, window, open_files
        self._open: OrderedDict[str, Any] = OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_open": OrderedDict()}

    def raw(self, file: str) -> Any:
        """The recording, opened without loading its samples (cached, least recently used closed first)."""
        if file in self._open:
            self._open.move_to_end(file)
            return self._open[file]
        path = Path(self.root) / file
        mne = mne_module()
        try:
            raw = mne.io.read_raw_eeglab(path, preload=False, verbose="error")
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise DataError(
                f"{path}: not a readable EEGLAB file ({type(err).__name__}: {err}); download it again from {URL}"
            ) from None
        self._open[file] = raw
        while len(self._open) > self.open_files:
            self._open.popitem(last=False)
        return raw

    def header(self, file: str) -> tuple[float, int]:
        """(sampling rate in Hz, channel count) of a recording."""
        raw = self.raw(file)
        return float(raw.info["sfreq"]), len(raw.ch_names)

    def length(self, file: str) -> int:
        """Samples per channel of a recording."""
        return int(self.raw(file).n_times)

    def __call__(self, identity: list[Any]) -> torch.Tensor:
        file, start = identity
        if self.window is None:
            raise ConfigError("EEGWindows: window is not set; it reads windows only once their length is known")
        data = self.raw(file).get_data(start=int(start), stop=int(start) + self.window)
        return torch.from_numpy(np.ascontiguousarray(data * 1e6, dtype=np.float32))
