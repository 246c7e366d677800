"""FedDBE (Zhang et al., NeurIPS 2023): the running mean and the mean regularizer by hand, two rounds replayed with
plain torch (round 1 the warm-up giving the global mean, round 2 with c_i and MR), evaluation with h(rep + c_i)."""

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch.func import functional_call

from fedlit.core.errors import ConfigError
from fedlit.strategies import FedDBE
from fedlit.strategies.feddbe import mean_regularizer, running_mean
from tests.strategies.test_fedper import BODY, CLIENTS, LR, assert_close, tiny_federation, tiny_module, train_split


def test_the_running_mean_by_hand():
    rep = torch.tensor([[1.0, 2.0], [3.0, 4.0]])  # batch mean [2, 3]
    assert running_mean(torch.zeros(2), rep, 0.1).tolist() == pytest.approx([0.2, 0.3])
    # 0.9 [1, -1] + 0.1 [2, 3] = [1.1, -0.6]
    assert running_mean(torch.tensor([1.0, -1.0]), rep, 0.1).tolist() == pytest.approx([1.1, -0.6])


def test_the_mean_regularizer_by_hand():
    # diff [0.9, -0.7]; 0.5 [0.81, 0.49] = [0.405, 0.245]; mean 0.325
    got = mean_regularizer(torch.tensor([1.1, -0.6]), torch.tensor([0.2, 0.1]))
    assert got.item() == pytest.approx(0.325, abs=1e-6)


def test_the_loss_of_one_step_by_hand():
    # rep = Linear(4, 5) -> ReLU of x; the head sees rep + c; MR on 0.1 mean(rep) against the global mean
    module = tiny_module()
    strategy = FedDBE(kappa=2.0)
    c = torch.tensor([0.5, -1.0, 0.0, 2.0, 0.25])
    gm = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5])
    strategy.on_client_fit_start(pl_module=module, received_extras={"global_mean": gm}, client_state={"bias": c})
    x, y = torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    with strategy.client_forward(module):
        out = module.training_step((x, y), 0)
    got = strategy.training_loss(module, out["loss"], (x, y), out)
    rep = module.backbone(x)
    rbar = 0.1 * rep.mean(0)
    expected = F.cross_entropy(module.head(rep + c), y) + 2.0 * (0.5 * (rbar - gm) ** 2).mean()
    torch.testing.assert_close(got, expected)


def replay(fed, kappa, rounds=2, local_steps=2, momentum=0.1):
    """Server tensors, global mean and each client's c_i after ``rounds`` rounds of full-batch steps, by hand."""
    module = tiny_module()
    server = {n: p.detach().clone() for n, p in module.named_parameters()}
    global_mean, biases = None, {}
    for _ in range(rounds):
        uploads, means = [], []
        for client in CLIENTS:
            x, y = train_split(fed, client)
            params = {n: t.clone().requires_grad_(True) for n, t in server.items()}
            c = biases.get(client, torch.zeros(5)).clone().requires_grad_(True)
            rbar = torch.zeros(5)
            for _ in range(local_steps):
                body = {n.removeprefix("backbone."): p for n, p in params.items() if n in BODY}
                rep = functional_call(module.backbone, body, (x,))
                rbar = 0.9 * rbar + 0.1 * rep.mean(0)
                if global_mean is None:  # the warm-up: plain CE
                    loss = F.cross_entropy(F.linear(rep, params["head.weight"], params["head.bias"]), y)
                else:
                    loss = F.cross_entropy(F.linear(rep + c, params["head.weight"], params["head.bias"]), y)
                    loss = loss + kappa * (0.5 * (rbar - global_mean) ** 2).mean()
                leaves = [*params.values(), c]
                grads = torch.autograd.grad(loss, leaves, allow_unused=True)
                params = {
                    n: (p - LR * g).detach().requires_grad_(True)
                    for (n, p), g in zip(params.items(), grads, strict=False)
                }
                if grads[-1] is not None:
                    c = (c - LR * grads[-1]).detach().requires_grad_(True)
                rbar = rbar.detach()
            uploads.append({n: p.detach() for n, p in params.items()})
            means.append(rbar)
            if global_mean is not None:
                biases[client] = c.detach()
        server = {n: torch.stack([u[n] for u in uploads]).mean(0) for n in server}
        if global_mean is None:
            global_mean = torch.stack(means).mean(0)  # every client has 15 training samples
    return server, global_mean, biases


def test_two_rounds_replayed_by_hand(tmp_path):
    fed = tiny_federation(tmp_path / "feddbe", FedDBE(kappa=0.5))
    results = fed.fit()
    server, global_mean, biases = replay(fed, kappa=0.5)
    assert_close(fed.strategy.global_state, server)
    torch.testing.assert_close(fed.strategy.global_mean, global_mean, atol=1e-6, rtol=0)
    key = fed.strategy.state_key
    for client in CLIENTS:
        torch.testing.assert_close(fed.store.extra(client, key)["bias"], biases[client], atol=1e-6, rtol=0)
    assert biases["c0"].abs().sum() > 0
    # uploads: 43 floats of the model per client and round, plus the 5-float running mean in the warm-up
    assert results["comm"]["upload_bytes"] == 3 * 2 * 43 * 4 + 3 * 5 * 4
    assert "global" in results


def test_evaluation_adds_c_to_the_head_input():
    module = tiny_module()
    x, c = torch.randn(6, 4), torch.randn(5)
    expected = module.head(module.backbone(x) + c)
    FedDBE().on_client_evaluate_start(pl_module=module, client_state={"bias": c})
    torch.testing.assert_close(module(x), expected)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"kappa": -1.0}, "kappa=-1.0 must be >= 0"), ({"momentum": 0.0}, r"momentum=0.0 must be in \(0, 1\]")],
)
def test_bad_options_are_named(kwargs, match):
    with pytest.raises(ConfigError, match=r"strategy\.init_args\." + match):
        FedDBE(**kwargs)
