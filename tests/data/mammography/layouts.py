"""Generated DICOM trees in the layouts of RSNA screening, CBIS-DDSM and CMMD (tiny 16-bit images written with
pydicom, uncompressed), for the mammography loaders' tests and the breast recipes' runs."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

#: Setting 1's machines and the RSNA sites, as the generated train.csv holds them.
MACHINES = (49, 48, 29, 21)
SIZE = (32, 24)  # rows, columns


def write_dicom(
    path: Path,
    pixels: np.ndarray,
    photometric: str = "MONOCHROME2",
    window: tuple[float, float] | None = None,
    voi_function: str | None = None,
    laterality: str | None = None,
) -> Path:
    """One uncompressed 16-bit digital-mammography DICOM of ``pixels`` (uint16, rows x columns)."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid

    mammography = "1.2.840.10008.5.1.4.1.1.1.2"  # Digital Mammography X-Ray Image Storage - For Presentation
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = mammography
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID, ds.SOPInstanceUID = mammography, meta.MediaStorageSOPInstanceUID
    ds.Modality = "MG"
    ds.Rows, ds.Columns = pixels.shape
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, photometric
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 0
    if window is not None:
        ds.WindowCenter, ds.WindowWidth = window
    if voi_function is not None:
        ds.VOILUTFunction = voi_function
    if laterality is not None:
        ds.ImageLaterality = laterality
    ds.PixelData = np.ascontiguousarray(pixels, dtype="<u2").tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        ds.save_as(path, enforce_file_format=True)  # pydicom >= 3
    except TypeError:  # pydicom 2.x
        ds.is_little_endian, ds.is_implicit_VR = True, False
        ds.save_as(path, write_like_original=False)
    return path


def image(label: int, seed: int) -> np.ndarray:
    """A noisy 12-bit image whose centre is bright for a cancer (label 1): learnable in a few steps."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(500, 1500, size=SIZE)
    if label:
        pixels[8:24, 6:18] += 2000
    return pixels.astype(np.uint16)


def make_rsna(root: Path, patients_per_machine: int = 8, images_per_patient: int = 2) -> Path:
    """RSNA's train.csv and train_images/<patient_id>/<image_id>.dcm: per machine of :data:`MACHINES`
    ``patients_per_machine`` patients (every other one with cancer), machines 49 and 48 at site 1, the others at
    site 2; every fourth image MONOCHROME1, with a window."""
    rows, image_id = [], 1000
    for m, machine in enumerate(MACHINES):
        for p in range(patients_per_machine):
            patient = 10000 + 100 * m + p
            cancer = p % 2
            for i in range(images_per_patient):
                image_id += 1
                photometric = "MONOCHROME1" if image_id % 4 == 0 else "MONOCHROME2"
                pixels = image(cancer, image_id)
                if photometric == "MONOCHROME1":
                    pixels = (4095 - pixels).astype(np.uint16)
                write_dicom(root / "train_images" / str(patient) / f"{image_id}.dcm", pixels, photometric, (2000, 4000))
                view = "CC" if i % 2 == 0 else "MLO"
                rows.append([1 if m < 2 else 2, patient, image_id, "L", view, 60, cancer, machine])
    with (root / "train.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["site_id", "patient_id", "image_id", "laterality", "view", "age", "cancer", "machine_id"])
        writer.writerows(rows)
    return root


def make_cbis_ddsm(root: Path, patients: int = 8) -> Path:
    """CBIS-DDSM's mass train/test CSVs and the case folders as the NBIA Data Retriever writes them (the CSV's
    study and series folders renamed), every other patient MALIGNANT, the others BENIGN or BENIGN_WITHOUT_CALLBACK;
    the ROI mask of each case in its ``_1`` folder."""
    header = ["patient_id", "breast_density", "left or right breast", "image view", "abnormality id"]
    header += ["abnormality type", "pathology", "image file path", "cropped image file path", "ROI mask file path"]
    tables = {"mass_case_description_train_set.csv": [], "mass_case_description_test_set.csv": []}
    for p in range(patients):
        patient = f"P_{p + 1:05d}"
        split = "Training" if p < patients * 3 // 4 else "Test"
        pathology = "MALIGNANT" if p % 2 else ("BENIGN" if p % 4 == 0 else "BENIGN_WITHOUT_CALLBACK")
        for view in ("CC", "MLO"):
            case = f"Mass-{split}_{patient}_LEFT_{view}"
            written = f"{case}/1.3.6.1.4.1.9590.{p}/1.3.6.1.4.1.9590.{p}.1/000000.dcm"
            on_disk = root / case / "07-20-2016-DDSM-74994" / "1.000000-full mammogram images-24515" / "1-1.dcm"
            write_dicom(on_disk, image(int(pathology == "MALIGNANT"), p * 2 + len(view)))
            write_dicom(root / f"{case}_1" / "x" / "1.000000-ROI mask images-1" / "1-1.dcm", image(0, 0))
            row = [patient, 3, "LEFT", view, 1, "mass", pathology, written, f"{case}_1/a/b/000000.dcm", ""]
            tables[f"mass_case_description_{'train' if split == 'Training' else 'test'}_set.csv"].append(row)
    for name, rows in tables.items():
        with (root / name).open("w", newline="") as f:
            csv.writer(f).writerows([header, *rows])
    return root


def make_cmmd(root: Path, patients: int = 8) -> Path:
    """CMMD's clinical table as CSV and ``<ID1>/<study>/<series>/1-<n>.dcm``: two images of the left breast per
    patient (every other one Malignant) and one of the right breast, which has no line (left out)."""
    rows = [["ID1", "LeftRight", "Age", "number", "abnormality", "classification", "subtype"]]
    for p in range(patients):
        patient = f"D1-{p + 1:04d}"
        kind = "Malignant" if p % 2 else "Benign"
        rows.append([patient, "L", 50, 2, "mass", kind, ""])
        series = root / patient / "07-18-2010-NA-NA-79377" / "1.000000-NA-70244"
        for n, side in enumerate(("L", "L", "R"), start=1):
            write_dicom(series / f"1-{n}.dcm", image(int(kind == "Malignant"), 100 * p + n), laterality=side)
    with (root / "CMMD_clinicaldata_revision.csv").open("w", newline="") as f:
        csv.writer(f).writerows(rows)
    return root
