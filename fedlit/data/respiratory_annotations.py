"""The annotations of the respiratory-sound data sets read into cycles: ICBHI 2017's per-recording ``.txt`` files
and its challenge split, SPRSound's per-recording ``.json`` event lists.

Each reader checks every cycle against its recording's duration and names the file and line (or event) of any
fault; :mod:`fedlit.data.respiratory` turns the cycles into clients.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from fedlit.core.errors import DataError
from fedlit.data.audio_clips import clip_identity, soundfile

__all__ = [
    "ICBHI_CLASSES",
    "ICBHI_SPLIT_FILE",
    "ICBHI_URL",
    "SPRSOUND_CLASSES",
    "SPRSOUND_URL",
    "Cycle",
    "icbhi_cycles",
    "icbhi_official_test",
    "in_test_folder",
    "sprsound_cycles",
]

ICBHI_URL = "https://bhichallenge.med.auth.gr/"
SPRSOUND_URL = "https://github.com/SJTU-YONGFU-RESEARCH-GRP/SPRSound"
ICBHI_SPLIT_FILE = "ICBHI_challenge_train_test.txt"
# Label = crackles + 2 * wheezes (FHBench's numbering).
ICBHI_CLASSES = ("normal", "crackle", "wheeze", "both")
# FHBench's numbering of SPRSound's event types.
SPRSOUND_CLASSES = ("Normal", "Fine Crackle", "Wheeze", "Coarse Crackle", "Wheeze+Crackle", "Rhonchi", "Stridor")
_SPRSOUND_ALIASES = {"Wheeze & Crackle": "Wheeze+Crackle"}


class Cycle(NamedTuple):
    """One annotated cycle: its identity (``file@start:end``), class, patient and official split (or None)."""

    identity: str
    label: int
    patient: str
    official: str | None = None


def _duration(path: Path, url: str) -> float:
    sf = soundfile()
    try:
        return float(sf.info(str(path)).duration)
    except (RuntimeError, sf.LibsndfileError) as err:
        raise DataError(
            f"{path}: cannot be read as a sound file ({err}); replace it or remove it and its "
            f"annotation (download: {url})"
        ) from None


def _cycle(root: Path, wav: Path, start: float, end: float, duration: float, where: str) -> str:
    """The identity of a cycle after checking its span against the file's duration."""
    if not 0 <= start < end or start >= duration:
        raise DataError(
            f"{where}: the cycle {start}-{end} s is empty or outside {wav.name} ({duration:.3f} s "
            "long); fix or drop the line"
        )
    return clip_identity(wav.relative_to(root).as_posix(), start, end)


def icbhi_cycles(root: Path) -> list[Cycle]:
    """Every cycle of the ICBHI 2017 recordings in ``root`` (``<name>.wav`` beside ``<name>.txt``), in file order."""
    cycles = []
    for wav in sorted(root.glob("*.wav")):
        parts = wav.stem.split("_")
        if len(parts) != 5:
            raise DataError(
                f"{wav}: ICBHI names are <patient>_<index>_<location>_<mode>_<device>.wav (5 parts "
                f"joined by _), got {len(parts)}; rename or remove it"
            )
        notes = wav.with_suffix(".txt")
        if not notes.is_file():
            raise DataError(f"{wav} has no annotation file {notes.name} beside it (download: {ICBHI_URL})")
        duration = _duration(wav, ICBHI_URL)
        for number, line in enumerate(notes.read_text(encoding="utf-8").splitlines(), start=1):
            fields = line.split()
            if not fields:
                continue
            try:
                start, end = float(fields[0]), float(fields[1])
                flags = [int(f) for f in fields[2:]]
            except (ValueError, IndexError):
                flags = []
            if len(fields) != 4 or len(flags) != 2 or any(f not in (0, 1) for f in flags):
                raise DataError(
                    f"{notes}, line {number}: expected 'start end crackles wheezes' (seconds, then "
                    f"two 0/1 flags), got {line.strip()!r}"
                )
            identity = _cycle(root, wav, start, end, duration, f"{notes}, line {number}")
            cycles.append(Cycle(identity, flags[0] + 2 * flags[1], parts[0]))
    return cycles


def icbhi_official_test(root: Path, cycles: list[Cycle]) -> np.ndarray:
    """Which ``cycles`` come from the challenge's test recordings (``root``'s ``ICBHI_challenge_train_test.txt``)."""
    path = root / ICBHI_SPLIT_FILE
    assigned = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 2 or fields[1] not in ("train", "test"):
            raise DataError(f"{path}, line {number}: expected '<recording name> train|test', got {line!r}")
        assigned[fields[0].removesuffix(".wav")] = fields[1]
    test = []
    for cycle in cycles:
        name = Path(cycle.identity.rpartition("@")[0]).stem
        if name not in assigned:
            raise DataError(
                f"{path} does not list the recording {name}; add it (train or test) or remove the recording"
            )
        test.append(assigned[name] == "test")
    return np.array(test, dtype=bool)


def sprsound_cycles(root: Path) -> list[Cycle]:
    """Every event of the SPRSound annotations anywhere under ``root``, in file order; a recording without events
    (poor quality) gives none."""
    wavs: dict[str, Path] = {}
    for wav in sorted(root.rglob("*.wav")):
        wavs.setdefault(wav.stem, wav)
    index = {name: i for i, name in enumerate(SPRSOUND_CLASSES)}
    cycles = []
    for notes in sorted(root.rglob("*.json")):
        try:
            record = json.loads(notes.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as err:
            raise DataError(f"{notes}: not a JSON annotation ({err}); download it again from {SPRSOUND_URL}") from None
        events = record.get("event_annotation") if isinstance(record, dict) else None
        if not isinstance(events, list):
            raise DataError(
                f"{notes}: no event_annotation list; SPRSound annotations hold "
                '{"event_annotation": [{"start", "end", "type"}, ...]}; remove other JSON '
                "files from the root"
            )
        if not events:
            continue
        recording = wavs.get(notes.stem)
        if recording is None:
            raise DataError(f"{notes}: no recording {notes.stem}.wav under {root} (download: {SPRSOUND_URL})")
        duration = _duration(recording, SPRSOUND_URL)
        for number, event in enumerate(events):
            where = f"{notes}, event {number}"
            kind: Any = event.get("type") if isinstance(event, dict) else None  # anything the JSON holds
            kind = _SPRSOUND_ALIASES.get(kind, kind)
            if kind not in index:
                raise DataError(f"{where}: type {kind!r} is not one of {list(SPRSOUND_CLASSES)}")
            try:
                start, end = float(event["start"]) / 1000, float(event["end"]) / 1000
            except (KeyError, TypeError, ValueError):
                raise DataError(f"{where}: start and end must be times in ms, got {event!r}") from None
            cycles.append(
                Cycle(
                    _cycle(root, recording, start, end, duration, where),
                    index[kind],
                    notes.stem.split("_")[0],
                    "test" if in_test_folder(root, notes) else "train",
                )
            )
    return cycles


def in_test_folder(root: Path, path: Path) -> bool:
    """Whether a folder between ``root`` and ``path`` is named ``test...`` (SPRSound's test releases)."""
    return any(part.lower().startswith("test") for part in path.relative_to(root).parent.parts)
