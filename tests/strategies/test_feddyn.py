"""FedDyn (Acar et al. 2021): client loss, h_k and theta_cld by hand, then two rounds end to end and exact resume."""

import pytest
import torch
from torch import nn

from fedlit.core.roles import ParameterRoles, RoleRule
from fedlit.module import FederatedModule
from fedlit.strategies import ClientUpdate, FedDyn
from fedlit.strategies.feddyn import feddyn_server_update
from tests.conftest import assert_resume_is_exact, make_federation


class Lin(FederatedModule):
    def __init__(self):
        super().__init__(roles=[RoleRule("personal.*", "personal")])
        self.shared = nn.Linear(2, 1, bias=False)
        self.personal = nn.Linear(2, 1, bias=False)


def client_turn(anchor="server", h=None):
    """A FedDyn client holding theta = [3, 1] that received theta_cld = [2, 2] and theta_srv = [1, 1]."""
    module = Lin()
    with torch.no_grad():
        module.shared.weight.copy_(torch.tensor([[3.0, 1.0]]))
        module.personal.weight.copy_(torch.tensor([[100.0, 100.0]]))
    strategy = FedDyn(alpha=0.1, anchor=anchor)
    state = {} if h is None else {"h": {"shared.weight": torch.tensor([h])}}
    strategy.on_client_fit_start(
        pl_module=module,
        received={"shared.weight": torch.tensor([[2.0, 2.0]])},
        received_extras={"server_state": {"shared.weight": torch.tensor([[1.0, 1.0]])}},
        client_state=state,
    )
    return module, strategy, state


def test_client_loss_value_and_gradient():
    module, strategy, _ = client_turn(h=[0.5, -1.0])
    loss = strategy.training_loss(module, torch.tensor(2.0), batch=None)
    # CE + alpha (<theta, -theta_srv + h> + ||theta||^2 / 2) = 2 + 0.1 * ([3, 1].[-0.5, -2] + (9 + 1) / 2)
    #                                                       = 2 + 0.1 * (-3.5 + 5) = 2.15; the personal layer is free
    assert loss.item() == pytest.approx(2.15)
    loss.backward()
    # d/dtheta = alpha (-theta_srv + h + theta) = 0.1 * ([-0.5, -2] + [3, 1]) = [0.25, -0.1]
    assert torch.allclose(module.shared.weight.grad, torch.tensor([[0.25, -0.1]]))
    assert module.personal.weight.grad is None


def test_cloud_anchor_is_the_received_model():
    module, strategy, _ = client_turn(anchor="cloud")  # h = 0
    # 0 + 0.1 * ([3, 1].[-2, -2] + 5) = 0.1 * (-8 + 5) = -0.3
    assert strategy.training_loss(module, torch.tensor(0.0), batch=None).item() == pytest.approx(-0.3)


def test_explicit_squared_norm_steps_like_the_reference_codes_adam_weight_decay():
    # FedPxN's code: Adam(weight_decay=alpha) on CE + alpha <theta, lin>; here: Adam() on the full penalty
    torch.manual_seed(0)
    theta0, lin, x = torch.randn(5), torch.randn(5), torch.randn(5)
    results = []
    for explicit in (False, True):
        theta = theta0.clone().requires_grad_(True)
        opt = torch.optim.Adam([theta], lr=0.01, weight_decay=0.0 if explicit else 0.1)
        for _ in range(3):
            opt.zero_grad()
            loss = (theta * x).sum().sigmoid() + 0.1 * (theta * lin).sum()
            if explicit:
                loss = loss + 0.1 * theta.pow(2).sum() / 2
            loss.backward()
            opt.step()
        results.append(theta.detach())
    assert torch.allclose(results[0], results[1], atol=1e-7)


def test_h_update_after_training():
    module, strategy, state = client_turn(h=[0.1, -0.2])
    update = ClientUpdate("a", 10, state={"shared.weight": torch.tensor([[1.5, 1.0]])})
    strategy.on_client_fit_end(update=update, client_state=state)
    # h_k += theta_k - theta_cld = [0.1, -0.2] + [1.5, 1] - [2, 2] = [-0.4, -1.2]
    assert torch.allclose(state["h"]["shared.weight"], torch.tensor([[-0.4, -1.2]]))


def test_server_mean_h_and_cloud_model_with_partial_participation():
    strategy = FedDyn(buffers="dynamic")
    strategy.initialize(
        {"w": torch.tensor([1.0, 1.0]), "rv": torch.tensor([1.0])},
        ["a", "b", "c"],
        roles=ParameterRoles({"w": "shared", "rv": "shared"}, buffers={"rv"}),
    )
    strategy.global_state = strategy.aggregate(
        1, [ClientUpdate("a", 1, {"w": torch.tensor([1.0, 1.0]), "rv": torch.tensor([1.0])})]
    )
    # round 1 with only a, unchanged: theta_srv = theta_cld = [1, 1], hbar = 0
    assert strategy.cloud_state["w"].tolist() == [1.0, 1.0]
    strategy.h_mean["w"] = torch.tensor([0.5, 0.0])
    out = strategy.global_state = strategy.aggregate(
        2,
        [
            ClientUpdate("a", 1, {"w": torch.tensor([2.0, 0.0]), "rv": torch.tensor([3.0])}),
            ClientUpdate("b", 9, {"w": torch.tensor([4.0, 2.0]), "rv": torch.tensor([5.0])}),
        ],
    )
    # theta_srv = unweighted mean = [3, 1]; hbar = [0.5, 0] + ([1, -1] + [3, 1]) / N=3 = [0.5 + 4/3, 0] = [11/6, 0]
    assert out["w"].tolist() == [3.0, 1.0]
    assert torch.allclose(strategy.h_mean["w"], torch.tensor([11 / 6, 0.0]))
    # theta_cld = theta_srv + hbar = [29/6, 1]; buffers (dynamic): srv 4, hbar (2 + 4) / 3 = 2, cld 6
    assert torch.allclose(strategy.configure_client(3, "c")["w"], torch.tensor([29 / 6, 1.0]))
    assert strategy.configure_client(3, "c")["rv"].item() == pytest.approx(6.0)
    assert strategy.configure_evaluate(3, "c")["w"].tolist() == [3.0, 1.0]  # evaluated with theta_srv
    assert strategy.configure_client_extras(3, "c") == {"server_state": {"w": strategy.global_state["w"]}}


def test_buffers_are_averaged_without_correction_by_default():
    strategy = FedDyn()
    strategy.initialize(
        {"w": torch.tensor([1.0]), "rv": torch.tensor([1.0])},
        ["a", "b"],
        roles=ParameterRoles({"w": "shared", "rv": "shared"}, buffers={"rv"}),
    )
    assert set(strategy.h_mean) == {"w"}
    states = [
        {"w": torch.tensor([2.0]), "rv": torch.tensor([3.0])},
        {"w": torch.tensor([4.0]), "rv": torch.tensor([5.0])},
    ]
    cloud = {"w": torch.tensor([1.0]), "rv": torch.tensor([1.0])}
    server, h, new_cloud = feddyn_server_update(states, cloud, {"w": torch.tensor([0.0])}, num_clients=2)
    # w: srv 3, hbar (1 + 3) / 2 = 2, cld 5; rv: no hbar, cld = srv = 4
    assert new_cloud["w"].item() == 5.0 and new_cloud["rv"].item() == 4.0 and set(h) == {"w"}


def test_bad_options_are_named():
    with pytest.raises(ValueError) as err:
        FedDyn(alpha=-1.0, anchor="global")
    assert "strategy.init_args.alpha=-1.0" in str(err.value) and "strategy.init_args.anchor='global'" in str(err.value)


def test_two_rounds_communication_and_the_server_mean_of_h(tmp_path):
    federation = make_federation(tmp_path, FedDyn(), rounds=2, clients_per_round=2)
    federation.fit()
    shared = federation.module.named_tensors("shared")
    model_bytes = sum(t.numel() * t.element_size() for t in shared.values())
    param_bytes = sum(p.numel() * p.element_size() for _, p in federation.module.shared_parameters())
    # 2 clients x 2 rounds: up theta_k (as FedAvg); down theta_cld + theta_srv's parameters (the anchor)
    # evaluation: all 3 clients download the model they evaluate with (theta_srv by default) in each of 2 rounds
    assert federation.state.comm == {
        "upload_bytes": 4 * model_bytes,
        "download_bytes": 4 * (model_bytes + param_bytes),
        "eval_download_bytes": 6 * model_bytes,
    }
    # the server's hbar is the mean over all N clients of the h_k each client keeps
    strategy, key = federation.strategy, federation.strategy.state_key
    hs = [federation.store.extra(c, key).get("h") for c in federation.client_ids]
    for name, _ in federation.module.shared_parameters():
        mean = sum(h[name] for h in hs if h is not None) / len(hs)
        assert torch.allclose(strategy.h_mean[name], mean, atol=1e-5)
        assert torch.allclose(strategy.cloud_state[name], strategy.global_state[name] + strategy.h_mean[name])
    assert not torch.equal(strategy.cloud_state["head.weight"], strategy.global_state["head.weight"])


def test_resume_is_exact_with_partial_participation(tmp_path):
    straight, _ = assert_resume_is_exact(tmp_path, lambda: FedDyn(), clients_per_round=2)
    assert {"global_state", "cloud_state", "h_mean"} <= set(straight.strategy.state_dict())
