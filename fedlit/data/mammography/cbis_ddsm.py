"""CBIS-DDSM (Lee et al., "A curated mammography data set for use in computer-aided detection and diagnosis
research", Scientific Data 2017), from The Cancer Imaging Archive: scanned film mammograms as DICOM, described by
four CSVs (``mass_case_description_train_set.csv``, ``mass_case_description_test_set.csv``,
``calc_case_description_train_set.csv``, ``calc_case_description_test_set.csv``), one line per abnormality.

Columns read: ``patient_id`` (``P_00001``), ``pathology`` (``MALIGNANT`` -> cancer, ``BENIGN`` and
``BENIGN_WITHOUT_CALLBACK`` -> class 0: CBIS-DDSM has no normal images) and ``image file path``, the full
mammogram's DICOM as ``<case folder>/<study UID>/<series UID>/000000.dcm``. The NBIA Data Retriever writes the case
folder (``Mass-Training_P_00001_LEFT_CC``) under the collection folder, but names the study and series folders by
date and description (``07-20-2016-DDSM-74994/1.000000-full mammogram images-24515/1-1.dcm``), so a path that does
not exist as written is looked for in its case folder: the one DICOM there (the ROI masks and crops sit in case
folders of their own, ``..._1``), or the one under a ``full mammogram images`` series. An image with several
abnormalities is listed once, cancer if any of them is malignant.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fedlit.core.errors import DataError, InputFileError
from fedlit.data.mammography.records import CBIS_DDSM_PAGE, Mammogram, missing_root, read_table, refuse_missing

KEY = "cbis_ddsm"
CLIENT = "cbis_ddsm"
TABLES = (
    "mass_case_description_train_set.csv",
    "mass_case_description_test_set.csv",
    "calc_case_description_train_set.csv",
    "calc_case_description_test_set.csv",
)
PATHOLOGY = {"MALIGNANT": 1, "BENIGN": 0, "BENIGN_WITHOUT_CALLBACK": 0}
LAYOUT = (
    "its case description CSVs beside the case folders (<case folder>/.../*.dcm, as the CSVs' 'image file path' "
    "or as the NBIA Data Retriever writes them)"
)
NAME = _SOURCE = "CBIS-DDSM"
PAGE = CBIS_DDSM_PAGE
_COLUMNS = ("patient_id", "pathology", "image file path")


def cbis_ddsm_records(
    root: Path, tables: Sequence[str] | None = None, option: str = "data.init_args.cbis_ddsm_root"
) -> list[Mammogram]:
    """Every full mammogram of the CSVs ``tables`` under ``root`` (None: those of :data:`TABLES` present), all of
    client ``cbis_ddsm``.

    Raises:
        InputFileError: naming the folder, or the tables (none present, or one named that is absent), and the
            download page.
        DataError: naming the CSV and its line for an unknown pathology, a path outside the root, a case folder
            with several DICOMs and no full-mammogram series; and the images that do not exist.
    """
    if not root.is_dir():
        raise missing_root(option, root, _SOURCE, LAYOUT, CBIS_DDSM_PAGE)
    names = list(tables) if tables is not None else [t for t in TABLES if (root / t).is_file()]
    if not names:
        raise InputFileError(
            f"{option}: {root} holds none of CBIS-DDSM's tables {list(TABLES)}; download them from {CBIS_DDSM_PAGE}"
        )
    labels: dict[str, int] = {}
    patients: dict[str, str] = {}
    for name in names:
        path = root / name
        frame = read_table(path, _COLUMNS, _SOURCE, CBIS_DDSM_PAGE, "data.init_args.cbis_ddsm_tables")
        problems, missing = [], []
        for line, row in enumerate(frame.to_dict("records"), start=2):
            pathology = str(row["pathology"]).strip().upper()
            if pathology not in PATHOLOGY:
                problems.append(f"line {line}: pathology {row['pathology']!r} is none of {sorted(PATHOLOGY)}")
                continue
            written = str(row["image file path"]).strip().strip('"')
            try:
                found = _dicom_of(root, written)
            except DataError as err:
                problems.append(f"line {line}: {err}")
                continue
            if found is None:
                missing.append(str(root / written))
                continue
            rel = found.relative_to(root).as_posix()
            labels[rel] = max(labels.get(rel, 0), PATHOLOGY[pathology])
            patients[rel] = str(row["patient_id"]).strip()
        if problems:
            raise DataError(f"{path}: {'; '.join(problems[:5])}")
        refuse_missing(missing, path, _SOURCE, LAYOUT, CBIS_DDSM_PAGE)
    return [Mammogram(f"{KEY}/{rel}", labels[rel], patients[rel], CLIENT) for rel in sorted(labels)]


def _dicom_of(root: Path, written: str) -> Path | None:
    """The DICOM file of an ``image file path``: as written, else the one in its case folder; None when absent.

    Raises:
        DataError: for a path leaving the root, or a case folder whose DICOM cannot be told apart.
    """
    parts = Path(written.replace("\\", "/")).parts
    if not parts or Path(written).is_absolute() or ".." in parts:
        raise DataError(f"image file path {written!r} is not a path inside the collection folder")
    if (root / written).is_file():
        return root / written
    case = root / parts[0]
    if not case.is_dir():
        return None
    found = sorted(case.rglob("*.dcm"))
    if len(found) > 1:
        found = [p for p in found if "full mammogram" in p.parent.name.lower()]
    if len(found) > 1:
        raise DataError(
            f"case folder {case} holds {len(found)} DICOM files and none alone under a 'full mammogram images' "
            "series; keep only the full mammogram there"
        )
    return found[0] if found else None
