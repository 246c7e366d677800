"""Robust aggregation: median, trimmed mean and Krum by hand and by property, and as pluggable aggregators."""

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonargparse import ArgumentParser

from fedlit.strategies import (
    ClientUpdate,
    FedAdam,
    FedAvg,
    FedBN,
    FedMedian,
    FedProx,
    FedTrimmedAvg,
    Krum,
    KrumAggregator,
    MedianAggregator,
    Strategy,
    TrimmedMeanAggregator,
)
from fedlit.strategies.common.aggregate import (
    coordinate_median,
    krum_scores,
    krum_select,
    pairwise_squared_distances,
    trimmed_mean,
)

finite = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False, width=32)


@st.composite
def client_states(draw, min_clients=1, max_clients=7):
    n = draw(st.integers(min_clients, max_clients))
    size = draw(st.integers(1, 4))
    return [
        {"w": torch.tensor(draw(st.lists(finite, min_size=size, max_size=size)), dtype=torch.float32)} for _ in range(n)
    ]


betas = st.sampled_from([0.0, 0.1, 0.2, 0.3, 0.45])
rules = {
    "median": lambda states, beta: coordinate_median(states),
    "trimmed": lambda states, beta: trimmed_mean(states, beta),
}


def test_median_and_trimmed_mean_by_hand():
    states = [{"w": torch.tensor([v, -v])} for v in (1.0, 9.0, 2.0, 100.0, 3.0)]
    # sorted first coordinate: 1 2 3 9 100 -> median 3; beta = 0.2 cuts int(0.2 * 5) = 1 at each end: (2+3+9)/3
    assert coordinate_median(states)["w"].tolist() == [3.0, -3.0]
    assert trimmed_mean(states, 0.2)["w"].tolist() == pytest.approx([14 / 3, -14 / 3])
    # four clients: 1 2 9 100 -> (2 + 9) / 2 (numpy's median), not torch.median's lower value 2
    assert coordinate_median(states[:4])["w"].tolist() == [5.5, -5.5]


@settings(max_examples=40, deadline=None)
@given(client_states(), betas, st.sampled_from(sorted(rules)))
def test_identical_clients_give_their_state_back(states, beta, rule):
    same = [states[0]] * len(states)
    assert torch.equal(rules[rule](same, beta)["w"], states[0]["w"])


@settings(max_examples=40, deadline=None)
@given(client_states(min_clients=2), betas, st.sampled_from(sorted(rules)), st.randoms(use_true_random=False))
def test_client_order_does_not_matter(states, beta, rule, rnd):
    shuffled = list(states)
    rnd.shuffle(shuffled)
    assert torch.equal(rules[rule](states, beta)["w"], rules[rule](shuffled, beta)["w"])


@settings(max_examples=40, deadline=None)
@given(client_states(), betas, st.sampled_from(sorted(rules)))
def test_result_stays_within_the_clients_range(states, beta, rule):
    out = rules[rule](states, beta)["w"]
    stacked = torch.stack([s["w"] for s in states])
    assert (out >= stacked.min(0).values).all() and (out <= stacked.max(0).values).all()


@settings(max_examples=40, deadline=None)
@given(client_states(), betas)
def test_equal_to_numpy_median_and_to_flowers_trim_mean(states, beta):
    from flwr.server.strategy.aggregate import _trim_mean

    stacked = np.stack([s["w"].numpy() for s in states])
    assert np.allclose(coordinate_median(states)["w"].numpy(), np.median(stacked, axis=0), rtol=1e-6)
    assert np.allclose(trimmed_mean(states, beta)["w"].numpy(), _trim_mean(stacked, beta), rtol=1e-5, atol=1e-4)


def test_trimmed_mean_with_beta_zero_is_the_plain_mean_and_dtypes_are_kept():
    states = [
        {"w": torch.tensor([1.0, 4.0], dtype=torch.float64), "n": torch.tensor(3)},
        {"w": torch.tensor([2.0, 8.0], dtype=torch.float64), "n": torch.tensor(6)},
    ]
    out = trimmed_mean(states, 0.0)
    assert out["w"].tolist() == [1.5, 6.0] and out["w"].dtype == torch.float64
    assert out["n"].item() == 4 and out["n"].dtype == torch.int64  # round(4.5) -> 4 (half to even)
    assert coordinate_median(states)["n"].dtype == torch.int64


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match=r"\[0, 0.5\)"):
        trimmed_mean([{"w": torch.ones(1)}], 0.5)
    with pytest.raises(ValueError, match="other tensors"):
        coordinate_median([{"a": torch.ones(1)}, {"b": torch.ones(1)}])
    with pytest.raises(ValueError, match="zero client updates"):
        coordinate_median([])
    with pytest.raises(ValueError, match="num_selected=4 of the 3"):
        krum_select([{"w": torch.ones(1)}] * 3, num_malicious=0, num_selected=4)


def test_krum_scores_by_hand():
    states = [{"w": torch.tensor([v])} for v in (0.0, 1.0, 3.0, 10.0)]
    # f = 0: each score sums the n - f - 2 = 2 smallest squared distances to the others
    # 0: {1, 9, 100} -> 1 + 9 = 10; 1: {1, 4, 81} -> 5; 3: {9, 4, 49} -> 13; 10: {100, 81, 49} -> 130
    assert krum_scores(states, num_malicious=0).tolist() == [10.0, 5.0, 13.0, 130.0]
    assert krum_select(states, 0, 1) == [1] and krum_select(states, 0, 2) == [1, 0]
    # f = 1: one neighbour each: 1, 1, 4, 49
    assert krum_scores(states, num_malicious=1).tolist() == [1.0, 1.0, 4.0, 49.0]
    assert krum_select(states, 1, 1) == [0]  # a tie goes to the lower index


def test_krum_distances_skip_integer_counters():
    states = [
        {"w": torch.tensor([0.0]), "n": torch.tensor(1000)},
        {"w": torch.tensor([0.1]), "n": torch.tensor(0)},
        {"w": torch.tensor([5.0]), "n": torch.tensor(0)},
    ]
    assert pairwise_squared_distances(states)[0, 1].item() == pytest.approx(0.01)
    out = KrumAggregator(num_malicious=0)(states, [1, 1, 1])
    assert out["w"].item() in (0.0, 0.1) and out["n"].dtype == torch.int64


def test_multikrum_averages_the_kept_updates_weighted_like_fedavg():
    states = [{"w": torch.tensor([v])} for v in (0.0, 1.0, 3.0, 10.0)]
    out = KrumAggregator(num_malicious=0, num_selected=2)(states, [1, 3, 1, 1])
    assert out["w"].item() == pytest.approx(0.25 * 0.0 + 0.75 * 1.0)  # clients 1 and 0, weights 3 : 1


def updates(*values, counts=None):
    counts = counts or [1] * len(values)
    return [
        ClientUpdate(client_id=str(i), num_examples=n, state={"w": torch.tensor(v)})
        for i, (v, n) in enumerate(zip(values, counts, strict=True))
    ]


@pytest.mark.parametrize("strategy_class", [FedAvg, FedProx, FedBN, FedAdam])
def test_every_averaging_strategy_takes_an_aggregator(strategy_class):
    strategy = strategy_class(aggregator=MedianAggregator())
    strategy.initialize({"w": torch.zeros(2)}, ["0", "1", "2"])
    out = strategy.aggregate(1, updates([1.0, 5.0], [2.0, -1.0], [100.0, 0.0], counts=[50, 1, 1]))
    if strategy_class is FedAdam:  # Delta = median - 0 = [2, 0]: the first Adam step moves by eta m/(sqrt v + tau)
        assert out["w"][0].item() == pytest.approx(0.01 * 0.2 / (0.2 + 0.01)) and out["w"][1].item() == 0.0
    else:  # the median, not FedAvg's 50-example-dominated mean
        assert out["w"].tolist() == [2.0, 0.0]
    assert "aggregator=MedianAggregator()" in repr(strategy)


def test_robust_strategies_fix_their_aggregator():
    ups = updates([0.0], [1.0], [3.0], [10.0], [-50.0], counts=[1, 2, 3, 4, 5])
    for strategy, expected in [
        (FedMedian(), 1.0),
        (FedTrimmedAvg(beta=0.2), (0 + 1 + 3) / 3),
        (Krum(num_malicious=1), 1.0),
    ]:
        strategy.initialize({"w": torch.zeros(1)}, [])
        assert strategy.aggregate(1, ups)["w"].item() == pytest.approx(expected)
    assert repr(FedTrimmedAvg()) == "FedTrimmedAvg(beta=0.2)" and repr(FedMedian()) == "FedMedian()"
    assert repr(Krum(num_selected=3)) == "Krum(num_malicious=0, num_selected=3, weighting='num_examples')"
    assert repr(FedProx(mu=0.1)) == "FedProx(mu=0.1, weighting='num_examples')"  # default aggregator not shown


def test_a_beta_that_trims_nothing_warns_with_the_smallest_beta_that_trims():
    # 4 clients, one poisoned: int(0.2 * 4) = int(0.8) = 0 values cut per side, so the mean (0 + 1 + 3 + 100) / 4 = 26
    strategy = FedTrimmedAvg(beta=0.2)
    strategy.initialize({"w": torch.zeros(1)}, [])
    with pytest.warns(UserWarning, match=r"strategy\.init_args\.beta=0\.2 trims int\(0\.2 \* 4\) = 0 .*1/4 = 0\.25"):
        out = strategy.aggregate(1, updates([0.0], [1.0], [3.0], [100.0], counts=[1, 1, 1, 1]))
    assert out["w"].item() == pytest.approx(26.0)
    # 5 clients: int(0.2 * 5) = 1 per side, the poisoned 100 is cut: (1 + 3 + 10) / 3, and no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = strategy.aggregate(2, updates([0.0], [1.0], [3.0], [10.0], [100.0], counts=[1, 1, 1, 1, 1]))
        assert out["w"].item() == pytest.approx(14 / 3)
        TrimmedMeanAggregator(beta=0.0)([{"w": torch.zeros(1)}] * 2, [1, 1])  # beta = 0 asks for the plain mean
    # as an aggregator it names its own option; with 2 clients no beta below 0.5 trims anything
    with pytest.warns(UserWarning, match=r"aggregator\.init_args\.beta=0\.3 .*at least 3 clients"):
        TrimmedMeanAggregator(beta=0.3)([{"w": torch.zeros(1)}] * 2, [1, 1])


def test_constructors_name_bad_options():
    with pytest.raises(ValueError, match=r"strategy\.init_args\.aggregator\.init_args\.beta=0\.5"):
        TrimmedMeanAggregator(beta=0.5)
    with pytest.raises(ValueError, match=r"strategy\.init_args\.beta=-0\.1"):
        FedTrimmedAvg(beta=-0.1)
    with pytest.raises(ValueError, match=r"num_malicious=-1.*num_selected=0"):
        KrumAggregator(num_malicious=-1, num_selected=0)
    with pytest.raises(ValueError, match=r"strategy\.init_args\.num_selected=0"):
        Krum(num_selected=0)
    with pytest.raises(TypeError, match=r"strategy\.init_args\.aggregator=.*not an Aggregator"):
        FedAvg(aggregator="median")


def test_aggregator_is_configured_by_short_name_in_a_recipe():
    parser = ArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(Strategy, "strategy")
    cfg = parser.parse_object(
        {
            "strategy": {
                "class_path": "FedProx",
                "init_args": {
                    "mu": 0.1,
                    "aggregator": {"class_path": "TrimmedMeanAggregator", "init_args": {"beta": 0.3}},
                },
            }
        }
    )
    strategy = parser.instantiate_classes(cfg).strategy
    assert isinstance(strategy, FedProx) and isinstance(strategy.aggregator, TrimmedMeanAggregator)
    assert strategy.aggregator.beta == 0.3
