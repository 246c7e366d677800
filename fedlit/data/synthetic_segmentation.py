"""A small synthetic segmentation set generated in code: grey images with lesion-like blobs and their masks."""

from __future__ import annotations

import math

import numpy as np
import torch
from typing_extensions import override

from fedlit.core.errors import ConfigError
from fedlit.data.common.datamodule import FederatedDataModule, is_int
from fedlit.data.common.pool import PartitionedData
from fedlit.data.common.splits import check_split_fractions, split_clients
from fedlit.data.synthetic import _background, _blur


class SyntheticSegmentation(FederatedDataModule):
    """Grey images holding 1 to 3 elliptic "lesions" each, with their binary masks, from sites that differ.

    Source: generated in code from ``seed`` (no files, no download); license: part of fedlit (Apache-2.0).

    Protocol: every image gets 1 to 3 ellipses at random positions, sizes (semi-axes ``0.06`` to ``0.16`` of the
    image side), angles and strengths (0.6 to 1.0 above a smooth tissue-like background); the mask (1, H, W)
    is their union, drawn before any blur. Each site has its own acquisition: mean intensity (offset),
    contrast, blur and noise level, spread evenly over fixed ranges in a seeded order so that no two sites look
    alike (feature shift, where FedBN or personal layers help). Each site is split into train/val/test by
    ``split_fractions``, stratified by the number of lesions. Task ``segmentation``: inputs float32
    (N, 1, S, S), targets float32 (N, 1, S, S) of 0/1.

    Args:
        num_clients: number of sites; client ids are ``site_0``, ``site_1``, ...
        samples_per_client: images per site.
        image_size: image height and width in pixels (>= 16, a multiple of 4 for a U-Net of depth 2).
        split_fractions: (train, val, test) fractions of every site; val may be 0 (no validation split).
        batch_size: training batch size.
        eval_batch_size: val/test batch size (default ``batch_size``).
        num_workers: DataLoader worker processes.
        seed: seed of the images, masks and splits.
    """

    task = "segmentation"

    def __init__(
        self,
        *,
        num_clients: int = 4,
        samples_per_client: int = 100,
        image_size: int = 32,
        split_fractions: tuple[float, float, float] = (0.6, 0.2, 0.2),
        batch_size: int = 16,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, num_workers=num_workers, seed=seed)
        check_split_fractions(split_fractions)
        problems = []
        if not is_int(num_clients) or num_clients < 1:
            problems.append(f"data.init_args.num_clients must be an integer >= 1, got {num_clients!r}")
        needed = sum(f > 0 for f in split_fractions)
        if not is_int(samples_per_client) or (samples_per_client < needed):
            problems.append(
                f"data.init_args.samples_per_client must be an integer >= {needed} (one per split), "
                f"got {samples_per_client!r}"
            )
        if not is_int(image_size) or image_size < 16:
            problems.append(f"data.init_args.image_size must be an integer >= 16, got {image_size!r}")
        if problems:
            raise ConfigError("; ".join(problems))
        self.num_clients, self.samples_per_client, self.image_size = num_clients, samples_per_client, image_size
        self.split_fractions = tuple(float(f) for f in split_fractions)

    @override
    @property
    def num_classes(self) -> int:
        """Mask channels: 1 (lesion)."""
        return 1

    @override
    def build(self) -> PartitionedData:
        data_rng, split_rng = np.random.default_rng(self.seed).spawn(2)
        n_sites, n, size = self.num_clients, self.samples_per_client, self.image_size
        total = n_sites * n
        counts = data_rng.integers(1, 4, total)
        lesions, masks = _ellipses(counts, size, data_rng)
        signal = lesions + _background(total, size, data_rng)  # NumPy only: same bytes at any thread count
        sites = np.repeat(np.arange(n_sites), n)

        def spread(low: float, high: float) -> np.ndarray:
            values = np.linspace(low, high, n_sites) if n_sites > 1 else np.array([(low + high) / 2])
            return data_rng.permutation(values)  # evenly spaced in a seeded order: sites always differ

        offset, contrast, blur, noise = spread(0.0, 0.6), spread(0.5, 1.5), spread(0.0, 1.0), spread(0.03, 0.15)
        images = np.empty((total, 1, size, size), dtype=np.float32)
        for s in range(n_sites):
            rows = np.flatnonzero(sites == s)
            blurred = _blur(signal[rows].astype(np.float64), float(blur[s]))
            images[rows, 0] = offset[s] + contrast[s] * (blurred - blurred.mean())
        images += noise[sites].astype(np.float32)[:, None, None, None] * data_rng.standard_normal(
            images.shape, dtype=np.float32
        )

        client_ids = [f"site_{s}" for s in range(n_sites)]
        parts = [np.flatnonzero(sites == s) for s in range(n_sites)]
        targets = torch.from_numpy(masks).unsqueeze(1)
        return PartitionedData(
            name="synthetic_segmentation",
            task="segmentation",
            num_classes=1,
            inputs=torch.from_numpy(images),
            targets=targets,
            splits=split_clients(parts, counts, self.split_fractions, split_rng, client_ids),
            partitioner="Natural()",
            details={
                "pool": f"site s holds pool rows [s * {n}, (s + 1) * {n})",
                "split_fractions": list(self.split_fractions),
                "sites": {
                    cid: {
                        "offset": float(offset[s]),
                        "contrast": float(contrast[s]),
                        "blur_sigma": float(blur[s]),
                        "noise_std": float(noise[s]),
                        "foreground_share": float(targets[parts[s]].mean()),
                    }
                    for s, cid in enumerate(client_ids)
                },
            },
        )


def _ellipses(counts: np.ndarray, size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``counts[i]`` ellipses in image i: (N, S, S) float32 intensities (strength inside, 0 outside, the
    strongest where two overlap) and their union as 0/1 float32 masks."""
    n = len(counts)
    grid = np.arange(size, dtype=np.float64)
    intensity = np.zeros((n, size, size), dtype=np.float32)
    for k in range(int(counts.max())):
        present = counts > k
        cy, cx = rng.uniform(0.2, 0.8, (2, n)) * (size - 1)
        a, b = rng.uniform(0.06, 0.16, (2, n)) * size
        angle = rng.uniform(0, math.pi, n)
        strength = rng.uniform(0.6, 1.0, n)
        dy, dx = grid[None, :, None] - cy[:, None, None], grid[None, None, :] - cx[:, None, None]
        cos, sin = np.cos(angle)[:, None, None], np.sin(angle)[:, None, None]
        u, v = dx * cos + dy * sin, -dx * sin + dy * cos
        inside = (u / a[:, None, None]) ** 2 + (v / b[:, None, None]) ** 2 <= 1.0
        inside &= present[:, None, None]
        intensity = np.maximum(intensity, np.where(inside, strength[:, None, None], 0.0).astype(np.float32))
    return intensity, (intensity > 0).astype(np.float32)
