"""``SiteTable``: a tabular data set in one CSV or Parquet file with a site column; one client per site."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from typing_extensions import override

from fedlit.core.errors import ConfigError, DataError, InputFileError
from fedlit.data.common.datamodule import FederatedDataModule
from fedlit.data.common.pool import PartitionedData
from fedlit.data.common.samples import CLASSIFICATION, class_sort_key, split_samples
from fedlit.data.common.site_options import class_index, class_names_problem, site_rng, warn_labels
from fedlit.data.common.splits import SPLITS, check_split_fractions
from fedlit.data.table_read import OPTION as _OPTION
from fedlit.data.table_read import (
    check_numeric,
    check_parquet_types,
    check_survival,
    duplicates,
    read_table,
    row_label,
    split_codes,
)

if TYPE_CHECKING:  # only annotations here; table_read imports pandas when a table is read
    import pandas as pd

SURVIVAL = "survival"
_FRACTIONS = (0.6, 0.2, 0.2)


class SiteTable(FederatedDataModule):
    """Rows of a CSV or Parquet file, one client per value of ``site_column``; a tensor pool. No code needed.

    Features are ``feature_columns`` (default: every column but the site, target and split columns), in that
    order, as float32. A file without rows or whose header names a column twice is refused. Features must be
    numbers: a categorical (text) value, a missing value, an infinite one or one beyond float32's range is refused
    naming the file, the row (the CSV line, header = line 1; the Parquet row, from 0) and the column;
    encode or impute such columns before (fedlit does not guess an encoding). Booleans are numbers, 0 and 1: a
    Parquet bool column, or a CSV column holding only ``true``/``false`` (any case, as pandas reads them). A
    Parquet column of dates, durations, categories or numbers stored as text is refused naming its dtype and the
    cast to do in pandas first. With ``standardize``, every site's features are standardized with the mean and
    (unbiased) std of that site's train rows only, so nothing leaks from its val and test rows or from other
    sites; a constant column is only centered.

    Targets (``target_column``): with ``class_names``, class ``i`` is the value ``class_names[i]`` on every site
    (declare it in the recipe when sites read their own files: a site lacking a class keeps the others' numbers),
    and a value not in the list is refused naming its row; without it, the sorted distinct values read (numerically
    when they are numbers) are the classes 0..K-1, recorded as ``class_names``. ``binary`` needs exactly two values
    (the second in ``class_names``, or in sorted order, is positive). ``survival`` takes two columns,
    ``[time, event]``: times finite and >= 0, event flags 0 (censored) or 1, each bad value refused naming its row
    and column; the targets are float32 (N, 2). Any other task name (e.g. ``regression``) keeps the columns'
    numbers as float32 targets (one column or several). A class of fewer than 5 rows, and (unless declared) class
    values that are fractional numbers (``0.5`` beside ``0`` and ``1``), get a warning.

    Splits: with ``split_column``, each row's split is that column's value, ``train``, ``val`` or ``test``
    (case-sensitive; any other value is refused naming its row); every site needs train and test rows, and one
    without val rows has no validation split. ``split_fractions`` and ``seed`` then do not change the split (a
    ``split_fractions`` other than the default is refused with it). Without it, each site is split by
    ``split_fractions``, seeded by ``seed``, stratified by class for classification and by the event flag for
    survival (every split gets events in proportion), each site by its own generator (``seed`` and its name), so
    a site's split does not depend on the others. For survival, a site whose val or test split holds no
    event gets a warning: its C-index there is undefined, and the mean over clients covers fewer clients. The
    manifest's ``details`` give each site's rows of the pool, their row numbers in the file and where the split
    came from. Reading Parquet needs ``pyarrow``.

    On a Flower node (:meth:`only_site`) only the node's site is built: give the node its own file (node config
    ``overrides``: ``--data.init_args.path /data/site.csv``); a file holding several sites is read, and only the
    node's rows are used.

    Args:
        path: the ``.csv`` (any other suffix is read as CSV) or ``.parquet``/``.pq`` file.
        site_column: the column naming each row's site.
        target_column: the target column (or columns: ``[time, event]`` for survival, several for regression).
        feature_columns: the feature columns (default: all other columns).
        task: ``multiclass``, ``binary``, ``survival``, or another task name whose targets are numbers.
        standardize: standardize features per site with its train rows' mean and std.
        split_fractions: (train, val, test) shares of each site's rows, when there is no ``split_column``.
        split_column: the column giving each row's split (``train``, ``val`` or ``test``), instead of drawing
            splits by ``split_fractions``; it is not a feature.
        class_names: the classes of a ``multiclass`` or ``binary`` target, in number order (the label map every
            site uses); default: the sorted distinct values read.
        batch_size: training batch size.
        eval_batch_size: val/test batch size (default ``batch_size``).
        num_workers: DataLoader worker processes.
        seed: seed of the splits drawn by ``split_fractions`` (none with ``split_column``).
        dedupe: drop the rows that repeat an earlier row of their site exactly (same features and targets),
            keeping the first; the manifest lists the dropped rows. Without it such rows get a warning.
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
        split_fractions: tuple[float, float, float] = _FRACTIONS,
        split_column: str | None = None,
        class_names: list[str] | None = None,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
        dedupe: bool = False,
    ) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, num_workers=num_workers, seed=seed)
        check_split_fractions(split_fractions, f"{_OPTION}.split_fractions")
        targets = [target_column] if isinstance(target_column, str) else list(target_column)
        problems = []
        if task in CLASSIFICATION and len(targets) != 1:
            problems.append(f"{_OPTION}.target_column: a {task} task takes one target column, got {targets}")
        if task == SURVIVAL and len(targets) != 2:
            problems.append(f"{_OPTION}.target_column: a survival task takes two columns, [time, event], got {targets}")
        if task == "multilabel":
            problems.append(
                f"{_OPTION}.task='multilabel' is not supported by SiteTable; use one multiclass or binary target column"
            )
        if split_column is not None and tuple(float(f) for f in split_fractions) != _FRACTIONS:
            problems.append(
                f"{_OPTION}.split_fractions={list(split_fractions)} with split_column={split_column!r}: "
                "the split column gives every row's split; leave split_fractions out"
            )
        if split_column is not None and split_column in (site_column, *targets):
            problems.append(
                f"{_OPTION}.split_column={split_column!r} is the site or a target column; name the "
                "column holding train/val/test"
            )
        if class_names is not None and task not in CLASSIFICATION:
            problems.append(f"{_OPTION}.class_names is for a multiclass or binary task, not {task!r}; leave it out")
        elif (problem := class_names_problem(class_names, task)) is not None:
            problems.append(problem)
        if problems:
            raise ConfigError("; ".join(problems))
        self.class_index = class_index(class_names)
        self.path = Path(path).expanduser()
        if not self.path.is_file():
            raise InputFileError(
                f"{_OPTION}.path: no file {self.path}; give a CSV or Parquet file with one row "
                f"per sample and a {site_column!r} column"
            )
        self.site_column, self.target_columns, self.split_column = site_column, targets, split_column
        self.feature_columns = None if feature_columns is None else list(feature_columns)
        self.requested_task, self.standardize, self.dedupe = task, standardize, dedupe
        self.split_fractions = tuple(float(f) for f in split_fractions)

    @override
    def build(self) -> PartitionedData:
        frame, row_name = read_table(self.path)
        features = self._feature_columns(frame)
        task, path = self.requested_task, self.path
        numeric_targets = task not in CLASSIFICATION
        if row_name == "row":  # a Parquet file keeps its types: refuse those that are not numbers
            check_parquet_types(frame, features, path, "feature")
            if numeric_targets:
                check_parquet_types(frame, self.target_columns, path, "target")
        check_numeric(frame, features, path, row_name, "feature")
        check_numeric(frame, [self.site_column], path, row_name, "site", numeric=False)
        check_numeric(frame, self.target_columns, path, row_name, "target", numeric=numeric_targets)
        if task == SURVIVAL:
            time, event = self.target_columns  # two for survival, checked by __init__
            check_survival(frame, time, event, path, row_name)
        if self.split_column is not None:
            check_numeric(frame, [self.split_column], path, row_name, "split", numeric=False)
        codes = None if self.split_column is None else split_codes(frame, self.split_column, path, row_name)
        class_names = None
        if task in CLASSIFICATION:
            values = frame[self.target_columns[0]].astype(str).str.strip()
            class_names = self._class_names(values, row_name)
            if task == "binary" and len(class_names) != 2:
                raise DataError(
                    f"{path}: {_OPTION}.task='binary' needs exactly 2 values in column "
                    f"{self.target_columns[0]!r}, found {len(class_names)}: {class_names[:10]}; use "
                    "task: multiclass"
                )
            codes_y = values.map({name: i for i, name in enumerate(class_names)}).to_numpy()
            y = torch.from_numpy(codes_y.astype(np.float32 if task == "binary" else np.int64))
        else:
            y = torch.from_numpy(frame[self.target_columns].to_numpy(dtype=np.float32))
            y = y[:, 0] if len(self.target_columns) == 1 else y
        x = torch.from_numpy(frame[features].to_numpy(dtype=np.float64))  # standardized in float64: no overflow
        sites = frame[self.site_column].astype(str).str.strip().to_numpy()
        file_rows = np.arange(len(frame))
        dropped = duplicates(frame, [self.site_column, *features], self.target_columns, path, row_name, self.dedupe)
        if len(dropped):
            keep = np.setdiff1d(file_rows, dropped)
            x, y, sites, file_rows = x[torch.from_numpy(keep)], y[torch.from_numpy(keep)], sites[keep], keep
            codes = None if codes is None else codes[keep]
        site_ids = self.sites_to_build(
            sorted({str(s) for s in sites}, key=class_sort_key), f"the sites of column {self.site_column!r} of {path}"
        )
        order = np.concatenate([np.flatnonzero(sites == s) for s in site_ids])
        x, y, file_rows = x[torch.from_numpy(order)], y[torch.from_numpy(order)], file_rows[order]
        bounds = np.cumsum([0] + [int((sites == s).sum()) for s in site_ids])
        if class_names is not None:
            first = {
                name: row_label(int(values[values == name].index[0]), row_name)
                for name in class_names
                if (values == name).any()
            }
            counts = torch.bincount(y.long(), minlength=len(class_names)).tolist()
            warn_labels(
                f"SiteTable ({path})",
                dict(zip(class_names, counts, strict=True)),
                first,
                declared=self.class_index is not None,
            )
        if codes is None:
            per_site = {s: y[bounds[i] : bounds[i + 1]] for i, s in enumerate(site_ids)}
            local = {
                s: split_samples(
                    {s: per_site[s]}, self.split_fractions, site_rng(self.seed, s), task, f"{_OPTION}.split_fractions"
                )[s]
                for s in site_ids
            }
            splits = {s: {k: v + bounds[i] for k, v in local[s].items()} for i, s in enumerate(site_ids)}
        else:
            splits = self._column_splits(codes[order], site_ids, bounds)
        stats = {}
        if self.standardize:
            for i, s in enumerate(site_ids):
                train = x[torch.from_numpy(splits[s]["train"])]
                mean = train.mean(dim=0)
                std = train.std(dim=0) if len(train) > 1 else torch.ones_like(mean)
                std = torch.where(torch.isfinite(std) & (std > 0), std, torch.ones_like(std))
                x[bounds[i] : bounds[i + 1]] = (x[bounds[i] : bounds[i + 1]] - mean) / std
                stats[s] = {"mean": mean.tolist(), "std": std.tolist()}
        x = x.float()
        if task == SURVIVAL:
            self._warn_without_events(splits, y)
        return PartitionedData(
            name=path.stem,
            task=task,  # type: ignore[arg-type]  # any task name the recipe declares
            num_classes=_num_classes(task, class_names, len(self.target_columns)),
            inputs=x,
            targets=y,
            splits=splits,
            partitioner="Natural()",
            details={
                "path": str(path),
                "site_column": self.site_column,
                "target_columns": self.target_columns,
                "feature_names": features,
                "class_names": class_names,
                "pool": {s: [int(bounds[i]), int(bounds[i + 1])] for i, s in enumerate(site_ids)},
                "rows": {s: [int(r) for r in file_rows[bounds[i] : bounds[i + 1]]] for i, s in enumerate(site_ids)},
                "standardize": self.standardize,
                "dedupe": self.dedupe,
                "dropped_duplicates": [row_label(int(r), row_name) for r in dropped],
                "train_statistics": stats,
                "split_column": self.split_column,
                "splits_from": (
                    f"column {self.split_column!r} of the file"
                    if self.split_column
                    else f"split_fractions drawn with seed {self.seed}"
                    + (", stratified by the event flag" if task == SURVIVAL else "")
                ),
                "split_fractions": None if self.split_column else list(self.split_fractions),
            },
        )

    def _class_names(self, values: pd.Series, row_name: str) -> list[str]:
        """The declared ``class_names`` (each value checked against them), else the sorted distinct values read."""
        if self.class_index is None:
            names = sorted(values.unique(), key=class_sort_key)
            if self.only_client is not None:
                warnings.warn(
                    f"SiteTable ({self.path}): the classes are numbered by the values this node reads "
                    f"({names[:10]}); another site lacking or adding a value numbers them differently. "
                    f"Declare them in the recipe with {_OPTION}.class_names",
                    stacklevel=3,
                )
            return names
        class_names = list(self.class_index)
        bad = np.flatnonzero(~values.isin(class_names).to_numpy())
        if len(bad):
            shown = "; ".join(f"{row_label(int(i), row_name)}: {values.iloc[int(i)]!r}" for i in bad[:5])
            more = f"; and {len(bad) - 5} more" if len(bad) > 5 else ""
            raise DataError(
                f"{self.path}: column {self.target_columns[0]!r} holds values that are not in "
                f"{_OPTION}.class_names {class_names}: {shown}{more}; fix the rows, or add the class to "
                "class_names (in the recipe, so that every site numbers the classes alike)"
            )
        return class_names

    def _column_splits(
        self, codes: np.ndarray, site_ids: list[str], bounds: np.ndarray
    ) -> dict[str, dict[str, np.ndarray]]:
        """Each site's pool indices per split, from the split column's codes (in pool order).

        Raises:
            DataError: naming every site without a train or a test row (val may be empty).
        """
        splits, problems = {}, []
        for i, s in enumerate(site_ids):
            local = codes[bounds[i] : bounds[i + 1]]
            splits[s] = {name: np.flatnonzero(local == k) + bounds[i] for k, name in enumerate(SPLITS)}
            empty = [name for name in ("train", "test") if not len(splits[s][name])]
            if empty:
                problems.append(f"site {s!r} has no {' and no '.join(empty)} row")
        if problems:
            raise DataError(
                f"{self.path}: column {self.split_column!r} ({_OPTION}.split_column): "
                f"{'; '.join(problems)}; every site needs train and test rows (val may be empty): mark "
                "some of its rows so, or drop the site's rows"
            )
        return splits

    def _warn_without_events(self, splits: dict[str, dict[str, np.ndarray]], y: torch.Tensor) -> None:
        """Warn once per site whose val or test split has rows but no event: its C-index is undefined there."""
        for s, parts in splits.items():
            lacking = [
                f"{name} split ({len(parts[name])} rows)"
                for name in ("val", "test")
                if len(parts[name]) and not bool((y[torch.from_numpy(parts[name]), 1] > 0.5).any())
            ]
            if lacking:
                fix = (
                    f"mark rows with an event as val/test in column {self.split_column!r}"
                    if self.split_column
                    else "give the site more rows or a larger val/test share of split_fractions"
                )
                warnings.warn(
                    f"SiteTable ({self.path}): site {s!r} has no event in its {' or its '.join(lacking)}"
                    ": its C-index is undefined there (NaN), so the mean over clients of that split leaves "
                    f"it out and covers fewer clients; {fix}",
                    stacklevel=3,
                )

    @override
    def client_id_source(self) -> str:
        """The site column of the file."""
        return f"column {self.site_column!r} of {self.path} ({_OPTION}.site_column)"

    def _feature_columns(self, frame: pd.DataFrame) -> list[str]:
        columns = [str(c) for c in frame.columns]
        frame.columns = columns
        problems = []
        split = [self.split_column] if self.split_column is not None else []
        for option, wanted in (
            ("site_column", [self.site_column]),
            ("target_column", self.target_columns),
            ("split_column", split),
            ("feature_columns", self.feature_columns or []),
        ):
            absent = [c for c in wanted if c not in columns]
            if absent:
                problems.append(f"{_OPTION}.{option}: {absent} not in the columns of {self.path} ({columns})")
        if problems:
            raise DataError("; ".join(problems))
        used = {self.site_column, *self.target_columns, *split}
        if self.feature_columns is not None:
            clash = sorted(used & set(self.feature_columns))
            if clash:
                raise DataError(f"{_OPTION}.feature_columns lists {clash}, the site, target or split column")
            return self.feature_columns
        features = [c for c in columns if c not in used]
        if not features:
            raise DataError(f"{self.path} has no feature column besides {sorted(used)}")
        return features

    @override
    def preprocessing(self, client_id: str) -> dict[str, object]:
        """The default's record plus the feature columns in input order and, with ``standardize``, this site's
        train mean and std: a row ``x`` (the columns' values) becomes ``(x - mean) / std``."""
        details = self.data.details
        stats = details["train_statistics"].get(client_id) if self.standardize else None
        return {
            **super().preprocessing(client_id),
            "feature_columns": list(details["feature_names"]),
            "normalization": None if stats is None else {"kind": "standardize", **stats},
        }


def _num_classes(task: str, class_names: list[str] | None, targets: int) -> int:
    """Classes (multiclass), 1 (binary), 0 (survival: no classes) or the number of target columns."""
    if class_names is not None:
        return len(class_names) if task == "multiclass" else 1
    return 0 if task == SURVIVAL else targets
