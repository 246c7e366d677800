"""``SiteTable``: a tabular data set in one CSV or Parquet file with a site column; one client per site."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from fedlit.core.errors import ConfigError, DataError, InputFileError
from fedlit.data.datamodule import FederatedDataModule
from fedlit.data.pool import PartitionedData
from fedlit.data.samples import CLASSIFICATION, class_sort_key, split_samples
from fedlit.data.splits import check_split_fractions
from fedlit.data.text import not_utf8

_OPTION = "data.init_args"


class SiteTable(FederatedDataModule):
    """Rows of a CSV or Parquet file, one client per value of ``site_column``; a tensor pool. No code needed.

    Features are ``feature_columns`` (default: every column but the site and target columns), in that order,
    as float32. They must be numbers: a categorical (text) value, a missing value or an infinite one is refused
    naming the file, the row (the CSV line, header = line 1; the Parquet row, from 0) and the column; encode or
    impute such columns before (fedlit does not guess an encoding). With ``standardize``, every site's features
    are standardized with the mean and (unbiased) std of that site's train rows only, so nothing leaks from its
    val and test rows or from other sites; a constant column is only centered.

    Targets (``target_column``): for ``multiclass`` the sorted distinct values (numerically when they are
    numbers) are the classes 0..K-1, recorded as ``class_names``; ``binary`` needs exactly two values (the second
    in sorted order is positive); any other task name (e.g. ``regression``) keeps the column's numbers as float32
    targets, and ``target_column`` may then list several columns (e.g. a survival time and an event flag).

    Each site is split by ``split_fractions``, stratified by class for classification, seeded by ``seed``. The
    manifest's ``details`` give each site's rows of the pool and their row numbers in the file. Reading Parquet
    needs ``pyarrow``.

    Args:
        path: the ``.csv`` (any other suffix is read as CSV) or ``.parquet``/``.pq`` file.
        site_column: the column naming each row's site.
        target_column: the target column (or columns, for a task that is not classification).
        feature_columns: the feature columns (default: all other columns).
        task: ``multiclass``, ``binary``, or another task name whose targets are numbers.
        standardize: standardize features per site with its train rows' mean and std.
        split_fractions: (train, val, test) shares of each site's rows.
        batch_size: training batch size.
        eval_batch_size: val/test batch size (default ``batch_size``).
        num_workers: DataLoader worker processes.
        seed: seed of the splits.
    """

    def __init__(
        self,
        *,
        path: str | os.PathLike,
        site_column: str = "site",
        target_column: str | list[str] = "label",
        feature_columns: list[str] | None = None,
        task: str = "multiclass",
        standardize: bool = True,
        split_fractions: tuple[float, float, float] = (0.6, 0.2, 0.2),
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(
            batch_size=batch_size, eval_batch_size=eval_batch_size, num_workers=num_workers, seed=seed
        )
        check_split_fractions(split_fractions, f"{_OPTION}.split_fractions")
        targets = [target_column] if isinstance(target_column, str) else list(target_column)
        if task in CLASSIFICATION and len(targets) != 1:
            raise ConfigError(f"{_OPTION}.target_column: a {task} task takes one target column, got {targets}")
        if task == "multilabel":
            raise ConfigError(f"{_OPTION}.task='multilabel' is not supported by SiteTable; use one multiclass or "
                             "binary target column")
        self.path = Path(path).expanduser()
        if not self.path.is_file():
            raise InputFileError(f"{_OPTION}.path: no file {self.path}; give a CSV or Parquet file with one row "
                                    f"per sample and a {site_column!r} column")
        self.site_column, self.target_columns = site_column, targets
        self.feature_columns = None if feature_columns is None else list(feature_columns)
        self.requested_task, self.standardize = task, standardize
        self.split_fractions = tuple(float(f) for f in split_fractions)

    def build(self) -> PartitionedData:
        frame, row_name = self._read()
        features = self._feature_columns(frame)
        _check_numeric(frame, features, self.path, row_name, "feature")
        _check_numeric(frame, [self.site_column], self.path, row_name, "site", numeric=False)
        task = self.requested_task
        _check_numeric(frame, self.target_columns, self.path, row_name, "target", numeric=task not in CLASSIFICATION)
        class_names = None
        if task in CLASSIFICATION:
            values = frame[self.target_columns[0]].astype(str).str.strip()
            class_names = sorted(values.unique(), key=class_sort_key)
            if task == "binary" and len(class_names) != 2:
                raise DataError(f"{self.path}: {_OPTION}.task='binary' needs exactly 2 values in column "
                                f"{self.target_columns[0]!r}, found {len(class_names)}: {class_names[:10]}; use "
                                "task: multiclass")
            codes = values.map({name: i for i, name in enumerate(class_names)}).to_numpy()
            y = torch.from_numpy(codes.astype(np.float32 if task == "binary" else np.int64))
        else:
            y = torch.from_numpy(frame[self.target_columns].to_numpy(dtype=np.float32))
            y = y[:, 0] if len(self.target_columns) == 1 else y
        x = torch.from_numpy(frame[features].to_numpy(dtype=np.float32))
        sites = frame[self.site_column].astype(str).str.strip().to_numpy()
        site_ids = sorted({str(s) for s in sites}, key=class_sort_key)
        order = np.concatenate([np.flatnonzero(sites == s) for s in site_ids])
        x, y, file_rows = x[torch.from_numpy(order)], y[torch.from_numpy(order)], order
        bounds = np.cumsum([0] + [int((sites == s).sum()) for s in site_ids])
        per_site = {s: y[bounds[i]:bounds[i + 1]] for i, s in enumerate(site_ids)}
        local = split_samples(per_site, self.split_fractions, np.random.default_rng(self.seed), task,
                              f"{_OPTION}.split_fractions")
        splits = {s: {k: v + bounds[i] for k, v in local[s].items()} for i, s in enumerate(site_ids)}
        stats = {}
        if self.standardize:
            for i, s in enumerate(site_ids):
                train = x[torch.from_numpy(splits[s]["train"])]
                mean = train.mean(dim=0)
                std = train.std(dim=0) if len(train) > 1 else torch.ones_like(mean)
                std = torch.where(torch.isfinite(std) & (std > 0), std, torch.ones_like(std))
                x[bounds[i]:bounds[i + 1]] = (x[bounds[i]:bounds[i + 1]] - mean) / std
                stats[s] = {"mean": mean.tolist(), "std": std.tolist()}
        return PartitionedData(
            name=self.path.stem,
            task=task,  # type: ignore[arg-type]  # any task name the recipe declares
            num_classes=(len(class_names) if task == "multiclass" else 1) if class_names else len(self.target_columns),
            inputs=x,
            targets=y,
            splits=splits,
            partitioner="Natural()",
            details={
                "path": str(self.path),
                "site_column": self.site_column,
                "target_columns": self.target_columns,
                "feature_names": features,
                "class_names": class_names,
                "pool": {s: [int(bounds[i]), int(bounds[i + 1])] for i, s in enumerate(site_ids)},
                "rows": {s: [int(r) for r in file_rows[bounds[i]:bounds[i + 1]]] for i, s in enumerate(site_ids)},
                "standardize": self.standardize,
                "train_statistics": stats,
                "split_fractions": list(self.split_fractions),
            },
        )

    def client_id_source(self) -> str:
        """The site column of the file."""
        return f"column {self.site_column!r} of {self.path} ({_OPTION}.site_column)"

    def _read(self) -> tuple[pd.DataFrame, str]:
        """The table, and how its rows are named in messages (``line`` for CSV, ``row`` for Parquet)."""
        parquet = self.path.suffix.lower() in (".parquet", ".pq")
        try:
            if not parquet:
                return pd.read_csv(self.path, skipinitialspace=True), "line"
            frame = pd.read_parquet(self.path).reset_index(drop=True)
        except ImportError as err:
            raise DataError(f"{self.path}: reading Parquet needs pyarrow ({err}); pip install pyarrow, or save "
                            "the table as CSV") from None
        except UnicodeDecodeError as err:
            raise (_parquet_error(self.path, err) if parquet else not_utf8(self.path)) from None
        except (pd.errors.ParserError, pd.errors.EmptyDataError, OSError, ValueError) as err:
            raise DataError(f"{self.path} ({_OPTION}.path) cannot be read as a table ({type(err).__name__}: "
                            f"{err})") from None
        except Exception as err:
            if type(err).__module__.split(".")[0] != "pyarrow":  # pyarrow's ArrowException is no OSError/ValueError
                raise
            raise _parquet_error(self.path, err) from None
        _check_parquet_text(self.path)  # pyarrow reads bad UTF-8 without a word; pandas fails on it later
        return frame, "row"

    def _feature_columns(self, frame: pd.DataFrame) -> list[str]:
        columns = [str(c) for c in frame.columns]
        frame.columns = columns
        problems = []
        for option, wanted in (("site_column", [self.site_column]), ("target_column", self.target_columns),
                               ("feature_columns", self.feature_columns or [])):
            absent = [c for c in wanted if c not in columns]
            if absent:
                problems.append(f"{_OPTION}.{option}: {absent} not in the columns of {self.path} ({columns})")
        if problems:
            raise DataError("; ".join(problems))
        used = {self.site_column, *self.target_columns}
        if self.feature_columns is not None:
            clash = sorted(used & set(self.feature_columns))
            if clash:
                raise DataError(f"{_OPTION}.feature_columns lists {clash}, the site or target column")
            return self.feature_columns
        features = [c for c in columns if c not in used]
        if not features:
            raise DataError(f"{self.path} has no feature column besides {sorted(used)}")
        return features

    def preprocessing(self, client_id: str) -> dict[str, object]:
        """The default's record plus the feature columns in input order and, with ``standardize``, this site's
        train mean and std: a row ``x`` (the columns' values) becomes ``(x - mean) / std``."""
        details = self.data.details
        stats = details["train_statistics"].get(client_id) if self.standardize else None
        return {**super().preprocessing(client_id), "feature_columns": list(details["feature_names"]),
                "normalization": None if stats is None else {"kind": "standardize", **stats}}


def _check_numeric(frame: pd.DataFrame, columns: list[str], path: Path, row_name: str, kind: str,
                   numeric: bool = True) -> None:
    """Refuse missing values in ``columns`` and, if ``numeric``, values that are not finite numbers.

    Raises:
        DataError: naming ``path``, the row (CSV line or Parquet row) and the column of each bad value (first
            few listed, then the count).
    """
    problems = []
    for column in columns:
        values = frame[column]
        missing = values.isna().to_numpy()
        numbers = values if pd.api.types.is_bool_dtype(values) else pd.to_numeric(values, errors="coerce")
        numbers = pd.Series(numbers, dtype="float64") if numeric else None
        for i in np.flatnonzero(missing):
            problems.append((i, column, f"is missing ({kind} values must be given; fill or drop the row)"))
        if numeric and numbers is not None:
            for i in np.flatnonzero(~missing & numbers.isna().to_numpy()):
                problems.append((i, column, f"{_show(values.iloc[i])} is not a number (a categorical {kind}? one-hot "
                                            "encode it, or leave the column out of the features)"))
            for i in np.flatnonzero(~missing & np.isinf(numbers.to_numpy())):
                problems.append((i, column, f"{_show(values.iloc[i])} is not finite"))
    if problems:
        problems.sort(key=lambda p: (p[0], columns.index(p[1])))
        offset = 2 if row_name == "line" else 0  # a CSV's header is line 1
        shown = "; ".join(f"{row_name} {i + offset}, column {c!r}: {what}" for i, c, what in problems[:5])
        more = f"; and {len(problems) - 5} more" if len(problems) > 5 else ""
        raise DataError(f"{path}: {shown}{more}")


def _check_parquet_text(path: Path) -> None:
    """Refuse a Parquet text value that is not UTF-8, naming its row and column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pq.read_schema(path)
    names = [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
    for name, column in zip(names, pq.read_table(path, columns=names).columns, strict=True):
        try:
            column.validate(full=True)
        except pa.ArrowInvalid:
            for row, value in enumerate(column.cast(pa.large_binary()).to_pylist()):
                try:
                    value is None or value.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise DataError(f"{path}: row {row}, column {name!r} is not UTF-8 text (byte {err.start} of "
                                    f"the value is 0x{value[err.start]:02x}); write the table again with its text "
                                    "as UTF-8") from None


def _parquet_error(path: Path, error: Exception) -> DataError:
    """The error for a Parquet file pandas cannot read (pyarrow's errors are no OSError or ValueError)."""
    try:
        _check_parquet_text(path)
    except DataError as err:
        return err
    except Exception:  # noqa: BLE001,S110 - unreadable in another way: the first message says how
        pass
    return DataError(f"{path} ({_OPTION}.path) cannot be read as Parquet ({type(error).__name__}: {error})")


def _show(value: object) -> str:
    return repr(value) if isinstance(value, str) else str(value)
