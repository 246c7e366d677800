"""Synthetic, heterogeneous multichannel signals (ECG-, EEG- or sound-like) generated in code, for tests and CPUs."""

from __future__ import annotations

import math

import numpy as np
import torch
from typing_extensions import override

from fedlit.core.errors import ConfigError
from fedlit.data.common.datamodule import FederatedDataModule
from fedlit.data.common.pool import PartitionedData
from fedlit.data.common.splits import check_split_fractions, split_clients
from fedlit.data.synthetic import spread_over_sites

# One event per class; the class count is capped by this list.
EVENTS = ("tone", "clicks", "beats", "chirp", "burst")
#: Samples (rows x channels x length) computed at once while building: bounds the float64 work arrays.
CHUNK_SAMPLES = 1 << 20


class SyntheticSignals(FederatedDataModule):
    """Signals of ``channels`` x ``length`` samples, one "event" each, from sites that record them differently.

    Source: generated in code from ``seed`` (no files, no download); license: part of fedlit (Apache-2.0). A stand-in
    for the signal and sound sets of FHBench (Wang et al., "FHBench: Towards Efficient and Personalized Federated
    Learning for Multimodal Healthcare", arXiv 2025), so that its ECG/EEG (MOMENT) and respiratory-sound
    (wav2vec 2.0) rows can run on a CPU without the data: the events are loosely those sets' findings, not a model
    of them.

    Protocol: every site draws ``samples_per_client`` labels from its own class mix p_s ~ Dir(label_alpha) (label
    shift). Class k is the k-th event of ``EVENTS`` at a random position, rate and strength, with frequencies given
    in cycles per sample (so a 16 kHz clip has its tone at 640-1,280 Hz, a wheeze's range, and a 512-sample ECG
    window its tone at 20-40 cycles):

    - ``tone``: a sinusoid over the whole window, 0.04-0.08 cycles/sample (a wheeze);
    - ``clicks``: 3 to 8 short Gaussian-windowed transients at random times (crackles);
    - ``beats``: a pulse train, one narrow spike and a broad wave per period of 10-20 % of the window (heart beats);
    - ``chirp``: a sinusoid sweeping 0.01 to 0.1 cycles/sample, up or down;
    - ``burst``: white noise under a Hann window over a random 30 % of the window.

    Each channel sees the event with its own gain. Each site has its own acquisition: an overall gain, white-noise
    level, a slow baseline wander (2 sinusoids of 1-3 cycles per window) and per-channel gains, spread over fixed
    ranges in a seeded order so that no two sites record alike (feature shift). Each site is split into
    train/val/test by ``split_fractions``, stratified. Signals are (channels, length) float32.

    Args:
        num_clients: number of sites; client ids are ``site_0``, ``site_1``, ...
        samples_per_client: signals per site.
        num_classes: 2 to 5 event classes.
        channels: channels (leads, electrodes, microphones) per signal.
        length: samples per channel (>= 64).
        label_alpha: Dirichlet concentration of the sites' class mixes (small = more label shift).
        split_fractions: (train, val, test) fractions of every site; val may be 0 (no validation split).
        batch_size: training batch size.
        eval_batch_size: val/test batch size (default ``batch_size``).
        num_workers: DataLoader worker processes.
        seed: seed of the signals, labels and splits.
    """

    task = "multiclass"

    def __init__(
        self,
        *,
        num_clients: int = 4,
        samples_per_client: int = 100,
        num_classes: int = 4,
        channels: int = 1,
        length: int = 512,
        label_alpha: float = 1.0,
        split_fractions: tuple[float, float, float] = (0.6, 0.2, 0.2),
        batch_size: int = 16,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, num_workers=num_workers, seed=seed)
        check_split_fractions(split_fractions)
        needed = sum(f > 0 for f in split_fractions)
        checks = [
            ("num_clients", num_clients, 1, "an integer >= 1"),
            ("samples_per_client", samples_per_client, needed, f"an integer >= {needed} (one per split)"),
            ("channels", channels, 1, "an integer >= 1"),
            ("length", length, 64, "an integer >= 64"),
        ]
        problems = [
            f"data.init_args.{name} must be {what}, got {value!r}"
            for name, value, low, what in checks
            if isinstance(value, bool) or not isinstance(value, int) or value < low
        ]
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or not 2 <= num_classes <= len(EVENTS):
            problems.append(
                f"data.init_args.num_classes must be between 2 and {len(EVENTS)} (one per event "
                f"{EVENTS}), got {num_classes!r}"
            )
        if not label_alpha > 0:
            problems.append(f"data.init_args.label_alpha must be > 0, got {label_alpha!r}: e.g. 0.3 or 1.0")
        if problems:
            raise ConfigError("; ".join(problems))
        self.num_clients = num_clients
        self.samples_per_client = samples_per_client
        self._num_classes = num_classes
        self.channels = channels
        self.length = length
        self.label_alpha = float(label_alpha)
        self.split_fractions = tuple(float(f) for f in split_fractions)

    @override
    @property
    def num_classes(self) -> int:
        """Number of event classes (known without building the data)."""
        return self._num_classes

    @override
    def build(self) -> PartitionedData:
        data_rng, split_rng = np.random.default_rng(self.seed).spawn(2)
        n_sites, n, c, length = self.num_clients, self.samples_per_client, self.channels, self.length
        mixes = [data_rng.dirichlet([self.label_alpha] * self._num_classes) for _ in range(n_sites)]
        labels = np.concatenate([data_rng.choice(self._num_classes, size=n, p=p) for p in mixes])
        sites = np.repeat(np.arange(n_sites), n)

        gain, noise, wander = (
            spread_over_sites(data_rng, low, high, n_sites) for low, high in ((0.6, 1.4), (0.05, 0.3), (0.0, 0.5))
        )
        channel_gain = data_rng.uniform(0.5, 1.5, (n_sites, c))

        # All random draws first, in a fixed order; then the signals a bounded number of rows at a time, so that
        # the float64 work arrays stay small whatever the pool's size. NumPy only, element-wise and
        # single-threaded: the same bytes whatever the thread count or chunk size.
        t = np.arange(length, dtype=np.float64)
        kinds = [(k, name, np.flatnonzero(labels == k)) for k, name in enumerate(EVENTS)]
        draws = {k: _event_draws(name, len(rows), length, data_rng) for k, name, rows in kinds if len(rows)}
        strength = data_rng.uniform(0.8, 1.2, (len(labels), 1))
        cycles = data_rng.uniform(1.0, 3.0, (len(labels), 2, 1))
        phase = data_rng.uniform(0.0, 2 * math.pi, (len(labels), 2, 1))
        scale = (gain[sites, None] * channel_gain[sites]).astype(np.float64)
        rank = np.zeros(len(labels), dtype=np.int64)  # a signal's row in its class's draws
        for _, _, rows in kinds:
            rank[rows] = np.arange(len(rows))
        signals = np.empty((len(labels), c, length), dtype=np.float32)
        step = max(1, CHUNK_SAMPLES // (c * length))
        for start in range(0, len(labels), step):
            part = slice(start, start + step)
            event = np.zeros((len(labels[part]), length))
            for k, name, _ in kinds:
                here = np.flatnonzero(labels[part] == k)
                if len(here):
                    event[here] = _event(name, {key: d[rank[part][here]] for key, d in draws[k].items()}, t)
            event *= strength[part]
            drift = np.sin(2 * math.pi * cycles[part] * t / length + phase[part]).sum(axis=1)
            signals[part] = scale[part, :, None] * event[:, None, :] + (wander[sites[part], None] * drift)[:, None, :]
        # Drawn a chunk at a time: consecutive draws from one Generator give the same values as one draw.
        for start in range(0, len(labels), step):
            chunk = signals[start : start + step]
            chunk += noise[sites[start : start + step]].astype(np.float32)[:, None, None] * data_rng.standard_normal(
                chunk.shape, dtype=np.float32
            )

        client_ids = [f"site_{s}" for s in range(n_sites)]
        parts = [np.flatnonzero(sites == s) for s in range(n_sites)]
        return PartitionedData(
            name="synthetic_signals",
            task="multiclass",
            num_classes=self._num_classes,
            inputs=torch.from_numpy(signals),
            targets=torch.from_numpy(labels.astype(np.int64)),
            splits=split_clients(parts, labels, self.split_fractions, split_rng, client_ids),
            partitioner="Natural()",
            details={
                "events": list(EVENTS[: self._num_classes]),
                "shape": [c, length],
                "pool": f"site s holds pool rows [s * {n}, (s + 1) * {n})",
                "split_fractions": list(self.split_fractions),
                "sites": {
                    cid: {
                        "gain": float(gain[s]),
                        "noise_std": float(noise[s]),
                        "wander": float(wander[s]),
                        "channel_gains": [round(float(g), 4) for g in channel_gain[s]],
                    }
                    for s, cid in enumerate(client_ids)
                },
            },
        )


def _event_draws(name: str, m: int, length: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The random draws of ``m`` events of kind ``name``, one row per event (clicks: up to 8 centres, NaN-padded)."""
    if name == "tone":
        return {"frequency": rng.uniform(0.04, 0.08, (m, 1)), "phase": rng.uniform(0, 2 * math.pi, (m, 1))}
    if name == "clicks":
        counts = rng.integers(3, 9, m)
        centres = np.full((m, 8), np.nan)
        for i, count in enumerate(counts):
            centres[i, :count] = rng.uniform(0.05, 0.95, count) * length
        return {"counts": counts, "centres": centres}
    if name == "beats":
        return {"period": rng.uniform(0.1, 0.2, (m, 1)) * length, "offset": rng.uniform(0, 1, (m, 1))}
    if name == "chirp":
        return {"up": rng.random((m, 1)) < 0.5, "phase": rng.uniform(0, 6.3, (m, 1))}
    # burst: the window's start and the white noise under it
    start = rng.integers(0, length - max(2, int(0.3 * length)) + 1, m)
    return {"start": start, "noise": rng.standard_normal((m, length))}


def _event(name: str, draws: dict[str, np.ndarray], t: np.ndarray) -> np.ndarray:
    """Events of kind ``name`` from their ``draws`` (rows of ``_event_draws``) over sample times ``t``, peak about 1."""
    length = len(t)
    if name == "tone":
        return np.sin(2 * math.pi * draws["frequency"] * t + draws["phase"])
    if name == "clicks":
        width = max(2.0, 0.004 * length)
        out = np.zeros((len(draws["counts"]), length))
        for i, count in enumerate(draws["counts"]):
            centres = draws["centres"][i, :count, None]
            shape = np.exp(-((t - centres) ** 2) / (2 * width**2)) * np.cos(2 * math.pi * 0.15 * (t - centres))
            out[i] = shape.sum(axis=0)
        return out
    if name == "beats":
        period = draws["period"]
        position = np.mod(t - draws["offset"] * period, period)
        spike = np.exp(-(position**2) / (2 * (0.01 * length) ** 2))
        wave = 0.3 * np.exp(-((position - 0.35 * period) ** 2) / (2 * (0.04 * length) ** 2))
        return spike + wave
    if name == "chirp":
        u = t / length
        start, end = np.where(draws["up"], 0.01, 0.1), np.where(draws["up"], 0.1, 0.01)
        return np.sin(2 * math.pi * length * (start * u + (end - start) * u**2 / 2) + draws["phase"])
    # burst: white noise under a Hann window over 30 % of the signal
    span, start = max(2, int(0.3 * length)), draws["start"]
    window = np.sin(math.pi * (t - start[:, None]) / span) ** 2 * ((t >= start[:, None]) & (t < start[:, None] + span))
    return window * draws["noise"]
