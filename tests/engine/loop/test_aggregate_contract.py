"""``Strategy.aggregate`` returns the new server state and the loop stores it: what it returns is used, and a return
that is not the declared server state (None, not a mapping, other names or shapes) stops the run, naming the
strategy and the fix."""

from __future__ import annotations

import pytest
import torch

from fedlit.core.errors import ConfigError
from fedlit.engine.loop.aggregation import aggregate, check_server_state
from fedlit.strategies import ClientUpdate, FedAvg
from tests.conftest import make_federation

FIX = "return the new server state from aggregate, e.g. `return new_state`"


class StoresAndReturnsNothing(FedAvg):
    """The mistake the contract catches: the new state stored by hand, nothing returned."""

    def aggregate(self, server_round, updates):
        self.global_state = super().aggregate(server_round, updates)


class ReturnsZeros(FedAvg):
    """Returns a new state (floating tensors zeroed) without storing it: the loop must use it."""

    def aggregate(self, server_round, updates):
        state = super().aggregate(server_round, updates)
        return {n: torch.zeros_like(t) if t.is_floating_point() else t for n, t in state.items()}


class DropsATensor(FedAvg):
    def aggregate(self, server_round, updates):
        state = super().aggregate(server_round, updates)
        state.pop("head.bias")
        return {**state, "head.extra": torch.zeros(1)}


class Reshapes(FedAvg):
    def aggregate(self, server_round, updates):
        state = super().aggregate(server_round, updates)
        return {**state, "head.weight": state["head.weight"].reshape(-1)}


def _strategy():
    strategy = FedAvg()
    strategy.initialize({"w": torch.zeros(2, 3), "b": torch.zeros(3), "n": torch.tensor(0)}, ["a"])
    return strategy


def _message(excinfo) -> str:
    return str(excinfo.value).lower()


@pytest.mark.parametrize(
    ("returned", "expected"),
    [
        (None, "fedavg.aggregate returned none, not the new server state"),
        ([torch.zeros(3)], "fedavg.aggregate returned a list, not a mapping"),
        ({"w": torch.zeros(2, 3), "b": torch.zeros(3)}, "missing names ['n']"),
        (
            {"w": torch.zeros(2, 3), "b": torch.zeros(3), "n": torch.tensor(0), "x": torch.zeros(1)},
            "unexpected names ['x']",
        ),
        (
            {"w": torch.zeros(3, 2), "b": torch.zeros(3, 1), "n": torch.tensor(0)},
            "'w' of shape [3, 2] where the server state has [2, 3]",
        ),
        ({"w": torch.zeros(2, 3), "b": [0.0, 0.0, 0.0], "n": torch.tensor(0)}, "values that are not tensors at ['b']"),
    ],
)
def test_what_does_not_fit_the_declared_state_is_named(returned, expected):
    strategy = _strategy()
    declared = {n: tuple(t.shape) for n, t in strategy.global_state.items()}
    with pytest.raises(ConfigError) as excinfo:
        check_server_state(strategy, 3, returned, declared)
    assert _message(excinfo).startswith("round 3: fedavg.aggregate returned")
    assert expected in _message(excinfo) and FIX in _message(excinfo)


def test_the_returned_state_is_stored_as_returned():
    strategy = _strategy()
    half = torch.ones(2, 3, dtype=torch.float64)  # another dtype than the declared float32: kept, not cast
    strategy.aggregate = lambda server_round, updates: {"w": half, "b": torch.ones(3), "n": torch.tensor(7)}
    stored = aggregate(strategy, 1, [])
    assert stored is strategy.global_state and stored["w"] is half and stored["n"].item() == 7
    # FedAvg itself: the weighted mean 1/4 * 4 + 3/4 * 8 = 7 is what the loop stores
    strategy = FedAvg()
    strategy.initialize({"w": torch.zeros(1)}, ["a", "b"])
    aggregate(
        strategy,
        1,
        [ClientUpdate("a", 1, {"w": torch.tensor([4.0])}), ClientUpdate("b", 3, {"w": torch.tensor([8.0])})],
    )
    assert strategy.global_state["w"].tolist() == [7.0]


def test_a_run_uses_what_aggregate_returns(tmp_path):
    federation = make_federation(tmp_path, ReturnsZeros(), rounds=1)
    federation.fit()
    state = federation.strategy.global_state
    floats = [t for t in state.values() if t.is_floating_point()]
    assert floats and all(not t.any() for t in floats)  # the zeros returned, not the mean FedAvg computed


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        (StoresAndReturnsNothing, "round 1: storesandreturnsnothing.aggregate returned none"),
        (DropsATensor, "missing names ['head.bias']; unexpected names ['head.extra']"),
        (Reshapes, "'head.weight' of shape [24] where the server state has [3, 8]"),
    ],
)
def test_a_run_refuses_an_aggregate_that_does_not_return_the_server_state(tmp_path, strategy, expected):
    federation = make_federation(tmp_path, strategy(), rounds=2)
    with pytest.raises(ConfigError) as excinfo:
        federation.fit()
    assert expected in _message(excinfo) and FIX in _message(excinfo)
    assert not (tmp_path / "checkpoints" / "last.ckpt").exists()  # nothing of the round was saved
