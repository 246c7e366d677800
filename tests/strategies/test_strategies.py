"""Each strategy's equation, reproduced by hand, and the properties that tie them together."""

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn

from fedlit.core.roles import ParameterRoles, RoleRule
from fedlit.module import FederatedModule
from fedlit.strategies import ClientUpdate, FedAvg, FedBN, FedProx, Local
from fedlit.strategies.fedprox import squared_distance
from tests.conftest import make_federation


def update(cid, n, **tensors):
    return ClientUpdate(client_id=cid, num_examples=n, state={k: torch.tensor(v) for k, v in tensors.items()})


def test_fedavg_weights_by_num_examples():
    strategy = FedAvg()
    strategy.initialize({"w": torch.zeros(2)}, ["a", "b"])
    out = strategy.global_state = strategy.aggregate(1, [update("a", 10, w=[1.0, 0.0]), update("b", 30, w=[5.0, 4.0])])
    # w = 10/40 * [1, 0] + 30/40 * [5, 4] = [4, 3]
    assert out["w"].tolist() == [4.0, 3.0]
    assert strategy.configure_client(2, "a")["w"].tolist() == [4.0, 3.0]


def test_fedavg_uniform_weighting():
    strategy = FedAvg(weighting="uniform")
    strategy.initialize({"w": torch.zeros(1)}, ["a", "b"])
    assert strategy.aggregate(1, [update("a", 10, w=[1.0]), update("b", 30, w=[5.0])])["w"].item() == 3.0


def test_fedavg_refuses_personal_uploads_and_keeps_unsent_keys():
    strategy = FedAvg()
    strategy.initialize({"w": torch.zeros(1), "v": torch.ones(1)}, ["a"])
    with pytest.raises(KeyError, match="does not share"):
        strategy.aggregate(1, [update("a", 1, head=[1.0])])
    out = strategy.aggregate(1, [update("a", 1, w=[2.0])])
    assert out["v"].item() == 1.0 and out["w"].item() == 2.0


class Lin(FederatedModule):
    def __init__(self):
        super().__init__(roles=[RoleRule("personal.*", "personal")])
        self.shared = nn.Linear(2, 1, bias=False)
        self.personal = nn.Linear(2, 1, bias=False)


def test_fedprox_adds_mu_half_squared_distance_to_the_received_tensors():
    module = Lin()
    with torch.no_grad():
        module.shared.weight.copy_(torch.tensor([[3.0, 1.0]]))
        module.personal.weight.copy_(torch.tensor([[100.0, 100.0]]))
    strategy = FedProx(mu=0.5)
    strategy.on_client_fit_start(received={"shared.weight": torch.tensor([[1.0, 1.0]])})
    loss = strategy.training_loss(module, torch.tensor(2.0), batch=None)
    # 2 + 0.5 / 2 * ((3 - 1)^2 + (1 - 1)^2) = 3; the personal layer is not pulled
    assert loss.item() == pytest.approx(3.0)
    loss.backward()
    # d/dw mu/2 ||w - w_t||^2 = mu (w - w_t) = 0.5 * [2, 0]
    assert module.shared.weight.grad.tolist() == [[1.0, 0.0]]


def test_squared_distance_by_hand():
    params = {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([3.0])}
    anchor = {"a": torch.tensor([0.0, 0.0]), "b": torch.tensor([1.0])}
    assert squared_distance(params, anchor).item() == 1 + 4 + 4


coords = st.lists(st.floats(-10, 10, allow_nan=False, width=32), min_size=2, max_size=2)


@settings(max_examples=30, deadline=None)
@given(coords, coords, st.lists(st.integers(1, 50), min_size=3, max_size=3))
def test_fedprox_with_mu_zero_equals_fedavg(trained, anchor, counts):
    assume(sum((w - a) ** 2 for w, a in zip(trained, anchor, strict=True)) > 1e-2)  # a real distance to the anchor
    x = [0.5, -2.0]
    grads, losses = {}, {}
    for mu in (0.0, 0.5):
        module = Lin()
        with torch.no_grad():
            module.shared.weight.copy_(torch.tensor([trained]))
        prox = FedProx(mu=mu)
        prox.on_client_fit_start(received={"shared.weight": torch.tensor([anchor])})
        base = module.shared(torch.tensor([x])).sum()  # the task loss w . x: its gradient is x
        loss = prox.training_loss(module, base, None)
        loss.backward()
        losses[mu], grads[mu] = loss.item(), module.shared.weight.grad[0].tolist()
    # mu = 0: FedAvg's client objective and gradient, although the weights are away from the anchor
    w_dot_x = sum(w * xi for w, xi in zip(trained, x, strict=True))
    assert losses[0.0] == pytest.approx(w_dot_x, rel=1e-5, abs=1e-4)
    assert grads[0.0] == pytest.approx(x, abs=1e-6)
    # mu = 0.5: + mu/2 ||w - w_t||^2, gradient x + mu (w - w_t)
    distance = sum((w - a) ** 2 for w, a in zip(trained, anchor, strict=True))
    assert losses[0.5] == pytest.approx(w_dot_x + 0.25 * distance, rel=1e-5, abs=1e-4)
    assert grads[0.5] == pytest.approx(
        [xi + 0.5 * (w - a) for xi, w, a in zip(x, trained, anchor, strict=True)], rel=1e-5, abs=1e-4
    )
    assert losses[0.5] - losses[0.0] > 1e-3
    # and the server is FedAvg's
    prox, avg = FedProx(mu=0.0), FedAvg()
    ups = [update(str(i), n, w=[v * i for v in trained]) for i, n in enumerate(counts)]
    for s in (prox, avg):
        s.initialize({"w": torch.zeros(2)}, ["0", "1", "2"])
    assert torch.equal(prox.aggregate(1, ups)["w"], avg.aggregate(1, ups)["w"])


def test_fedprox_run_with_mu_zero_is_fedavgs_run_and_mu_positive_is_not(tmp_path):
    runs = {}
    for name, strategy in (("avg", FedAvg()), ("prox0", FedProx(mu=0.0)), ("prox", FedProx(mu=0.5))):
        runs[name] = make_federation(tmp_path / name, strategy, rounds=2)
        runs[name].fit()
    avg, prox0, prox = (runs[n].strategy.global_state for n in ("avg", "prox0", "prox"))
    assert avg.keys() == prox0.keys() == prox.keys()
    assert all(torch.equal(avg[k], prox0[k]) for k in avg)
    # the proximal term pulls toward the received weights: the mu = 0.5 run ends elsewhere (by 2.3e-3 at its
    # largest coordinate here)
    gap = max((avg[k].double() - prox[k].double()).abs().max().item() for k in avg if avg[k].is_floating_point())
    assert gap > 1e-3


class WithNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2))
        self.adapter = nn.Sequential(nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2))
        self.head = nn.Linear(2, 2)


def test_fedbn_makes_trainable_norm_layers_personal_and_keeps_frozen_ones_frozen():
    roles = ParameterRoles.from_module(WithNorm(), [RoleRule("backbone.*", "frozen")])
    fedbn = FedBN().configure_roles(roles)
    assert fedbn["adapter.1.weight"] == "personal" and fedbn["adapter.1.running_mean"] == "personal"
    assert fedbn["backbone.1.weight"] == "frozen" and fedbn["backbone.1.running_var"] == "frozen"
    assert fedbn["adapter.0.weight"] == "shared" and fedbn["head.weight"] == "shared"


def test_fedbn_server_never_changes_norm_tensors():
    roles = FedBN().configure_roles(ParameterRoles.from_module(WithNorm(), []))
    shared = set(roles.names("shared"))
    assert not any(roles.is_norm(n) for n in shared)


def test_local_shares_nothing():
    roles = Local().configure_roles(ParameterRoles.from_module(WithNorm(), [RoleRule("backbone.*", "frozen")]))
    assert roles.names("shared") == []
    assert Local().aggregate(1, []) == {}


def test_select_clients_is_seeded_and_without_replacement():
    strategy = FedAvg()
    ids = [f"c{i}" for i in range(10)]
    a = strategy.select_clients(1, ids, 4, torch.Generator().manual_seed(3))
    b = strategy.select_clients(1, ids, 4, torch.Generator().manual_seed(3))
    c = strategy.select_clients(1, ids, 4, torch.Generator().manual_seed(4))
    assert a == b and len(set(a)) == 4 and a != c
    assert strategy.select_clients(1, ids, 20, torch.Generator()) == ids


def test_constructors_name_bad_options():
    with pytest.raises(ValueError, match="strategy.init_args.mu"):
        FedProx(mu=-1)
    with pytest.raises(ValueError, match="strategy.init_args.weighting"):
        FedAvg(weighting="size")
    assert repr(FedProx(mu=0.1)) == "FedProx(mu=0.1, weighting='num_examples')"
