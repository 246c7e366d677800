"""Respiratory sounds, one sample per annotated breathing cycle: ICBHI 2017 (4 classes) and SPRSound (7 classes),
FHBench's audio data sets, read lazily from the original files.

FHBench (Wang et al., "FHBench: Towards Efficient and Personalized Federated Learning for Multimodal Healthcare",
arXiv 2025) cuts every recording into its annotated cycles, turns each into an 8 s waveform at 16 kHz
(:class:`~fedlit.data.audio_clips.AudioClip`), keeps a seeded random 30% of the cycles, splits them into 20 clients
by Dirichlet(0.1) label skew, and each client 4:3:3 into train/val/test.
"""

from __future__ import annotations

import os
from abc import abstractmethod
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from typing_extensions import override

from fedlit.core.errors import ConfigError, DataError
from fedlit.data.audio_clips import AudioClip
from fedlit.data.common.datamodule import FederatedDataModule, is_int
from fedlit.data.common.partition import Dirichlet, Natural, Partitioner
from fedlit.data.common.samples import SampleList
from fedlit.data.common.splits import SPLITS, check_split_fractions, stratified_split
from fedlit.data.respiratory_annotations import (
    ICBHI_CLASSES,
    ICBHI_SPLIT_FILE,
    ICBHI_URL,
    SPRSOUND_CLASSES,
    SPRSOUND_URL,
    Cycle,
    icbhi_cycles,
    icbhi_official_test,
    in_test_folder,
    sprsound_cycles,
)

__all__ = ["ICBHI", "ICBHI_CLASSES", "SPRSOUND_CLASSES", "SPRSound"]

_OPTION = "data.init_args"


class _RespiratoryCycles(FederatedDataModule):
    """The options and the partition shared by :class:`ICBHI` and :class:`SPRSound` (see there)."""

    task = "multiclass"
    class_names: tuple[str, ...] = ()
    layout = ""
    url = ""

    def __init__(
        self,
        *,
        root: str | os.PathLike,
        split: Literal["random", "official"] = "random",
        num_clients: int = 20,
        partitioner: Partitioner | None = None,
        split_fractions: tuple[float, float, float] = (0.4, 0.3, 0.3),
        fraction: float = 1.0,
        clip_seconds: float = 8.0,
        sample_rate: int = 16000,
        pad: Literal["circular", "zero"] = "circular",
        fade_seconds: float = 0.0625,
        batch_size: int = 16,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, num_workers=num_workers, seed=seed)
        check_split_fractions(split_fractions)
        problems = []
        if not is_int(num_clients) or num_clients < 1:
            problems.append(f"{_OPTION}.num_clients must be an integer >= 1, got {num_clients!r}")
        if partitioner is not None and not isinstance(partitioner, Partitioner):
            problems.append(
                f"{_OPTION}.partitioner must be a Partitioner (IID, Dirichlet, Pathological, Shards, "
                f"Natural: one client per patient), got {partitioner!r}"
            )
        if not isinstance(fraction, int | float) or isinstance(fraction, bool) or not 0 < fraction <= 1:
            problems.append(f"{_OPTION}.fraction must be in (0, 1] (FHBench uses 0.3), got {fraction!r}")
        for option, value in (("clip_seconds", clip_seconds), ("sample_rate", sample_rate)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                problems.append(f"{_OPTION}.{option} must be > 0, got {value!r}")
        if not is_int(sample_rate):
            problems.append(f"{_OPTION}.sample_rate must be an integer (Hz), got {sample_rate!r}")
        if split not in ("random", "official"):
            problems.append(f"{_OPTION}.split must be 'random' or 'official', got {split!r}")
        if pad not in ("circular", "zero"):
            problems.append(f"{_OPTION}.pad must be 'circular' or 'zero', got {pad!r}")
        if isinstance(fade_seconds, bool) or not isinstance(fade_seconds, int | float) or fade_seconds < 0:
            problems.append(f"{_OPTION}.fade_seconds must be >= 0, got {fade_seconds!r}")
        if problems:
            raise ConfigError("; ".join(problems))
        self.root = Path(root).expanduser()
        if not self.root.is_dir() or not any(self.root.rglob("*.wav")):
            where = f"folder {self.root} holds no .wav file" if self.root.is_dir() else f"no folder {self.root}"
            raise DataError(f"{_OPTION}.root: {where}. It must hold {self.layout} (download: {self.url})")
        self.split = split
        if split == "official":
            self.check_official_split()
        self.num_clients = num_clients
        self.partitioner: Partitioner = partitioner if partitioner is not None else Dirichlet(alpha=0.1)
        self.split_fractions = tuple(float(f) for f in split_fractions)
        self.fraction = float(fraction)
        self.reader = AudioClip(
            root=str(self.root),
            sample_rate=int(sample_rate),
            clip_seconds=float(clip_seconds),
            pad=pad,
            fade_seconds=float(fade_seconds),
        )

    @abstractmethod
    def cycles(self) -> list[Cycle]:
        """Every annotated cycle of the data set, in a stable order (checked against the files' lengths)."""

    @abstractmethod
    def check_official_split(self) -> None:
        """Raise ``DataError`` when the files of the data set's official split are missing."""

    @abstractmethod
    def official_test(self, cycles: list[Cycle]) -> np.ndarray | None:
        """Which cycles the official split puts in test (``split: official``), or None (``split: random``)."""

    @override
    def build_samples(self) -> SampleList:
        cycles = self.cycles()
        if not cycles:
            raise DataError(f"{_OPTION}.root: {self.root} holds no annotated cycle; it must hold {self.layout}")
        labels = np.array([c.label for c in cycles], dtype=np.int64)
        patients = np.array([c.patient for c in cycles])
        test = self.official_test(cycles)
        subset_rng, part_rng, split_rng = np.random.default_rng(self.seed).spawn(3)
        rows = np.arange(len(cycles))
        if self.fraction < 1:
            keep = max(1, int(len(rows) * self.fraction))  # FHBench: int(len(data) * datapercent)
            rows = np.sort(subset_rng.permutation(len(rows))[:keep])
        parts = self.partitioner(labels[rows], self.num_clients, part_rng, groups=patients[rows])
        if isinstance(self.partitioner, Natural):
            client_ids = [f"patient_{p}" for p in np.unique(patients[rows])]
        else:
            client_ids = [f"client_{i}" for i in range(len(parts))]
        samples, targets, splits = {}, {}, {}
        for client_id, part in zip(client_ids, parts, strict=True):
            chosen = rows[part]
            samples[client_id] = [cycles[i].identity for i in chosen]
            targets[client_id] = torch.from_numpy(labels[chosen])
            splits[client_id] = self._split(labels[chosen], None if test is None else test[chosen], split_rng)
        return SampleList(
            name=type(self).__name__.lower(),
            task="multiclass",
            num_classes=len(self.class_names),
            samples=samples,
            targets=targets,
            splits=splits,
            read=self.reader,
            partitioner=repr(self.partitioner),
            class_names=list(self.class_names),
            details={
                "root": str(self.root),
                "cycles": len(cycles),
                "fraction": self.fraction,
                "split_fractions": list(self.split_fractions),
                "sample_rate": self.reader.sample_rate,
                "clip_seconds": self.reader.clip_seconds,
                "pad": self.reader.pad,
                "fade_seconds": self.reader.fade_seconds,
                "official_split": test is not None,
            },
        )

    def _split(self, y: np.ndarray, test: np.ndarray | None, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """One client's train/val/test positions: stratified by ``split_fractions``, or with ``test`` marking the
        official test cycles (the others split into train and val by the train:val ratio of ``split_fractions``)."""
        positions = np.arange(len(y))
        if test is None:
            if len(y) < sum(f > 0 for f in self.split_fractions):  # check_samples names the client
                return {"train": positions, "val": positions[:0], "test": positions[:0]}
            return dict(zip(SPLITS, stratified_split(positions, y, self.split_fractions, rng), strict=True))
        rest = positions[~test]
        train, val = self.split_fractions[:2]
        if val == 0 or len(rest) < 2:
            return {"train": rest, "val": rest[:0], "test": positions[test]}
        parts = stratified_split(rest, y[rest], (train / (train + val), val / (train + val), 0.0), rng)
        return {"train": parts[0], "val": parts[1], "test": positions[test]}

    @override
    def preprocessing(self, client_id: str) -> dict:
        """The default's record plus how a cycle becomes the model's input (see :class:`AudioClip`)."""
        reader = self.reader
        return {
            **super().preprocessing(client_id),
            "normalization": {
                "kind": "waveform",
                "sample_rate": reader.sample_rate,
                "clip_seconds": reader.clip_seconds,
                "pad": reader.pad,
                "fade_seconds": reader.fade_seconds,
                "channels": "averaged",
            },
        }


class ICBHI(_RespiratoryCycles):
    """The ICBHI 2017 Respiratory Sound Database, one sample per annotated respiratory cycle, 4 classes.

    Source: Rocha et al., "An open access database for the evaluation of respiratory sound classification
    algorithms", Physiological Measurement 2019 (ICBHI 2017 Challenge, https://bhichallenge.med.auth.gr/): 920
    recordings of 126 patients, 6,898 cycles. Layout: ``<root>/<patient>_<index>_<location>_<mode>_<device>.wav``,
    each with a same-name ``.txt`` whose lines are ``start end crackles wheezes`` (seconds, then 0/1 flags); the
    challenge's split ``ICBHI_challenge_train_test.txt`` (lines ``<name> train|test``) for ``split: official``.
    Classes: normal, crackle, wheeze, both (target = crackles + 2 * wheezes).

    Protocol (FHBench's by default): every cycle is a sample, read lazily as a ``clip_seconds`` waveform at
    ``sample_rate`` (:class:`~fedlit.data.audio_clips.AudioClip`: FHBench's 8 s, 16 kHz, fades and circular
    padding); ``fraction`` keeps a seeded random share of the cycles (FHBench: 0.3); ``partitioner`` splits them into
    ``num_clients`` clients (default Dirichlet(0.1) over the labels; ``Natural`` gives one client per patient,
    ``patient_<id>``, with ``num_clients`` set to their number); each client is split by ``split_fractions``,
    stratified by class. With ``split: official`` a client's cycles from the challenge's test recordings are its
    test split, and the rest is split into train and val by the train:val ratio of ``split_fractions``.

    Args:
        root: the folder of the database's .wav and .txt files.
        split: ``random`` (``split_fractions`` in every client) or ``official`` (the challenge's test recordings).
        num_clients: number of clients; ids ``client_0``, ``client_1``, ...
        partitioner: how the cycles are split into clients (default ``Dirichlet(alpha=0.1)``).
        split_fractions: (train, val, test) fractions of every client; val may be 0.
        fraction: share of the cycles kept (seeded); 1 keeps all.
        clip_seconds: length of every waveform (longer cycles are cut, shorter ones padded).
        sample_rate: rate the cycles are resampled to (16 kHz for wav2vec 2.0).
        pad: ``circular`` (repeat the cycle, FHBench) or ``zero`` (centre it between zeros).
        fade_seconds: linear fade-in and fade-out at the cycle's ends (FHBench: 1/16 s).
        batch_size: training batch size (FHBench: 16).
        eval_batch_size: val/test batch size (default ``batch_size``).
        num_workers: DataLoader worker processes reading the sound files.
        seed: seed of the subset, the partition and the splits.
    """

    class_names = ICBHI_CLASSES
    layout = (
        "the ICBHI 2017 files <patient>_<index>_<location>_<mode>_<device>.wav, each with a same-name .txt "
        "of cycles (start end crackles wheezes)"
    )
    url = ICBHI_URL

    @override
    def check_official_split(self) -> None:
        if not (self.root / ICBHI_SPLIT_FILE).is_file():
            raise DataError(
                f"{_OPTION}.split=official needs {self.root / ICBHI_SPLIT_FILE} (lines <name> "
                f"train|test, from {ICBHI_URL}); add it or use split: random"
            )

    @override
    def cycles(self) -> list[Cycle]:
        return icbhi_cycles(self.root)

    @override
    def official_test(self, cycles: list[Cycle]) -> np.ndarray | None:
        if self.split != "official":
            return None
        return icbhi_official_test(self.root, cycles)


class SPRSound(_RespiratoryCycles):
    """SPRSound (SJTU Paediatric Respiratory Sound Database), one sample per annotated event, 7 classes.

    Source: Zhang et al., "SPRSound: Open-Source SJTU Paediatric Respiratory Sound Database", IEEE Transactions on
    Biomedical Circuits and Systems 2022 (https://github.com/SJTU-YONGFU-RESEARCH-GRP/SPRSound). Layout: anywhere
    under ``root`` (e.g. its ``train2022_wav/`` and ``train2022_json/`` folders), recordings
    ``<patient>_<age>_<gender>_<location>_<number>.wav`` and same-name ``.json`` annotations ``{"record_annotation":
    ..., "event_annotation": [{"start": "<ms>", "end": "<ms>", "type": ...}, ...]}``. Classes, numbered as FHBench
    does: Normal, Fine Crackle, Wheeze, Coarse Crackle, Wheeze+Crackle (also spelled ``Wheeze & Crackle``), Rhonchi,
    Stridor. Recordings without events (poor quality) give no sample.

    Protocol and options: as :class:`ICBHI`. With ``split: official``, the events of the recordings whose JSON lies
    in a folder named ``test...`` (the releases' ``test2022_json/`` and the like) are their client's test split.
    """

    class_names = SPRSOUND_CLASSES
    layout = (
        "SPRSound's .wav recordings and their same-name .json annotations (event_annotation: start and end "
        "in ms, type), in any sub-folders"
    )
    url = SPRSOUND_URL

    @override
    def check_official_split(self) -> None:
        if not any(in_test_folder(self.root, p) for p in self.root.rglob("*.json")):
            raise DataError(
                f"{_OPTION}.split=official needs SPRSound's test annotations in a folder named test... "
                f"under {self.root} (e.g. test2022_json/, from {SPRSOUND_URL}); add them or use split: "
                "random"
            )

    @override
    def official_test(self, cycles: list[Cycle]) -> np.ndarray | None:
        return np.array([c.official == "test" for c in cycles], dtype=bool) if self.split == "official" else None

    @override
    def cycles(self) -> list[Cycle]:
        return sprsound_cycles(self.root)
