"""FedHEAL: the consistency mask, the momentum weights and the masked update by hand, the fall-back, resume."""

from __future__ import annotations

import math

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedlit.core.errors import ConfigError
from fedlit.strategies import ClientUpdate, FedAvg, FedHEAL
from fedlit.strategies.fedheal import heal_aggregate, heal_consistency_mask, heal_weights
from tests.conftest import assert_resume_is_exact, make_federation


def _round(strategy, server_round, updates):
    """``updates``: {client: u_k}; the client uploads theta_k = theta_g - u_k (one example each)."""
    theta = strategy.global_state["w"]
    strategy.global_state = strategy.aggregate(
        server_round,
        [  # as the loop stores it
            ClientUpdate(k, 1, {"w": theta - torch.tensor(u, dtype=torch.float64)}) for k, u in updates.items()
        ],
    )
    return strategy.global_state["w"]


# Round 1, theta_g = 0: u_0 = [1, 1, -1], u_1 = [-1, 2, 0]. First updates: masks are all ones, histories
# [u >= 0] = [1, 1, 0] and [0, 1, 1]. d_0 = sqrt 3, d_1 = sqrt 5; w_prev = 1/2, dw_prev = 0:
# dw_k = 0.4 d_k / (sqrt 3 + sqrt 5), w_k = 1/2 + dw_k, p = w / sum w; theta_g = -(p_0 u_0 + p_1 u_1).
# Round 2: u_0 = [1, -1, -1] -> same-sign fractions [1, 1 - 1, 1 - 0] = [1, 0, 1] -> m_0 = [1, 0, 1];
#          u_1 = [2, -1, 3]  -> [0, 1 - 1, 1] = [0, 0, 1]                    -> m_1 = [0, 0, 1].
# Masked: [1, 0, -1] (d_0 = sqrt 2) and [0, 0, 3] (d_1 = 3). dw_k = 0.6 dw_k_prev + 0.4 d_k / (3 + sqrt 2).
# Coordinate 0: only client 0's mask is 1 -> q = [1, 0], theta -= 1. Coordinate 1: every mask is 0: the fall-back
# q = p multiplies masked updates that are 0, theta stays. Coordinate 2: q = p, theta -= -p_0 + 3 p_1.
S3, S5, S2 = math.sqrt(3), math.sqrt(5), math.sqrt(2)
DW1 = [0.4 * S3 / (S3 + S5), 0.4 * S5 / (S3 + S5)]
W1 = [0.5 + DW1[0], 0.5 + DW1[1]]
P1 = [W1[0] / sum(W1), W1[1] / sum(W1)]
THETA1 = [-(P1[0] - P1[1]), -(P1[0] + 2 * P1[1]), P1[0]]
DW2 = [0.6 * DW1[0] + 0.4 * S2 / (3 + S2), 0.6 * DW1[1] + 0.4 * 3 / (3 + S2)]
W2 = [W1[0] + DW2[0], W1[1] + DW2[1]]
P2 = [W2[0] / sum(W2), W2[1] / sum(W2)]
THETA2 = [THETA1[0] - 1, THETA1[1], THETA1[2] - (-P2[0] + 3 * P2[1])]


def _two_rounds(**kwargs):
    strategy = FedHEAL(**kwargs)
    strategy.initialize({"w": torch.zeros(3, dtype=torch.float64)}, ["c0", "c1"])
    first = _round(strategy, 1, {"c0": [1.0, 1.0, -1.0], "c1": [-1.0, 2.0, 0.0]}).clone()
    second = _round(strategy, 2, {"c0": [1.0, -1.0, -1.0], "c1": [2.0, -1.0, 3.0]}).clone()
    return strategy, first, second


def test_two_rounds_by_hand():
    strategy, first, second = _two_rounds()
    assert first.tolist() == pytest.approx(THETA1)
    assert second.tolist() == pytest.approx(THETA2)
    assert [strategy.weights[k] for k in ("c0", "c1")] == pytest.approx(W2)
    assert [strategy.deltas[k] for k in ("c0", "c1")] == pytest.approx(DW2)
    assert [strategy.distances[k] for k in ("c0", "c1")] == pytest.approx([S2, 3.0])
    assert [strategy.last_weights[k] for k in ("c0", "c1")] == pytest.approx(P2)
    # Histories after two updates: (h * 1 + [u >= 0]) / 2.
    assert strategy.history["c0"]["w"].tolist() == [1.0, 0.5, 0.0]
    assert strategy.history["c1"]["w"].tolist() == [0.5, 0.5, 1.0]
    assert strategy.counts == {"c0": 2, "c1": 2}


def test_the_result_is_not_fedavgs():
    _, _, heal = _two_rounds()
    fedavg = FedAvg()
    fedavg.initialize({"w": torch.tensor(THETA1, dtype=torch.float64)}, ["c0", "c1"])
    theta = fedavg.global_state["w"]
    mean = fedavg.aggregate(
        2,
        [
            ClientUpdate("c0", 1, {"w": theta - torch.tensor([1.0, -1.0, -1.0])}),
            ClientUpdate("c1", 1, {"w": theta - torch.tensor([2.0, -1.0, 3.0])}),
        ],
    )["w"]
    # FedAvg moves every coordinate by the mean update [1.5, -1, 1]; FedHEAL moves coordinate 0 by 1, keeps 1.
    assert mean.tolist() == pytest.approx([THETA1[0] - 1.5, THETA1[1] + 1, THETA1[2] - 1])
    assert abs(heal[0] - mean[0]) > 0.4 and abs(heal[1] - mean[1]) > 0.9


def test_mask_threshold_and_fall_back_in_the_functions():
    # History 0.3 of positive updates: a positive update has consistency 0.3 (not > 0.3), a negative one 0.7.
    fraction = {"w": torch.tensor([0.3, 0.3], dtype=torch.float64)}
    mask, history = heal_consistency_mask({"w": torch.tensor([1.0, -1.0])}, fraction, 3, 0.3)
    assert mask["w"].tolist() == [0.0, 1.0]
    assert history["w"].tolist() == pytest.approx([(0.9 + 1) / 4, 0.9 / 4])
    first, h = heal_consistency_mask({"w": torch.tensor([0.0, -2.0])}, None, 0, 0.3)
    assert first["w"].tolist() == [1.0, 1.0] and h["w"].tolist() == [1.0, 0.0]  # 0 counts as >= 0
    # Fall-back: every mask 0 on coordinate 1 -> q = p there (and the masked updates are 0: theta stays).
    out = heal_aggregate(
        {"w": torch.tensor([10.0, 10.0])},
        [{"w": torch.tensor([2.0, 0.0])}, {"w": torch.tensor([4.0, 0.0])}],
        [{"w": torch.tensor([1.0, 0.0])}, {"w": torch.tensor([1.0, 0.0])}],
        [1.0, 3.0],
    )
    assert out["w"].tolist() == pytest.approx([10 - (0.25 * 2 + 0.75 * 4), 10.0])
    # No client moved: the distance term is 0, the weights keep their ratio.
    p, w, dw = heal_weights([0.0, 0.0], [1.0, 3.0], [0.5, 0.0], 0.4)
    assert dw.tolist() == pytest.approx([0.3, 0.0]) and w.tolist() == pytest.approx([1.3, 3.0])
    assert p.tolist() == pytest.approx([1.3 / 4.3, 3.0 / 4.3])


def test_choices_of_the_authors_code():
    # sign_count="rounds": a client first seen in round 3 starts fresh; its next update divides by round - 1 = 3.
    strategy = FedHEAL(sign_count="rounds")
    strategy.initialize({"w": torch.zeros(1, dtype=torch.float64)}, ["c0"])
    _round(strategy, 3, {"c0": [1.0]})
    _round(strategy, 4, {"c0": [-1.0]})
    assert strategy.history["c0"]["w"].tolist() == [0.75]  # (1 * 3 + 0) / 4; by participations: 1 / 2
    # distance_share="seen": the sum runs over the latest distance of every client seen, c0's from round 1 too.
    seen = FedHEAL(distance_share="seen")
    seen.initialize({"w": torch.zeros(1, dtype=torch.float64)}, ["c0", "c1"])
    _round(seen, 1, {"c0": [3.0]})
    _round(seen, 2, {"c1": [1.0]})
    assert seen.deltas["c1"] == pytest.approx(0.4 * 1 / (3 + 1))  # "round" would give 0.4 * 1 / 1


def test_bad_arguments_name_the_option():
    for kwargs, option in [
        ({"tau": 1.0}, "tau"),
        ({"tau": -0.1}, "tau"),
        ({"beta": 1.5}, "beta"),
        ({"sign_count": "epochs"}, "sign_count"),
        ({"distance_share": "all"}, "distance_share"),
    ]:
        with pytest.raises(ConfigError, match=f"strategy.init_args.{option}"):
            FedHEAL(**kwargs)


# Seed 0, TinyMLP (every tensor shared, BatchNorm buffers included), 3 clients, 2 rounds: train loss mean per round and
# validation loss mean after round 2. FedAvg(weighting="uniform") on the same run gives FEDAVG_LOSSES: the same
# round 1 (every client starts from the same model), then other values.
PINNED_LOSSES = [1.102971, 0.952464, 1.096969]
FEDAVG_LOSSES = [1.102971, 0.952829, 1.100733]


def _losses(path):
    events = EventAccumulator(str(path / "tensorboard")).Reload()
    return [e.value for e in events.Scalars("server/train/loss_mean")] + [
        events.Scalars("server/val/loss_mean")[-1].value
    ]


def test_two_rounds_pinned_and_unlike_fedavg(tmp_path):
    strategy = FedHEAL()
    make_federation(tmp_path / "heal", strategy).fit()
    assert set(strategy.history) == {"c0", "c1", "c2"} and strategy.counts == {"c0": 2, "c1": 2, "c2": 2}
    assert sum(strategy.last_weights.values()) == pytest.approx(1.0)
    assert strategy.global_state["backbone.1.num_batches_tracked"].dtype == torch.long
    ours = _losses(tmp_path / "heal")
    assert ours == pytest.approx(PINNED_LOSSES, abs=2e-5)
    assert abs(ours[1] - FEDAVG_LOSSES[1]) > 2e-4 and abs(ours[2] - FEDAVG_LOSSES[2]) > 2e-3


def test_resume_is_exact(tmp_path):
    straight, _ = assert_resume_is_exact(tmp_path, FedHEAL)
    assert straight.strategy.counts == {"c0": 4, "c1": 4, "c2": 4}
