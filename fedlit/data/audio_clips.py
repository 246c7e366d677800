"""One respiratory cycle (a time span of a sound file) read as a fixed-length waveform, as FHBench prepares it.

FHBench (Wang et al., arXiv 2025) reads each annotated cycle of ICBHI 2017 and SPRSound, averages the channels,
resamples it to 16 kHz, fades its first and last 1/16 s in and out linearly, then crops it to 8 s or repeats it
("circular" padding) up to 8 s and fades the last 1/16 s out again. :class:`AudioClip` does the same, one cycle at a
time inside the DataLoader workers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from fedlit.core.errors import ConfigError, DataError

__all__ = ["AudioClip", "clip_identity", "parse_identity", "soundfile"]


def soundfile() -> Any:
    """The ``soundfile`` module, or a one-line error saying how to install it."""
    try:
        import soundfile as module
    except ImportError:
        raise ConfigError(
            "the audio data sets read sound files with the soundfile package: pip install "
            "'fedlit[audio]' (or pip install soundfile)"
        ) from None
    return module


def clip_identity(path: str, start: float, end: float) -> str:
    """The identity of a cycle: ``<path relative to the root>@<start>:<end>`` (seconds)."""
    return f"{path}@{start!r}:{end!r}"


def parse_identity(identity: str) -> tuple[str, float, float]:
    """``(path, start, end)`` of an identity made by :func:`clip_identity`."""
    path, _, span = identity.rpartition("@")
    start, _, end = span.partition(":")
    return path, float(start), float(end)


@dataclass(frozen=True)
class AudioClip:
    """Reads a cycle ``<file>@<start>:<end>`` under ``root`` as a float32 waveform of ``clip_seconds`` seconds.

    Steps: frames ``int(start * rate)`` to ``int(end * rate)`` of the file (its own rate; the end is cut to the
    file's length), channels averaged; resampled to ``sample_rate`` (polyphase, ``scipy.signal.resample_poly``); the
    first and last ``fade_seconds`` faded in and out linearly (from 0 to 1 and back, as torchaudio's ``Fade``; at
    most half the cycle each); then cut to its first ``clip_seconds`` when longer, else padded: ``circular`` repeats
    the cycle up to the length and fades its last ``fade_seconds`` out again, ``zero`` centres it between zeros.

    Raises:
        DataError: naming the file when it is missing, unreadable, or the span holds no sample.
    """

    root: str
    sample_rate: int = 16000
    clip_seconds: float = 8.0
    pad: Literal["circular", "zero"] = "circular"
    fade_seconds: float = 0.0625

    @property
    def length(self) -> int:
        """Samples per clip."""
        return int(round(self.clip_seconds * self.sample_rate))

    def __call__(self, identity: str) -> torch.Tensor:
        sf = soundfile()
        name, start, end = parse_identity(identity)
        path = Path(self.root) / name
        try:
            rate = sf.info(str(path)).samplerate
            data, _ = sf.read(str(path), start=int(start * rate), stop=int(end * rate), dtype="float32", always_2d=True)
        except FileNotFoundError:
            raise DataError(
                f"{path}: sound file not found (it was listed when the data set was built); restore "
                "it, or rebuild the run's data without it"
            ) from None
        except (RuntimeError, ValueError, sf.LibsndfileError) as err:
            raise DataError(
                f"{path}: cannot be read as a sound file ({type(err).__name__}: {err}); replace it "
                "or remove it and its annotation"
            ) from None
        wave = data.mean(axis=1)
        if len(wave) == 0:
            raise DataError(
                f"{path}: the cycle {start}-{end} s holds no sample (the file is "
                f"{sf.info(str(path)).duration:.3f} s long); fix its annotation"
            )
        return torch.from_numpy(self.fit(resample(wave, rate, self.sample_rate)))

    def fit(self, wave: np.ndarray) -> np.ndarray:
        """Fade, then crop or pad ``wave`` (already at ``sample_rate``) to ``length`` samples."""
        fade = int(self.fade_seconds * self.sample_rate)
        wave = fade_out(fade_in(wave, fade), fade)
        n = self.length
        if len(wave) >= n:
            return np.ascontiguousarray(wave[:n], dtype=np.float32)
        if self.pad == "circular":
            return fade_out(np.tile(wave, math.ceil(n / len(wave)))[:n], fade).astype(np.float32)
        out = np.zeros(n, dtype=np.float32)
        offset = (n - len(wave)) // 2
        out[offset : offset + len(wave)] = wave
        return out


def fade_in(wave: np.ndarray, samples: int) -> np.ndarray:
    """``wave`` with its first ``samples`` (at most half of it) scaled by a ramp from 0 to 1."""
    k = min(samples, len(wave) // 2)
    if k < 1:
        return wave
    out = wave.copy()
    out[:k] *= np.linspace(0.0, 1.0, k, dtype=np.float64).astype(wave.dtype)
    return out


def fade_out(wave: np.ndarray, samples: int) -> np.ndarray:
    """``wave`` with its last ``samples`` (at most half of it) scaled by a ramp from 1 to 0."""
    k = min(samples, len(wave) // 2)
    if k < 1:
        return wave
    out = wave.copy()
    out[len(out) - k :] *= np.linspace(1.0, 0.0, k, dtype=np.float64).astype(wave.dtype)
    return out


def resample(wave: np.ndarray, rate: int, target: int) -> np.ndarray:
    """``wave`` from ``rate`` to ``target`` Hz (polyphase filtering; unchanged when the rates are equal)."""
    if rate == target:
        return wave
    from scipy.signal import resample_poly

    g = math.gcd(int(rate), int(target))
    return resample_poly(wave, target // g, rate // g).astype(np.float32)
