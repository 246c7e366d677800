"""CMMD, the Chinese Mammography Database (Cui et al., The Cancer Imaging Archive, 2021): 3,728 DICOM mammograms
of 1,775 patients, laid out by the NBIA Data Retriever as ``<ID1>/<study>/<series>/1-1.dcm`` (``D1-0001/...``),
with the clinical table ``CMMD_clinicaldata_revision.xlsx`` (or its CSV export): ``ID1``, ``LeftRight`` (``L`` or
``R``), ``Age``, ``number``, ``abnormality``, ``classification`` (``Benign`` -> class 0, ``Malignant`` -> cancer:
CMMD has no normal images) and ``subtype``; one line per patient and breast.

An image's breast is its DICOM header's ``ImageLaterality`` (else ``Laterality``); its label is the line of its
patient and breast. An image whose breast has no line is left out (with a warning counting them); an image
without a laterality tag is refused, naming it.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from fedlit.core.errors import DataError
from fedlit.data.mammography.dicom import read_header
from fedlit.data.mammography.records import CMMD_PAGE, Mammogram, missing_root, read_table, refuse_missing

KEY = "cmmd"
CLIENT = "cmmd"
TABLE = "CMMD_clinicaldata_revision.xlsx"
CLASSES = {"BENIGN": 0, "MALIGNANT": 1}
LAYOUT = "the clinical table beside one folder per patient ID1 holding its DICOMs (<ID1>/.../*.dcm)"
NAME = _SOURCE = "CMMD"
PAGE = CMMD_PAGE


def cmmd_records(root: Path, table: str = TABLE, option: str = "data.init_args.cmmd_root") -> list[Mammogram]:
    """Every labelled image of the patients of the clinical ``table`` (a ``.xlsx`` name falls back to the ``.csv``
    of the same name when only that exists), all of client ``cmmd``.

    Raises:
        InputFileError: naming the folder or the table when absent, and the download page.
        DataError: naming the table and its line for an unknown classification or side, a line given twice; the
            patients without a DICOM folder; a DICOM without a laterality tag.
    """
    if not root.is_dir():
        raise missing_root(option, root, _SOURCE, LAYOUT, CMMD_PAGE)
    path = root / table
    if not path.is_file() and path.with_suffix(".csv").is_file():
        path = path.with_suffix(".csv")
    frame = read_table(path, ("ID1", "LeftRight", "classification"), _SOURCE, CMMD_PAGE, "data.init_args.cmmd_table")
    labels: dict[tuple[str, str], int] = {}
    problems = []
    for line, row in enumerate(frame.to_dict("records"), start=2):
        patient, side = str(row["ID1"]).strip(), str(row["LeftRight"]).strip().upper()
        kind = str(row["classification"]).strip().upper()
        if kind not in CLASSES or side not in ("L", "R") or not patient:
            problems.append(f"line {line}: ID1={patient!r}, LeftRight={side!r}, classification={kind!r}")
        elif (patient, side) in labels:
            problems.append(f"line {line}: patient {patient} side {side} is listed again")
        else:
            labels[(patient, side)] = CLASSES[kind]
    if problems:
        raise DataError(
            f"{path}: {'; '.join(problems[:5])}; ID1 must be set, LeftRight L or R, classification Benign or "
            "Malignant, one line per patient and side"
        )
    records, missing, unlabelled = [], [], 0
    for patient in sorted({p for p, _ in labels}):
        files = sorted((root / patient).rglob("*.dcm")) if (root / patient).is_dir() else []
        if not files:
            missing.append(str(root / patient / "**" / "*.dcm"))
        for file in files:
            side = _laterality(file)
            if (patient, side) not in labels:
                unlabelled += 1
                continue
            rel = file.relative_to(root).as_posix()
            records.append(Mammogram(f"{KEY}/{rel}", labels[(patient, side)], patient, CLIENT))
    refuse_missing(missing, path, _SOURCE, LAYOUT, CMMD_PAGE)
    if unlabelled:
        warnings.warn(
            f"CMMD ({root}): {unlabelled} images of a breast without a line in {path.name} left out", stacklevel=2
        )
    return records


def _laterality(file: Path) -> str:
    header = read_header(file)
    side = str(getattr(header, "ImageLaterality", "") or getattr(header, "Laterality", "")).strip().upper()
    if side not in ("L", "R"):
        raise DataError(
            f"{file}: no ImageLaterality or Laterality tag of L or R (got {side!r}); CMMD labels each breast, "
            "so an image must say which it shows"
        )
    return side
