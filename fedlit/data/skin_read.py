"""Reading the five skin cancer sources of :class:`~fedlit.data.skin_sources.SkinSources` from their publishers'
files, each diagnosis mapped to one of the 8 ISIC 2019 classes (as the FedPxN authors' preprocessing does), every
row left out counted under its reason, every missing file named with its download page."""

from __future__ import annotations

import csv
import io
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from fedlit.core.errors import DataError, InputFileError
from fedlit.data.common.samples import is_image
from fedlit.data.common.text import decode_utf8

#: The 8 diagnostic classes of ISIC 2019, in target order (the columns of its ground truth CSV).
CLASS_NAMES = ("MEL", "NV", "BCC", "AK", "BKL", "DF", "VASC", "SCC")
#: The five sites (clients), in the FedPxN authors' order.
SITES = ("barcelona", "rosendahl", "vienna", "pad_ufes_20", "derm7pt")
#: The sites whose images come from ISIC 2019 (the sources layout) or from FLamby's Fed-ISIC2019.
ISIC_SITES = ("barcelona", "rosendahl", "vienna")

ISIC = "ISIC_2019"
ISIC_TRUTH = "ISIC_2019_Training_GroundTruth.csv"
ISIC_META = "ISIC_2019_Training_Metadata.csv"
ISIC_IMAGES = "ISIC_2019_Training_Input"
HAM = "HAM10000"
HAM_META = ("HAM10000_metadata.csv", "HAM10000_metadata")  # the Dataverse name, and the name without suffix
HAM_IMAGES = ("HAM10000_images_part_1", "HAM10000_images_part_2", ".")
PAD, PAD_META = "PAD-UFES-20", "metadata.csv"
DERM, DERM_META, DERM_IMAGES = "Derm7pt", "meta/meta.csv", "images"
FLAMBY, FLAMBY_SPLIT, FLAMBY_IMAGES = "fed_isic2019", "train_test_split", "ISIC_2019_Training_Input_preprocessed"

PAGES = {
    ISIC: "https://challenge.isic-archive.com/data/#2019",
    HAM: "https://doi.org/10.7910/DVN/DBW86T",
    PAD: "https://data.mendeley.com/datasets/zr7vgbcyr2/1",
    DERM: "https://derm.cs.sfu.ca/",
    FLAMBY: "https://github.com/owkin/FLamby (flamby/datasets/fed_isic2019)",
}

#: HAM10000's ``dataset`` column -> site: Rosendahl's practice, and the three Vienna sources together.
HAM_SITES = {"rosendahl": "rosendahl", "vidir_modern": "vienna", "vidir_molemax": "vienna", "vienna_dias": "vienna"}
HAM_CLASSES = {"akiec": "AK", "bcc": "BCC", "bkl": "BKL", "df": "DF", "mel": "MEL", "nv": "NV", "vasc": "VASC"}
# Seborrheic keratosis is one of ISIC 2019's benign keratoses (BKL); actinic keratosis is AK.
PAD_CLASSES = {"ACK": "AK", "BCC": "BCC", "MEL": "MEL", "NEV": "NV", "SCC": "SCC", "SEK": "BKL"}
# Lentigo, melanosis and miscellaneous have no ISIC 2019 class: left out, as the FedPxN authors leave them out.
DERM_CLASSES = {
    "basal cell carcinoma": "BCC",
    "blue nevus": "NV",
    "clark nevus": "NV",
    "combined nevus": "NV",
    "congenital nevus": "NV",
    "dermal nevus": "NV",
    "recurrent nevus": "NV",
    "reed or spitz nevus": "NV",
    "dermatofibroma": "DF",
    "melanoma": "MEL",
    "melanoma (in situ)": "MEL",
    "melanoma (less than 0.76 mm)": "MEL",
    "melanoma (0.76 to 1.5 mm)": "MEL",
    "melanoma (more than 1.5 mm)": "MEL",
    "melanoma metastasis": "MEL",
    "seborrheic keratosis": "BKL",
    "vascular lesion": "VASC",
}
#: FLamby's Fed-ISIC2019 centers -> site (its 4, MSK, is no site of the benchmark and is left out).
FLAMBY_CENTERS = {"0": "barcelona", "1": "vienna", "2": "vienna", "3": "rosendahl", "5": "vienna"}


@dataclass
class Sources:
    """What the readers found: per site, (image path relative to the root, class name) rows in file order; per file
    read (relative to the root), the rows left out by reason."""

    rows: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    left_out: dict[str, dict[str, int]] = field(default_factory=dict)

    def add(self, site: str, identity: str, label: str) -> None:
        self.rows.setdefault(site, []).append((identity, label))

    def leave_out(self, root: Path, table: Path, reasons: Counter[str]) -> None:
        if reasons:
            self.left_out[table.relative_to(root).as_posix()] = dict(sorted(reasons.items()))


def sources_layout(sites: Iterable[str]) -> str:
    """The files the sites need under the root, as an error message names them, with the download pages."""
    sites = set(sites)
    parts = []
    if sites & set(ISIC_SITES):
        parts.append(
            f"{ISIC}/ ({ISIC_TRUTH}, {ISIC_META}, {ISIC_IMAGES}/; {PAGES[ISIC]}) and {HAM}/ ({HAM_META[0]}, "
            f"{HAM_IMAGES[0]}/, {HAM_IMAGES[1]}/; {PAGES[HAM]}), or FLamby's Fed-ISIC2019 as {FLAMBY}/ "
            f"({FLAMBY_SPLIT}, {FLAMBY_IMAGES}/; {PAGES[FLAMBY]})"
        )
    if "pad_ufes_20" in sites:
        parts.append(f"{PAD}/ ({PAD_META}, images/; {PAGES[PAD]})")
    if "derm7pt" in sites:
        parts.append(f"{DERM}/ (the release_v0 folder: {DERM_META}, {DERM_IMAGES}/; {PAGES[DERM]})")
    return "; ".join(parts)


def read_table(path: Path, columns: tuple[str, ...], source: str, what: str) -> list[tuple[int, dict[str, str]]]:
    """(line, row) of every line of a publisher's CSV, fields stripped.

    Raises:
        InputFileError: naming the file and the download page when it does not exist.
        DataError: naming the file, the columns lacking and those found, when it is not the publisher's file.
    """
    if not path.is_file():
        raise InputFileError(f"{path}: no such file ({what}); download it from {PAGES[source]}")
    text = decode_utf8(path, path.read_bytes())
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = [name.strip() for name in reader.fieldnames or []]
    reader.fieldnames = header
    missing = [c for c in columns if c not in header]
    if missing:
        raise DataError(
            f"{path}: no column {', '.join(repr(c) for c in missing)} (its columns: {header}); it is not {what}: "
            f"download it again from {PAGES[source]}"
        )
    try:
        return [(reader.line_num, {k: (v or "").strip() for k, v in row.items() if k}) for row in reader]
    except csv.Error as err:
        raise DataError(f"{path}: line {reader.line_num}: not valid CSV ({err})") from None


def _missing_images(table: Path, absent: list[str], where: str, source: str) -> DataError:
    shown = ", ".join(absent[:3]) + (", ..." if len(absent) > 3 else "")
    return DataError(
        f"{table}: {len(absent)} listed images are not in {where} ({shown}); unpack the images there as "
        f"{PAGES[source]} ships them, or drop the site with data.init_args.sites"
    )


def _image_index(folders: Iterable[Path], recursive: bool) -> dict[str, Path]:
    """File name -> path of every image in ``folders`` (the first one found wins)."""
    found: dict[str, Path] = {}
    for folder in folders:
        if not folder.is_dir():
            continue
        walk = os.walk(folder) if recursive else [(str(folder), [], os.listdir(folder))]
        for parent, _, names in walk:
            for name in sorted(names):
                if is_image(name):
                    found.setdefault(name, Path(parent) / name)
    return found


def read_isic(root: Path, out: Sources) -> None:
    """Barcelona from ISIC 2019's publisher files: the images whose ``lesion_id`` is one of BCN_20000's; those of
    HAM10000 (the rosendahl and vienna sites, read from HAM10000/) and of other origins are counted as left out."""
    folder = root / ISIC
    truth = read_table(folder / ISIC_TRUTH, ("image", *CLASS_NAMES), ISIC, "ISIC 2019's training ground truth")
    meta = read_table(folder / ISIC_META, ("image", "lesion_id"), ISIC, "ISIC 2019's training metadata")
    lesion = {row["image"]: row["lesion_id"] for _, row in meta}
    reasons: Counter[str] = Counter()
    absent = []
    for line, row in truth:
        origin = lesion.get(row["image"], "")
        if origin.startswith("HAM"):
            reasons["a HAM10000 image (sites rosendahl and vienna read it from HAM10000/)"] += 1
            continue
        if not origin.startswith("BCN"):
            reasons["not from BCN_20000 (lesion_id neither BCN_ nor HAM_: MSK or unknown)"] += 1
            continue
        try:
            hot = [name for name in CLASS_NAMES if float(row[name]) == 1.0]
        except ValueError:
            raise DataError(f"{folder / ISIC_TRUTH}: line {line}: class columns must be 0 or 1, got {row}") from None
        if len(hot) != 1:
            reasons["no single class of the 8 (UNK)"] += 1
            continue
        identity = f"{ISIC}/{ISIC_IMAGES}/{row['image']}.jpg"
        if not (root / identity).is_file():
            absent.append(row["image"] + ".jpg")
        out.add("barcelona", identity, hot[0])
    if absent:
        raise _missing_images(folder / ISIC_TRUTH, absent, str(folder / ISIC_IMAGES), ISIC)
    out.leave_out(root, folder / ISIC_TRUTH, reasons)


def ham_metadata(root: Path) -> Path:
    """The HAM10000 metadata file found (``HAM10000_metadata.csv`` or without suffix), else the one expected."""
    found = [root / HAM / name for name in HAM_META if (root / HAM / name).is_file()]
    return found[0] if found else root / HAM / HAM_META[0]


def read_ham(root: Path, sites: set[str], out: Sources) -> None:
    """Rosendahl and Vienna from HAM10000's metadata (its ``dataset`` column) and its two image folders."""
    table = ham_metadata(root)
    rows = read_table(table, ("image_id", "dx", "dataset"), HAM, "HAM10000's metadata")
    index = _image_index([root / HAM / part for part in HAM_IMAGES], recursive=False)
    reasons: Counter[str] = Counter()
    absent = []
    for _, row in rows:
        site = HAM_SITES.get(row["dataset"])
        if site is None:
            reasons[f"dataset {row['dataset']!r} (no site)"] += 1
        elif row["dx"] not in HAM_CLASSES:
            reasons[f"dx {row['dx']!r} (no ISIC 2019 class)"] += 1
        elif site in sites:
            path = index.get(row["image_id"] + ".jpg")
            if path is None:
                absent.append(row["image_id"] + ".jpg")
            else:
                out.add(site, path.relative_to(root).as_posix(), HAM_CLASSES[row["dx"]])
    if absent:
        where = " or ".join(str(root / HAM / p) for p in HAM_IMAGES[:2])
        raise _missing_images(table, absent, where, HAM)
    out.leave_out(root, table, reasons)


def read_flamby(root: Path, sites: set[str], out: Sources) -> None:
    """Barcelona, Rosendahl and Vienna from FLamby's Fed-ISIC2019: its ``train_test_split`` CSV (``center``,
    ``target``) and its preprocessed images; FLamby's own train/test folds are not used."""
    folder = root / FLAMBY
    table = folder / FLAMBY_SPLIT
    rows = read_table(table, ("image", "target", "center"), FLAMBY, "FLamby's Fed-ISIC2019 train_test_split")
    reasons: Counter[str] = Counter()
    absent = []
    for line, row in rows:
        site = FLAMBY_CENTERS.get(row["center"])
        if site is None:
            reasons[f"center {row['center']!r} (MSK, no site)"] += 1
            continue
        if row["target"] not in {str(i) for i in range(len(CLASS_NAMES))}:
            raise DataError(f"{table}: line {line}: target must be 0..7, got {row['target']!r}")
        if site in sites:
            identity = f"{FLAMBY}/{FLAMBY_IMAGES}/{row['image']}.jpg"
            if not (root / identity).is_file():
                absent.append(row["image"] + ".jpg")
            out.add(site, identity, CLASS_NAMES[int(row["target"])])
    if absent:
        raise _missing_images(table, absent, str(folder / FLAMBY_IMAGES), FLAMBY)
    out.leave_out(root, table, reasons)


def read_pad(root: Path, out: Sources) -> None:
    """PAD-UFES-20 from its ``metadata.csv`` (``img_id``, ``diagnostic``) and its images (found at any depth under
    the folder: the publisher's images/imgs_part_1..3, or all in one folder)."""
    table = root / PAD / PAD_META
    rows = read_table(table, ("img_id", "diagnostic"), PAD, "PAD-UFES-20's metadata")
    index = _image_index([root / PAD], recursive=True)
    reasons: Counter[str] = Counter()
    absent = []
    for _, row in rows:
        label = PAD_CLASSES.get(row["diagnostic"])
        if label is None:
            reasons[f"diagnostic {row['diagnostic']!r} (no ISIC 2019 class)"] += 1
            continue
        path = index.get(row["img_id"])
        if path is None:
            absent.append(row["img_id"])
        else:
            out.add("pad_ufes_20", path.relative_to(root).as_posix(), label)
    if absent:
        raise _missing_images(table, absent, str(root / PAD / "images"), PAD)
    out.leave_out(root, table, reasons)


def read_derm7pt(root: Path, out: Sources) -> None:
    """Derm7pt from ``meta/meta.csv`` (``diagnosis``; the dermoscopic image ``derm``, under ``images/``)."""
    table = root / DERM / DERM_META
    rows = read_table(table, ("diagnosis", "derm"), DERM, "Derm7pt's meta.csv")
    reasons: Counter[str] = Counter()
    absent = []
    for _, row in rows:
        label = DERM_CLASSES.get(row["diagnosis"])
        if label is None:
            reasons[f"diagnosis {row['diagnosis']!r} (no ISIC 2019 class)"] += 1
            continue
        identity = f"{DERM}/{DERM_IMAGES}/{row['derm']}"
        if not (root / identity).is_file():
            absent.append(row["derm"])
        out.add("derm7pt", identity, label)
    if absent:
        raise _missing_images(table, absent, str(root / DERM / DERM_IMAGES), DERM)
    out.leave_out(root, table, reasons)
