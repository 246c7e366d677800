"""FedRoD (Chen, Chao, ICLR 2022): the balanced softmax and the personal loss by hand, two rounds replayed with plain
torch (generic head FedAvg'd, personal head kept in the client's state), evaluation with h_G + h_P, bad heads."""

import math

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch.func import functional_call

from fedlit.core.errors import ConfigError
from fedlit.strategies import FedRoD
from fedlit.strategies.fedrod import balanced_softmax_loss, personal_loss
from tests.strategies.test_fedper import (
    BODY,
    CLIENTS,
    HEAD,
    LR,
    assert_close,
    tiny_federation,
    tiny_module,
    train_split,
)


def test_the_balanced_softmax_by_hand():
    # counts [2, 1, 1]: log prior = log [0.5, 0.25, 0.25]; logits [1, 0, -1], label 0:
    # exp(1) 0.5 = 1.359141, exp(0) 0.25 = 0.25, exp(-1) 0.25 = 0.091970; sum 1.701111;
    # loss = -log(1.359141 / 1.701111) = 0.224429
    loss = balanced_softmax_loss(torch.tensor([[1.0, 0.0, -1.0]]), torch.tensor([0]), torch.tensor([2, 1, 1]))
    assert loss.item() == pytest.approx(0.224429, abs=1e-5)
    # the same logits, label 2: -log(0.091970 / 1.701111) = 2.917576
    loss = balanced_softmax_loss(torch.tensor([[1.0, 0.0, -1.0]]), torch.tensor([2]), torch.tensor([2, 1, 1]))
    assert loss.item() == pytest.approx(2.917576, abs=1e-5)
    # the mean over a batch of both: (0.224429 + 2.917576) / 2 = 1.571002
    loss = balanced_softmax_loss(torch.tensor([[1.0, 0.0, -1.0]] * 2), torch.tensor([0, 2]), torch.tensor([2, 1, 1]))
    assert loss.item() == pytest.approx(1.571002, abs=1e-5)


def test_the_binary_balanced_softmax_by_hand():
    # one logit s = 0.5, 3 negatives and 1 positive: BCE(s + log(1/3)) = log(1 + exp(-(0.5 - 1.098612))) for y = 1
    loss = balanced_softmax_loss(torch.tensor([[0.5]]), torch.tensor([1.0]), torch.tensor([3, 1]))
    assert loss.item() == pytest.approx(math.log1p(math.exp(0.598612)), abs=1e-5)  # 1.036929


def test_a_class_the_client_lacks_gets_no_probability_and_no_gradient():
    logits = torch.tensor([[0.3, 2.0, -0.5]], requires_grad=True)
    loss = balanced_softmax_loss(logits, torch.tensor([0]), torch.tensor([1, 0, 3]))
    # classes 0 and 2 only: exp(0.3) 0.25 = 0.337465, exp(-0.5) 0.75 = 0.454898; -log(0.337465 / 0.792363) = 0.853558
    assert loss.item() == pytest.approx(0.853558, abs=1e-5)
    loss.backward()
    assert torch.isfinite(logits.grad).all() and logits.grad[0, 1] == 0


def test_the_personal_loss_by_hand_and_its_gradient_reaches_the_personal_logits_only():
    generic = torch.tensor([[1.0, 0.0]], requires_grad=True)
    personal = torch.tensor([[0.0, 1.0]], requires_grad=True)
    loss = personal_loss(generic, personal, torch.tensor([1]))
    assert loss.item() == pytest.approx(math.log(2), abs=1e-6)  # logits [1, 1]
    loss.backward()
    assert generic.grad is None
    assert personal.grad[0].tolist() == pytest.approx([0.5, -0.5])  # softmax - one-hot


def replay(fed, rounds=2, local_steps=2):
    """The server's tensors and each client's personal head after ``rounds`` rounds of full-batch steps, by hand."""
    module = tiny_module()
    server = {n: p.detach().clone() for n, p in module.named_parameters()}
    phis = {}
    for _ in range(rounds):
        uploads = []
        for client in CLIENTS:
            x, y = train_split(fed, client)
            log_prior = torch.log(torch.bincount(y, minlength=3).float() / len(y))
            params = {n: t.clone().requires_grad_(True) for n, t in server.items()}
            phi = {
                n: t.clone().requires_grad_(True)
                for n, t in phis.get(client, {"weight": server["head.weight"], "bias": server["head.bias"]}).items()
            }
            for _ in range(local_steps):
                body = {n.removeprefix("backbone."): p for n, p in params.items() if n in BODY}
                z = functional_call(module.backbone, body, (x,))
                generic = F.linear(z, params["head.weight"], params["head.bias"])
                bsm = F.cross_entropy(generic + log_prior, y)
                grads = dict(zip(params, torch.autograd.grad(bsm, list(params.values())), strict=True))
                p_loss = F.cross_entropy(generic.detach() + F.linear(z.detach(), phi["weight"], phi["bias"]), y)
                p_grads = dict(zip(phi, torch.autograd.grad(p_loss, list(phi.values())), strict=True))
                params = {n: (p - LR * grads[n]).detach().requires_grad_(True) for n, p in params.items()}
                phi = {n: (p - LR * p_grads[n]).detach().requires_grad_(True) for n, p in phi.items()}
            uploads.append({n: p.detach() for n, p in params.items()})
            phis[client] = {n: p.detach() for n, p in phi.items()}
        server = {n: torch.stack([u[n] for u in uploads]).mean(0) for n in server}
    return server, phis


def test_two_rounds_replayed_by_hand(tmp_path):
    fed = tiny_federation(tmp_path / "fedrod", FedRoD())
    results = fed.fit()
    server, phis = replay(fed)
    assert_close(fed.strategy.global_state, server)
    key = fed.strategy.state_key
    for client in CLIENTS:
        got = fed.store.extra(client, key)["head_p"]
        assert_close(got, {f"head.{n}": t for n, t in phis[client].items()})
    # the personal heads part from each other and from the generic head
    assert not torch.allclose(phis["c0"]["weight"], phis["c1"]["weight"], atol=1e-3)
    # uploads: body and generic head only, 3 clients x 2 rounds x (5 x 4 + 5 + 3 x 5 + 3) float32
    assert results["comm"]["upload_bytes"] == 3 * 2 * 43 * 4
    assert "global" in results  # the generic model evaluated beside the personalized one


def test_evaluation_adds_the_personal_head_to_the_generic_one():
    module = tiny_module()
    x = torch.randn(6, 4)
    phi = {"head.weight": torch.randn(3, 5), "head.bias": torch.randn(3)}
    z = module.backbone(x)
    expected = module.head(z) + F.linear(z, phi["head.weight"], phi["head.bias"])
    FedRoD().on_client_evaluate_start(pl_module=module, client_state={"head_p": phi})
    torch.testing.assert_close(module(x), expected)
    FedRoD().on_client_evaluate_start(pl_module=module, client_state={})  # before the first turn: unchanged
    torch.testing.assert_close(module(x), expected)


@pytest.mark.parametrize("head", ["re:.*weight", "head.weight"])
def test_a_head_that_is_not_one_linear_layer_is_named(head):
    with pytest.raises(ConfigError, match=r"strategy\.init_args\.head=.*one nn\.Linear"):
        FedRoD(head=head).on_client_evaluate_start(pl_module=tiny_module(), client_state={"head_p": {}})
    assert HEAD == {"head.weight", "head.bias"}
