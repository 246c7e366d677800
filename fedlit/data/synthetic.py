"""A small synthetic, heterogeneous "medical-like" image set generated in code, for tests and quick starts."""

from __future__ import annotations

import math

import numpy as np
import torch
from typing_extensions import override

from fedlit.core.errors import ConfigError
from fedlit.data.common.datamodule import FederatedDataModule
from fedlit.data.common.pool import PartitionedData
from fedlit.data.common.splits import check_split_fractions, split_clients

# One lesion shape per class; the class count is capped by this list.
PATTERNS = ("blob", "ring", "bar", "cross", "square", "stripes")
#: Pixels computed at once while building: bounds the float64 work arrays (about 8 MiB each).
CHUNK_PIXELS = 1 << 20


class SyntheticImages(FederatedDataModule):
    """Grey images of one "lesion" each on a smooth tissue-like background, from sites that differ.

    Source: generated in code from ``seed`` (no files, no download); license: part of fedlit (Apache-2.0).

    Protocol: every site draws ``samples_per_client`` labels from its own class mix p_s ~ Dir(label_alpha)
    (label shift). Class k is the k-th shape of ``PATTERNS`` (blob, ring, bar, cross, square outline, striped
    patch) at a random position, size, angle and strength. Each site then has its own acquisition: mean
    intensity (offset), contrast, blur and noise level, spread evenly over fixed ranges in a seeded order so
    that no two sites look alike (feature shift, where FedBN or local heads help). Each site is split into
    train/val/test by ``split_fractions``, stratified. Images are (1, image_size, image_size) float32, roughly
    in [-0.5, 1.5].

    Args:
        num_clients: number of sites; client ids are ``site_0``, ``site_1``, ...
        samples_per_client: images per site.
        num_classes: 2 to 6 lesion classes.
        image_size: image height and width in pixels (>= 8).
        label_alpha: Dirichlet concentration of the sites' class mixes (small = more label shift).
        split_fractions: (train, val, test) fractions of every site; val may be 0 (no validation split).
        batch_size: training batch size.
        eval_batch_size: val/test batch size (default ``batch_size``).
        num_workers: DataLoader worker processes.
        seed: seed of the images, labels and splits.
    """

    task = "multiclass"

    def __init__(
        self,
        *,
        num_clients: int = 4,
        samples_per_client: int = 200,
        num_classes: int = 3,
        image_size: int = 16,
        label_alpha: float = 1.0,
        split_fractions: tuple[float, float, float] = (0.6, 0.2, 0.2),
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, num_workers=num_workers, seed=seed)
        check_split_fractions(split_fractions)
        problems = []
        if not isinstance(num_clients, int) or num_clients < 1:
            problems.append(f"data.init_args.num_clients must be an integer >= 1, got {num_clients!r}")
        needed = sum(f > 0 for f in split_fractions)
        if not isinstance(samples_per_client, int) or samples_per_client < needed:
            problems.append(
                f"data.init_args.samples_per_client must be an integer >= {needed} (one per split), "
                f"got {samples_per_client!r}"
            )
        if not isinstance(num_classes, int) or not 2 <= num_classes <= len(PATTERNS):
            problems.append(
                f"data.init_args.num_classes must be between 2 and {len(PATTERNS)} (one per lesion pattern "
                f"{PATTERNS}), got {num_classes!r}"
            )
        if not isinstance(image_size, int) or image_size < 8:
            problems.append(f"data.init_args.image_size must be an integer >= 8, got {image_size!r}")
        if not label_alpha > 0:
            problems.append(f"data.init_args.label_alpha must be > 0, got {label_alpha!r}: e.g. 0.3 or 1.0")
        if problems:
            raise ConfigError("; ".join(problems))
        self.num_clients = num_clients
        self.samples_per_client = samples_per_client
        self._num_classes = num_classes
        self.image_size = image_size
        self.label_alpha = float(label_alpha)
        self.split_fractions = tuple(float(f) for f in split_fractions)

    @override
    @property
    def num_classes(self) -> int:
        """Number of lesion classes (known without building the data)."""
        return self._num_classes

    @override
    def build(self) -> PartitionedData:
        data_rng, split_rng = np.random.default_rng(self.seed).spawn(2)
        n_sites, n, size = self.num_clients, self.samples_per_client, self.image_size
        labels = np.concatenate(
            [
                data_rng.choice(self._num_classes, size=n, p=data_rng.dirichlet([self.label_alpha] * self._num_classes))
                for _ in range(n_sites)
            ]
        )
        sites = np.repeat(np.arange(n_sites), n)

        offset, contrast, blur, noise = (
            spread_over_sites(data_rng, 0.0, 0.6, n_sites),
            spread_over_sites(data_rng, 0.6, 1.4, n_sites),
            spread_over_sites(data_rng, 0.0, 0.7, n_sites),
            spread_over_sites(data_rng, 0.02, 0.1, n_sites),
        )

        # All random draws first, in a fixed order; then the images site by site and, within a site, a bounded
        # number of rows at a time, so that the float64 work arrays stay small whatever the pool's size. NumPy
        # only, element-wise and single-threaded: the same bytes whatever the thread count or chunk size.
        lesions = _lesion_draws(len(labels), size, data_rng)
        coarse = data_rng.normal(0.0, 0.1, (len(labels), 4, 4)).astype(np.float32)
        images = np.empty((len(labels), 1, size, size), dtype=np.float32)
        step = max(1, CHUNK_PIXELS // (size * size))
        for s in range(n_sites):
            blurred = np.empty((n, size, size), dtype=np.float64)
            for start in range(0, n, step):
                rows = slice(s * n + start, s * n + min(start + step, n))
                signal = _lesions(labels[rows], size, *(d[rows] for d in lesions)) + _field(coarse[rows], size)
                blurred[start : start + step] = _blur(signal.astype(np.float64), float(blur[s]))
            # Centered on the site's own mean: ``offset`` is the site's mean intensity whatever its labels.
            mean, site = blurred.mean(), images[s * n : (s + 1) * n, 0]
            for start in range(0, n, step):
                site[start : start + step] = offset[s] + contrast[s] * (blurred[start : start + step] - mean)
        # Drawn a chunk at a time: consecutive draws from one Generator give the same values as one draw.
        for start in range(0, len(labels), step):
            chunk = images[start : start + step]
            chunk += noise[sites[start : start + step]].astype(np.float32)[:, None, None, None] * (
                data_rng.standard_normal(chunk.shape, dtype=np.float32)
            )

        client_ids = [f"site_{s}" for s in range(n_sites)]
        parts = [np.flatnonzero(sites == s) for s in range(n_sites)]
        return PartitionedData(
            name="synthetic_images",
            task="multiclass",
            num_classes=self._num_classes,
            inputs=torch.from_numpy(images),
            targets=torch.from_numpy(labels.astype(np.int64)),
            splits=split_clients(parts, labels, self.split_fractions, split_rng, client_ids),
            partitioner="Natural()",
            details={
                "patterns": list(PATTERNS[: self._num_classes]),
                "pool": f"site s holds pool rows [s * {n}, (s + 1) * {n})",
                "split_fractions": list(self.split_fractions),
                "sites": {
                    cid: {
                        "offset": float(offset[s]),
                        "contrast": float(contrast[s]),
                        "blur_sigma": float(blur[s]),
                        "noise_std": float(noise[s]),
                    }
                    for s, cid in enumerate(client_ids)
                },
            },
        )


def spread_over_sites(rng: np.random.Generator, low: float, high: float, n_sites: int) -> np.ndarray:
    """``n_sites`` evenly spaced values over [low, high] in a seeded order: sites always differ, whatever the seed."""
    return rng.permutation(np.linspace(low, high, n_sites) if n_sites > 1 else np.array([(low + high) / 2]))


def _lesion_draws(n: int, size: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Random position, scale, angle and strength of ``n`` lesions: (scale, cy, cx, angle, strength)."""
    scale = size / 16 * rng.uniform(0.85, 1.15, n)
    cy, cx = rng.uniform(0.35, 0.65, (2, n)) * (size - 1)
    angle = rng.uniform(0, math.pi, n)
    strength = rng.uniform(0.8, 1.2, n)
    return scale, cy, cx, angle, strength


def _lesions(
    labels: np.ndarray,
    size: int,
    scale: np.ndarray,
    cy: np.ndarray,
    cx: np.ndarray,
    angle: np.ndarray,
    strength: np.ndarray,
) -> np.ndarray:
    """One lesion per image, its shape given by the label, at the drawn position, scale, angle and strength."""
    grid = np.arange(size, dtype=np.float64)
    out = np.zeros((len(labels), size, size), dtype=np.float32)
    for k, name in enumerate(PATTERNS):
        rows = np.flatnonzero(labels == k)
        if len(rows) == 0:
            continue
        dy = grid[None, :, None] - cy[rows, None, None]
        dx = grid[None, None, :] - cx[rows, None, None]
        cos, sin = np.cos(angle[rows])[:, None, None], np.sin(angle[rows])[:, None, None]
        shape = _shape(name, dx * cos + dy * sin, -dx * sin + dy * cos, scale[rows, None, None])
        out[rows] = strength[rows, None, None] * shape
    return out


def _shape(name: str, u: np.ndarray, v: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Pattern ``name`` at in-lesion coordinates (u along the lesion's axis, v across it), scale ``s``."""
    r = np.hypot(u, v)

    def bar(along: np.ndarray, across: np.ndarray, half_length: float) -> np.ndarray:
        return np.exp(-(across**2) / (2 * (0.8 * s) ** 2)) / (1 + np.exp(2 * (np.abs(along) - half_length * s)))

    if name == "blob":
        return np.exp(-(r**2) / (2 * (1.6 * s) ** 2))
    if name == "ring":
        return np.exp(-((r - 3.5 * s) ** 2) / (2 * (0.7 * s) ** 2))
    if name == "bar":
        return bar(u, v, 5.0)
    if name == "cross":
        return np.maximum(bar(u, v, 3.5), bar(v, u, 3.5))
    if name == "square":
        return np.exp(-((np.maximum(np.abs(u), np.abs(v)) - 3.2 * s) ** 2) / (2 * (0.6 * s) ** 2))
    # stripes: a soft disk filled with stripes across the lesion's axis
    return (0.5 + 0.5 * np.cos(2 * math.pi * u / (2.5 * s))) / (1 + np.exp(2 * (r - 4.0 * s)))


def _background(n: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """Smooth tissue-like texture: a 4x4 random field upsampled bilinearly (half-pixel centres, as
    ``torch.nn.functional.interpolate(..., mode="bilinear", align_corners=False)``), around a base level."""
    return _field(rng.normal(0.0, 0.1, (n, 4, 4)).astype(np.float32), size)


def _field(coarse: np.ndarray, size: int) -> np.ndarray:
    """The background of ``_background`` from its (N, 4, 4) float32 random field."""
    coarse = coarse.astype(np.float64)
    low, high, weight = _bilinear_taps(4, size)
    rows = coarse[:, low, :] * (1 - weight)[None, :, None] + coarse[:, high, :] * weight[None, :, None]
    field = rows[:, :, low] * (1 - weight)[None, None, :] + rows[:, :, high] * weight[None, None, :]
    return (0.2 + field).astype(np.float32)


def _bilinear_taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Source pixels and weights of a bilinear resize along one axis with half-pixel centres."""
    source = np.maximum((np.arange(out_size) + 0.5) * in_size / out_size - 0.5, 0.0)
    low = np.floor(source).astype(np.int64)
    return low, np.minimum(low + 1, in_size - 1), source - low


def _blur(images: np.ndarray, sigma: float) -> np.ndarray:
    """Gaussian blur of a (N, H, W) float64 batch, a stand-in for a site's scanner resolution.

    Written as a sum over the kernel's taps (no BLAS, no threads), so the result does not depend on the
    number of threads; borders repeat the edge pixel."""
    if sigma < 0.1:
        return images
    radius = max(1, math.ceil(2 * sigma))
    kernel = np.exp(-(np.arange(-radius, radius + 1, dtype=np.float64) ** 2) / (2 * sigma**2))
    kernel /= kernel.sum()
    height, width = images.shape[1:]
    padded = np.pad(images, ((0, 0), (radius, radius), (radius, radius)), mode="edge")
    across = sum(k * padded[:, :, i : i + width] for i, k in enumerate(kernel))
    return sum(k * across[:, i : i + height, :] for i, k in enumerate(kernel))
