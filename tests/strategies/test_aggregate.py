"""Property tests of the weighted mean (identity, order, scale, range, one client, dtypes, errors), hand-worked
values, and the client weights every averaging strategy uses. The robust rules are tested in test_aggregators.py."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedlit.core import tensors
from fedlit.strategies import ClientUpdate
from fedlit.strategies.common.aggregate import client_weights, normalized_weights, weighted_average

finite = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False, width=32)
positive = st.floats(0.01, 100.0, allow_nan=False)


@st.composite
def client_states(draw, min_clients=1, max_clients=5):
    n = draw(st.integers(min_clients, max_clients))
    size = draw(st.integers(1, 4))
    states = [
        {"w": torch.tensor(draw(st.lists(finite, min_size=size, max_size=size)), dtype=torch.float32)} for _ in range(n)
    ]
    weights = draw(st.lists(positive, min_size=n, max_size=n))
    return states, weights


def test_weighted_average_by_hand():
    out = weighted_average([{"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([4.0, 8.0])}], [1, 3])
    assert torch.allclose(out["w"], torch.tensor([0.25 * 1 + 0.75 * 4, 0.25 * 2 + 0.75 * 8]))


@settings(max_examples=50, deadline=None)
@given(client_states(max_clients=1), st.integers(1, 5), st.data())
def test_identical_clients_give_their_state_back(states_weights, n, data):
    states, _ = states_weights
    weights = data.draw(st.lists(positive, min_size=n, max_size=n), label="weights")
    out = weighted_average([states[0]] * n, weights)  # n copies of one state, any weights
    assert torch.allclose(out["w"], states[0]["w"], rtol=1e-6, atol=1e-6)


@settings(max_examples=50, deadline=None)
@given(client_states(min_clients=2), st.randoms(use_true_random=False))
def test_client_order_does_not_matter(states_weights, rnd):
    states, weights = states_weights
    order = list(range(len(states)))
    rnd.shuffle(order)
    a = weighted_average(states, weights)
    b = weighted_average([states[i] for i in order], [weights[i] for i in order])
    assert torch.allclose(a["w"], b["w"], rtol=1e-6, atol=1e-4)


@settings(max_examples=50, deadline=None)
@given(client_states(), st.floats(0.01, 100.0))
def test_scaling_all_weights_changes_nothing(states_weights, scale):
    states, weights = states_weights
    a = weighted_average(states, weights)
    b = weighted_average(states, [w * scale for w in weights])
    assert torch.allclose(a["w"], b["w"], rtol=1e-5, atol=1e-3)


@settings(max_examples=50, deadline=None)
@given(client_states())
def test_result_stays_within_the_clients_range(states_weights):
    states, weights = states_weights
    out = weighted_average(states, weights)["w"]
    stacked = torch.stack([s["w"] for s in states])
    assert (out >= stacked.min(0).values - 1e-3).all() and (out <= stacked.max(0).values + 1e-3).all()


@settings(max_examples=30, deadline=None)
@given(client_states(min_clients=1, max_clients=1))
def test_one_client_returns_its_own_state(states_weights):
    states, weights = states_weights
    assert torch.equal(weighted_average(states, weights)["w"], states[0]["w"])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int64])
def test_dtypes_are_kept(dtype):
    states = [{"t": torch.tensor([1, 2], dtype=dtype)}, {"t": torch.tensor([2, 5], dtype=dtype)}]
    out = weighted_average(states, [1, 1])["t"]
    assert out.dtype == dtype
    if dtype == torch.int64:  # num_batches_tracked: rounded mean
        assert out.tolist() == [2, 4]


def test_zero_total_weight_raises_a_clear_error():
    with pytest.raises(ValueError, match="sum to zero"):
        weighted_average([{"w": torch.ones(1)}, {"w": torch.ones(1)}], [0, 0])
    with pytest.raises(ValueError, match=">= 0"):
        normalized_weights([1, -1])


def test_mismatched_keys_are_named():
    with pytest.raises(ValueError, match="other tensors"):
        weighted_average([{"a": torch.ones(1)}, {"b": torch.ones(1)}], [1, 1])


def test_client_weights_by_hand():
    updates = [ClientUpdate(client_id=c, num_examples=n, state={}) for c, n in (("a", 10), ("b", 30))]
    assert client_weights(updates) == [10.0, 30.0]
    assert client_weights(updates, "uniform") == [1.0, 1.0]
    assert normalized_weights(client_weights(updates)).tolist() == [0.25, 0.75]
    with pytest.raises(ValueError, match=r"weighting='size' is not one of \['num_examples', 'uniform'\]"):
        client_weights(updates, "size")


def test_nbytes_by_hand():
    assert tensors.nbytes({"x": torch.zeros(3), "y": [torch.zeros(2, dtype=torch.float64)], "n": 3}) == 12 + 16
