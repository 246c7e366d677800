"""A tiny PhysioNet/CinC Challenge 2021 ``training/`` folder: records written as the challenge ships them
(``<record>.hea`` text headers and MATLAB v4 ``<record>.mat`` files holding ``val``), for the loader's tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from scipy.io import savemat

LEADS = ("I", "II", "III", "aVR", "aVL", "aVF", "V1", "V2", "V3", "V4", "V5", "V6")
FOLDERS = ("chapman_shaoxing", "cpsc_2018", "cpsc_2018_extra", "georgia", "ningbo", "ptb-xl")
# Diagnoses dealt to the generated records in turn: AF; sinus rhythm; RBBB (scored as CRBBB|RBBB) with an
# unscored code; VPB (scored as PVC|VPB) with sinus bradycardia; T wave abnormal.
DX = ("164889003", "426783006", "59118001,251173003", "17338001,426177001", "164934002")


def write_record(
    folder: Path,
    name: str,
    val: np.ndarray,
    *,
    fs: int = 500,
    dx: str = "426783006",
    leads: tuple[str, ...] = LEADS,
    gain: float = 1000.0,
    baseline: int = 0,
) -> Path:
    """Write ``<folder>/<name>.hea`` and ``.mat`` (``val``: int16 leads x samples); returns the header's path."""
    folder.mkdir(parents=True, exist_ok=True)
    savemat(str(folder / f"{name}.mat"), {"val": val.astype(np.int16)}, format="4")
    lines = [f"{name} {len(leads)} {fs} {val.shape[1]} 05-Feb-2020 11:39:16"]
    for lead, row in zip(leads, val, strict=True):
        lines.append(f"{name}.mat 16+24 {gain:g}/mV 16 {baseline} {int(row[0])} 0 0 {lead}")
    lines += ["#Age: 63", "#Sex: Female", f"#Dx: {dx}", "#Rx: Unknown", "#Hx: Unknown", "#Sx: Unknown"]
    path = folder / f"{name}.hea"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_layout(root: Path, records: int = 10, seconds: float = 10.0, seed: int = 0) -> Path:
    """``records`` records of ``seconds`` s at 500 Hz in each folder of :data:`FOLDERS` (in ``g1/``), diagnoses
    from :data:`DX` in turn; returns ``root``."""
    rng = np.random.default_rng(seed)
    for f, folder in enumerate(FOLDERS):
        for r in range(records):
            val = rng.integers(-500, 500, size=(12, int(500 * seconds)))
            write_record(root / folder / "g1", f"R{f}{r:04d}", val, dx=DX[r % len(DX)])
    return root
