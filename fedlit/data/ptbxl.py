"""PTB-XL: 12-lead ECGs labelled with the five diagnostic superclasses, split into federated clients."""

from __future__ import annotations

import ast
import csv
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import numpy as np
import torch
from typing_extensions import override

from fedlit.core.errors import ConfigError, DataError
from fedlit.data.common.datamodule import FederatedDataModule, is_int
from fedlit.data.common.partition import Dirichlet, Natural, Partitioner
from fedlit.data.common.samples import SampleList, strata
from fedlit.data.common.splits import SPLITS, check_split_fractions, stratified_split
from fedlit.data.common.text import not_utf8
from fedlit.data.wfdb_files import WFDBRecord

DATABASE = "ptbxl_database.csv"
STATEMENTS = "scp_statements.csv"
#: The five diagnostic superclasses (``diagnostic_class`` of scp_statements.csv), in target order.
CLASS_NAMES = ("NORM", "MI", "STTC", "CD", "HYP")
#: Strodthoff et al.'s recommended split of the ten stratified folds: 1-8 train, 9 val, 10 test.
FOLDS = {"train": range(1, 9), "val": (9,), "test": (10,)}
URL = "https://physionet.org/content/ptb-xl/"
_COLUMNS = ("ecg_id", "patient_id", "scp_codes", "strat_fold", "filename_lr", "filename_hr")
LabelMode = Literal["single", "max_likelihood", "multilabel"]


def layout(sampling_rate: int = 100) -> str:
    """The files a PTB-XL folder must hold, as error messages name them."""
    return (
        f"{DATABASE}, {STATEMENTS} and the WFDB records records{sampling_rate}/<thousands>/<ecg_id>_"
        f"{'lr' if sampling_rate == 100 else 'hr'}.hea/.dat, as PhysioNet ships PTB-XL ({URL})"
    )


class PTBXL(FederatedDataModule):
    """PTB-XL's ECGs, labelled with their diagnostic superclass, partitioned into ``num_clients`` clients.

    Source: Wagner et al., "PTB-XL, a large publicly available electrocardiography dataset", Scientific Data 2020
    (https://physionet.org/content/ptb-xl/, CC BY 4.0): 21,799 ten-second 12-lead ECGs of 18,869 patients, at
    100 Hz (``records100``) and 500 Hz (``records500``); the ECG set of FHBench (Wang et al., arXiv 2025).

    Labels: every SCP code of a record's ``scp_codes`` that ``scp_statements.csv`` marks diagnostic maps to its
    ``diagnostic_class``, one of NORM, MI, STTC, CD, HYP (the aggregation of PhysioNet's example code and of
    Strodthoff et al., "Deep Learning for ECG Analysis: Benchmarks and Insights from PTB-XL", IEEE JBHI 2021; every
    likelihood counts). A record may so have several superclasses, or none. ``labels`` chooses the targets:

    - ``single`` (default, FHBench's 5-class classification): the records with exactly one superclass, targets
      0..4 in ``CLASS_NAMES`` order; the others are left out (their count is in the manifest's details);
    - ``max_likelihood``: every record with a superclass, labelled with that of its diagnostic code of highest
      likelihood (ties: the code written first);
    - ``multilabel``: every record with a superclass, a 0/1 target per superclass (task ``multilabel``).

    Clients: ``partitioner`` splits the records (default ``Dirichlet(alpha=0.1)``, FHBench's label skew, over the
    targets; multilabel records count under their first superclass); ``Natural()`` makes one client per value
    of ``site_column`` (``site``: the recording site; ``device`` also works), named ``site_<value>``, records
    without one left out with a warning. Splits: ``split: clients`` splits every client by ``split_fractions``
    (FHBench: 4:3:3), stratified by label; ``split: strat_fold`` keeps the data set's folds, 1-8 train, 9 val,
    10 test, within every client. The ECGs are read lazily, one record per item (``WFDBRecord``): float32 (12,
    1000) at 100 Hz, (12, 5000) at 500 Hz, in mV, leads in the header's order (I, II, III, aVR, aVL, aVF, V1-V6).
    The manifest lists every client's record names, ``ecg_id`` and ``patient_id``.

    Args:
        root: the PTB-XL folder (``ptbxl_database.csv``, ``scp_statements.csv``, ``records100/``...).
        sampling_rate: 100 (``filename_lr``) or 500 (``filename_hr``) Hz.
        labels: ``single``, ``max_likelihood`` or ``multilabel`` (above).
        num_clients: number of clients (with ``Natural()``: the number of distinct values of ``site_column``).
        partitioner: how records are dealt to clients (default ``Dirichlet(alpha=0.1)``).
        split: ``clients`` (``split_fractions`` per client) or ``strat_fold`` (folds 1-8 / 9 / 10).
        split_fractions: (train, val, test) fractions of every client, with ``split: clients``.
        site_column: the column ``Natural()`` takes the clients from.
        max_samples: use a seeded random subset of this many labelled records (quick runs); None uses all.
        batch_size: training batch size.
        eval_batch_size: val/test batch size (default ``batch_size``).
        num_workers: DataLoader worker processes.
        seed: seed of the subset, the partition and the splits.
    """

    def __init__(
        self,
        *,
        root: str | os.PathLike,
        sampling_rate: Literal[100, 500] = 100,
        labels: LabelMode = "single",
        num_clients: int = 20,
        partitioner: Partitioner | None = None,
        split: Literal["clients", "strat_fold"] = "clients",
        split_fractions: tuple[float, float, float] = (0.4, 0.3, 0.3),
        site_column: str = "site",
        max_samples: int | None = None,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, num_workers=num_workers, seed=seed)
        check_split_fractions(split_fractions)
        problems = []
        choices = {
            "sampling_rate": (sampling_rate, (100, 500)),
            "labels": (labels, get_args(LabelMode)),
            "split": (split, ("clients", "strat_fold")),
        }
        for option, (value, allowed) in choices.items():
            if value not in allowed or isinstance(value, bool):
                problems.append(f"data.init_args.{option} must be one of {list(allowed)}, got {value!r}")
        if not is_int(num_clients) or num_clients < 1:
            problems.append(f"data.init_args.num_clients must be an integer >= 1, got {num_clients!r}")
        if max_samples is not None and (not is_int(max_samples) or max_samples < 1):
            problems.append(f"data.init_args.max_samples must be null or an integer >= 1, got {max_samples!r}")
        if partitioner is not None and not isinstance(partitioner, Partitioner):
            problems.append(
                f"data.init_args.partitioner must be a Partitioner (IID, Dirichlet, Pathological, "
                f"Shards, Natural), got {partitioner!r}"
            )
        if problems:
            raise ConfigError("; ".join(problems))
        self.root = Path(root).expanduser()
        records = self.root / f"records{sampling_rate}"
        absent = [
            p.name + ("/" if p == records else "")
            for p in (self.root / DATABASE, self.root / STATEMENTS, records)
            if not p.exists()
        ]
        if absent:
            where = f"folder {self.root} lacks {', '.join(absent)}" if self.root.is_dir() else f"no folder {self.root}"
            raise DataError(f"data.init_args.root: {where}. It must hold {layout(sampling_rate)}")
        self.sampling_rate = int(sampling_rate)
        self.labels = labels
        self.num_clients = num_clients
        self.partitioner: Partitioner = partitioner if partitioner is not None else Dirichlet(alpha=0.1)
        self.split = split
        self.split_fractions = tuple(float(f) for f in split_fractions)
        self.site_column = site_column
        self.max_samples = max_samples

    @override
    @property
    def task(self) -> str:
        """``multilabel`` with ``labels: multilabel``, else ``multiclass`` (known before the data is built)."""
        return "multilabel" if self.labels == "multilabel" else "multiclass"

    @override
    def build_samples(self) -> SampleList:
        rows = read_database(self.root / DATABASE, self.site_column)
        superclass = read_statements(self.root / STATEMENTS)
        targets, kept, dropped = label_records([r.scp_codes for r in rows], superclass, self.labels)
        if not len(kept):
            raise DataError(
                f"{self.root / DATABASE}: none of its {len(rows)} records has a label under "
                f"data.init_args.labels={self.labels!r} (left out: {dropped}); try labels: multilabel"
            )
        rows = [rows[i] for i in kept]
        subset_rng, part_rng, split_rng = np.random.default_rng(self.seed).spawn(3)
        if self.max_samples is not None and self.max_samples < len(rows):
            chosen = np.sort(subset_rng.permutation(len(rows))[: self.max_samples])
            rows, targets = [rows[i] for i in chosen], targets[chosen]
        groups = None
        if isinstance(self.partitioner, Natural):
            sited = [i for i, r in enumerate(rows) if r.site]
            if len(sited) < len(rows):
                warnings.warn(
                    f"PTBXL: {len(rows) - len(sited)} records have no {self.site_column!r} in "
                    f"{self.root / DATABASE}; Natural() leaves them out",
                    stacklevel=2,
                )
                dropped[f"no_{self.site_column}"] = len(rows) - len(sited)
                rows, targets = [rows[i] for i in sited], targets[sited]
            groups = np.asarray([r.site for r in rows])
        task = self.task
        y = torch.from_numpy(targets)
        parts = self.partitioner(strata(y, task), self.num_clients, part_rng, groups=groups)
        if groups is not None:
            client_ids = [f"site_{groups[part[0]]}" for part in parts]
        else:
            client_ids = [f"client_{i}" for i in range(len(parts))]
        identities = [r.filename_lr if self.sampling_rate == 100 else r.filename_hr for r in rows]
        read = WFDBRecord(str(self.root), fs=float(self.sampling_rate), samples=10 * self.sampling_rate)
        absent = read.missing(identities)
        if absent:
            shown = ", ".join(f"{a}.hea" for a in absent[:3])
            raise DataError(
                f"{self.root}: {len(absent)} of the {len(identities)} records used from {DATABASE} "
                f"are missing ({shown}{', ...' if len(absent) > 3 else ''}); the folder must hold "
                f"{layout(self.sampling_rate)}"
            )
        splits = {}
        for client_id, part in zip(client_ids, parts, strict=True):
            if self.split == "strat_fold":
                folds = np.asarray([rows[i].strat_fold for i in part])
                splits[client_id] = {s: np.flatnonzero(np.isin(folds, FOLDS[s])) for s in SPLITS}
            else:
                needed = sum(f > 0 for f in self.split_fractions)
                if len(part) < needed:
                    raise DataError(
                        f"client {client_id!r} has {len(part)} records, fewer than the {needed} "
                        f"non-empty splits of data.init_args.split_fractions={self.split_fractions}: "
                        "lower num_clients or raise the partitioner's min_size"
                    )
                positions = stratified_split(
                    np.arange(len(part)), strata(y[part], task), self.split_fractions, split_rng
                )
                splits[client_id] = dict(zip(SPLITS, positions, strict=True))
        return SampleList(
            name="ptbxl",
            task=task,
            num_classes=len(CLASS_NAMES),
            samples={c: [identities[i] for i in part] for c, part in zip(client_ids, parts, strict=True)},
            targets={c: y[torch.from_numpy(part)] for c, part in zip(client_ids, parts, strict=True)},
            splits=splits,
            read=read,
            partitioner=repr(self.partitioner),
            class_names=list(CLASS_NAMES),
            details={
                "root": str(self.root),
                "sampling_rate": self.sampling_rate,
                "labels": self.labels,
                "split": self.split,
                "split_fractions": list(self.split_fractions) if self.split == "clients" else None,
                "left_out": dropped,
                "ecg_id": {c: [rows[i].ecg_id for i in part] for c, part in zip(client_ids, parts, strict=True)},
                "patient_id": {
                    c: [rows[i].patient_id for i in part] for c, part in zip(client_ids, parts, strict=True)
                },
            },
        )


@dataclass(frozen=True)
class Record:
    """One row of ``ptbxl_database.csv``: what the loader needs of it."""

    ecg_id: int
    patient_id: int
    scp_codes: dict[str, float]
    strat_fold: int
    filename_lr: str
    filename_hr: str
    site: str


def read_database(path: Path, site_column: str = "site") -> list[Record]:
    """The rows of ``ptbxl_database.csv``; ``site`` is ``site_column``'s value as an integer string ('' if empty).

    Raises:
        DataError: naming the file, and the line of a malformed ``scp_codes``, id or fold.
    """
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            columns = reader.fieldnames or []
            lacking = [c for c in (*_COLUMNS, site_column) if c not in columns]
            if lacking:
                raise DataError(
                    f"{path}: no column {lacking} (columns: {columns}); this is not PTB-XL's {DATABASE} ({URL})"
                )
            rows = [_record(path, reader.line_num, row, site_column) for row in reader]
    except UnicodeDecodeError:
        raise not_utf8(path) from None
    except csv.Error as err:
        raise DataError(f"{path} is not a readable CSV file ({err}); download PTB-XL again from {URL}") from None
    if not rows:
        raise DataError(f"{path} lists no record; download PTB-XL again from {URL}")
    return rows


def _record(path: Path, line: int, row: dict[str, str], site_column: str) -> Record:
    try:
        codes = ast.literal_eval(row["scp_codes"])
        if not isinstance(codes, dict) or not all(isinstance(v, int | float) for v in codes.values()):
            raise ValueError("not a dict of likelihoods")
        fold = int(float(row["strat_fold"]))
        if not 1 <= fold <= 10:
            raise ValueError(f"strat_fold {fold} is not one of 1..10")
        site = row[site_column].strip()
        return Record(
            ecg_id=int(float(row["ecg_id"])),
            patient_id=int(float(row["patient_id"])),
            scp_codes={str(k): float(v) for k, v in codes.items()},
            strat_fold=fold,
            filename_lr=row["filename_lr"].strip(),
            filename_hr=row["filename_hr"].strip(),
            site=str(int(float(site))) if _is_number(site) else site,
        )
    except (ValueError, SyntaxError, TypeError) as err:
        raise DataError(
            f"{path}, line {line}: {err} (ecg_id {row.get('ecg_id')!r}, scp_codes "
            f"{row.get('scp_codes')!r}); download PTB-XL again from {URL}"
        ) from None


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def read_statements(path: Path) -> dict[str, str]:
    """SCP code -> diagnostic superclass, for the codes ``scp_statements.csv`` marks diagnostic (``diagnostic``
    1) whose ``diagnostic_class`` is one of ``CLASS_NAMES``.

    Raises:
        DataError: naming the file when it lacks the ``diagnostic`` or ``diagnostic_class`` column.
    """
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.reader(handle)
            header = next(reader, [])
            if "diagnostic" not in header or "diagnostic_class" not in header:
                raise DataError(
                    f"{path}: no diagnostic and diagnostic_class columns (header: {header}); this is not "
                    f"PTB-XL's {STATEMENTS} ({URL})"
                )
            flag, column = header.index("diagnostic"), header.index("diagnostic_class")
            superclass = {}
            for row in reader:
                if len(row) > max(flag, column) and _is_number(row[flag]) and float(row[flag]) == 1:
                    if row[column].strip() in CLASS_NAMES:
                        superclass[row[0].strip()] = row[column].strip()
    except UnicodeDecodeError:
        raise not_utf8(path) from None
    if not superclass:
        raise DataError(
            f"{path} marks no SCP code diagnostic with a class of {list(CLASS_NAMES)}; download PTB-XL again from {URL}"
        )
    return superclass


def label_records(
    codes: list[dict[str, float]],
    superclass: dict[str, str],
    mode: LabelMode,
) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """Targets of the records that get one under ``mode`` (see :class:`PTBXL`), their positions in ``codes``,
    and how many were left out and why.

    Returns:
        ``(targets, kept, left_out)``: int64 (n,) classes, or float32 (n, 5) 0/1 rows for ``multilabel``; the
        kept records' indices; ``{"no_superclass": ..., "several_superclasses": ...}``.
    """
    index = {name: i for i, name in enumerate(CLASS_NAMES)}
    targets: list[int | list[float]] = []
    kept = []
    left_out = {"no_superclass": 0, "several_superclasses": 0}
    for i, record in enumerate(codes):
        diagnostic = [(code, likelihood) for code, likelihood in record.items() if code in superclass]
        classes = sorted({index[superclass[code]] for code, _ in diagnostic})
        if not classes:
            left_out["no_superclass"] += 1
            continue
        if mode == "single":
            if len(classes) > 1:
                left_out["several_superclasses"] += 1
                continue
            targets.append(classes[0])
        elif mode == "max_likelihood":
            best = max(range(len(diagnostic)), key=lambda k: (diagnostic[k][1], -k))
            targets.append(index[superclass[diagnostic[best][0]]])
        else:
            targets.append([float(c in classes) for c in range(len(CLASS_NAMES))])
        kept.append(i)
    if mode == "multilabel":
        array = np.asarray(targets, dtype=np.float32).reshape(len(targets), len(CLASS_NAMES))
    else:
        array = np.asarray(targets, dtype=np.int64)
    return array, np.asarray(kept, dtype=np.int64), left_out
