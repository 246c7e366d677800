"""The RSNA Screening Mammography Breast Cancer Detection images (Kaggle, 2022-2023): ``train.csv`` and
``train_images/<patient_id>/<image_id>.dcm``, about 54,000 DICOMs of 11,913 patients from two sites.

``train.csv``'s columns: ``site_id``, ``patient_id``, ``image_id``, ``laterality``, ``view``, ``age``,
``cancer`` (the label: 1 cancer, 0 normal), ``biopsy``, ``invasive``, ``BIRADS``, ``implant``, ``density``,
``machine_id``, ``difficult_negative_case``. Any of them can form the clients (``site_column``): ``machine_id``
(Setting 1: machines 49, 48, 29 and 21), ``site_id`` (Setting 2's RSNA sites 1 and 2), ``view``...
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fedlit.core.errors import ConfigError, DataError
from fedlit.data.mammography.records import RSNA_PAGE, Mammogram, missing_root, read_table, refuse_missing

KEY = "rsna"
LAYOUT = "train.csv beside train_images/<patient_id>/<image_id>.dcm (the competition's layout)"
NAME = _SOURCE = "RSNA Screening Mammography"
PAGE = RSNA_PAGE


def rsna_records(
    root: Path,
    site_column: str,
    sites: Sequence[str] | None,
    table: str = "train.csv",
    images: str = "train_images",
    option: str = "data.init_args.rsna_root",
) -> list[Mammogram]:
    """Every image of ``root``'s table whose ``site_column`` value is one of ``sites`` (all when None); the client
    of an image is ``<site_column>_<value>`` (``machine_id_49``).

    Raises:
        InputFileError: naming the folder or ``train.csv`` when absent, and the download page.
        ConfigError: naming ``site_column`` or ``sites`` when the table has no such column or value.
        DataError: naming ``train.csv`` and its line for a label that is not 0/1, and the images it lists that do
            not exist.
    """
    if not root.is_dir():
        raise missing_root(option, root, _SOURCE, LAYOUT, RSNA_PAGE)
    path = root / table
    frame = read_table(path, ["patient_id", "image_id", "cancer"], _SOURCE, RSNA_PAGE, option)
    if site_column not in frame.columns:
        raise ConfigError(
            f"data.init_args.rsna_site_column={site_column!r} is not a column of {path} (its columns: "
            f"{list(frame.columns)})"
        )
    values = sorted(set(frame[site_column]))
    wanted = [str(s) for s in sites] if sites is not None else values
    unknown = [s for s in wanted if s not in values]
    if unknown:
        raise ConfigError(
            f"data.init_args.rsna_sites: {unknown} are not values of column {site_column!r} of {path} (its values: "
            f"{values[:20]})"
        )
    records, missing, bad = [], [], []
    for line, row in enumerate(frame.itertuples(index=False), start=2):
        fields = row._asdict()
        value = str(fields[site_column])
        if value not in wanted:
            continue
        if fields["cancer"] not in ("0", "1"):
            bad.append(f"line {line}: cancer={fields['cancer']!r}")
            continue
        rel = f"{images}/{fields['patient_id']}/{fields['image_id']}.dcm"
        if not (root / rel).is_file():
            missing.append(str(root / rel))
            continue
        records.append(
            Mammogram(f"{KEY}/{rel}", int(fields["cancer"]), str(fields["patient_id"]), f"{site_column}_{value}")
        )
    if bad:
        raise DataError(f"{path}: the cancer column must be 0 or 1: {'; '.join(bad[:5])}")
    refuse_missing(missing, path, _SOURCE, LAYOUT, RSNA_PAGE)
    if not records:
        raise DataError(f"{path}: no image of {site_column} in {wanted}; add rows or pick other sites")
    return records
