"""The server screens each upload and the aggregate: a poisoned or corrupt update never reaches a checkpoint."""

from __future__ import annotations

import json
import math

import pytest
import torch
from lightning.pytorch import Callback

from fedlit.core.errors import NonFiniteError
from fedlit.engine.loop.screening import screen_update
from fedlit.strategies import FedAvg
from fedlit.strategies.base import ClientUpdate
from tests.conftest import make_federation

SENT = {"w": torch.tensor([3.0, 4.0]), "steps": torch.tensor(2)}  # ||w|| = 5


def update(w, extras=None):
    return ClientUpdate("c1", 10, {"w": torch.tensor(w), "steps": torch.tensor(3)}, {"loss": 0.1}, extras or {})


def test_an_update_is_screened_by_hand():
    # delta = (0, 9): norm 9 <= 2 x max(1, 5) = 10, kept; delta (0, 11): norm 11 > 10, rejected
    assert screen_update(update([3.0, 13.0]), SENT, None, 2.0) is None
    kind, detail = screen_update(update([3.0, 15.0]), SENT, None, 2.0)
    assert kind == "rejected" and detail.startswith("update norm 11 is over federation.max_update_ratio=2 times")
    # an absolute bound: delta (0.6, 0.8), norm 1 > 0.5
    assert screen_update(update([3.6, 4.8]), SENT, 0.5, None) == (
        "rejected",
        "update norm 1 over federation.max_update_norm=0.5",
    )
    assert screen_update(update([3.6, 4.8]), SENT, 1.5, None) is None
    # a small sent model: the ratio is of max(1, ||sent||)
    assert screen_update(update([0.0, 0.5]), {"w": torch.zeros(2)}, None, 1.0) is None
    assert screen_update(update([0.0, 1.5]), {"w": torch.zeros(2)}, None, 1.0)[0] == "rejected"
    # non-finite state or extras, whatever the bounds
    assert screen_update(update([math.nan, 4.0]), SENT, None, None) == (
        "non-finite",
        "non-finite uploaded tensor 'w' (found by the server)",
    )
    assert screen_update(update([3.0, 4.0], {"c": [torch.tensor([math.inf])]}), SENT, None, None)[0] == "non-finite"


class Poison(Callback):
    """A client that scales (or corrupts) its upload after its own checks, in the given rounds."""

    def __init__(self, client="c1", rounds=(2,), factor=1e30, value=None):
        self.client, self.rounds, self.factor, self.value = client, rounds, factor, value

    def on_client_fit_end(self, server_round, client_id, update):
        if client_id == self.client and server_round in self.rounds:
            for tensor in update.state.values():
                if tensor.is_floating_point():
                    tensor.mul_(self.factor) if self.value is None else tensor.fill_(self.value)


def _max_abs(path):
    payload = torch.load(path, weights_only=True)
    return max(float(t.abs().max()) for t in payload["strategy"]["global_state"].values() if t.is_floating_point())


def test_a_huge_finite_update_never_reaches_a_checkpoint(tmp_path):
    federation = make_federation(tmp_path, FedAvg(), rounds=3, callbacks=[Poison()])
    with pytest.warns(UserWarning, match=r"Round 2: client 'c1'.s update is rejected"):
        results = federation.fit()
    assert [(f["round"], f["client"], f["kind"]) for f in results["faults"]] == [(2, "c1", "rejected")]
    assert "max_update_ratio=1000" in results["faults"][0]["detail"]
    for name in ("last.ckpt", "best.ckpt"):
        assert _max_abs(tmp_path / "checkpoints" / name) < 100
    rows = [row.split(",") for row in (tmp_path / "metrics.csv").read_text().splitlines()[1:]]
    losses = [float(r[4]) for r in rows if r[3].startswith("loss")]
    assert {r[0] for r in rows} == {"1", "2", "3"} and losses and max(losses) < 100


def test_without_the_bounds_the_poison_would_be_averaged(tmp_path):
    federation = make_federation(tmp_path, FedAvg(), rounds=2, callbacks=[Poison()], max_update_ratio=None)
    federation.fit()
    assert _max_abs(tmp_path / "checkpoints" / "last.ckpt") > 1e20  # what the default bound prevents


def test_nan_injected_after_the_clients_check_is_quarantined_by_the_server(tmp_path):
    federation = make_federation(tmp_path, FedAvg(), rounds=2, callbacks=[Poison(rounds=(1, 2), value=math.nan)])
    with pytest.warns(UserWarning, match="quarantined"):
        results = federation.fit()
    assert {(f["round"], f["kind"]) for f in results["faults"]} == {(1, "non-finite"), (2, "non-finite")}
    assert all("found by the server" in f["detail"] for f in results["faults"])
    assert math.isfinite(_max_abs(tmp_path / "checkpoints" / "last.ckpt"))


class NaNAggregate(FedAvg):
    """A strategy whose round-2 aggregate is not finite."""

    def aggregate(self, server_round, updates):
        state = super().aggregate(server_round, updates)
        if server_round == 2:
            next(t for t in state.values() if t.is_floating_point()).fill_(math.nan)
        return state


def test_a_non_finite_aggregate_is_not_committed(tmp_path):
    federation = make_federation(tmp_path, NaNAggregate(), rounds=3)
    with pytest.raises(NonFiniteError, match=r"Round 2: the aggregate of the clients' updates is not finite") as err:
        federation.fit()
    assert "last good checkpoint" in str(err.value) and "max_update_norm" in str(err.value)
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["server_round"] == 1
    rows = (tmp_path / "metrics.csv").read_text().splitlines()[1:]
    assert rows and {row.split(",")[0] for row in rows} == {"1"}  # nothing of round 2 was recorded
    assert not (tmp_path / "results.json").exists()


def test_the_bounds_are_checked_and_may_change_on_resume(tmp_path):
    with pytest.raises(ValueError, match=r"federation.max_update_norm=0 must be > 0"):
        make_federation(tmp_path / "a", FedAvg(), max_update_norm=0)
    first = make_federation(tmp_path / "b", FedAvg(), rounds=1)
    first.fit()
    resumed = make_federation(tmp_path / "b", FedAvg(), rounds=2, max_update_norm=10.0)
    resumed.fit(ckpt_path=tmp_path / "b" / "checkpoints" / "last.ckpt")
    assert json.loads((tmp_path / "b" / "results.json").read_text())["last"]["round"] == 2
