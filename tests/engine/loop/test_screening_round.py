"""The round's updates screened together: a client's weight against ``max_client_weight``, each update's norm against
``max_update_norm_vs_median`` times the median of the others' (rejected, or clipped), values worked out by hand."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from fedlit.engine.loop.screening import screen_round, update_norm
from fedlit.strategies import FedAvg
from fedlit.strategies.base import ClientUpdate
from tests.conftest import make_federation
from tests.flower.faults import ScaleUpdateAt

SENT = {"w": torch.tensor([1.0, 1.0]), "steps": torch.tensor(0)}


def _update(client, delta, n=10):
    state = {"w": SENT["w"] + torch.tensor(delta), "steps": torch.tensor(3)}
    return ClientUpdate(client, n, state, {"loss": 0.1}, {})


def _settings(**values):
    defaults = {
        "max_update_norm": None,
        "max_update_norm_vs_median": None,
        "update_norm_action": "reject",
        "max_client_weight": None,
    }
    return SimpleNamespace(**(defaults | values))


def _screen(updates, sizes=None, **values):
    sizes = sizes if sizes is not None else {u.client_id: u.num_examples for u in updates}
    return screen_round(updates, [SENT] * len(updates), sizes, _settings(**values))


def test_an_update_over_k_times_the_median_of_the_others_is_rejected():
    # norms 1 (a), 2 (b), 500 (c): c against median(1, 2) = 1.5 -> 333x; a against median(2, 500) = 251; b 250.5
    updates = [_update("a", [0.6, 0.8]), _update("b", [0.0, 2.0]), _update("c", [300.0, 400.0])]
    assert [update_norm(u, SENT) for u in updates] == [pytest.approx(1.0), 2.0, 500.0]
    out = _screen(updates, max_update_norm_vs_median=10.0)
    assert out[:2] == [None, None]
    assert out[2] == (
        "rejected",
        "update norm 500 is 333 times the median 1.5 of the round's other updates, over "
        "federation.max_update_norm_vs_median=10",
    )
    # at k = 400, 333x passes; the others never fail against a median that holds the big one
    assert _screen(updates, max_update_norm_vs_median=400.0) == [None, None, None]


def test_two_clients_are_compared_with_each_other():
    # the round's own median of (1, 500) is 250.5, which 500 is only 2x over: the other's norm (1) is the reference
    out = _screen([_update("a", [0.6, 0.8]), _update("c", [300.0, 400.0])], max_update_norm_vs_median=10.0)
    assert out[0] is None and out[1][0] == "rejected" and "500 times the median 1 " in out[1][1]
    assert _screen([_update("c", [300.0, 400.0])], max_update_norm_vs_median=1.0) == [None]  # alone: not checked


def test_clip_scales_the_update_down_to_the_bound_and_keeps_it():
    updates = [_update("a", [0.6, 0.8]), _update("b", [0.0, 2.0]), _update("c", [300.0, 400.0])]
    out = _screen(updates, max_update_norm_vs_median=10.0, update_norm_action="clip")
    assert out[:2] == [None, None] and out[2][0] == "clipped" and out[2][1].endswith("clipped to 15")
    # 10 x 1.5 = 15 along the same direction (0.6, 0.8): (9, 12) added to what was sent
    assert torch.allclose(updates[2].state["w"], torch.tensor([10.0, 13.0]))
    assert update_norm(updates[2], SENT) == pytest.approx(15.0)
    assert torch.equal(updates[2].state["steps"], torch.tensor(3))  # an integer tensor is not scaled
    # the absolute bound clips too: 2 -> 1.5, and 500 -> 1.5
    updates = [_update("a", [0.6, 0.8]), _update("b", [0.0, 2.0]), _update("c", [300.0, 400.0])]
    out = _screen(updates, max_update_norm=1.5, update_norm_action="clip")
    assert [o and o[0] for o in out] == [None, "clipped", "clipped"]
    assert torch.allclose(updates[1].state["w"], torch.tensor([1.0, 2.5]))


def test_a_weight_over_the_cap_is_refused():
    # declared sizes 10, 20, 30 (total 60); c claims 10**9: 10**9 / (10**9 + 30) > 0.5
    sizes = {"a": 10, "b": 20, "c": 30}
    honest = [_update("a", [0.1, 0.0], 10), _update("b", [0.1, 0.0], 20)]
    out = _screen([*honest, _update("c", [0.1, 0.0], 10**9)], sizes, max_client_weight=0.5)
    assert out[:2] == [None, None] and out[2][0] == "rejected"
    assert out[2][1] == (
        "its 1000000000 training examples would weigh 1 of the round's 1000000030, over "
        "federation.max_client_weight=0.5"
    )
    # honest: c weighs 30/60 = 0.5, allowed at 0.5 and refused at 0.45; b's 20/60 passes both
    out = _screen([*honest, _update("c", [0.1, 0.0], 30)], sizes, max_client_weight=0.45)
    assert [o and o[0] for o in out] == [None, None, "rejected"] and "weigh 0.5 of the round's 60" in out[2][1]
    assert _screen([*honest, _update("c", [0.1, 0.0], 30)], sizes, max_client_weight=0.5) == [None] * 3
    # a selected client that failed still counts in the round's total (its size is declared): b alone weighs 20/60
    assert _screen([honest[1]], sizes, max_client_weight=0.4) == [None]
    assert _screen([_update("c", [0.1, 0.0], 10**9)], {"c": 30}, max_client_weight=0.5) == [None]  # alone: weight 1


def test_a_500x_update_is_rejected_in_a_run_and_results_record_the_sizes(tmp_path):
    federation = make_federation(
        tmp_path, FedAvg(), rounds=2, callbacks=[ScaleUpdateAt("c1", 2, 500.0)], max_update_norm_vs_median=10.0
    )
    with pytest.warns(UserWarning, match=r"Round 2: client 'c1'.s update is rejected"):
        results = federation.fit()
    assert [(f["round"], f["client"], f["kind"]) for f in results["faults"]] == [(2, "c1", "rejected")]
    assert "federation.max_update_norm_vs_median=10" in results["faults"][0]["detail"]
    sizes = {c: federation.num_examples(c, "train") for c in ("c0", "c1", "c2")}
    assert results["train_sizes"] == {"1": sizes, "2": sizes}
    assert json.loads((tmp_path / "results.json").read_text())["train_sizes"]["2"] == sizes
    rows = (tmp_path / "metrics.csv").read_text()
    assert "\n2,c1,train,rejected,1.0\n" in rows
    payload = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    largest = max(float(t.abs().max()) for t in payload["strategy"]["global_state"].values() if t.is_floating_point())
    assert largest < 2


def test_without_the_bound_the_500x_update_passes_the_ratio_bound(tmp_path):
    """The relative bound of 1000 times the model's size lets a 500x update through: what the median bound adds."""
    federation = make_federation(tmp_path, FedAvg(), rounds=2, callbacks=[ScaleUpdateAt("c1", 2, 500.0)])
    results = federation.fit()
    assert "faults" not in results
    payload = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    largest = max(float(t.abs().max()) for t in payload["strategy"]["global_state"].values() if t.is_floating_point())
    assert math.isfinite(largest) and largest > 20  # the poison is in the model (below 2 where it is rejected)
