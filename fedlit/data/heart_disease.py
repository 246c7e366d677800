"""Fed-Heart-Disease (FLamby): the UCI Heart Disease data of 4 hospitals, one client each."""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from typing_extensions import override

from fedlit.core.errors import ConfigError, DataError, InputFileError
from fedlit.data.common.datamodule import FederatedDataModule
from fedlit.data.common.pool import PartitionedData
from fedlit.data.common.splits import stratified_split
from fedlit.data.common.text import decode_utf8

if TYPE_CHECKING:
    import pandas as pd

# pandas and scikit-learn are imported where they are used: every run imports this module (fedlit.data), few read
# this data set, and the two take about a second to import.

CENTERS = ("cleveland", "hungarian", "switzerland", "va")
FILES = tuple(f"processed.{center}.data" for center in CENTERS)
# The 14 columns of a processed file, as the UCI documentation (and some mirrors' header line) names them.
COLUMNS = (
    "age", "sex", "cp", "trestbps", "chol", "fbs", "restecg", "thalach", "exang", "oldpeak", "slope", "ca",
    "thal", "target",
)  # fmt: skip
# The 13 inputs after FLamby's preprocessing: 8 kept columns, then one-hot cp (2..4) and restecg (1..2).
FEATURE_NAMES = (
    "age", "sex", "trestbps", "chol", "fbs", "thalach", "exang", "oldpeak",
    "cp_2", "cp_3", "cp_4", "restecg_1", "restecg_2",
)  # fmt: skip
_URL = "https://archive.ics.uci.edu/dataset/45/heart+disease"
# The UCI "num" column: 0 = no disease, 1-4 = disease; the label is target > 0.
_DIAGNOSES = (0.0, 1.0, 2.0, 3.0, 4.0)
# The documented values of the two one-hot encoded columns (UCI's heart-disease.names): chest pain type cp 1 =
# typical angina, 2 = atypical angina, 3 = non-anginal pain, 4 = asymptomatic; resting ECG restecg 0 = normal,
# 1 = ST-T wave abnormality, 2 = left ventricular hypertrophy.
_CP = (1.0, 2.0, 3.0, 4.0)
_RESTECG = (0.0, 1.0, 2.0)
_LEVELS = {"cp": _CP, "restecg": _RESTECG}


class FedHeartDisease(FederatedDataModule):
    """Binary heart disease prediction in 4 hospitals, exactly as FLamby's Fed-Heart-Disease.

    Source: UCI Heart Disease (Janosi, Steinbrunn, Pfisterer, Detrano, 1988), ``processed.{cleveland,
    hungarian,switzerland,va}.data`` from https://archive.ics.uci.edu/dataset/45/heart+disease; benchmark
    protocol of FLamby (Ogier du Terrail et al., NeurIPS 2022 Datasets and Benchmarks). License: CC BY 4.0.

    Protocol (FLamby's ``HeartDiseaseRaw``): per file, "?" and empty fields are missing; columns 10-12 (slope,
    ca, thal) are dropped, then every row with a missing value; the label is ``target > 0``. Per center,
    ``train_test_split(arange(n), test_size=1 - 0.66, train_size=0.66, random_state=43, shuffle=True)``,
    stratified by label when both classes have more than 2 samples. Columns 2 (cp) and 6 (restecg) are one-hot
    encoded with the first level dropped: 13 float features (``FEATURE_NAMES``). FLamby encodes over all centers
    pooled; here the levels are the columns' documented values (cp 1-4, restecg 0-2, UCI's heart-disease.names),
    the same columns as pooled over the four files, but fixed by the data's definition, so one hospital's file
    alone gives the same features (any other value is refused naming its line).
    Each center is standardized with the mean and unbiased std of its own train rows,
    x = (x - mean) / (std + 1e-9). Sizes: train 199/172/30/85, test 104/89/16/45. FLamby trains a logistic
    regression with BCE, batch 4.

    Additions, off by default: ``val_fraction > 0`` moves a stratified share of each center's train rows
    (seeded by ``seed`` and the center, so each center's split is its own) to a validation split; the
    standardization then uses the remaining train rows only. Files with a header line (as some mirrors ship them)
    are read too. The pool is the built centers' kept rows in ``sites`` order; ``manifest()["details"]["rows"]``
    maps them back to data rows of the files.

    Every step depends on one center's rows only, so a hospital that holds only its own file builds its client
    exactly as it is built among all four (a Flower node does so, :meth:`only_site`: its ``root`` needs only
    ``processed.<site>.data``).

    Only "?" and empty fields mean missing. Any other field must be a finite number within float32's range
    (and the target one of 0..4): a "nan", "inf" or "1e400" (which parses to infinity) is refused when the data
    is built, naming the file, line and column, rather than silently dropped or trained on.

    Args:
        root: folder holding the ``processed.<center>.data`` files of the centers built.
        sites: the centers (clients), in this order; default all four, ``CENTERS``.
        val_fraction: share of each center's train rows used for validation, in [0, 1); 0 = FLamby (no val).
        normalize: standardize each center with its train statistics.
        batch_size: training batch size (FLamby: 4).
        eval_batch_size: val/test batch size (default ``batch_size``).
        num_workers: DataLoader worker processes.
        seed: seed of the validation split (unused when ``val_fraction`` is 0).
    """

    task = "binary"
    num_classes = 1

    def __init__(
        self,
        *,
        root: str | os.PathLike,
        sites: list[str] | None = None,
        val_fraction: float = 0.0,
        normalize: bool = True,
        batch_size: int = 4,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, num_workers=num_workers, seed=seed)
        if not 0 <= val_fraction < 1:
            raise ConfigError(
                f"data.init_args.val_fraction must be in [0, 1), got {val_fraction!r}: 0 reproduces FLamby "
                "(no validation split), e.g. 0.2 holds out a fifth of each center's train rows"
            )
        unknown = [s for s in sites or () if s not in CENTERS]
        if sites is not None and (unknown or not sites or len(set(sites)) != len(sites)):
            raise ConfigError(f"data.init_args.sites must list distinct centers of {list(CENTERS)}, got {sites!r}")
        self.root = Path(root).expanduser()
        if not self.root.is_dir():
            raise InputFileError(
                f"data.init_args.root: no folder {self.root}. It must hold the processed files of UCI Heart "
                f"Disease ({_URL}, 'processed.*.data' in the download): {list(FILES)}, or on a node of one "
                "hospital that hospital's file alone"
            )
        self.sites = list(sites) if sites is not None else list(CENTERS)
        self.val_fraction = float(val_fraction)
        self.normalize = normalize

    @override
    @classmethod
    def clients_in_options(cls, options: Mapping[str, object]) -> int:
        """The centers of ``sites`` (default all four), known without reading their files."""
        sites = options.get("sites")
        return len(sites) if isinstance(sites, list | tuple) else len(CENTERS)

    @override
    def expected_num_clients(self) -> int:
        """The centers of ``sites`` (one client each), known without reading their files."""
        return len(self.sites)

    @override
    def build(self) -> PartitionedData:
        from sklearn.model_selection import train_test_split

        centers = self.sites_to_build(self.sites)
        missing = [f"processed.{c}.data" for c in centers if not (self.root / f"processed.{c}.data").is_file()]
        if missing:
            raise InputFileError(
                f"data.init_args.root: folder {self.root} lacks {missing}, the processed files of UCI Heart "
                f"Disease ({_URL}, 'processed.*.data' in the download) of the centers it builds ({centers})"
            )
        blocks, labels, kept_rows, center_splits = [], [], {}, []
        for center in centers:
            name = f"processed.{center}.data"
            raw = _read(self.root / name)
            df = raw.drop(columns=[10, 11, 12]).dropna(axis=0)
            y = (df.pop(13).to_numpy() > 0).astype(np.int64)
            n = len(df)
            if n < 2:
                # train_test_split(0.66 / 0.34) leaves the train or the test split empty below 2 rows.
                raise DataError(
                    f"client {center!r} ({self.root / name}): only {n} of its {len(raw)} data rows are complete "
                    "(rows with a missing value outside slope, ca and thal are dropped); its 66/34 train/test "
                    "split needs at least 2: restore the file from the UCI download"
                )
            levels, counts = np.unique(y, return_counts=True)
            stratify = y if len(levels) > 1 and (counts > 2).all() else None
            train, test = train_test_split(
                np.arange(n),
                test_size=1.0 - 0.66,
                train_size=0.66,
                random_state=43,
                shuffle=True,
                stratify=stratify,
            )
            val = np.empty(0, dtype=np.int64)
            if self.val_fraction > 0:
                if len(train) < 2:
                    raise DataError(
                        f"client {center!r} ({self.root / name}) has {len(train)} train row, too few to move "
                        f"a share to validation (data.init_args.val_fraction={self.val_fraction}): set "
                        "val_fraction to 0"
                    )
                # Seeded per center: a hospital's split is the same whether it is built alone or with the others.
                val_rng = np.random.default_rng([self.seed, CENTERS.index(center)])
                train, val = stratified_split(train, y[train], (1 - self.val_fraction, self.val_fraction), val_rng)
            if self.normalize and len(train) < 2:
                raise DataError(
                    f"client {center!r} ({self.root / name}) has {len(train)} train row: standardizing with the "
                    "std of its train rows needs 2 or more (one row gives NaN features); restore the file from "
                    "the UCI download, or set data.init_args.normalize: false"
                )
            blocks.append(encode(df))
            labels.append(y)
            kept_rows[center] = [int(i) for i in df.index]
            center_splits.append({"train": np.sort(train), "val": np.sort(val), "test": np.sort(test)})

        x = torch.from_numpy(np.concatenate(blocks).astype(np.float32))
        offsets = np.cumsum([0] + [len(y) for y in labels])
        splits = {}
        for i, center in enumerate(centers):
            splits[center] = {k: v + offsets[i] for k, v in center_splits[i].items()}
            if self.normalize:
                rows = slice(offsets[i], offsets[i + 1])
                train_x = x[torch.from_numpy(splits[center]["train"])]
                x[rows] = (x[rows] - train_x.mean(dim=0)) / (train_x.std(dim=0) + 1e-9)
        return PartitionedData(
            name="fed_heart_disease",
            task="binary",
            num_classes=1,
            inputs=x,
            targets=torch.from_numpy(np.concatenate(labels).astype(np.float32)),
            splits=splits,
            partitioner="Natural()",
            details={
                "root": str(self.root),
                "feature_names": list(FEATURE_NAMES),
                "pool": {c: [int(offsets[i]), int(offsets[i + 1])] for i, c in enumerate(centers)},
                "rows": kept_rows,
                "val_fraction": self.val_fraction,
                "normalize": self.normalize,
            },
        )


def encode(df: pd.DataFrame) -> np.ndarray:
    """The 13 features (``FEATURE_NAMES``) of one center's complete rows (columns 0-9 of a processed file): the 8
    kept columns, then cp and restecg one-hot over their documented values with the first dropped (``cp_2``..
    ``cp_4``, ``restecg_1``, ``restecg_2``). Fixed by the data's definition, not by the values present, so a center
    alone is encoded as among all four (``_read`` refuses any other value of cp or restecg)."""
    kept = df[[0, 1, 3, 4, 5, 7, 8, 9]].to_numpy(dtype=np.float64)
    cp, restecg = df[2].to_numpy(), df[6].to_numpy()
    onehot = [cp == level for level in _CP[1:]] + [restecg == level for level in _RESTECG[1:]]
    return np.concatenate([kept, np.stack(onehot, axis=1).astype(np.float64)], axis=1)


def _read(path: Path) -> pd.DataFrame:
    """Read one processed file: integer column names 0..13, one row per data line (index: its number among the
    data lines, from 0), missing values ("?" or empty) as NaN.

    Raises:
        DataError: naming the file, and the line and column of each field that is not a finite number within
            float32's range (all such fields are found; the first few are listed), or of each line without 14
            fields; or the byte offset and line of the first byte that is not UTF-8.
    """
    rows: list[list[float]] = []
    problems: list[str] = []
    float32_max = float(np.finfo(np.float32).max)
    reader = csv.reader(io.StringIO(decode_utf8(path, path.read_bytes()), newline=""))
    for fields in reader:
        if len(fields) <= 1 and not "".join(fields).strip():
            continue  # a blank line
        line = reader.line_num
        if not rows and not problems and not any(_is_number(field) for field in fields):
            continue  # a mirror's "age,sex,..." header line, absent from the UCI files
        if len(fields) != len(COLUMNS):
            problems.append(
                f"line {line} has {len(fields)} comma-separated fields, expected {len(COLUMNS)} (13 features + target)"
            )
            continue
        row = []
        for column, field in zip(COLUMNS, fields, strict=True):
            token = field.strip()
            value = math.nan
            if token not in ("?", ""):
                if not _is_number(token):
                    problems.append(
                        f"line {line}, column {column!r}: {field!r} is not a number; write a number, or '?' "
                        "for a missing value"
                    )
                elif not math.isfinite(value := float(token)) or abs(value) > float32_max:
                    reads = "is not finite" if not math.isfinite(value) else "is beyond float32's range"
                    problems.append(
                        f"line {line}, column {column!r}: {field!r} {reads} (parses to {value:g}); write a "
                        "finite number, or '?' if the value is missing (the row is then dropped, as FLamby "
                        "does)"
                    )
                elif column == "target" and value not in _DIAGNOSES:
                    problems.append(
                        f"line {line}, column 'target': {field!r} is not a diagnosis; the target is 0 (no "
                        "disease) to 4, or '?' if it is missing"
                    )
                elif column in _LEVELS and value not in _LEVELS[column]:
                    problems.append(
                        f"line {line}, column {column!r}: {field!r} is not one of its documented values "
                        f"{[int(v) for v in _LEVELS[column]]} (UCI heart-disease.names), which fix its one-hot "
                        "encoding; correct it, or write '?' (the row is then dropped)"
                    )
            row.append(value)
        rows.append(row)
    if problems:
        listed = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise DataError(f"{path}: {listed}")
    import pandas as pd

    return pd.DataFrame(rows, columns=range(len(COLUMNS)), dtype=np.float64)


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True
