"""PhysioNet/CinC Challenge 2021: 12-lead ECGs of five sources as five clients, the 26 scored diagnoses."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch
from typing_extensions import override

from fedlit.core.errors import ConfigError, DataError
from fedlit.data.cinc2021_labels import CLASS_NAMES, LEADS, URL, Header, read_header, scored_targets
from fedlit.data.common.datamodule import FederatedDataModule, is_int
from fedlit.data.common.samples import SampleList, strata
from fedlit.data.common.splits import SPLITS, check_split_fractions, stratified_split

#: Client -> the folders of the challenge's ``training/`` it holds, as PhysioNet ships them (version 1.0.3): the
#: five sources of the FedPxN paper, CPSC 2018 with its extra records as the paper's code merges them.
SOURCES: dict[str, list[str]] = {
    "chapman_shaoxing": ["chapman_shaoxing"],
    "cpsc_2018": ["cpsc_2018", "cpsc_2018_extra"],
    "georgia": ["georgia"],
    "ningbo": ["ningbo"],
    "ptb-xl": ["ptb-xl"],
}


def layout(sources: dict[str, list[str]] | None = None) -> str:
    """The folders a challenge ``training/`` folder must hold, as error messages name them."""
    folders = [folder for group in (sources or SOURCES).values() for folder in group]
    return (
        f"the PhysioNet/CinC Challenge 2021 training folders {', '.join(folders)} (each <record>.hea + <record>.mat, "
        f"in g1/, g2/... subfolders as PhysioNet ships them; download from {URL})"
    )


class CinC2021(FederatedDataModule):
    """The PhysioNet/CinC Challenge 2021's ECGs, one client per source, multilabel over its 26 scored classes.

    Source: Reyna et al., "Will Two Do? Varying Dimensions in Electrocardiography: The PhysioNet/Computing in
    Cardiology Challenge 2021", CinC 2021 (https://physionet.org/content/challenge-2021/, CC BY 4.0). The ECG
    benchmark of Yang et al., "Towards the Practical Utility of Federated Learning in the Medical Domain", CHIL 2023:
    five sources as five hospitals (Chapman-Shaoxing, CPSC 2018 with its extra records, Georgia, Ningbo, PTB-XL).

    ``root`` is the challenge's ``training`` folder (or the folder above it); ``sources`` maps each client to its
    folders under it (default :data:`SOURCES`). Every ``<record>.hea`` under a client's folders (any depth) with
    its ``<record>.mat`` is a record. Labels: the 26 classes of the challenge's weights.csv, equivalent codes
    merged (:func:`~fedlit.data.cinc2021_labels.scored_targets`); records without a scored code keep an all-zero
    target, as the paper's code keeps them. Inputs: the 12 leads in standard order (I, II, III, aVR, aVL, aVF,
    V1-V6), in mV ((digital - baseline) / gain), resampled to ``fs`` Hz (polyphase) where a record has another rate,
    cut into consecutive non-overlapping ``seconds``-long segments, the tail shorter than a segment dropped; every
    segment is a sample with its record's labels, in every split (the paper's preprocessing: fixed 5-s crops at 500
    Hz, no random crop). Records shorter than one segment are left out (counted in the manifest).

    Splits: per client, ``split_fractions`` (default 80/10/10, the paper's code's valid/test percentage of 10 %)
    of its *records*, stratified by their first scored class, so the segments of one recording never sit in two
    splits. Deviation: the paper's code shuffles segments, not records. The signals are read lazily, one
    segment per item: float32 (12, ``fs * seconds``).

    Args:
        root: the challenge's ``training`` folder, or a folder holding it.
        sources: client id -> folders under ``root`` (default: the five sources of the FedPxN paper).
        fs: sampling rate of the inputs (Hz).
        seconds: segment length (s).
        split_fractions: (train, val, test) fractions of every client's records.
        max_records_per_source: a seeded random subset of this many records per client (quick runs); None: all.
        batch_size: training batch size.
        eval_batch_size: val/test batch size (default ``batch_size``).
        num_workers: DataLoader worker processes.
        seed: seed of the subset and the splits.
    """

    def __init__(
        self,
        *,
        root: str | os.PathLike,
        sources: dict[str, list[str]] | None = None,
        fs: int = 500,
        seconds: float = 5.0,
        split_fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
        max_records_per_source: int | None = None,
        batch_size: int = 64,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, num_workers=num_workers, seed=seed)
        check_split_fractions(split_fractions)
        problems = []
        if not is_int(fs) or fs < 1:
            problems.append(f"data.init_args.fs must be an integer >= 1 (Hz), got {fs!r}")
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
            problems.append(f"data.init_args.seconds must be a number > 0, got {seconds!r}")
        if max_records_per_source is not None and (not is_int(max_records_per_source) or max_records_per_source < 1):
            problems.append(
                f"data.init_args.max_records_per_source must be null or an integer >= 1, got {max_records_per_source!r}"
            )
        sources = dict(SOURCES) if sources is None else sources
        if not isinstance(sources, dict) or not sources:
            problems.append(f"data.init_args.sources must map client ids to lists of folders, got {sources!r}")
        else:
            for client, folders in sources.items():
                if not isinstance(folders, list) or not folders or not all(isinstance(f, str) for f in folders):
                    problems.append(f"data.init_args.sources.{client} must be a non-empty list of folders")
        if problems:
            raise ConfigError("; ".join(problems))
        self.sources = {str(client): list(folders) for client, folders in sources.items()}
        given = Path(root).expanduser()
        self.root = _training_folder(given, self.sources)
        absent = [f for group in self.sources.values() for f in group if not (self.root / f).is_dir()]
        if absent:
            where = f"folder {self.root} lacks {', '.join(absent)}" if self.root.is_dir() else f"no folder {given}"
            raise DataError(f"data.init_args.root: {where}. It must hold {layout(self.sources)}")
        self.fs, self.seconds = int(fs), float(seconds)
        self.split_fractions = tuple(float(f) for f in split_fractions)
        self.max_records_per_source = max_records_per_source

    @override
    @property
    def task(self) -> str:
        """``multilabel`` (known before the data is built)."""
        return "multilabel"

    @override
    def build_samples(self) -> SampleList:
        length = segment_length(self.fs, self.seconds)
        subset_rng, split_rng = np.random.default_rng(self.seed).spawn(2)
        samples, targets, splits, records, left_out = {}, {}, {}, {}, {}
        for client, folders in self.sources.items():
            headers = _client_headers(self.root, folders)
            segments = [segment_count(h, self.fs, length) for _, h in headers]
            left_out[client] = sum(n == 0 for n in segments)
            kept = [i for i, n in enumerate(segments) if n > 0]
            if self.max_records_per_source is not None and self.max_records_per_source < len(kept):
                chosen = np.sort(subset_rng.permutation(len(kept))[: self.max_records_per_source])
                kept = [kept[i] for i in chosen]
            needed = sum(f > 0 for f in self.split_fractions)
            if len(kept) < needed:
                raise DataError(
                    f"client {client!r} ({', '.join(str(self.root / f) for f in folders)}) has {len(kept)} records "
                    f"of at least {self.seconds:g} s, fewer than the {needed} non-empty splits of "
                    f"data.init_args.split_fractions={self.split_fractions}"
                )
            y = np.stack([scored_targets(headers[i][1].dx) for i in kept])
            parts = stratified_split(
                np.arange(len(kept)), strata(torch.from_numpy(y), "multilabel"), self.split_fractions, split_rng
            )
            # every segment of a record follows it into its split
            owner = np.repeat(np.arange(len(kept)), [segments[i] for i in kept])
            samples[client] = [f"{headers[i][0]}#{k}" for i in kept for k in range(segments[i])]
            targets[client] = torch.from_numpy(y[owner])
            splits[client] = {s: np.flatnonzero(np.isin(owner, part)) for s, part in zip(SPLITS, parts, strict=True)}
            records[client] = {s: len(part) for s, part in zip(SPLITS, parts, strict=True)}
        return SampleList(
            name="cinc2021",
            task="multilabel",
            num_classes=len(CLASS_NAMES),
            samples=samples,
            targets=targets,
            splits=splits,
            read=ChallengeSegment(str(self.root), fs=self.fs, seconds=self.seconds),
            partitioner="Natural() (one client per source)",
            class_names=list(CLASS_NAMES),
            details={
                "root": str(self.root),
                "sources": self.sources,
                "fs": self.fs,
                "seconds": self.seconds,
                "split_fractions": list(self.split_fractions),
                "records_per_split": records,
                "left_out_shorter_than_a_segment": left_out,
            },
        )


def _training_folder(root: Path, sources: dict[str, list[str]]) -> Path:
    """``root``, or ``root/training`` when only that holds the source folders (the download's top folder)."""
    first = next(iter(sources.values()))[0]
    if not (root / first).is_dir() and (root / "training" / first).is_dir():
        return root / "training"
    return root


def _client_headers(root: Path, folders: list[str]) -> list[tuple[str, Header]]:
    """(record path relative to ``root`` without suffix, its header) of every record under ``folders``, sorted.

    Raises:
        DataError: naming the folder without a header, a header without its .mat, or a record lacking a lead.
    """
    found = []
    for folder in folders:
        paths = sorted((root / folder).rglob("*.hea"))
        if not paths:
            raise DataError(f"{root / folder}: no <record>.hea file; it must hold {layout()}")
        for path in paths:
            header = read_header(path)
            if not path.with_suffix(".mat").is_file():
                raise DataError(f"{path}: its signal file {path.with_suffix('.mat').name} is missing; {layout()}")
            lacking = [lead for lead in LEADS if lead not in header.leads]
            if lacking:
                raise DataError(f"{path}: no lead {lacking} (leads: {list(header.leads)}); {layout()}")
            found.append((path.relative_to(root).with_suffix("").as_posix(), header))
    return found


def segment_length(fs: int, seconds: float) -> int:
    """Samples of one segment."""
    return int(round(fs * seconds))


def resampled_length(num_samples: int, fs_from: float, fs_to: int) -> int:
    """Length of ``num_samples`` samples at ``fs_from`` Hz resampled to ``fs_to`` Hz by :func:`read_signal`."""
    ratio = Fraction(fs_to) / Fraction(fs_from).limit_denominator(1000)
    return math.ceil(num_samples * ratio.numerator / ratio.denominator)


def segment_count(header: Header, fs: int, length: int) -> int:
    """Whole segments of ``length`` samples in a record once resampled to ``fs``."""
    return resampled_length(header.num_samples, header.fs, fs) // length


def read_signal(record: Path, header: Header, fs: int) -> np.ndarray:
    """A record's 12 leads in mV, standard order, at ``fs`` Hz: float32 (12, samples).

    Raises:
        DataError: naming the .mat file when it is missing, unreadable, or does not match its header.
    """
    from scipy.io import loadmat
    from scipy.io.matlab import MatReadError

    path = record.with_name(record.name + ".mat")
    try:
        value = loadmat(str(path)).get("val")
    except FileNotFoundError:
        raise DataError(f"{path}: signal file not found; {layout()}") from None
    except (MatReadError, ValueError, OSError) as err:
        raise DataError(f"{path}: not a readable MATLAB file ({err}); download it again from {URL}") from None
    if value is None or np.ndim(value) != 2 or value.shape[0] != len(header.leads):
        shape = None if value is None else np.shape(value)
        raise DataError(
            f"{path}: expected a 'val' array of {len(header.leads)} leads x {header.num_samples} samples as its header "
            f"says, got {'no val' if shape is None else shape}; download it again from {URL}"
        )
    order = [header.leads.index(lead) for lead in LEADS]
    gains = np.asarray(header.gains, dtype=np.float64)[order, None]
    baselines = np.asarray(header.baselines, dtype=np.float64)[order, None]
    signal = (np.asarray(value, dtype=np.float64)[order] - baselines) / gains
    if header.fs != fs:
        from scipy.signal import resample_poly

        ratio = Fraction(fs) / Fraction(header.fs).limit_denominator(1000)
        signal = resample_poly(signal, ratio.numerator, ratio.denominator, axis=1)
    if not np.isfinite(signal).all():
        raise DataError(f"{path}: holds non-finite values; download it again from {URL}")
    return signal.astype(np.float32)


@dataclass(frozen=True)
class ChallengeSegment:
    """Reads ``<record>#<k>`` (a record path under ``root`` and a segment index) as float32 (12, fs * seconds).

    Picklable (it runs in DataLoader workers).

    Attributes:
        root: the challenge's ``training`` folder the records are relative to.
        fs: sampling rate of the segments (Hz).
        seconds: segment length (s).
    """

    root: str
    fs: int = 500
    seconds: float = 5.0

    def __call__(self, identity: str) -> torch.Tensor:
        name, _, index = identity.rpartition("#")
        record = Path(self.root) / name
        header = read_header(record.with_name(record.name + ".hea"))
        length = segment_length(self.fs, self.seconds)
        start = int(index) * length
        segment = read_signal(record, header, self.fs)[:, start : start + length]
        if segment.shape[1] != length:
            raise DataError(
                f"{record}.mat: segment {index} ends past its {header.num_samples} samples; the record changed "
                "since the data set was built: rebuild it"
            )
        return torch.from_numpy(np.ascontiguousarray(segment))
