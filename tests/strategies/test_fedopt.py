"""FedAdam, FedAdagrad, FedYogi (Reddi et al. 2021, Algorithm 2): steps worked out by hand, state, resume."""

import math

import pytest
import torch
from lightning.pytorch import Callback
from torch import nn

from fedlit.core.roles import ParameterRoles
from fedlit.strategies import ClientUpdate, FedAdagrad, FedAdam, FedYogi
from tests.conftest import assert_resume_is_exact, make_federation


def updates(*states, counts):
    return [
        ClientUpdate(
            client_id=str(i), num_examples=n, state={k: torch.tensor(v, dtype=torch.float64) for k, v in s.items()}
        )
        for i, (s, n) in enumerate(zip(states, counts, strict=True))
    ]


def test_fedadam_one_step_by_hand():
    strategy = FedAdam(eta=0.1, tau=0.01, beta_1=0.9, beta_2=0.99)
    strategy.initialize({"w": torch.tensor([0.0, 1.0], dtype=torch.float64)}, ["a", "b"])
    out = strategy.aggregate(1, updates({"w": [0.4, 2.0]}, {"w": [0.8, 1.0]}, counts=[1, 3]))
    # weighted mean = 0.25 [0.4, 2] + 0.75 [0.8, 1] = [0.7, 1.25]; Delta = [0.7, 0.25]
    # m = 0.1 Delta = [0.07, 0.025]; v = 0.01 Delta^2 = [0.0049, 0.000625]; sqrt(v) = [0.07, 0.025]
    # x = x + 0.1 m / (sqrt(v) + 0.01) = [0 + 0.1 * 0.07 / 0.08, 1 + 0.1 * 0.025 / 0.035] = [0.0875, 1.0714285...]
    assert out["w"].tolist() == pytest.approx([0.0875, 1 + 0.0025 / 0.035], rel=1e-12)
    assert strategy.m["w"].tolist() == pytest.approx([0.07, 0.025], rel=1e-12)
    assert strategy.v["w"].tolist() == pytest.approx([0.0049, 0.000625], rel=1e-12)


# Three server steps from x = 0 with one client, eta = 0.1, tau = 0.01, beta_1 = 0.9, beta_2 = 0.99, no bias
# correction. The client moves the model by Delta = 1, then 0.05, then 0.5:
#   m_1 = 0.1 * 1 = 0.1;  m_2 = 0.9 * 0.1 + 0.1 * 0.05 = 0.095;  m_3 = 0.9 * 0.095 + 0.1 * 0.5 = 0.1355
# Adam     v_t = 0.99 v + 0.01 Delta^2:            0.01,  0.0099 + 0.000025 = 0.009925,
#                                                   0.99 * 0.009925 + 0.0025 = 0.01232575
# Yogi     v_t = v - 0.01 Delta^2 sign(v - Delta^2): 0 + 0.01 = 0.01 (v < Delta^2: grows, as Adam's),
#                                                   0.01 - 0.000025 = 0.009975 (v > Delta^2: shrinks),
#                                                   0.009975 + 0.0025 = 0.012475 (v < Delta^2: grows)
# Adagrad  v_t = v + Delta^2:                       1,  1.0025,  1.2525
# and x_t = x_{t-1} + 0.1 m_t / (sqrt(v_t) + 0.01).
HAND_M = [0.1, 0.095, 0.1355]
HAND_V = {
    "FedAdam": [0.01, 0.009925, 0.01232575],
    "FedYogi": [0.01, 0.009975, 0.012475],
    "FedAdagrad": [1.0, 1.0025, 1.2525],
}
RULES = {"FedAdam": FedAdam, "FedYogi": FedYogi, "FedAdagrad": FedAdagrad}


@pytest.mark.parametrize("rule", list(RULES))
def test_three_server_steps_by_hand(rule):
    kwargs = {"eta": 0.1, "tau": 0.01, "beta_1": 0.9}
    strategy = RULES[rule](**kwargs) if rule == "FedAdagrad" else RULES[rule](**kwargs, beta_2=0.99)
    strategy.initialize({"w": torch.tensor([0.0], dtype=torch.float64)}, ["a"])
    x = 0.0
    for server_round, (delta, m, v) in enumerate(zip([1.0, 0.05, 0.5], HAND_M, HAND_V[rule], strict=True), 1):
        upload = strategy.global_state["w"].item() + delta
        strategy.global_state = strategy.aggregate(server_round, updates({"w": [upload]}, counts=[5]))  # as the loop
        out = strategy.global_state["w"].item()
        x = x + 0.1 * m / (math.sqrt(v) + 0.01)
        assert strategy.m["w"].item() == pytest.approx(m, rel=1e-12), server_round
        assert strategy.v["w"].item() == pytest.approx(v, rel=1e-12), server_round
        assert out == pytest.approx(x, rel=1e-12), server_round


def test_the_hand_worked_rules_differ_where_the_test_can_see_it():
    # Adam and Yogi agree after round 1 (v starts at 0) and differ from round 2 on, in both of Yogi's branches
    assert HAND_V["FedAdam"][0] == HAND_V["FedYogi"][0]
    for t in (1, 2):
        assert abs(HAND_V["FedAdam"][t] - HAND_V["FedYogi"][t]) > 1e-6 * HAND_V["FedAdam"][t]


def test_fedadagrad_without_momentum():
    strategy = FedAdagrad(eta=0.1, tau=0.01, beta_1=0.0)
    strategy.initialize({"w": torch.tensor([0.0], dtype=torch.float64)}, ["a"])
    # round 1: Delta = 0.3, v = 0.09, m = Delta: x = 0.1 * 0.3 / (0.3 + 0.01)
    strategy.global_state = strategy.aggregate(1, updates({"w": [0.3]}, counts=[1]))  # as the loop stores it
    x1 = strategy.global_state["w"].item()
    assert x1 == pytest.approx(0.03 / 0.31, rel=1e-12)
    # round 2: Delta = 0.4, v = 0.09 + 0.16 = 0.25: x = x1 + 0.1 * 0.4 / (0.5 + 0.01)
    x2 = strategy.aggregate(2, updates({"w": [x1 + 0.4]}, counts=[1]))["w"].item()
    assert strategy.v["w"].item() == pytest.approx(0.25, rel=1e-12)
    assert x2 == pytest.approx(x1 + 0.04 / 0.51, rel=1e-12)


def test_fedadam_bias_correction_is_flowers_step_size():
    strategy = FedAdam(eta=0.1, beta_1=0.9, beta_2=0.99, bias_correction=True)
    # Flower 1.41: eta sqrt(1 - b2^(t+1)) / (1 - b1^(t+1)) with t the server round
    assert strategy.step_size(1) == pytest.approx(0.1 * math.sqrt(1 - 0.99**2) / (1 - 0.9**2))
    assert strategy.step_size(3) == pytest.approx(0.1 * math.sqrt(1 - 0.99**4) / (1 - 0.9**4))
    assert FedAdam(eta=0.1).step_size(3) == 0.1


def test_integer_buffers_are_aggregated_not_optimized_and_dtypes_kept():
    strategy = FedAdam()
    state = {"w": torch.zeros(2, dtype=torch.bfloat16), "bn.num_batches_tracked": torch.tensor(0)}
    strategy.initialize(state, ["a", "b"])
    ups = [
        ClientUpdate(
            client_id="a",
            num_examples=1,
            state={"w": torch.ones(2, dtype=torch.bfloat16), "bn.num_batches_tracked": torch.tensor(10)},
        ),
        ClientUpdate(
            client_id="b",
            num_examples=1,
            state={"w": torch.ones(2, dtype=torch.bfloat16), "bn.num_batches_tracked": torch.tensor(20)},
        ),
    ]
    out = strategy.aggregate(1, ups)
    assert out["bn.num_batches_tracked"].item() == 15 and out["bn.num_batches_tracked"].dtype == torch.int64
    assert out["w"].dtype == torch.bfloat16 and set(strategy.m) == {"w"}
    assert strategy.m["w"].dtype == torch.float32  # moments of half-precision tensors in float32


@pytest.mark.parametrize("optimize_buffers", [False, True])
def test_running_statistics_are_averaged_unless_optimize_buffers(optimize_buffers):
    strategy = FedAdam(eta=0.1, tau=0.01, optimize_buffers=optimize_buffers)
    roles = strategy.configure_roles(ParameterRoles.from_module(nn.BatchNorm1d(1), []))
    strategy.initialize({"weight": torch.ones(1), "running_var": torch.ones(1)}, ["a"], roles=roles)
    upload = {"weight": torch.tensor([3.0]), "running_var": torch.tensor([3.0])}
    out = strategy.aggregate(1, [ClientUpdate(client_id="a", num_examples=1, state=upload)])
    # Delta = 2 for both: Adam step 0.1 * 0.2 / (0.2 + 0.01) on the weight; the running variance takes the mean (3)
    assert out["weight"].item() == pytest.approx(1 + 0.02 / 0.21)
    assert out["running_var"].item() == pytest.approx(1 + 0.02 / 0.21 if optimize_buffers else 3.0)
    assert ("running_var" in strategy.m) == optimize_buffers


def test_unsent_tensors_and_empty_rounds_leave_the_server_unchanged():
    strategy = FedYogi()
    strategy.initialize({"w": torch.zeros(1), "personal_like": torch.ones(1)}, ["a"])
    assert strategy.aggregate(1, [])["w"].item() == 0.0
    out = strategy.aggregate(1, [ClientUpdate(client_id="a", num_examples=1, state={"w": torch.ones(1)})])
    assert out["personal_like"].item() == 1.0 and out["w"].item() > 0


def test_state_dict_round_trip_restores_the_moments():
    a = FedAdam(eta=0.1)
    a.initialize({"w": torch.zeros(2)}, ["a"])
    a.global_state = a.aggregate(
        1, [ClientUpdate(client_id="a", num_examples=1, state={"w": torch.tensor([1.0, -1.0])})]
    )
    b = FedAdam(eta=0.1)
    b.load_state_dict(a.state_dict())
    assert torch.equal(b.m["w"], a.m["w"]) and torch.equal(b.v["w"], a.v["w"])
    nxt = [ClientUpdate(client_id="a", num_examples=1, state={"w": torch.tensor([0.5, 0.5])})]
    assert torch.equal(a.aggregate(2, nxt)["w"], b.aggregate(2, nxt)["w"])


def test_constructors_name_bad_options():
    with pytest.raises(ValueError, match=r"strategy\.init_args\.eta=0.*strategy\.init_args\.tau=-1"):
        FedAdam(eta=0, tau=-1)
    with pytest.raises(ValueError, match=r"strategy\.init_args\.beta_2=1"):
        FedYogi(beta_2=1)
    with pytest.raises(ValueError, match=r"strategy\.init_args\.beta_1=-0\.5"):
        FedAdagrad(beta_1=-0.5)
    assert repr(FedAdagrad()) == "FedAdagrad(eta=0.01, tau=0.01, beta_1=0.9, weighting='num_examples')"
    assert repr(FedAdam()) == (
        "FedAdam(eta=0.01, tau=0.01, beta_1=0.9, beta_2=0.99, weighting='num_examples', bias_correction=False)"
    )


class Recorder(Callback):
    """The server model each round's clients received and the uploads the strategy aggregated."""

    def __init__(self):
        self.received, self.uploads = {}, {}

    def on_client_fit_start(self, server_round, received):
        self.received[server_round] = {n: t.detach().clone() for n, t in received.items()}

    def on_before_aggregate(self, server_round, updates):
        self.uploads[server_round] = [
            ({n: t.detach().clone() for n, t in u.state.items()}, u.num_examples) for u in updates
        ]


def reference_server_step(rule, x, uploads, m, v, buffers, eta, tau, beta_1, beta_2):
    """Algorithm 2 of Reddi et al. written out again, in float64: the n_k-weighted mean of the uploads gives
    Delta; parameters take the rule's step, buffers the weighted mean (integers rounded)."""
    total = sum(n for _, n in uploads)
    out = {}
    for name, value in x.items():
        mean = sum(n * state[name].double() for state, n in uploads) / total
        if not value.is_floating_point() or name in buffers:
            out[name] = mean if value.is_floating_point() else mean.round()
            continue
        delta = mean - value.double()
        m[name] = beta_1 * m.get(name, 0.0) + (1 - beta_1) * delta
        v_prev = v.get(name, torch.zeros_like(delta))
        if rule == "FedAdam":
            v[name] = beta_2 * v_prev + (1 - beta_2) * delta**2
        elif rule == "FedYogi":
            v[name] = v_prev - (1 - beta_2) * delta**2 * torch.sign(v_prev - delta**2)
        else:
            v[name] = v_prev + delta**2
        out[name] = value.double() + eta * m[name] / (v[name].sqrt() + tau)
    return out


@pytest.mark.parametrize("rule", list(RULES))
def test_real_runs_take_their_own_rules_server_steps(tmp_path, rule):
    # beta_2 = 0.5 so that Adam's and Yogi's v part clearly in round 2
    hp = {"eta": 0.05, "tau": 0.01, "beta_1": 0.9, "beta_2": 0.5}
    recorder = Recorder()
    strategy = RULES[rule](**{k: val for k, val in hp.items() if rule != "FedAdagrad" or k != "beta_2"})
    run = make_federation(tmp_path, strategy, rounds=2, callbacks=[recorder])
    run.fit()
    roles = run.module.parameter_roles()
    buffers = {n for n in strategy.global_state if roles.is_buffer(n)}
    assert any("running_var" in n for n in buffers) and any("num_batches_tracked" in n for n in buffers)
    assert set(strategy.m) == set(strategy.global_state) - buffers  # parameters only
    observed = {1: recorder.received[2], 2: strategy.global_state}
    for candidate in RULES:
        m, v, x = {}, {}, recorder.received[1]
        gaps = []
        for server_round in (1, 2):
            x = reference_server_step(candidate, x, recorder.uploads[server_round], m, v, buffers, **hp)
            gaps.append(max((x[n] - observed[server_round][n].double()).abs().max().item() for n in x))
        if candidate == rule:
            assert max(gaps) < 1e-6, (rule, gaps)
        else:
            # the other rules' steps are far from what this run took: the test would catch a swapped rule
            assert max(gaps) > 1e-3, (rule, candidate, gaps)


def test_fedadam_resumes_exactly(tmp_path):
    straight, resumed = assert_resume_is_exact(tmp_path, lambda: FedAdam(eta=0.05))
    assert straight.strategy.m and torch.equal(
        next(iter(straight.strategy.v.values())), next(iter(resumed.strategy.v.values()))
    )
