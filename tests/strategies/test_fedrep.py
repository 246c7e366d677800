"""FedRep: each turn trains the personal head first (body fixed), then the shared body (head fixed).

The phases are checked on a two-scalar model worked by hand, through the strategy's hooks and a real SGD optimizer
with momentum (a parameter without gradient must not move, not even by its momentum), then on a 2-round federation
recomputed with plain torch (the reference of tests/strategies/test_fedper.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from fedlit.core.errors import ConfigError
from fedlit.strategies import FedRep
from tests.strategies.test_fedper import BODY, CLIENTS, HEAD, assert_close, replay, tiny_federation


class TwoScalars(nn.Module):
    """``y = head * body * x``, one weight each."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(1, 1, bias=False)
        self.head = nn.Linear(1, 1, bias=False)
        with torch.no_grad():
            self.body.weight.fill_(2.0)
            self.head.weight.fill_(3.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def test_phase_one_moves_only_the_head_and_phase_two_only_the_body():
    # loss = head * body (x = 1): d/d body = head, d/d head = body; SGD lr 0.1, momentum 0.9
    model, strategy = TwoScalars(), FedRep(head_steps=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    strategy.on_client_fit_start(pl_module=model, client=SimpleNamespace(local=SimpleNamespace(local_steps=3)))
    values = []
    for _ in range(3):
        model(torch.ones(1, 1)).sum().backward()
        strategy.on_before_optimizer_step(pl_module=model)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        values += [model.body.weight.item(), model.head.weight.item()]
    # step 1 (head): head = 3 - 0.1 * 2 = 2.8, body stays 2
    # step 2 (body): body = 2 - 0.1 * 2.8 = 1.72; the head's momentum (0.9 * 2) must not move it: stays 2.8
    # step 3 (body): grad 2.8, buffer 0.9 * 2.8 + 2.8 = 5.32, body = 1.72 - 0.532 = 1.188; head 2.8
    assert values == pytest.approx([2.0, 2.8, 1.72, 2.8, 1.188, 2.8], abs=1e-6)
    strategy.on_client_fit_end(client_id="c0")  # 3 steps > head_steps: the body trained


def test_a_two_round_run_trains_head_then_body_and_uploads_the_body(tmp_path):
    fed = tiny_federation(tmp_path / "fedrep", FedRep(head_steps=2), local_steps=3)
    results = fed.fit()
    assert {n for n, r in fed.module.parameter_roles().items() if r == "personal"} == HEAD
    server, personal = replay(fed, BODY, lambda step: HEAD if step < 2 else BODY, local_steps=3)
    assert_close(fed.strategy.global_state, server)
    for client in CLIENTS:
        assert_close(fed.store.tensors(client), personal[client])
    assert results["comm"]["upload_bytes"] == 3 * 2 * 25 * 4  # the body only
    # the phases matter: training both together (FedPer) ends elsewhere
    fedper, _ = replay(fed, BODY, lambda step: BODY | HEAD, local_steps=3)
    assert not torch.allclose(
        server["backbone.layers.0.linear.weight"], fedper["backbone.layers.0.linear.weight"], atol=1e-4
    )


def test_a_turn_without_body_steps_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"local_steps=2 leaves no step to train the body after .*head_steps=2"):
        tiny_federation(tmp_path / "short", FedRep(head_steps=2), rounds=1, local_steps=2).fit()
    strategy = FedRep(head_steps=4)
    epochs = SimpleNamespace(local=SimpleNamespace(local_steps=None))  # a turn of local_epochs: checked at its end
    strategy.on_client_fit_start(pl_module=TwoScalars(), client=epochs)
    for _ in range(4):
        strategy.on_before_optimizer_step(pl_module=TwoScalars())
    with pytest.raises(ConfigError, match=r"client 'c1'.s turn took 4 optimizer steps, all spent on the head"):
        strategy.on_client_fit_end(client_id="c1")


@pytest.mark.parametrize("steps", [0, -1, 2.5, True])
def test_bad_head_steps_are_named(steps):
    with pytest.raises(ConfigError, match=r"strategy.init_args.head_steps=.* must be an int >= 1"):
        FedRep(head_steps=steps)
