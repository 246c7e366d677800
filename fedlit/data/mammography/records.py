"""What every mammography source gives: one :class:`Mammogram` per image (file, label, patient, client), and the
reading of its tables, every problem named by file (and line) with the page to download the data from."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from fedlit.core.errors import DataError, InputFileError

#: Where each source is downloaded from.
RSNA_PAGE = "https://www.kaggle.com/competitions/rsna-breast-cancer-detection/data"
CBIS_DDSM_PAGE = "https://www.cancerimagingarchive.net/collection/cbis-ddsm/"
CMMD_PAGE = "https://www.cancerimagingarchive.net/collection/cmmd/"
#: Class 0 and class 1 of every source (benign findings are class 0 where a source has no normal images).
CLASS_NAMES = ["normal", "cancer"]


@dataclass(frozen=True)
class Mammogram:
    """One image of a source.

    Attributes:
        identity: ``<source key>/<path relative to the source's root>`` (what the manifest lists).
        label: 0 (normal, or benign) or 1 (cancer, malignant).
        patient: the patient id within the source; a patient's images always share a split.
        client: the client (site) the image belongs to.
    """

    identity: str
    label: int
    patient: str
    client: str


def missing_root(option: str, root: Path, source: str, layout: str, page: str) -> InputFileError:
    """The error for a source folder that does not exist."""
    return InputFileError(f"{option}: no folder {root}. {source} expects {layout}; download it from {page}")


def read_table(path: Path, columns: Sequence[str], source: str, page: str, option: str) -> pd.DataFrame:
    """A source's CSV (or, for ``.xlsx``, spreadsheet), every value read as text, with ``columns`` checked.

    Raises:
        InputFileError: naming ``path``, ``option`` and ``page`` when the file does not exist.
        DataError: naming ``path`` when it cannot be read or lacks a column (its columns listed).
    """
    if not path.is_file():
        raise InputFileError(f"{option}: no file {path}; it is {source}'s table: download it from {page}")
    try:
        if path.suffix.lower() in (".xlsx", ".xls"):
            table = pd.read_excel(path, dtype=str)
        else:
            table = pd.read_csv(path, dtype=str, skipinitialspace=True)
    except ImportError as err:
        raise DataError(
            f"{path}: reading a spreadsheet needs openpyxl ({err}); pip install openpyxl, or export the sheet as "
            f"CSV beside it ({path.with_suffix('.csv').name}) and name that file with {option}"
        ) from None
    except (OSError, ValueError, pd.errors.ParserError) as err:
        raise DataError(f"{path}: cannot be read as {source}'s table ({type(err).__name__}: {err})") from None
    table.columns = [str(c).strip() for c in table.columns]
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise DataError(
            f"{path}: no column {', '.join(repr(c) for c in missing)} (its columns: {list(table.columns)}); it is "
            f"not {source}'s table as published at {page}"
        )
    return table.fillna("")


def refuse_missing(paths: Sequence[str], table: Path, source: str, layout: str, page: str) -> None:
    """Refuse the files a table lists that do not exist, the first three named.

    Raises:
        DataError: naming ``table``, the missing files and the layout expected.
    """
    if paths:
        shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
        raise DataError(
            f"{table}: {len(paths)} images it lists do not exist: {shown}. {source} expects {layout} "
            f"(download from {page}), or drop those rows"
        )
