"""FedBABU: the head stays at its one initialization during federation, the body is FedAvg'd, and each client is
evaluated after fine-tuning the whole model; a 2-round run recomputed with plain torch (the reference of
tests/strategies/test_fedper.py)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from fedlit.core.errors import ConfigError
from fedlit.strategies import FedBABU
from tests.strategies.test_fedper import (
    BODY,
    CLIENTS,
    HEAD,
    LR,
    assert_close,
    replay,
    tiny_federation,
    tiny_module,
    train_split,
)


def finetuned_loss(fed, state: dict[str, torch.Tensor], client: str, steps: int, trained: set[str]) -> float:
    """Test cross-entropy of the model with ``state`` after ``steps`` full-batch gradient steps of ``trained``."""
    model = copy.deepcopy(fed.module)
    model.load_state_dict({**model.state_dict(), **state})
    params = {n: p for n, p in model.named_parameters() if n in trained}
    x, y = train_split(fed, client)
    for _ in range(steps):
        grads = torch.autograd.grad(F.cross_entropy(model(x), y), list(params.values()))
        with torch.no_grad():
            for p, g in zip(params.values(), grads, strict=True):
                p -= LR * g
    x, y = train_split(fed, client, "test")
    with torch.no_grad():
        return F.cross_entropy(model(x), y).item()


def test_the_head_never_moves_the_body_is_averaged_and_evaluation_fine_tunes_both(tmp_path):
    fed = tiny_federation(tmp_path / "babu", FedBABU(finetune_steps=3))
    results = fed.fit()
    initial_head = {n: p.detach() for n, p in tiny_module().named_parameters() if n in HEAD}
    assert {n for n, r in fed.module.parameter_roles().items() if r == "personal"} == HEAD
    for client in CLIENTS:  # bit for bit the one initialization, after 2 rounds of momentum-free SGD steps
        stored = fed.store.tensors(client)
        assert stored.keys() == HEAD and all(torch.equal(stored[n], initial_head[n]) for n in HEAD)
    server, _ = replay(fed, BODY, lambda step: BODY)
    assert_close(fed.strategy.global_state, server)
    state = {**server, **initial_head}
    for client in CLIENTS:
        got = results["last"]["clients"][client]["loss"]
        assert got == pytest.approx(finetuned_loss(fed, state, client, 3, BODY | HEAD), abs=1e-5)
        # the head is fine-tuned too: fine-tuning the body alone gives another model
        assert abs(got - finetuned_loss(fed, state, client, 3, BODY)) > 1e-4
        # the global model (averaged body, initial head) is evaluated beside, not fine-tuned
        assert results["global"]["last"]["clients"][client]["loss"] == pytest.approx(
            finetuned_loss(fed, state, client, 0, set()), abs=1e-5
        )
    assert results["comm"]["upload_bytes"] == results["comm"]["download_bytes"] == 3 * 2 * 25 * 4  # the body only
    assert results["compute"] == {"eval_finetune_steps": 3 * 3 * 2}


def test_finetune_head_trains_the_head_alone_before_evaluation(tmp_path):
    fed = tiny_federation(tmp_path / "babu", FedBABU(finetune_steps=3, finetune="head"))
    results = fed.fit()
    initial_head = {n: p.detach() for n, p in tiny_module().named_parameters() if n in HEAD}
    server, _ = replay(fed, BODY, lambda step: BODY)
    state = {**server, **initial_head}
    for client in CLIENTS:
        got = results["last"]["clients"][client]["loss"]
        assert got == pytest.approx(finetuned_loss(fed, state, client, 3, HEAD), abs=1e-5)
        assert abs(got - finetuned_loss(fed, state, client, 3, BODY | HEAD)) > 1e-4
    with pytest.raises(ConfigError, match=r"finetune='body' is not one of"):
        FedBABU(finetune="body")


def test_the_head_keeps_its_value_under_momentum_and_weight_decay(tmp_path):
    fed = tiny_federation(tmp_path / "babu", FedBABU(finetune_steps=1))
    fed.module.momentum, fed.module.weight_decay = 0.9, 0.1
    fed.fit()
    initial_head = {n: p.detach() for n, p in tiny_module().named_parameters() if n in HEAD}
    for client in CLIENTS:
        assert all(torch.equal(fed.store.tensors(client)[n], initial_head[n]) for n in HEAD)
    assert not torch.equal(
        fed.strategy.global_state["backbone.layers.0.linear.weight"], tiny_module().backbone.layers[0].linear.weight
    )


@pytest.mark.parametrize("steps", [0, -2, 1.5, True])
def test_bad_fine_tuning_steps_are_named(steps):
    with pytest.raises(ConfigError, match=r"strategy.init_args.finetune_steps=.* must be an int >= 1"):
        FedBABU(finetune_steps=steps)
