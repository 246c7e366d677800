"""Reading and checking the file of :class:`~fedlit.data.table.SiteTable`: the table, its column types, values and
splits, each bad value named by file, row (CSV line or Parquet row) and column."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fedlit.core.errors import DataError
from fedlit.data.common.splits import SPLITS
from fedlit.data.common.text import not_utf8

if TYPE_CHECKING:  # pandas is imported where a table is read: a run without one never pays its import
    import pandas as pd

OPTION = "data.init_args"
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def read_table(path: Path) -> tuple[pd.DataFrame, str]:
    """The table at ``path`` (Parquet for ``.parquet``/``.pq``, else CSV), and how its rows are named in messages
    (``line`` for CSV, ``row`` for Parquet).

    Raises:
        DataError: naming the file when it cannot be read, has no rows or names a column twice; for a CSV that
            is not UTF-8, the byte offset and the line of its first bad byte; for Parquet text that is not UTF-8,
            the row and column.
    """
    import pandas as pd

    parquet = path.suffix.lower() in (".parquet", ".pq")
    try:
        if not parquet:
            frame = pd.read_csv(path, skipinitialspace=True)
            header = pd.read_csv(path, skipinitialspace=True, header=None, nrows=1, dtype=str).iloc[0]
        else:
            frame = pd.read_parquet(path).reset_index(drop=True)
    except ImportError as err:
        raise DataError(
            f"{path}: reading Parquet needs pyarrow ({err}); pip install pyarrow, or save the table as CSV"
        ) from None
    except UnicodeDecodeError as err:
        raise (_parquet_error(path, err) if parquet else not_utf8(path)) from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, OSError, ValueError) as err:
        raise DataError(f"{path} ({OPTION}.path) cannot be read as a table ({type(err).__name__}: {err})") from None
    except Exception as err:
        if type(err).__module__.split(".")[0] != "pyarrow":  # pyarrow's ArrowException is no OSError/ValueError
            raise
        raise _parquet_error(path, err) from None
    if not parquet:
        _check_rows(path, frame, [str(c) for c in header if not pd.isna(c)], "line")
        return frame, "line"
    _check_parquet_text(path)  # pyarrow reads bad UTF-8 without a word; pandas fails on it later
    _check_rows(path, frame, [str(c) for c in frame.columns], "row")
    return frame, "row"


def _check_rows(path: Path, frame: pd.DataFrame, header: list[str], row_name: str) -> None:
    """Refuse a table without rows, or whose header names a column twice (pandas renames the second ``age.1``)."""
    twice = sorted({c for c in header if header.count(c) > 1})
    if twice:
        where = "its header" if row_name == "line" else "its columns"
        raise DataError(
            f"{path}: {where} names column {', '.join(repr(c) for c in twice)} more than once; "
            "rename or drop the repeated column (fedlit does not guess which one is meant)"
        )
    if not len(frame):
        raise DataError(
            f"{path} has no rows (only {'a header' if row_name == 'line' else 'a schema'}: columns "
            f"{header[:10]}); give it one row per sample"
        )


def row_label(i: int, row_name: str) -> str:
    """``line <n>`` of a CSV (its header is line 1) or ``row <i>`` of a Parquet file (from 0), for row ``i``."""
    return f"{row_name} {i + 2 if row_name == 'line' else i}"


def check_parquet_types(frame: pd.DataFrame, columns: list[str], path: Path, kind: str) -> None:
    """Refuse Parquet columns that would only become numbers by a conversion fedlit does not guess.

    Dates and durations, categoricals, and text holding numbers (a type the file keeps, unlike a CSV) are refused
    with the column, its dtype and the cast to do in pandas before writing the file; booleans are numbers (0/1), as
    a CSV column of ``true``/``false`` is. Text that is not numbers is left to :func:`check_numeric`, which names
    its rows.

    Raises:
        DataError: naming ``path`` and every refused column with its dtype and fix.
    """
    import pandas as pd

    problems = []
    for column in columns:
        values = frame[column]
        dtype = values.dtype
        if pd.api.types.is_bool_dtype(dtype) or (
            pd.api.types.is_numeric_dtype(dtype) and not isinstance(dtype, pd.CategoricalDtype)
        ):
            continue
        if pd.api.types.is_datetime64_any_dtype(dtype):
            fix = (
                f"turn it into a number first, e.g. days since a date: (df[{column!r}] - "
                "pd.Timestamp('2000-01-01')).dt.days"
            )
        elif pd.api.types.is_timedelta64_dtype(dtype):
            fix = f"turn it into a number first, e.g. df[{column!r}].dt.total_seconds()"
        elif isinstance(dtype, pd.CategoricalDtype):
            fix = f"one-hot encode it (pd.get_dummies(df, columns=[{column!r}])) or leave it out of the {kind}s"
        else:
            present = values.dropna()
            if not len(present) or pd.to_numeric(present, errors="coerce").isna().any():
                continue  # text that is not numbers: check_numeric names its rows
            fix = f"numbers stored as text; cast it first: df[{column!r}] = pd.to_numeric(df[{column!r}])"
        problems.append(f"column {column!r} ({kind}) has dtype {dtype}: {fix}")
    if problems:
        raise DataError(
            f"{path}: {'; '.join(problems)}; then write the Parquet file again (fedlit converts no "
            "Parquet type to numbers but booleans, read as 0/1)"
        )


def check_numeric(
    frame: pd.DataFrame, columns: list[str], path: Path, row_name: str, kind: str, numeric: bool = True
) -> None:
    """Refuse missing values in ``columns`` and, if ``numeric``, values that are not finite numbers or that float32
    (the tensors' type) cannot hold.

    Raises:
        DataError: naming ``path``, the row (CSV line or Parquet row) and the column of each bad value (first
            few listed, then the count).
    """
    import pandas as pd

    problems = []
    for column in columns:
        values = frame[column]
        missing = values.isna().to_numpy()
        for i in np.flatnonzero(missing):
            problems.append((int(i), column, f"is missing ({kind} values must be given; fill or drop the row)"))
        if not numeric:
            continue
        numbers = values if pd.api.types.is_bool_dtype(values) else pd.to_numeric(values, errors="coerce")
        numbers = pd.Series(numbers, dtype="float64")
        for i in np.flatnonzero(~missing & numbers.isna().to_numpy()):
            problems.append(
                (
                    int(i),
                    column,
                    f"{_show(values.iloc[i])} is not a number (a categorical {kind}? one-hot "
                    "encode it, or leave the column out of the features)",
                )
            )
        for i in np.flatnonzero(~missing & np.isinf(numbers.to_numpy())):
            problems.append((int(i), column, f"{_show(values.iloc[i])} is not finite"))
        for i in np.flatnonzero(np.isfinite(numbers.to_numpy()) & (numbers.abs().to_numpy() > _FLOAT32_MAX)):
            problems.append(
                (
                    int(i),
                    column,
                    f"{_show(values.iloc[i])} is finite but beyond float32's range (+-{_FLOAT32_MAX:.4g}), so it "
                    "would become inf; rescale the column (divide it by a power of ten, or take its log)",
                )
            )
    _raise(problems, columns, path, row_name)


def check_survival(frame: pd.DataFrame, time: str, event: str, path: Path, row_name: str) -> None:
    """Refuse a negative time or an event flag other than 0/1 (the values are finite numbers by now).

    Raises:
        DataError: naming ``path``, the row and the column of each bad value.
    """
    import pandas as pd

    times = pd.Series(frame[time], dtype="float64").to_numpy()
    events = pd.Series(frame[event], dtype="float64").to_numpy()
    problems = [
        (int(i), time, f"{_show(frame[time].iloc[i])} is negative (survival times are >= 0)")
        for i in np.flatnonzero(times < 0)
    ]
    problems += [
        (int(i), event, f"{_show(frame[event].iloc[i])} is not an event flag (1 = event, 0 = censored)")
        for i in np.flatnonzero((events != 0) & (events != 1))
    ]
    _raise(problems, [time, event], path, row_name)


def split_codes(frame: pd.DataFrame, column: str, path: Path, row_name: str) -> np.ndarray:
    """Each row's split from ``column``, as an index into ``SPLITS`` (train 0, val 1, test 2).

    Raises:
        DataError: naming ``path``, the row and the column of each value that is not ``train``, ``val`` or
            ``test`` (case-sensitive; surrounding spaces are ignored).
    """
    values = frame[column].astype(str).str.strip()
    codes = values.map({name: i for i, name in enumerate(SPLITS)})
    problems = [
        (int(i), column, f"{_show(frame[column].iloc[i])} is not a split") for i in np.flatnonzero(codes.isna())
    ]
    _raise(
        problems,
        [column],
        path,
        row_name,
        f" ({OPTION}.split_column: each value must be one of {list(SPLITS)}, lower case)",
    )
    return codes.to_numpy(dtype=np.int64)


def _raise(
    problems: list[tuple[int, str, str]], columns: list[str], path: Path, row_name: str, after: str = ""
) -> None:
    if problems:
        problems.sort(key=lambda p: (p[0], columns.index(p[1])))
        shown = "; ".join(f"{row_label(i, row_name)}, column {c!r}: {what}" for i, c, what in problems[:5])
        more = f"; and {len(problems) - 5} more" if len(problems) > 5 else ""
        raise DataError(f"{path}: {shown}{more}{after}")


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
                    raise DataError(
                        f"{path}: row {row}, column {name!r} is not UTF-8 text (byte {err.start} of "
                        f"the value is 0x{value[err.start]:02x}); write the table again with its text "
                        "as UTF-8"
                    ) from None


def _parquet_error(path: Path, error: Exception) -> DataError:
    """The error for a Parquet file pandas cannot read (pyarrow's errors are no OSError or ValueError)."""
    try:
        _check_parquet_text(path)
    except DataError as err:
        return err
    except Exception:  # noqa: BLE001,S110 - unreadable in another way: the first message says how
        pass
    return DataError(f"{path} ({OPTION}.path) cannot be read as Parquet ({type(error).__name__}: {error})")


def _show(value: object) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def duplicates(
    frame: pd.DataFrame, keys: list[str], targets: list[str], path: Path, row_name: str, dedupe: bool
) -> np.ndarray:
    """The rows ``dedupe`` drops: those that repeat an earlier row's ``keys`` (the site and feature columns) and
    ``targets`` (none without ``dedupe``). A warning names the rows that repeat an earlier row: exact copies (unless
    dropped), and rows whose keys repeat with other targets (conflicting labels, never dropped)."""
    import pandas as pd

    exact = frame[keys + targets].duplicated().to_numpy()
    conflicting = frame[keys].duplicated().to_numpy() & ~exact
    hashes = pd.util.hash_pandas_object(frame[keys], index=False).to_numpy()
    first = pd.Series(np.arange(len(frame))).groupby(hashes).transform("min").to_numpy()
    shown = {
        kind: ", ".join(f"{row_label(int(i), row_name)} = {row_label(int(first[i]), row_name)}" for i in rows[:5])
        + (", ..." if len(rows) > 5 else "")
        for kind, rows in (("exact", np.flatnonzero(exact)), ("conflicting", np.flatnonzero(conflicting)))
    }
    found = []
    if exact.any() and not dedupe:
        found.append(
            f"rows repeating an earlier row of their site exactly: {int(exact.sum())} ({shown['exact']}); such copies "
            "can land in both the train and the test split, which inflates test scores: drop them from the file, "
            f"or set {OPTION}.dedupe: true to keep the first of each"
        )
    if conflicting.any():
        found.append(
            f"rows repeating an earlier row's site and features with another target: {int(conflicting.sum())} "
            f"({shown['conflicting']}), conflicting labels, kept as they are; fix or drop them"
        )
    if found:
        warnings.warn(f"SiteTable ({path}): {'; '.join(found)}", stacklevel=3)
    return np.flatnonzero(exact) if dedupe else np.array([], dtype=np.int64)
