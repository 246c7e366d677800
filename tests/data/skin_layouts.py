"""Tiny copies of the publishers' layouts of the five skin cancer sources (ISIC 2019, HAM10000, PAD-UFES-20,
Derm7pt) and of FLamby's Fed-ISIC2019, written with a few 8x8 images, for the tests of ``SkinSources``.

Per copy (``copies`` repeats every row under new names), each site has 10 images of known classes, and some rows
that the benchmark leaves out; ``EXPECTED`` and ``LEFT_OUT`` are those counts, worked out from the rows below.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from PIL import Image

CLASSES = ("MEL", "NV", "BCC", "AK", "BKL", "DF", "VASC", "SCC")

# (label in the publisher's words, how many per copy)
BARCELONA = [("MEL", 4), ("NV", 3), ("BCC", 3)]
ROSENDAHL = [("mel", 3), ("nv", 4), ("bkl", 3)]
VIENNA = [("nv", 4), ("akiec", 3), ("df", 3)]  # over vidir_modern, vidir_molemax and vienna_dias
PAD = [("ACK", 3), ("SEK", 3), ("NEV", 2), ("SCC", 2)]
DERM = [("clark nevus", 3), ("melanoma (in situ)", 3), ("seborrheic keratosis", 2), ("vascular lesion", 2)]
DERM_LEFT_OUT = [("lentigo", 2), ("miscellaneous", 1)]

#: Per site, the images per class (in CLASSES order) of one copy.
EXPECTED = {
    "barcelona": [4, 3, 3, 0, 0, 0, 0, 0],
    "rosendahl": [3, 4, 0, 0, 3, 0, 0, 0],
    "vienna": [0, 4, 0, 3, 0, 3, 0, 0],
    "pad_ufes_20": [0, 2, 0, 3, 3, 0, 0, 2],
    "derm7pt": [3, 3, 0, 0, 2, 0, 2, 0],
}


def left_out(copies: int = 1) -> dict[str, dict[str, int]]:
    """The manifest's ``left_out`` of the publishers' layout: per file, the rows left out by reason."""
    return {
        "HAM10000/HAM10000_metadata.csv": {"dataset 'external' (no site)": 1 * copies},
        "ISIC_2019/ISIC_2019_Training_GroundTruth.csv": {
            "a HAM10000 image (sites rosendahl and vienna read it from HAM10000/)": 2 * copies,
            "no single class of the 8 (UNK)": 1 * copies,
            "not from BCN_20000 (lesion_id neither BCN_ nor HAM_: MSK or unknown)": 1 * copies,
        },
        "Derm7pt/meta/meta.csv": {
            "diagnosis 'lentigo' (no ISIC 2019 class)": 2 * copies,
            "diagnosis 'miscellaneous' (no ISIC 2019 class)": 1 * copies,
        },
    }


def image(path: Path, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)


def _csv(path: Path, header: list[str], rows: list[list[object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def _labels(spec: list[tuple[str, int]], copies: int) -> list[str]:
    return [label for _ in range(copies) for label, count in spec for _ in range(count)]


def write_isic(root: Path, copies: int = 1) -> None:
    """ISIC_2019/: ground truth, metadata and the BCN images; HAM, MSK and UNK rows that Barcelona leaves out."""
    folder = root / "ISIC_2019"
    truth, meta = [], []
    for i, label in enumerate(_labels(BARCELONA, copies)):
        name = f"ISIC_{60000 + i:07d}"
        truth.append([name, *(float(c == label) for c in CLASSES), 0.0])
        meta.append([name, 50, "anterior torso", f"BCN_{i:07d}", "male"])
        image(folder / "ISIC_2019_Training_Input" / f"{name}.jpg", i)
    for c in range(copies):
        others = [  # two HAM10000 images, and one of MSK (no lesion_id)
            (f"ISIC_{24306 + 10 * c}", "HAM_0000550"),
            (f"ISIC_{24307 + 10 * c}", "HAM_0003577"),
            (f"ISIC_{12000 + c:07d}_downsampled", ""),
        ]
        for name, lesion in others:
            truth.append([name, 0.0, 1.0, *([0.0] * 7)])
            meta.append([name, 40, "head/neck", lesion, "female"])
        name = f"ISIC_{70000 + c:07d}"  # BCN, but no class of the 8
        truth.append([name, *([0.0] * 8), 1.0])
        meta.append([name, 60, "", f"BCN_{90000 + c:07d}", "male"])
    _csv(folder / "ISIC_2019_Training_GroundTruth.csv", ["image", *CLASSES, "UNK"], truth)
    _csv(
        folder / "ISIC_2019_Training_Metadata.csv",
        ["image", "age_approx", "anatom_site_general", "lesion_id", "sex"],
        meta,
    )


def write_ham(root: Path, copies: int = 1) -> None:
    """HAM10000/: HAM10000_metadata.csv and its images in the two part folders; one row of an unknown source."""
    folder = root / "HAM10000"
    sources = ["vidir_modern"] * 4 + ["vidir_molemax"] * 3 + ["vienna_dias"] * 3
    rows = []
    for site, spec in (("rosendahl", ROSENDAHL), ("vienna", VIENNA)):
        for i, dx in enumerate(_labels(spec, copies)):
            name = f"ISIC_{(30000 if site == 'rosendahl' else 40000) + i:07d}"
            source = "rosendahl" if site == "rosendahl" else sources[i % 10]
            rows.append([f"HAM_{i:07d}", name, dx, "histo", 50.0, "male", "back", source])
            image(folder / f"HAM10000_images_part_{1 + i % 2}" / f"{name}.jpg", 1000 + i)
    rows += [
        ["HAM_9999999", f"ISIC_{50000 + c:07d}", "nv", "histo", 30.0, "male", "back", "external"] for c in range(copies)
    ]
    header = ["lesion_id", "image_id", "dx", "dx_type", "age", "sex", "localization", "dataset"]
    _csv(folder / "HAM10000_metadata.csv", header, rows)


def write_pad(root: Path, copies: int = 1) -> None:
    """PAD-UFES-20/: metadata.csv and its PNG images under images/imgs_part_1 and imgs_part_2."""
    folder = root / "PAD-UFES-20"
    rows = []
    for i, diagnostic in enumerate(_labels(PAD, copies)):
        name = f"PAT_{i}_{100 + i}_{200 + i}.png"
        rows.append([f"PAT_{i}", f"{100 + i}", "True", 55, diagnostic, name, "True"])
        image(folder / "images" / f"imgs_part_{1 + i % 2}" / name, 2000 + i)
    _csv(folder / "metadata.csv", ["patient_id", "lesion_id", "smoke", "age", "diagnostic", "img_id", "biopsed"], rows)


def write_derm7pt(root: Path, copies: int = 1) -> None:
    """Derm7pt/: meta/meta.csv and the dermoscopic and clinical images under images/<folder>/."""
    folder = root / "Derm7pt"
    rows = []
    for i, diagnosis in enumerate(_labels(DERM + DERM_LEFT_OUT, copies)):
        derm, clinic = f"A{i % 3}/Aal{i:03d}.jpg", f"A{i % 3}/Aac{i:03d}.jpg"
        rows.append([i + 1, diagnosis, 3, "present", clinic, derm, "back"])
        if diagnosis not in dict(DERM_LEFT_OUT):
            image(folder / "images" / derm, 3000 + i)
    _csv(
        folder / "meta" / "meta.csv",
        ["case_num", "diagnosis", "seven_point_score", "pigment_network", "clinic", "derm", "location"],
        rows,
    )


def write_flamby(root: Path, copies: int = 1) -> None:
    """fed_isic2019/: FLamby's train_test_split (centers 0, 1, 2, 3, 5 of the sites, 4 = MSK) and its images."""
    folder = root / "fed_isic2019"
    rows = []
    vienna_centers = [1] * 4 + [2] * 3 + [5] * 3
    specs = [
        (0, BARCELONA, None),
        (3, [("MEL", 3), ("NV", 4), ("BKL", 3)], None),
        (None, [("NV", 4), ("AK", 3), ("DF", 3)], vienna_centers),
    ]
    for k, (center, spec, centers) in enumerate(specs):
        for i, label in enumerate(_labels(spec, copies)):
            name = f"ISIC_{(k + 1) * 100000 + i:07d}"
            where = centers[i % 10] if centers else center
            target = CLASSES.index(label)
            rows.append([name, *(float(j == target) for j in range(8)), 0.0, target, where, "train", f"train_{where}"])
            image(folder / "ISIC_2019_Training_Input_preprocessed" / f"{name}.jpg", 5000 + 100 * k + i)
    rows += [[f"ISIC_{900 + j:07d}_downsampled", *([0.0] * 9), 1, 4, "test", "test_4"] for j in range(2 * copies)]
    header = ["image", *CLASSES, "UNK", "target", "center", "fold", "fold2"]
    _csv(folder / "train_test_split", header, rows)


def write_sources(root: Path, copies: int = 1) -> Path:
    """Every publisher's layout under ``root``; returns ``root``."""
    for write in (write_isic, write_ham, write_pad, write_derm7pt):
        write(root, copies)
    return root
