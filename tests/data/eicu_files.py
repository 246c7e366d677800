"""A tiny eICU folder in the layout the FedPxN authors' preprocessing leaves (``patient.csv`` and
``cached_data/<patientunitstayid>.pt``), for the loader's, the model's and the recipes' tests."""

from __future__ import annotations

from pathlib import Path

import torch

#: Stays per hospital of the generated folder: the FedPxN paper's five largest first, then two more.
STAYS = {73: 10, 264: 9, 420: 8, 243: 7, 458: 6, 443: 5, 338: 5}
SERIES, STATICS = 4, 3


def stay_labels(stay: int) -> tuple[list[float], int, int, int]:
    """The generated labels of ``stay``: (mort_24h, mort_48h, LOS with NaN for every 5th stay), disch_24h,
    disch_48h (int64's minimum, unknown, for every 7th stay) and acuity."""
    binary = [float(stay % 2), float(stay % 3 == 0), float("nan") if stay % 5 == 0 else float(stay % 4 < 2)]
    unknown = -(2**63)
    return binary, stay % 10, unknown if stay % 7 == 0 else (stay // 2) % 10, stay % 12


def write_stay(cache: Path, stay: int, hours: int = 6, series: int = SERIES, statics: int = STATICS) -> None:
    """``cache/<stay>.pt``: ``ts`` (hours, series) = stay + hour/10 + feature/100, ``statics`` = stay * 0.01 + i,
    and the labels of :func:`stay_labels`, saved as the authors' cache does (float16 floats, int64 classes)."""
    binary, disch24, disch48, acuity = stay_labels(stay)
    hour = torch.arange(hours).reshape(-1, 1) / 10
    feature = torch.arange(series).reshape(1, -1) / 100
    torch.save(
        {
            "ts": (stay % 100 + hour + feature).half(),
            "statics": (stay * 0.01 + torch.arange(statics)).half(),
            "tasks_binary_multilabel": torch.tensor(binary).half(),
            "disch_24h": torch.tensor([disch24]),
            "disch_48h": torch.tensor([disch48]),
            "Final Acuity Outcome": torch.tensor([acuity]),
        },
        cache / f"{stay}.pt",
    )


def write_eicu(root: Path, stays: dict[int, int] | None = None, hours: int = 6) -> Path:
    """Write the folder: hospital h gets stays h * 1000 + 1 .. h * 1000 + n (n = ``stays[h]``), each cached, plus
    one stay per hospital listed in ``patient.csv`` without a cached file (left out, as the authors' cohort
    leaves stays out); returns ``root``."""
    cache = root / "cached_data"
    cache.mkdir(parents=True, exist_ok=True)
    lines = ["patientunitstayid,patienthealthsystemstayid,hospitalid,wardid"]
    for hospital, count in (STAYS if stays is None else stays).items():
        for k in range(1, count + 2):
            stay = hospital * 1000 + k
            lines.append(f"{stay},{stay + 7},{hospital},1")
            if k <= count:
                write_stay(cache, stay, hours=hours - (k % 2))
    (root / "patient.csv").write_text("\n".join(lines) + "\n")
    return root


def write_paper_hospitals(root: Path, hospitals: int = 30, hours: int = 6) -> Path:
    """A folder with the FedPxN paper's ``hospitals`` largest hospitals, sizes 3 + ``hospitals`` - rank (strictly
    decreasing, so the ranking is the paper's)."""
    from fedlit.data.eicu import PAPER_HOSPITALS

    return write_eicu(root, {h: 3 + hospitals - i for i, h in enumerate(PAPER_HOSPITALS[:hospitals])}, hours)
