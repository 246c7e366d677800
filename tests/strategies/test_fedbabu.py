"""FedBABU: the head stays at its one initialization during federation, the body is FedAvg'd, and each client is
evaluated after fine-tuning the whole model; a 2-round run recomputed with plain torch (the reference of
tests/strategies/test_fedper.py)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from fedlit import Federation
from fedlit.core.errors import ConfigError
from fedlit.strategies import ClientUpdate, FedBABU
from tests.conftest import TinyTabular
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


def test_finetune_from_local_puts_the_clients_own_last_body_over_the_global_one():
    module = tiny_module()
    weight, bias = "backbone.layers.0.linear.weight", "backbone.layers.0.linear.bias"
    uploaded = {weight: torch.full((5, 4), 2.0), bias: torch.full((5,), -1.0)}

    class Store:
        device = torch.device("cpu")

    class Client:
        store = Store()

    for finetune_from, expected in (("local", (2.0, -1.0)), ("global", None)):
        strategy, state = FedBABU(finetune_from=finetune_from), {}
        strategy.on_client_fit_end(ClientUpdate("c0", 15, uploaded), state, Client())
        live = copy.deepcopy(module)
        strategy.on_client_evaluate_start(live, state)
        got = dict(live.named_parameters())
        if expected is None:  # global: nothing kept, the received (here: initial) body is left as it is
            assert state == {} and torch.equal(got[weight], module.backbone.layers[0].linear.weight)
        else:  # local: every entry of the body is the uploaded value; the head is untouched
            assert torch.equal(got[weight], torch.full((5, 4), expected[0]))
            assert torch.equal(got[bias], torch.full((5,), expected[1]))
            assert torch.equal(got["head.weight"], module.head.weight)
    fresh = copy.deepcopy(module)  # a client that has not trained yet: the global body
    FedBABU(finetune_from="local").on_client_evaluate_start(fresh, {})
    assert torch.equal(fresh.backbone.layers[0].linear.weight, module.backbone.layers[0].linear.weight)
    with pytest.raises(ConfigError, match=r"finetune_from='own' is not one of 'global'"):
        FedBABU(finetune_from="own")


def test_finetune_from_local_fine_tunes_each_clients_last_trained_body(tmp_path):
    fed = tiny_federation(tmp_path / "babu", FedBABU(finetune_steps=3, finetune_from="local"))
    results = fed.fit()
    initial_head = {n: p.detach() for n, p in tiny_module().named_parameters() if n in HEAD}
    server, _ = replay(fed, BODY, lambda step: BODY)
    assert_close(fed.strategy.global_state, server)  # the federation itself is unchanged
    after_round_1, _ = replay(fed, BODY, lambda step: BODY, rounds=1)
    for client in CLIENTS:
        # the client's own body after its round-2 turn: two full-batch steps of the body from the round-1 global body
        own = last_body(fed, client, after_round_1, initial_head)
        assert_close(fed.store.client_state(client)["extra"][fed.strategy.state_key]["body"], own)
        got = results["last"]["clients"][client]["loss"]
        assert got == pytest.approx(finetuned_loss(fed, {**own, **initial_head}, client, 3, BODY | HEAD), abs=1e-5)
        # fine-tuning from the global body (the default) gives another model
        assert abs(got - finetuned_loss(fed, {**server, **initial_head}, client, 3, BODY | HEAD)) > 1e-4
        # the global model is still the averaged body with the initial head, not fine-tuned
        assert results["global"]["last"]["clients"][client]["loss"] == pytest.approx(
            finetuned_loss(fed, {**server, **initial_head}, client, 0, set()), abs=1e-5
        )


def test_finetune_from_local_resumes_with_the_kept_bodies(tmp_path):
    def federation(out_dir, rounds: int) -> Federation:
        strategy = FedBABU(finetune_steps=2, finetune_from="local")
        return Federation(
            tiny_module(),
            TinyTabular(batch_size=16),
            strategy,
            rounds=rounds,
            out_dir=out_dir,
            progress_bar=False,
            accelerator="cpu",
            local_steps=2,
            seed=0,
            clients_per_round=2,
        )

    def kept(fed) -> list[str]:
        return [c for c in CLIENTS if "body" in fed.store.extra(c, fed.strategy.state_key)]

    straight = federation(tmp_path / "straight", 3)
    expected = straight.fit()
    first_leg = federation(tmp_path / "resumed", 2)
    first_leg.fit()
    # 2 of 3 clients a round: c2 first trains in round 3, so c0 or c1 sits round 3 out and is fine-tuned from the
    # body it kept in round 1 or 2, which the resumed run reads back from the checkpoint
    assert kept(first_leg) == ["c0", "c1"] and kept(straight) == list(CLIENTS)
    got = federation(tmp_path / "resumed", 3).fit(ckpt_path=tmp_path / "resumed" / "checkpoints" / "last.ckpt")
    assert got["last"]["clients"] == expected["last"]["clients"]


def last_body(fed, client: str, body: dict, head: dict, steps: int = 2) -> dict[str, torch.Tensor]:
    """``body`` after ``steps`` full-batch gradient steps of the body alone, under ``head``, on ``client``'s data."""
    model = copy.deepcopy(fed.module)
    model.load_state_dict({**model.state_dict(), **body, **head})
    params = {n: p for n, p in model.named_parameters() if n in BODY}
    x, y = train_split(fed, client)
    for _ in range(steps):
        grads = torch.autograd.grad(F.cross_entropy(model(x), y), list(params.values()))
        with torch.no_grad():
            for p, g in zip(params.values(), grads, strict=True):
                p -= LR * g
    return {n: p.detach().clone() for n, p in params.items()}


@pytest.mark.parametrize("steps", [0, -2, 1.5, True])
def test_bad_fine_tuning_steps_are_named(steps):
    with pytest.raises(ConfigError, match=r"strategy.init_args.finetune_steps=.* must be an int >= 1"):
        FedBABU(finetune_steps=steps)
