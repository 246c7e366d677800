"""SCAFFOLD (Karimireddy et al. 2020): Eqs. 3-5 reproduced by hand, then two rounds end to end and exact resume."""

import warnings

import pytest
import torch
from torch import nn

from fedlit.core.errors import ConfigError
from fedlit.core.roles import ParameterRoles, RoleRule
from fedlit.module import FederatedModule
from fedlit.strategies import SCAFFOLD, ClientUpdate
from fedlit.strategies.scaffold import scaffold_server_control, server_step
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
    strategy.initialize(
        {"shared.weight": module.shared.weight.detach().clone()}, ["a", "b", "c", "d"], roles=module.parameter_roles()
    )
    state = {} if c_i is None else {"c_i": {"shared.weight": torch.tensor([c_i])}}
    strategy.on_client_fit_start(
        pl_module=module,
        received={"shared.weight": torch.tensor([[3.0, 1.0]])},
        received_extras={"c": {"shared.weight": torch.tensor([c])}},
        client_state=state,
    )
    return module, strategy, state


def sgd_step(module, strategy, optimizer, grad, stepped=True):
    """One local step as the loop takes it; ``stepped=False``: the gradient scaler skips ``optimizer.step()``."""
    module.shared.weight.grad = torch.tensor([grad])
    module.personal.weight.grad = torch.tensor([[1.0, 1.0]])
    strategy.on_before_optimizer_step(optimizer=optimizer)
    if stepped:
        optimizer.step()
    strategy.on_before_zero_grad(optimizer=optimizer, stepped=stepped)
    optimizer.zero_grad(set_to_none=True)


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
    sgd_step(module, strategy, optimizer, grad=[1.0, 2.0])  # y = [2.875, 0.95]
    sgd_step(module, strategy, optimizer, grad=[3.0, -2.0])  # y = [2.875, 0.95] - 0.1 * [3.25, -3.5] = [2.55, 1.3]
    update = ClientUpdate("a", 10, state={"shared.weight": module.shared.weight.detach().clone()})
    strategy.on_client_fit_end(update=update, client_state=state)
    # Eq. 4 (II), K = 2, lr = 0.1: c_i+ = c_i - c + (x - y) / (K lr) = [0.25, 0.5] - [0.5, -1] + [0.45, -0.3] / 0.2
    #                                   = [-0.25, 1.5] + [2.25, -1.5] = [2, 0]  (= the mean raw gradient, for SGD)
    assert torch.allclose(state["c_i"]["shared.weight"], torch.tensor([[2.0, 0.0]]), atol=1e-6)
    # upload delta c_i = c_i+ - c_i = [2, 0] - [0.25, 0.5]
    assert torch.allclose(update.extras["delta_c"]["shared.weight"], torch.tensor([[1.75, -0.5]]), atol=1e-6)


def test_k_lr_sums_the_learning_rates_a_schedule_applied():
    module, strategy, state = client_turn(c=[0.5, -1.0], c_i=[0.25, 0.5])
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)  # interval "step": 0.1, 0.05
    sgd_step(module, strategy, optimizer, grad=[1.0, 2.0])  # y = [3, 1] - 0.1 * [1.25, 0.5] = [2.875, 0.95]
    scheduler.step()  # as the loop does, after the step
    sgd_step(module, strategy, optimizer, grad=[1.0, 2.0])  # y = [2.875, 0.95] - 0.05 * [1.25, 0.5] = [2.8125, 0.925]
    update = ClientUpdate("a", 10, state={"shared.weight": module.shared.weight.detach().clone()})
    strategy.on_client_fit_end(update=update, client_state=state)
    # K eta_l = 0.1 + 0.05: c_i+ = [-0.25, 1.5] + [0.1875, 0.075] / 0.15 = [-0.25, 1.5] + [1.25, 0.5] = [1, 2]
    # (2 * 0.1 would give [0.6875, 1.875], 2 * 0.05 [1.625, 2.25])
    assert torch.allclose(state["c_i"]["shared.weight"], torch.tensor([[1.0, 2.0]]), atol=1e-5)
    assert torch.allclose(update.extras["delta_c"]["shared.weight"], torch.tensor([[0.75, 1.5]]), atol=1e-5)


def test_a_step_the_gradient_scaler_skipped_is_not_counted_in_k_lr():
    module, strategy, state = client_turn(c=[0.5, -1.0], c_i=[0.25, 0.5])
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    sgd_step(module, strategy, optimizer, grad=[1.0, 2.0], stepped=False)  # skipped: y stays x = [3, 1]
    sgd_step(module, strategy, optimizer, grad=[3.0, -2.0])
    # y = x - 0.1 (g + c - c_i) = [3, 1] - 0.1 * ([3, -2] + [0.25, -1.5]) = [3, 1] - [0.325, -0.35] = [2.675, 1.35]
    assert torch.allclose(module.shared.weight, torch.tensor([[2.675, 1.35]]))
    update = ClientUpdate("a", 10, state={"shared.weight": module.shared.weight.detach().clone()})
    strategy.on_client_fit_end(update=update, client_state=state)
    # K = 1 step happened: c_i+ = c_i - c + (x - y) / (1 * 0.1) = [-0.25, 1.5] + [0.325, -0.35] / 0.1 = [3, -2]
    # (the raw gradient of the one step); counting the skipped step too (K lr = 0.2) would give [1.375, -0.25]
    assert torch.allclose(state["c_i"]["shared.weight"], torch.tensor([[3.0, -2.0]]), atol=1e-5)
    assert torch.allclose(update.extras["delta_c"]["shared.weight"], torch.tensor([[2.75, -2.5]]), atol=1e-5)


def test_a_client_whose_every_step_was_skipped_keeps_its_c_i():
    module, strategy, state = client_turn(c=[0.5, -1.0], c_i=[0.25, 0.5])
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    sgd_step(module, strategy, optimizer, grad=[1.0, 2.0], stepped=False)
    update = ClientUpdate("a", 10, state={"shared.weight": module.shared.weight.detach().clone()})
    with pytest.warns(UserWarning, match="client 'a' took no optimizer step"):
        strategy.on_client_fit_end(update=update, client_state=state)
    # K = 0: (x - y) / (K lr) is 0 / 0; c_i stays [0.25, 0.5] and delta c_i = 0
    assert state["c_i"]["shared.weight"].tolist() == [[0.25, 0.5]]
    assert update.extras["delta_c"]["shared.weight"].tolist() == [[0.0, 0.0]]


def test_server_steps_x_by_the_mean_delta_and_c_by_the_sum_over_all_clients():
    strategy = SCAFFOLD(eta_g=0.5)
    strategy.initialize(
        {"w": torch.tensor([1.0, 2.0]), "nbt": torch.tensor(10)},
        ["a", "b", "c", "d"],
        roles=ParameterRoles({"w": "shared", "nbt": "shared"}, buffers={"nbt"}),
    )
    strategy.c["w"] = torch.tensor([1.0, 1.0])
    updates = [
        ClientUpdate(
            "a",
            10,
            {"w": torch.tensor([3.0, 2.0]), "nbt": torch.tensor(14)},
            extras={"delta_c": {"w": torch.tensor([4.0, 0.0])}},
        ),
        ClientUpdate(
            "b",
            30,
            {"w": torch.tensor([1.0, 6.0]), "nbt": torch.tensor(18)},
            extras={"delta_c": {"w": torch.tensor([0.0, 8.0])}},
        ),
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
    assert server_step(x, ys, [1, 3], 1.0)["w"].item() == 7.0
    strategy = SCAFFOLD(weighting="num_examples")
    strategy.initialize({"w": torch.tensor([0.0])}, ["a", "b"])
    ups = [
        ClientUpdate(c, n, y, extras={"delta_c": {"w": torch.zeros(1)}})
        for c, n, y in (("a", 1, ys[0]), ("b", 3, ys[1]))
    ]
    assert strategy.aggregate(1, ups)["w"].item() == 7.0


def three_client_round(weighting, control_weighting="same"):
    """N = 5 clients, 3 of them (n = 1, 2, 5) upload; x = [0, 0], c = [1, 0]."""
    strategy = SCAFFOLD(weighting=weighting, control_weighting=control_weighting)
    strategy.initialize({"w": torch.zeros(2)}, ["a", "b", "c", "d", "e"])
    strategy.c["w"] = torch.tensor([1.0, 0.0])
    ups = [
        ClientUpdate(name, n, {"w": torch.tensor(y)}, extras={"delta_c": {"w": torch.tensor(dc)}})
        for name, n, y, dc in (
            ("a", 1, [8.0, 0.0], [2.0, 4.0]),
            ("b", 2, [0.0, 8.0], [4.0, 0.0]),
            ("c", 5, [8.0, 8.0], [-1.0, 8.0]),
        )
    ]
    return strategy, strategy.aggregate(1, ups)["w"]


def test_sample_weighted_models_move_c_with_the_same_weights():
    strategy, x = three_client_round("num_examples")
    # w = [1, 2, 5] / 8; x = 1/8 [8, 0] + 2/8 [0, 8] + 5/8 [8, 8] = [1 + 5, 2 + 5] = [6, 7]
    assert torch.allclose(x, torch.tensor([6.0, 7.0]))
    # sum_i w_i delta c_i = 1/8 [2, 4] + 2/8 [4, 0] + 5/8 [-1, 8] = [(2 + 8 - 5) / 8, (4 + 40) / 8] = [0.625, 5.5]
    # c += |S| / N * that = 3/5 [0.625, 5.5] = [0.375, 3.3]: c = [1.375, 3.3]
    # (the unweighted sum / N would give [1, 0] + [5, 12] / 5 = [2, 2.4])
    assert torch.allclose(strategy.c["w"], torch.tensor([1.375, 3.3]), atol=1e-6)
    assert strategy.hparams()["control_weighting"] == "same"


@pytest.mark.parametrize(("weighting", "control_weighting"), [("uniform", "same"), ("num_examples", "uniform")])
def test_uniform_control_weights_are_the_papers_sum_over_n(weighting, control_weighting):
    strategy, x = three_client_round(weighting, control_weighting)
    # Eq. 5: c += (1 / N) sum_i delta c_i = [1, 0] + [2 + 4 - 1, 4 + 0 + 8] / 5 = [1, 0] + [1, 2.4]
    assert torch.allclose(strategy.c["w"], torch.tensor([2.0, 2.4]), atol=1e-6)
    # the model's weights are still weighting's: the mean [16/3, 16/3], or [6, 7] weighted as above
    expected = [16 / 3, 16 / 3] if weighting == "uniform" else [6.0, 7.0]
    assert torch.allclose(x, torch.tensor(expected), atol=1e-6)


def test_with_every_client_c_stays_the_weighted_mean_of_the_c_i_so_the_corrections_cancel():
    strategy = SCAFFOLD(weighting="num_examples")
    strategy.initialize({"w": torch.zeros(1)}, ["a", "b"])
    # c = c_a = c_b = 0 before; after round 1 c_a = 4, c_b = 8 (delta = c_i+ here); n = 1, 3: w = [1/4, 3/4]
    ups = [
        ClientUpdate(name, n, {"w": torch.zeros(1)}, extras={"delta_c": {"w": torch.tensor([dc])}})
        for name, n, dc in (("a", 1, 4.0), ("b", 3, 8.0))
    ]
    strategy.aggregate(1, ups)
    # |S| = N: c = 1/4 * 4 + 3/4 * 8 = 7 = sum_i w_i c_i, so sum_i w_i (c - c_i) = 0 (the plain mean would give 6)
    assert strategy.c["w"].item() == pytest.approx(7.0, abs=1e-9)


def test_server_control_update_rejects_weights_that_sum_to_zero():
    with pytest.raises(ValueError, match="sum to zero"):
        scaffold_server_control({"w": torch.zeros(1)}, [{"w": torch.ones(1)}], [0.0], 2)


@pytest.mark.parametrize(
    "make",
    [
        lambda params: torch.optim.Adam(params, lr=0.1),
        lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
        lambda params: torch.optim.SGD(params, lr=0.1, weight_decay=0.01),
    ],
    ids=["adam", "momentum", "weight_decay"],
)
def test_warns_once_unless_plain_sgd(make):
    module, strategy, _ = client_turn(c=[0.0, 0.0])
    with pytest.warns(UserWarning, match="SCAFFOLD assumes plain SGD") as record:
        sgd_step(module, strategy, make(module.parameters()), grad=[1.0, 1.0])
    assert "model.init_args.weight_decay=0" in str(record[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per strategy
        sgd_step(module, strategy, make(module.parameters()), grad=[1.0, 1.0])


def test_plain_sgd_does_not_warn():
    module, strategy, _ = client_turn(c=[0.0, 0.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sgd_step(module, strategy, torch.optim.SGD(module.parameters(), lr=0.1), grad=[1.0, 1.0])


def test_bad_options_are_named():
    with pytest.raises(ConfigError) as err:
        SCAFFOLD(eta_g=0.0, weighting="size", control_weighting="n")
    assert "strategy.init_args.eta_g=0.0" in str(err.value) and "strategy.init_args.weighting='size'" in str(err.value)
    assert "strategy.init_args.control_weighting='n'" in str(err.value)


@pytest.mark.filterwarnings(MOMENTUM_WARNING)
def test_two_rounds_exchange_control_variates_and_c_is_the_mean_of_every_c_i(tmp_path):
    federation = make_federation(tmp_path, SCAFFOLD(), rounds=2, clients_per_round=2)
    federation.fit()
    shared = federation.module.named_tensors("shared")
    model_bytes = sum(t.numel() * t.element_size() for t in shared.values())
    param_bytes = sum(p.numel() * p.element_size() for _, p in federation.module.shared_parameters())
    # 2 clients x 2 rounds; each way: the shared tensors (FedAvg's) + one control variate per shared parameter
    # evaluation: all 3 clients download the shared tensors (no control variate) in each of the 2 rounds
    assert federation.state.comm == {
        "upload_bytes": 4 * (model_bytes + param_bytes),
        "download_bytes": 4 * (model_bytes + param_bytes),
        "eval_download_bytes": 6 * model_bytes,
    }
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
