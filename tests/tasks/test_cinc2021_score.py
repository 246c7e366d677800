"""The PhysioNet/CinC 2021 challenge score against values worked out by hand from the challenge's definition."""

from __future__ import annotations

import pytest
import torch

from fedlit.core.errors import ConfigError
from fedlit.tasks.cinc2021 import CinC2021Score, cinc2021_metric

# Classes AF, AFL, NSR (normal): the published weights among them are AF-AFL 0.5, AF-NSR 0.25, AFL-NSR 0.25.
W3 = [[1.0, 0.5, 0.25], [0.5, 1.0, 0.25], [0.25, 0.25, 1.0]]
LABELS = torch.tensor([[1, 0, 0], [0, 1, 1], [0, 0, 1], [0, 0, 0]], dtype=torch.float32)
PROBS = torch.tensor([[0.9, 0.6, 0.1], [0.2, 0.3, 0.7], [0.5, 0.4, 0.8], [0.7, 0.1, 0.2]])
# Outputs (> 0.5): {AF, AFL}, {NSR}, {NSR} (0.5 is not above 0.5), {AF}. Each record's pairs share 1 / |labels OR
# outputs|:
#   observed: r1 {AF} vs {AF, AFL}: (W[AF,AF] + W[AF,AFL]) / 2 = (1 + 0.5) / 2 = 0.75
#             r2 {AFL, NSR} vs {NSR}: (W[AFL,NSR] + W[NSR,NSR]) / 2 = (0.25 + 1) / 2 = 0.625
#             r3 {NSR} vs {NSR}: 1;  r4 no label: 0              -> 2.375
#   correct:  r1 1;  r2 (1 + 0.25 + 0.25 + 1) / 2 = 1.25;  r3 1;  r4 0   -> 3.25
#   inactive (NSR alone): r1 W[AF,NSR] / 2 = 0.125;  r2 (0.25 + 1) / 2 = 0.625;  r3 1;  r4 0   -> 1.75
#   score = (2.375 - 1.75) / (3.25 - 1.75) = 0.625 / 1.5 = 5 / 12
EXPECTED = 5 / 12


def test_three_classes_by_hand():
    metric = CinC2021Score(weights=W3, normal_index=2)
    metric.update(PROBS, LABELS)
    assert metric.compute().item() == pytest.approx(EXPECTED, abs=1e-12)


def test_batches_and_logits_give_the_same_score():
    metric = CinC2021Score(weights=W3, normal_index=2)
    logits = torch.logit(PROBS.clamp(1e-6, 1 - 1e-6))
    metric.update(logits[:1], LABELS[:1])
    metric.update(logits[1:], LABELS[1:])
    assert metric.compute().item() == pytest.approx(EXPECTED, abs=1e-6)


def test_the_published_weights_give_the_same_on_the_26_classes():
    # AF, AFL and NSR are classes 0, 1 and 14 of weights.csv; every other output stays below the threshold
    probs, labels = torch.zeros(4, 26), torch.zeros(4, 26)
    for small, full in enumerate((0, 1, 14)):
        probs[:, full], labels[:, full] = PROBS[:, small], LABELS[:, small]
    metric = cinc2021_metric("multilabel", 26)
    metric.update(probs, labels)
    assert metric.compute().item() == pytest.approx(EXPECTED, abs=1e-12)


def test_perfect_inactive_and_degenerate_scores():
    perfect = CinC2021Score(weights=W3, normal_index=2)
    perfect.update(LABELS * 0.8 + 0.1, LABELS)
    inactive = CinC2021Score(weights=W3, normal_index=2)
    inactive.update(torch.tensor([[0.0, 0.0, 1.0]]).repeat(4, 1), LABELS)
    assert (perfect.compute().item(), inactive.compute().item()) == (1.0, 0.0)
    normal_only = CinC2021Score(weights=W3, normal_index=2)  # the inactive classifier is the perfect one: 0
    normal_only.update(torch.tensor([[0.9, 0.0, 0.9]]), torch.tensor([[0.0, 0.0, 1.0]]))
    assert normal_only.compute().item() == 0.0


def test_bad_options_and_shapes_are_refused():
    with pytest.raises(ConfigError, match="normal_index must be in"):
        CinC2021Score(weights=W3, normal_index=3)
    with pytest.raises(ConfigError, match="26 classes"):
        cinc2021_metric("multiclass", 26)
    with pytest.raises(ValueError, match=r"shape \(N, 3\)"):
        CinC2021Score(weights=W3, normal_index=2).update(torch.zeros(2, 4), torch.zeros(2, 4))
