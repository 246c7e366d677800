"""The PhysioNet/CinC Challenge 2021's scored diagnoses, its weight matrix, and its WFDB headers.

Reyna et al., "Will Two Do? Varying Dimensions in Electrocardiography: The PhysioNet/Computing in Cardiology
Challenge 2021", CinC 2021 (https://physionet.org/content/challenge-2021/). The challenge scores 26 classes: 30
SNOMED CT codes, four pairs of which it scores as one diagnosis (complete and plain left bundle branch block,
complete and plain right bundle branch block, premature atrial contraction and supraventricular premature beats,
premature ventricular contractions and ventricular premature beats). The classes, their order and the weight matrix
are those of the challenge's ``weights.csv`` (github.com/physionetchallenges/evaluation-2021): ``WEIGHTS[i][j]`` is
the credit of output class ``j`` on a record labelled ``i``; sinus rhythm (``426783006``) is the normal class.

A record is a header ``<record>.hea`` and a MATLAB file ``<record>.mat`` holding the digital signal ``val``
(leads x samples). The header's first line is ``<record> <leads> <Hz> <samples> ...``; one line per lead follows,
``<file> <format> <gain>/mV <bits> <baseline> ... <lead name>``; comments ``#Age: 74``, ``#Sex: Male`` and
``#Dx: 164889003,59118001`` (SNOMED CT codes) close it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedlit.core.errors import DataError

URL = "https://physionet.org/content/challenge-2021/"
#: The scored classes in ``weights.csv`` order: (abbreviation, SNOMED CT codes scored as that class).
SCORED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("AF", ("164889003",)),
    ("AFL", ("164890007",)),
    ("BBB", ("6374002",)),
    ("Brady", ("426627000",)),
    ("CLBBB|LBBB", ("733534002", "164909002")),
    ("CRBBB|RBBB", ("713427006", "59118001")),
    ("IAVB", ("270492004",)),
    ("IRBBB", ("713426002",)),
    ("LAD", ("39732003",)),
    ("LAnFB", ("445118002",)),
    ("LPR", ("164947007",)),
    ("LQRSV", ("251146004",)),
    ("LQT", ("111975006",)),
    ("NSIVCB", ("698252002",)),
    ("NSR", ("426783006",)),
    ("PAC|SVPB", ("284470004", "63593006")),
    ("PR", ("10370003",)),
    ("PRWP", ("365413008",)),
    ("PVC|VPB", ("427172004", "17338001")),
    ("QAb", ("164917005",)),
    ("RAD", ("47665007",)),
    ("SA", ("427393009",)),
    ("SB", ("426177001",)),
    ("STach", ("427084000",)),
    ("TAb", ("164934002",)),
    ("TInv", ("59931005",)),
)
CLASS_NAMES: tuple[str, ...] = tuple(name for name, _ in SCORED)
#: SNOMED CT code of sinus rhythm, the challenge's normal class (its inactive classifier outputs it alone).
NORMAL_CODE = "426783006"
NORMAL_INDEX = next(i for i, (_, codes) in enumerate(SCORED) if NORMAL_CODE in codes)
#: The standard twelve leads, the order the loader gives them in.
LEADS = ("I", "II", "III", "aVR", "aVL", "aVF", "V1", "V2", "V3", "V4", "V5", "V6")
# weights.csv's matrix, row by row (26 values a row, written over two lines), as the challenge publishes it.
_WEIGHTS_TEXT = """
    1 0.5 0.475 0.3 0.475 0.4 0.3 0.3 0.35 0.35 0.3 0.425 0.45
    0.35 0.25 0.3375 0.375 0.425 0.375 0.4 0.35 0.3 0.3 0.375 0.5 0.5
    0.5 1 0.475 0.3 0.475 0.4 0.3 0.3 0.35 0.35 0.3 0.425 0.45
    0.35 0.25 0.3375 0.375 0.425 0.375 0.4 0.35 0.3 0.3 0.375 0.5 0.5
    0.475 0.475 1 0.325 0.475 0.425 0.325 0.325 0.375 0.375 0.325 0.45 0.475
    0.375 0.275 0.3625 0.4 0.45 0.4 0.375 0.375 0.325 0.325 0.4 0.475 0.475
    0.3 0.3 0.325 1 0.325 0.4 0.5 0.5 0.45 0.45 0.5 0.375 0.35
    0.45 0.45 0.4625 0.425 0.375 0.425 0.2 0.45 0.5 0.5 0.425 0.3 0.3
    0.475 0.475 0.475 0.325 1 0.425 0.325 0.325 0.375 0.375 0.325 0.45 0.475
    0.375 0.275 0.3625 0.4 0.45 0.4 0.375 0.375 0.325 0.325 0.4 0.475 0.475
    0.4 0.4 0.425 0.4 0.425 1 0.4 0.4 0.45 0.45 0.4 0.475 0.45
    0.45 0.35 0.4375 0.475 0.475 0.475 0.3 0.45 0.4 0.4 0.475 0.4 0.4
    0.3 0.3 0.325 0.5 0.325 0.4 1 0.5 0.45 0.45 0.5 0.375 0.35
    0.45 0.45 0.4625 0.425 0.375 0.425 0.2 0.45 0.5 0.5 0.425 0.3 0.3
    0.3 0.3 0.325 0.5 0.325 0.4 0.5 1 0.45 0.45 0.5 0.375 0.35
    0.45 0.45 0.4625 0.425 0.375 0.425 0.2 0.45 0.5 0.5 0.425 0.3 0.3
    0.35 0.35 0.375 0.45 0.375 0.45 0.45 0.45 1 0.5 0.45 0.425 0.4
    0.5 0.4 0.4875 0.475 0.425 0.475 0.25 0.5 0.45 0.45 0.475 0.35 0.35
    0.35 0.35 0.375 0.45 0.375 0.45 0.45 0.45 0.5 1 0.45 0.425 0.4
    0.5 0.4 0.4875 0.475 0.425 0.475 0.25 0.5 0.45 0.45 0.475 0.35 0.35
    0.3 0.3 0.325 0.5 0.325 0.4 0.5 0.5 0.45 0.45 1 0.375 0.35
    0.45 0.45 0.4625 0.425 0.375 0.425 0.2 0.45 0.5 0.5 0.425 0.3 0.3
    0.425 0.425 0.45 0.375 0.45 0.475 0.375 0.375 0.425 0.425 0.375 1 0.475
    0.425 0.325 0.4125 0.45 0.475 0.45 0.325 0.425 0.375 0.375 0.45 0.425 0.425
    0.45 0.45 0.475 0.35 0.475 0.45 0.35 0.35 0.4 0.4 0.35 0.475 1
    0.4 0.3 0.3875 0.425 0.475 0.425 0.35 0.4 0.35 0.35 0.425 0.45 0.45
    0.35 0.35 0.375 0.45 0.375 0.45 0.45 0.45 0.5 0.5 0.45 0.425 0.4
    1 0.4 0.4875 0.475 0.425 0.475 0.25 0.5 0.45 0.45 0.475 0.35 0.35
    0.25 0.25 0.275 0.45 0.275 0.35 0.45 0.45 0.4 0.4 0.45 0.325 0.3
    0.4 1 0.4125 0.375 0.325 0.375 0.15 0.4 0.45 0.45 0.375 0.25 0.25
    0.3375 0.3375 0.3625 0.4625 0.3625 0.4375 0.4625 0.4625 0.4875 0.4875 0.4625 0.4125 0.3875
    0.4875 0.4125 1 0.4625 0.4125 0.4625 0.2375 0.4875 0.4625 0.4625 0.4625 0.3375 0.3375
    0.375 0.375 0.4 0.425 0.4 0.475 0.425 0.425 0.475 0.475 0.425 0.45 0.425
    0.475 0.375 0.4625 1 0.45 0.5 0.275 0.475 0.425 0.425 0.5 0.375 0.375
    0.425 0.425 0.45 0.375 0.45 0.475 0.375 0.375 0.425 0.425 0.375 0.475 0.475
    0.425 0.325 0.4125 0.45 1 0.45 0.325 0.425 0.375 0.375 0.45 0.425 0.425
    0.375 0.375 0.4 0.425 0.4 0.475 0.425 0.425 0.475 0.475 0.425 0.45 0.425
    0.475 0.375 0.4625 0.5 0.45 1 0.275 0.475 0.425 0.425 0.5 0.375 0.375
    0.4 0.4 0.375 0.2 0.375 0.3 0.2 0.2 0.25 0.25 0.2 0.325 0.35
    0.25 0.15 0.2375 0.275 0.325 0.275 1 0.25 0.2 0.2 0.275 0.4 0.4
    0.35 0.35 0.375 0.45 0.375 0.45 0.45 0.45 0.5 0.5 0.45 0.425 0.4
    0.5 0.4 0.4875 0.475 0.425 0.475 0.25 1 0.45 0.45 0.475 0.35 0.35
    0.3 0.3 0.325 0.5 0.325 0.4 0.5 0.5 0.45 0.45 0.5 0.375 0.35
    0.45 0.45 0.4625 0.425 0.375 0.425 0.2 0.45 1 0.5 0.425 0.3 0.3
    0.3 0.3 0.325 0.5 0.325 0.4 0.5 0.5 0.45 0.45 0.5 0.375 0.35
    0.45 0.45 0.4625 0.425 0.375 0.425 0.2 0.45 0.5 1 0.425 0.3 0.3
    0.375 0.375 0.4 0.425 0.4 0.475 0.425 0.425 0.475 0.475 0.425 0.45 0.425
    0.475 0.375 0.4625 0.5 0.45 0.5 0.275 0.475 0.425 0.425 1 0.375 0.375
    0.5 0.5 0.475 0.3 0.475 0.4 0.3 0.3 0.35 0.35 0.3 0.425 0.45
    0.35 0.25 0.3375 0.375 0.425 0.375 0.4 0.35 0.3 0.3 0.375 1 0.5
    0.5 0.5 0.475 0.3 0.475 0.4 0.3 0.3 0.35 0.35 0.3 0.425 0.45
    0.35 0.25 0.3375 0.375 0.425 0.375 0.4 0.35 0.3 0.3 0.375 0.5 1
"""
_values = [float(v) for v in _WEIGHTS_TEXT.split()]
WEIGHTS: tuple[tuple[float, ...], ...] = tuple(
    tuple(_values[i * len(SCORED) : (i + 1) * len(SCORED)]) for i in range(len(SCORED))
)


@dataclass(frozen=True)
class Header:
    """What the loader needs of a challenge header (module docstring).

    Attributes:
        record: the record name of the first line.
        fs: sampling frequency (Hz).
        num_samples: samples per lead.
        leads: lead names, in the order of the ``val`` rows.
        gains: ADC units per mV of each lead.
        baselines: the ADC value of 0 mV of each lead (the gain field's ``(baseline)``, else the ADC zero).
        dx: the ``#Dx`` SNOMED CT codes.
        age: ``#Age`` (NaN when absent or not a number).
        sex: ``#Sex`` ('' when absent).
    """

    record: str
    fs: float
    num_samples: int
    leads: tuple[str, ...]
    gains: tuple[float, ...]
    baselines: tuple[float, ...]
    dx: tuple[str, ...]
    age: float = math.nan
    sex: str = ""


def read_header(path: Path) -> Header:
    """Parse one challenge header ``<record>.hea``.

    Raises:
        DataError: naming the file and the line that does not follow the challenge's header format.
    """
    try:
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except UnicodeDecodeError:
        raise DataError(f"{path}: not a UTF-8 text file; a challenge header is text. {_again()}") from None
    except OSError as err:
        raise DataError(f"{path}: cannot be read ({err}). {_again()}") from None
    signal_lines = [line for line in lines if not line.startswith("#")]
    if not signal_lines:
        raise DataError(f"{path}: empty; a challenge header starts '<record> <leads> <Hz> <samples>'. {_again()}")
    first = signal_lines[0].split()
    try:
        if len(first) < 4:
            raise ValueError("fewer than 4 fields")
        num_leads, fs, num_samples = int(first[1]), float(first[2].split("/")[0]), int(first[3])
        if num_leads < 1 or not fs > 0 or num_samples < 0:
            raise ValueError("leads, Hz and samples must be positive")
    except ValueError as err:
        raise DataError(
            f"{path}, line 1 {signal_lines[0]!r}: {err}; a challenge header starts '<record> <leads> <Hz> "
            f"<samples>'. {_again()}"
        ) from None
    if len(signal_lines) < 1 + num_leads:
        raise DataError(f"{path}: {num_leads} leads announced, {len(signal_lines) - 1} lead lines. {_again()}")
    leads, gains, baselines = [], [], []
    for line in signal_lines[1 : 1 + num_leads]:
        fields = line.split()
        try:
            gain_field = fields[2].split("/")[0]
            gain_text, _, baseline_text = gain_field.partition("(")
            gain = float(gain_text)
            baseline = float(baseline_text.rstrip(")")) if baseline_text else float(fields[4])
            if not gain > 0 or len(fields) < 9:
                raise ValueError("expected 9 fields, a gain > 0 and a lead name")
        except (ValueError, IndexError) as err:
            raise DataError(
                f"{path}, lead line {line!r}: {err}; a lead line reads '<file> <format> <gain>/mV <bits> "
                f"<baseline> <first> <checksum> <block> <lead>'. {_again()}"
            ) from None
        leads.append(fields[-1])
        gains.append(gain)
        baselines.append(baseline)
    comments = {}
    for line in lines:
        if line.startswith("#") and ":" in line:
            key, _, value = line.lstrip("#").partition(":")
            comments[key.strip().lower()] = value.strip()
    age = comments.get("age", "")
    return Header(
        record=first[0],
        fs=fs,
        num_samples=num_samples,
        leads=tuple(leads),
        gains=tuple(gains),
        baselines=tuple(baselines),
        dx=tuple(code.strip() for code in comments.get("dx", "").split(",") if code.strip()),
        age=float(age) if _is_number(age) else math.nan,
        sex=comments.get("sex", ""),
    )


def scored_targets(dx: tuple[str, ...] | list[str]) -> np.ndarray:
    """The 0/1 float32 (26,) target of a record's ``#Dx`` codes: class ``i`` is 1 when any of its codes is there
    (equivalent codes count as one class); codes the challenge does not score are ignored."""
    codes = set(dx)
    return np.asarray([float(bool(codes & set(group))) for _, group in SCORED], dtype=np.float32)


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _again() -> str:
    return f"Download the challenge's training data again from {URL}"
