"""SCAFFOLD (Karimireddy et al. 2020): Eqs. 3-5 reproduced by hand, then two rounds end to end and exact resume."""

import warnings

import pytest
import torch
from torch import nn

from fedlit.module import FederatedModule
from fedlit.roles import ParameterRoles, RoleRule
from fedlit.strategies import SCAFFOLD, ClientUpdate
from fedlit.strategies import functional as F
from tests.conftest import assert_resume_is_exact, make_federation

MOMENTUM_WARNING = "ignore:SCAFFOLD assumes plain SGD"  # the tiny federation trains with momentum 0.9


class Lin(FederatedModule):
    def __init__(self):
        super().__init__(roles=[RoleRule("personal.*", "personal")])
        self.shared = nn.Linear(2, 1, bias=False)
        self.personal = nn.Linear(2, 1, bias=False)


def client_turn(c, c_i=None):
    """A SCAFFOLD that received x = [3, 1] and c, for a client whose c_i is given (0 when None)."""
    module = Lin()
    with torch.no_grad():
        module.shared.weight.copy_(torch.tensor([[3.0, 1.0]]))
        module.personal.weight.copy_(torch.tensor([[5.0, 5.0]]))
    strategy = SCAFFOLD()
    strategy.configure_roles(module.parameter_roles())
    strategy.initialize({"shared.weight": module.shared.weight.detach().clone()}, ["a", "b", "c", "d"])
    state = {} if c_i is None else {"c_i": {"shared.weight": torch.tensor([c_i])}}
    strategy.on_client_fit_start(pl_module=module, received={"shared.weight": torch.tensor([[3.0, 1.0]])},
                                 received_extras={"c": {"shared.weight": torch.tensor([c])}}, client_state=state)
    return module, strategy, state


def sgd_step(module, strategy, optimizer, grad):
    module.shared.weight.grad = torch.tensor([grad])
    module.personal.weight.grad = torch.tensor([[1.0, 1.0]])
    strategy.on_before_optimizer_step(optimizer=optimizer)
    optimizer.step()


def test_one_local_step_adds_c_minus_c_i_to_the_gradient():
    module, strategy, _ = client_turn(c=[0.5, -1.0], c_i=[0.25, 0.5])
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    sgd_step(module, strategy, optimizer, grad=[1.0, 2.0])
    # Eq. 3: y = x - lr (g + c - c_i) = [3, 1] - 0.1 * ([1, 2] + [0.25, -1.5]) = [3, 1] - 0.1 * [1.25, 0.5]
    assert torch.allclose(module.shared.weight, torch.tensor([[2.875, 0.95]]))
    # the personal layer has no control variate: a plain SGD step, 5 - 0.1 * 1
    assert torch.allclose(module.personal.weight, torch.tensor([[4.9, 4.9]]))


def test_control_variate_after_k_steps_is_option_two():
    module, strategy, state = client_turn(c=[0.5, -1.0], c_i=[0.25, 0.5])
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    sgd_step(module, strategy, optimizer, grad=[1.0, 2.0])   # y = [2.875, 0.95]
    sgd_step(module, strategy, optimizer, grad=[3.0, -2.0])  # y = [2.875, 0.95] - 0.1 * [3.25, -3.5] = [2.55, 1.3]
    update = ClientUpdate("a", 10, state={"shared.weight": module.shared.weight.detach().clone()})
    strategy.on_client_fit_end(update=update, client_state=state)
    # Eq. 4 (II), K = 2, lr = 0.1: c_i+ = c_i - c + (x - y) / (K lr) = [0.25, 0.5] - [0.5, -1] + [0.45, -0.3] / 0.2
    #                                   = [-0.25, 1.5] + [2.25, -1.5] = [2, 0]  (= the mean raw gradient, for SGD)
    assert torch.allclose(state["c_i"]["shared.weight"], torch.tensor([[2.0, 0.0]]), atol=1e-6)
    # upload delta c_i = c_i+ - c_i = [2, 0] - [0.25, 0.5]
    assert torch.allclose(update.extras["delta_c"]["shared.weight"], torch.tensor([[1.75, -0.5]]), atol=1e-6)


def test_server_steps_x_by_the_mean_delta_and_c_by_the_sum_over_all_clients():
    strategy = SCAFFOLD(eta_g=0.5)
    strategy.configure_roles(ParameterRoles({"w": "shared", "nbt": "shared"}, buffers={"nbt"}))
    strategy.initialize({"w": torch.tensor([1.0, 2.0]), "nbt": torch.tensor(10)}, ["a", "b", "c", "d"])
    strategy.c["w"] = torch.tensor([1.0, 1.0])
    updates = [
        ClientUpdate("a", 10, {"w": torch.tensor([3.0, 2.0]), "nbt": torch.tensor(14)},
                     extras={"delta_c": {"w": torch.tensor([4.0, 0.0])}}),
        ClientUpdate("b", 30, {"w": torch.tensor([1.0, 6.0]), "nbt": torch.tensor(18)},
                     extras={"delta_c": {"w": torch.tensor([0.0, 8.0])}}),
    ]
    out = strategy.aggregate(1, updates)
    # x += 0.5 * mean([2, 0], [0, 4]) = [1, 2] + 0.5 * [1, 2]; buffers alike, integers rounded: 10 + 0.5 * 6
    assert out["w"].tolist() == [1.5, 3.0] and out["nbt"].item() == 13 and out["nbt"].dtype == torch.int64
    # c += (delta_a + delta_b) / N with N = 4 (c, d not selected): [1, 1] + [4, 8] / 4
    assert strategy.c["w"].tolist() == [2.0, 3.0]
    assert strategy.configure_client_extras(2, "c")["c"]["w"].tolist() == [2.0, 3.0]


def test_num_examples_weighting_and_the_pure_step():
    x, ys = {"w": torch.tensor([0.0])}, [{"w": torch.tensor([4.0])}, {"w": torch.tensor([8.0])}]
    # x + 1 * (1/4 * 4 + 3/4 * 8) = 7
    assert F.server_step(x, ys, [1, 3], 1.0)["w"].item() == 7.0
    strategy = SCAFFOLD(weighting="num_examples")
    strategy.initialize({"w": torch.tensor([0.0])}, ["a", "b"])
    ups = [ClientUpdate(c, n, y, extras={"delta_c": {}}) for c, n, y in (("a", 1, ys[0]), ("b", 3, ys[1]))]
    assert strategy.aggregate(1, ups)["w"].item() == 7.0


def test_warns_once_unless_plain_sgd():
    module, strategy, _ = client_turn(c=[0.0, 0.0])
    with pytest.warns(UserWarning, match="SCAFFOLD assumes plain SGD"):
        sgd_step(module, strategy, torch.optim.Adam(module.parameters(), lr=0.1), grad=[1.0, 1.0])
    module, strategy, _ = client_turn(c=[0.0, 0.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sgd_step(module, strategy, torch.optim.SGD(module.parameters(), lr=0.1), grad=[1.0, 1.0])


def test_bad_options_are_named():
    with pytest.raises(ValueError) as err:
        SCAFFOLD(eta_g=0.0, weighting="size")
    assert "strategy.init_args.eta_g=0.0" in str(err.value) and "strategy.init_args.weighting='size'" in str(err.value)


@pytest.mark.filterwarnings(MOMENTUM_WARNING)
def test_two_rounds_exchange_control_variates_and_c_is_the_mean_of_every_c_i(tmp_path):
    federation = make_federation(tmp_path, SCAFFOLD(), rounds=2, clients_per_round=2)
    federation.fit()
    shared = federation.module.named_tensors("shared")
    model_bytes = sum(t.numel() * t.element_size() for t in shared.values())
    param_bytes = sum(p.numel() * p.element_size() for _, p in federation.module.shared_parameters())
    # 2 clients x 2 rounds; each way: the shared tensors (FedAvg's) + one control variate per shared parameter
    # evaluation: all 3 clients download the shared tensors (no control variate) in each of the 2 rounds
    assert federation.comm == {"upload_bytes": 4 * (model_bytes + param_bytes),
                               "download_bytes": 4 * (model_bytes + param_bytes),
                               "eval_download_bytes": 6 * model_bytes}
    assert param_bytes > 0.8 * model_bytes  # "about twice FedAvg": buffers carry no control variate
    # c starts at 0 and moves by sum(delta c_i) / N: it is always the mean of all N client variates
    key = federation.strategy.state_key
    variates = [federation.store.extra(c, key).get("c_i") for c in federation.client_ids]
    assert sum(v is None for v in variates) <= 1  # partial participation: some client may not have trained yet
    for name, c in federation.strategy.c.items():
        mean = sum(v[name] for v in variates if v is not None) / len(variates)
        assert torch.allclose(c, mean, atol=1e-5)
    # nonzero except where gradients vanish (a Linear bias right before BatchNorm gets none)
    assert federation.strategy.c["head.weight"].abs().min() > 0
    assert federation.strategy.c["backbone.0.bias"].abs().max() < 1e-6


@pytest.mark.filterwarnings(MOMENTUM_WARNING)
def test_resume_is_exact(tmp_path):
    straight, _ = assert_resume_is_exact(tmp_path, lambda: SCAFFOLD())
    assert all("c_i" in straight.store.extra(c, straight.strategy.state_key) for c in straight.client_ids)
