"""The synthetic generators build their pool a bounded chunk at a time: the same values as before chunking, the
same bytes at any chunk size, and a peak memory a small multiple of the finished pool."""

from __future__ import annotations

import hashlib
import json
import tracemalloc

import numpy as np
import pytest
import torch

from fedlit.data import SyntheticImages, SyntheticSignals
from fedlit.data import synthetic as synthetic_module
from fedlit.data import synthetic_signals as signals_module
from fedlit.data.common.pool import PartitionedData

#: Values printed by the generator before it was chunked (the whole pool computed at once): SHA-256 of the targets
#: and splits (first 16 hex digits), the float64 sum and sum of squares of the inputs, and four pixels of the
#: flattened inputs. The inputs are compared to 1e-6 only: NumPy's vectorised exp/sin may differ in the last bit
#: between CPUs, while any change of the random draws or their order moves these values by far more.
IMAGES = [
    (
        dict(seed=0),
        "d14960a9a63d98d9",
        61476.48610921466,
        40829.2883243424,
        {0: -0.11001355201005936, 68266: 0.6682789325714111, 102400: 0.01098950207233429, 204799: 0.14871035516262054},
    ),
    (
        dict(num_clients=1, samples_per_client=50, image_size=8, seed=0),
        "fabecbe2281cad30",
        959.0053778104484,
        445.89636289153486,
        {0: 0.2704586684703827, 1066: 0.7879799604415894, 1600: 0.45747673511505127, 3199: 0.1167009025812149},
    ),
    (
        dict(
            num_clients=7,
            samples_per_client=23,
            image_size=24,
            num_classes=6,
            label_alpha=5.0,
            seed=11,
            split_fractions=(0.8, 0.0, 0.2),
        ),
        "4797475b90f05638",
        27866.991530023806,
        18387.33527608458,
        {0: 0.14229504764080048, 30912: 0.3373955190181732, 46368: 0.33408308029174805, 92735: -0.05824591964483261},
    ),
]
SIGNALS = [
    (
        dict(seed=0),
        "4389b687e326c86f",
        11413.961138663191,
        92749.95429661337,
        {0: -0.07648967951536179, 68266: -0.3924943208694458, 102400: 0.33843615651130676, 204799: 1.8406262397766113},
    ),
    (
        dict(num_clients=3, samples_per_client=30, num_classes=5, channels=3, length=64, label_alpha=0.2, seed=4),
        "e00d235c4d645608",
        1612.9802522259415,
        10619.418841984472,
        {0: -0.1759195327758789, 5760: 0.4348301887512207, 8640: 0.41155263781547546, 17279: -0.05923935025930405},
    ),
    (
        dict(num_clients=1, samples_per_client=40, num_classes=5, channels=2, length=300, seed=1),
        "7c01f5e7563aabef",
        1205.0785075880121,
        20711.0652381266,
        {0: -1.0344935655593872, 8000: 0.06434562802314758, 12000: -0.9215322732925415, 23999: -1.2917033433914185},
    ),
]


def _labels_digest(built: PartitionedData) -> str:
    digest = hashlib.sha256(built.targets.numpy().tobytes())
    digest.update(
        json.dumps(
            {c: {s: list(map(int, r)) for s, r in p.items()} for c, p in built.splits.items()}, sort_keys=True
        ).encode()
    )
    return digest.hexdigest()[:16]


def _peak_over_pool(build) -> float:
    tracemalloc.start()
    try:
        built = build()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak / built.inputs.numpy().nbytes


@pytest.mark.parametrize(
    ("generator", "kwargs", "labels", "total", "squares", "pixels"),
    [(SyntheticImages, *case) for case in IMAGES] + [(SyntheticSignals, *case) for case in SIGNALS],
)
def test_the_values_of_the_unchunked_generators(generator, kwargs, labels, total, squares, pixels) -> None:
    built = generator(**kwargs).build()
    inputs = built.inputs.numpy().ravel().astype(np.float64)
    assert _labels_digest(built) == labels
    assert inputs.sum() == pytest.approx(total, rel=1e-6)
    assert (inputs**2).sum() == pytest.approx(squares, rel=1e-6)
    assert {i: inputs[i] for i in pixels} == pytest.approx(pixels, rel=1e-6, abs=1e-7)


def test_images_are_the_same_bytes_whatever_the_chunk_size(monkeypatch: pytest.MonkeyPatch) -> None:
    data = SyntheticImages(num_clients=3, samples_per_client=23, image_size=24, num_classes=6, seed=4)
    whole = data.build()
    monkeypatch.setattr(synthetic_module, "CHUNK_PIXELS", 5 * 24 * 24 + 7)  # 5 rows: sites end mid-chunk
    chunked = data.build()
    assert torch.equal(chunked.inputs, whole.inputs) and torch.equal(chunked.targets, whole.targets)
    assert _labels_digest(chunked) == _labels_digest(whole)


def test_building_images_peaks_near_the_pool_size(monkeypatch: pytest.MonkeyPatch) -> None:
    # Computed whole, the float64 intermediates (coordinates, shapes, the blur's padded copies) peaked at 7.3x
    # the pool; in chunks of 8 rows the peak is the pool, one site's float64 blur (2/8 of it) and the chunk's.
    monkeypatch.setattr(synthetic_module, "CHUNK_PIXELS", 8 * 32 * 32)
    data = SyntheticImages(num_clients=8, samples_per_client=100, image_size=32, num_classes=6, seed=0)
    assert _peak_over_pool(data.build) < 2.0


def test_signals_are_the_same_bytes_whatever_the_chunk_size(monkeypatch: pytest.MonkeyPatch) -> None:
    data = SyntheticSignals(num_clients=3, samples_per_client=30, num_classes=5, channels=3, length=64, seed=4)
    whole = data.build()
    monkeypatch.setattr(signals_module, "CHUNK_SAMPLES", 7 * 3 * 64 + 5)  # 7 rows: sites end mid-chunk
    chunked = data.build()
    assert torch.equal(chunked.inputs, whole.inputs) and torch.equal(chunked.targets, whole.targets)
    assert _labels_digest(chunked) == _labels_digest(whole)


def test_building_signals_peaks_near_the_pool_size(monkeypatch: pytest.MonkeyPatch) -> None:
    # Computed whole, the float64 events, drift and signals peaked at 10x the pool (one channel); in chunks of 8
    # rows the peak is the pool, the bursts' noise drawn up front (float64, a fifth of the rows) and the chunk's.
    monkeypatch.setattr(signals_module, "CHUNK_SAMPLES", 8 * 512)
    data = SyntheticSignals(num_clients=8, samples_per_client=100, num_classes=5, channels=1, length=512, seed=0)
    assert _peak_over_pool(data.build) < 2.0
