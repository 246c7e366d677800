"""SyntheticSignals: shapes, determinism, the events each class holds, feature and label shift, learnability."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedlit.core.errors import ConfigError
from fedlit.data import SyntheticSignals


@pytest.fixture(scope="module")
def ecg() -> SyntheticSignals:
    data = SyntheticSignals(num_clients=4, samples_per_client=60, num_classes=5, channels=3, length=256, seed=0)
    data.setup()
    return data


def _spectrum(signals: torch.Tensor) -> np.ndarray:
    """Magnitude spectrum of every signal's first channel, (N, length // 2 + 1)."""
    return np.abs(np.fft.rfft(signals[:, 0].numpy().astype(np.float64), axis=-1))


def test_shapes_sizes_and_batches(ecg: SyntheticSignals) -> None:
    assert ecg.client_ids == ["site_0", "site_1", "site_2", "site_3"]
    assert ecg.task == "multiclass" and ecg.num_classes == 5
    assert ecg.data.inputs.shape == (240, 3, 256) and ecg.data.inputs.dtype == torch.float32
    assert [ecg.num_examples("site_2", s) for s in ("train", "val", "test")] == [36, 12, 12]
    x, y = next(iter(ecg.train_dataloader("site_0", torch.Generator().manual_seed(0))))
    assert x.shape == (16, 3, 256) and y.dtype == torch.int64 and set(y.tolist()) <= set(range(5))
    assert ecg.manifest()["details"]["events"] == ["tone", "clicks", "beats", "chirp", "burst"]


def test_same_seed_same_signals_other_seed_different(ecg: SyntheticSignals) -> None:
    kwargs = dict(num_clients=4, samples_per_client=60, num_classes=5, channels=3, length=256)
    assert torch.equal(SyntheticSignals(**kwargs, seed=0).build().inputs, ecg.data.inputs)
    assert not torch.equal(SyntheticSignals(**kwargs, seed=1).build().inputs, ecg.data.inputs)


def test_each_class_holds_its_event() -> None:
    # On a 1,024-sample window, a tone of 0.04-0.08 cycles/sample peaks in bins 41-82, a chirp sweeping 0.01-0.1
    # cycles/sample keeps its energy in bins 10-102, a click (a 4-sample Gaussian) spreads over the whole band.
    data = SyntheticSignals(num_clients=1, samples_per_client=200, num_classes=4, length=1024, seed=3).build()
    spectrum, labels = _spectrum(data.inputs), data.targets.numpy()
    peak = 8 + spectrum[:, 8:].argmax(axis=1)  # above the baseline wander (1-3 cycles per window)
    assert np.all((peak[labels == 0] >= 40) & (peak[labels == 0] <= 83))
    energy = spectrum**2
    band = energy[:, 10:103].sum(axis=1) / energy[:, 8:].sum(axis=1)
    assert band[labels == 3].min() > 0.8  # the chirp's sweep holds its energy within 0.01-0.1 cycles/sample
    assert band[labels == 1].max() < 0.3  # clicks are broadband
    # clicks and beats are sparse in time: their peak-to-RMS ratio is above a tone's (a sinusoid's is sqrt(2), raised
    # here by the noise and the wander)
    x = data.inputs[:, 0].numpy()
    x = x - x.mean(axis=1, keepdims=True)
    crest = np.abs(x).max(axis=1) / np.sqrt((x**2).mean(axis=1))
    assert crest[labels == 0].max() < 2.8 < min(crest[labels == 1].mean(), crest[labels == 2].mean())


def test_sites_record_differently(ecg: SyntheticSignals) -> None:
    sites = ecg.manifest()["details"]["sites"]
    assert sorted(round(s["gain"], 6) for s in sites.values()) == pytest.approx([0.6, 0.8667, 1.1333, 1.4], abs=1e-4)
    assert sorted(round(s["noise_std"], 6) for s in sites.values()) == pytest.approx(
        [0.05, 0.1333, 0.2167, 0.3], abs=1e-4
    )
    # The noisiest site's signals carry the most energy above every event's band (0.3-0.5 cycles/sample).
    noisiest = max(sites, key=lambda c: sites[c]["noise_std"])
    quietest = min(sites, key=lambda c: sites[c]["noise_std"])

    def high_band(client_id: str) -> float:
        rows = np.concatenate([ecg.data.splits[client_id][s] for s in ("train", "val", "test")])
        return float(_spectrum(ecg.data.inputs[rows])[:, 77:].mean())

    assert high_band(noisiest) > 3 * high_band(quietest)


def test_label_mixes_follow_label_alpha() -> None:
    def shares(alpha: float) -> np.ndarray:
        data = SyntheticSignals(num_clients=4, samples_per_client=200, num_classes=4, length=64, label_alpha=alpha)
        counts = data.class_counts()
        return np.array([np.sum([counts[c][s] for s in counts[c]], axis=0) for c in data.client_ids]) / 200

    assert np.abs(shares(1e4) - 0.25).max() < 0.1
    skewed = shares(0.1)
    assert skewed.max(axis=1).min() > 0.5  # every site dominated by one class


def test_a_linear_model_on_spectra_learns_it() -> None:
    data = SyntheticSignals(num_clients=3, samples_per_client=120, num_classes=5, length=256, seed=1)
    d = data.data
    features = torch.log1p(torch.from_numpy(_spectrum(d.inputs)).float())
    features = (features - features.mean(0)) / (features.std(0) + 1e-6)
    train = np.concatenate([d.splits[c][s] for c in data.client_ids for s in ("train", "val")])
    test = np.concatenate([d.splits[c]["test"] for c in data.client_ids])
    torch.manual_seed(0)
    model = torch.nn.Linear(features.shape[1], 5)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(200):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(features[train]), d.targets[train]).backward()
        optimizer.step()
    accuracy = (model(features[test]).argmax(1) == d.targets[test]).float().mean().item()
    assert accuracy > 0.7  # chance is 0.2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_classes": 6}, "data.init_args.num_classes must be between 2 and 5"),
        ({"length": 32}, "data.init_args.length must be an integer >= 64, got 32"),
        ({"channels": 0}, "data.init_args.channels must be an integer >= 1, got 0"),
        ({"samples_per_client": 2}, "data.init_args.samples_per_client must be an integer >= 3 (one per split)"),
        ({"label_alpha": 0}, "data.init_args.label_alpha must be > 0"),
    ],
)
def test_bad_options_name_themselves(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        SyntheticSignals(**kwargs)
