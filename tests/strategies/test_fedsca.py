"""FedSCA: the simplex projection, SGCA's weights, the cosine regularizer, LAT's roles, a 2-round run and resume."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

import tests.conftest
from fedlit import RoleRule
from fedlit.core.errors import ConfigError
from fedlit.core.roles import ParameterRoles
from fedlit.models import Backbone
from fedlit.strategies import ClientUpdate, FedAvg, FedSCA
from fedlit.strategies.fedsca import cosine_regularizer, sgca_weights, simplex_projection
from tests.conftest import assert_resume_is_exact, make_federation

ADAPTER_ROLES = [RoleRule("backbone.*", "frozen"), RoleRule("*adapter*", "shared")]


class _Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.adapter = nn.Sequential(nn.Linear(width, 2), nn.GELU(), nn.Linear(2, width))

    def forward(self, x):
        x = torch.relu(self.linear(x))
        return x + self.adapter(x)


class AdapterNet(Backbone):
    """3 blocks, each Linear + ReLU with a bottleneck adapter and its own skip (the Medical-SAM-Adapter pattern)."""

    def __init__(self, *, in_features: int = 4, depth: int = 3) -> None:
        self.in_features, self.depth = in_features, depth

    def build(self) -> nn.Module:
        net = nn.Sequential()
        net.blocks = nn.Sequential(*[_Block(self.in_features) for _ in range(self.depth)])
        net.num_features = self.in_features
        return net


# --- the simplex projection ----------------------------------------------------------------------------------------


def test_simplex_projection_by_hand():
    # v = [0.5, 0.8, -0.2]: sorted [0.8, 0.5, -0.2]; j = 2 keeps 0.5 - (1.3 - 1) / 2 = 0.35 > 0, j = 3 fails
    # (-0.2 - (1.1 - 1) / 3 < 0): rho = 2, theta = 0.15, w = [0.35, 0.65, 0].
    assert simplex_projection(torch.tensor([0.5, 0.8, -0.2])).tolist() == pytest.approx([0.35, 0.65, 0.0])
    # Already on the simplex: unchanged. All equal: uniform.
    assert simplex_projection(torch.tensor([0.2, 0.3, 0.5])).tolist() == pytest.approx([0.2, 0.3, 0.5])
    assert simplex_projection(torch.tensor([5.0, 5.0, 5.0, 5.0])).tolist() == pytest.approx([0.25] * 4)
    assert simplex_projection(torch.tensor([-3.0])).tolist() == [1.0]
    with pytest.raises(ValueError):
        simplex_projection(torch.tensor([float("nan"), 1.0]))


def _qp(target, linear, n):
    """scipy's SLSQP on ``min ||w - target||^2 + linear . w`` over the simplex."""
    result = minimize(
        lambda w: ((w - target) ** 2).sum() + linear @ w,
        np.full(n, 1 / n),
        jac=lambda w: 2 * (w - target) + linear,
        method="SLSQP",
        bounds=[(0, None)] * n,
        constraints=[{"type": "eq", "fun": lambda w: w.sum() - 1, "jac": lambda w: np.ones(n)}],
        options={"ftol": 1e-12, "maxiter": 500},
    )
    assert result.success, result.message
    return result.x


def _kkt_qp(target, linear):
    """The exact minimizer of ``||w - target||^2 + linear . w`` over the simplex, by trying every support set S:
    on S the KKT conditions give ``w_S = target_S - linear_S / 2 + lam`` with lam from ``sum w = 1``; the solution is
    the S whose w_S >= 0 and whose multipliers off S are >= 0 (``2 (0 - target_j) + linear_j - 2 lam >= 0``)."""
    n = len(target)
    c = target - linear / 2
    for size in range(1, n + 1):
        for support in itertools.combinations(range(n), size):
            s = list(support)
            lam = (1 - c[s].sum()) / size
            w = np.zeros(n)
            w[s] = c[s] + lam
            off = [j for j in range(n) if j not in support]
            if (w[s] >= 0).all() and all(-c[j] - lam >= -1e-15 for j in off):
                return w
    raise AssertionError("no support set satisfies the KKT conditions")


def test_simplex_projection_matches_a_generic_qp_solver():
    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(2, 8))
        v = rng.normal(0, rng.uniform(0.1, 3), size=n)
        expected = _qp(v, np.zeros(n), n)
        assert simplex_projection(torch.from_numpy(v)).numpy() == pytest.approx(expected, abs=1e-5)


def test_sgca_rows_solve_eq7_by_a_generic_qp_solver():
    rng = np.random.default_rng(1)
    for _ in range(20):
        n = int(rng.integers(2, 7))
        points = rng.normal(size=(n, 3))
        d = np.linalg.norm(points[:, None] - points[None], axis=-1)
        sizes, alpha = rng.integers(1, 50, size=n), float(rng.uniform(0, 2))
        m = sizes / sizes.sum()
        weights = sgca_weights(torch.from_numpy(d), sizes.tolist(), alpha).numpy()
        normalized = sgca_weights(torch.from_numpy(d), sizes.tolist(), alpha, normalize=True).numpy()
        mean = d[~np.eye(n, dtype=bool)].mean()
        for i in range(n):
            expected = _qp(m, alpha * d[i], n)
            assert weights[i] == pytest.approx(expected, abs=1e-5)
            assert normalized[i] == pytest.approx(_qp(m, alpha * d[i] / mean, n), abs=1e-5)
            # and to rounding against the exact KKT solution (SLSQP itself stops near 1e-6)
            assert weights[i] == pytest.approx(_kkt_qp(m, alpha * d[i]), abs=1e-12)
            assert normalized[i] == pytest.approx(_kkt_qp(m, alpha * d[i] / mean), abs=1e-12)


# --- SGCA on 3 clients, by hand -------------------------------------------------------------------------------------
#
# Scalar uploads Theta = [0, 1, 3], examples n = [1, 1, 2] -> m = [1/4, 1/4, 1/2], d = [[0,1,3],[1,0,2],[3,2,0]].
# alpha = 0.5, so each row projects m - 0.25 d_i:
#   client 0: [1/4, 0, -1/4]   -> all kept, theta = (0 - 1)/3 = -1/3          -> W_0 = [7/12, 1/3, 1/12]
#   client 1: [0, 1/4, 0]      -> all kept, theta = (1/4 - 1)/3 = -1/4        -> W_1 = [1/4, 1/2, 1/4]
#   client 2: [-1/2, -1/4, 1/2] -> -1/2 dropped (-1/2 + 1.25/3 < 0), theta = (1/4 - 1)/2 = -3/8 -> W_2 = [0, 1/8, 7/8]
# Mixes: 0 * W_i0 + 1 * W_i1 + 3 * W_i2 = [1/3 + 1/4, 1/2 + 3/4, 1/8 + 21/8] = [7/12, 5/4, 11/4].
# The mean off-diagonal distance is (1 + 3 + 2) * 2 / 6 = 2: normalizing with alpha = 1 gives the same rows.
# Eq. 7 as printed (m_0 = 1/4 for all j, + 0.25 d_0): [1/4, 1/2, 1] -> rho = 2, theta = 1/4 -> W_0 = [0, 1/4, 3/4].
W_BY_HAND = [[7 / 12, 1 / 3, 1 / 12], [1 / 4, 1 / 2, 1 / 4], [0, 1 / 8, 7 / 8]]
THETA, SIZES = [0.0, 1.0, 3.0], [1, 1, 2]


def _three_clients(scale: float = 1.0, **kwargs):
    strategy = FedSCA(**kwargs)
    strategy.initialize({"w": torch.zeros(1)}, ["c0", "c1", "c2"])
    updates = [
        ClientUpdate(f"c{k}", n, {"w": torch.tensor([scale * t])})
        for k, (t, n) in enumerate(zip(THETA, SIZES, strict=True))
    ]
    strategy.global_state = strategy.aggregate(1, updates)  # as the loop stores it
    return strategy


def test_sgca_three_clients_by_hand():
    strategy = _three_clients(alpha=0.5, normalize_distances=False)
    assert strategy.weights.tolist() == [pytest.approx(row) for row in W_BY_HAND]
    assert strategy.weight_clients == ["c0", "c1", "c2"]
    mixes = [strategy.configure_client(2, f"c{k}")["w"].item() for k in range(3)]
    assert mixes == pytest.approx([7 / 12, 5 / 4, 11 / 4])
    assert strategy.configure_evaluate(2, "c2")["w"].item() == pytest.approx(11 / 4)
    assert strategy.global_state["w"].item() == pytest.approx((0 + 1 + 6) / 4)  # the size-weighted mean
    normalized = _three_clients(alpha=1.0)  # the default: normalize_distances=True
    assert normalized.weights.tolist() == [pytest.approx(row) for row in W_BY_HAND]
    literal = _three_clients(alpha=0.5, literal_eq7=True, normalize_distances=False)
    assert literal.weights[0].tolist() == pytest.approx([0, 1 / 4, 3 / 4])
    assert _three_clients(alpha=0.0).weights.tolist() == [pytest.approx([1 / 4, 1 / 4, 1 / 2])] * 3


def test_default_sgca_does_not_depend_on_the_distance_scale():
    # Uploads 10 times farther apart (a bigger adapter, a larger learning rate, more local steps): with raw
    # distances d = [[0,10,30],[10,0,20],[30,20,0]] and alpha = 1, every row projects m - d_i / 2, whose own entry
    # leads the others by at least 5 > 1: W = I, no client gets anything of another. The default divides by the
    # mean distance 20, giving d / 20 = [0,1,3] / 2 as above: the same rows W_BY_HAND whatever the scale.
    raw = _three_clients(scale=10.0, alpha=1.0, normalize_distances=False)
    assert raw.weights.tolist() == [pytest.approx(row) for row in np.eye(3).tolist()]
    for scale in (10.0, 1e-3):
        assert _three_clients(scale=scale).weights.tolist() == [pytest.approx(row) for row in W_BY_HAND]
    assert FedSCA().normalize_distances is True


def test_sgca_weights_go_to_the_round_log():
    strategy = _three_clients(alpha=0.5, normalize_distances=False)
    log = {"comm/clients": 3}
    strategy.on_after_aggregate(server_round=1, log=log)
    expected = {f"sgca/weight/c{i}/c{j}": W_BY_HAND[i][j] for i in range(3) for j in range(3)}
    expected.update(
        {"sgca/own_weight_mean": (7 / 12 + 1 / 2 + 7 / 8) / 3, "sgca/distance_mean": 2.0, "comm/clients": 3}
    )
    assert log == pytest.approx(expected)
    log = {}
    strategy.on_after_aggregate(server_round=2, log=log)  # nothing aggregated since: nothing logged twice
    assert log == {}


def test_a_client_outside_the_round_keeps_its_mix_and_resume_restores_everything():
    strategy = _three_clients(alpha=0.5, normalize_distances=False)
    # Round 2 with c0 and c1 only, uploads 0 and 2, one example each: m = [1/2, 1/2], d = [[0, 2], [2, 0]],
    # alpha / 2 = 1/4: rows project [1/2, 0] -> [3/4, 1/4] (both kept, theta = (1/2 - 1)/2) and [0, 1/2] ->
    # [1/4, 3/4]; mixes 1/4 * 2 = 1/2 and 3/4 * 2 = 3/2. c2 did not train: it keeps its round-1 mix 11/4.
    strategy.global_state = strategy.aggregate(
        2, [ClientUpdate("c0", 1, {"w": torch.tensor([0.0])}), ClientUpdate("c1", 1, {"w": torch.tensor([2.0])})]
    )
    assert strategy.weights.tolist() == [[0.75, 0.25], [0.25, 0.75]] and strategy.weight_clients == ["c0", "c1"]
    assert [strategy.configure_client(3, c)["w"].item() for c in ("c0", "c1", "c2")] == pytest.approx(
        [1 / 2, 3 / 2, 11 / 4]
    )
    restored = FedSCA(alpha=0.5)
    restored.initialize({"w": torch.zeros(1)}, ["c0", "c1", "c2"])
    restored.load_state_dict(strategy.state_dict())
    assert [restored.configure_client(3, c)["w"].item() for c in ("c0", "c1", "c2")] == pytest.approx(
        [1 / 2, 3 / 2, 11 / 4]
    )
    assert restored.weights.tolist() == [[0.75, 0.25], [0.25, 0.75]] and restored.weight_clients == ["c0", "c1"]
    fresh = FedSCA()
    fresh.initialize({"w": torch.ones(1)}, ["c0"])
    assert fresh.configure_client(1, "c0")["w"].item() == 1.0  # no mix yet: the initial tensors


# --- the cosine regularizer -----------------------------------------------------------------------------------------


class _Client:
    def __init__(self, **params):
        self.params = {n: nn.Parameter(torch.tensor(v)) for n, v in params.items()}

    def shared_parameters(self):
        return iter(self.params.items())


def test_cosine_regularizer_value_and_round_one_skip():
    # cos([1, 0, 2], [1, 1, 0]) = 1 / (sqrt 5 sqrt 2); with [3] and [4] appended: (1 + 12) / (sqrt 14 sqrt 18).
    a, b = {"a": torch.tensor([1.0, 0.0, 2.0])}, {"a": torch.tensor([1.0, 1.0, 0.0])}
    assert cosine_regularizer(a, b).item() == pytest.approx(-1 / math.sqrt(10))
    a2, b2 = {**a, "b": torch.tensor([3.0])}, {**b, "b": torch.tensor([4.0])}
    assert cosine_regularizer(a2, b2).item() == pytest.approx(-13 / math.sqrt(14 * 18))

    strategy = _three_clients(alpha=0.5, beta=0.5)
    client = _Client(w=[0.0, 1.0])
    loss = torch.tensor(2.0)
    strategy.on_client_fit_start(
        server_round=1,
        received={"w": torch.tensor([1.0, 1.0])},
        received_extras=strategy.configure_client_extras(1, "c0"),
    )
    assert strategy.training_loss(client, loss, None) is loss  # round 1: no regularizer
    strategy.on_client_fit_start(
        server_round=2,
        received={"w": torch.tensor([1.0, 1.0])},
        received_extras=strategy.configure_client_extras(2, "c0"),
    )
    out = strategy.training_loss(client, loss, None)
    assert out.item() == pytest.approx(2.0 - 0.5 / math.sqrt(2))
    out.backward()
    assert client.params["w"].grad is not None
    strategy.on_client_fit_start(
        server_round=2,
        received={"w": torch.tensor([1.0, 1.0])},
        received_extras=strategy.configure_client_extras(2, "c9"),
    )
    assert strategy.training_loss(client, loss, None) is loss  # a client without a mix yet


# --- LAT: which tensors travel --------------------------------------------------------------------------------------


def _roles(module, rules):
    return ParameterRoles.from_module(module, rules)


def test_only_the_lowest_adapters_are_shared():
    module = nn.Sequential()
    module.backbone = AdapterNet().build()
    module.head = nn.Linear(4, 3)
    roles = _roles(module, ADAPTER_ROLES)
    strategy = FedSCA()
    refined = strategy.configure_roles(roles)
    assert strategy.adapters == [f"backbone.blocks.{k}.adapter" for k in range(3)]
    assert refined.names("shared") == [f"backbone.blocks.0.adapter.{i}.{p}" for i in (0, 2) for p in ("weight", "bias")]
    assert set(refined.names("personal")) == {
        n for n in roles.names("shared") if not n.startswith("backbone.blocks.0.")
    }
    assert "head.weight" in refined.names("personal") and "backbone.blocks.2.adapter.0.weight" in refined.names(
        "personal"
    )
    assert refined.names("frozen") == roles.names("frozen")
    two = FedSCA(num_shared_adapters=2).configure_roles(roles)
    assert {n.split(".")[2] for n in two.names("shared")} == {"0", "1"}
    with pytest.raises(ConfigError, match="num_shared_adapters=4"):
        FedSCA(num_shared_adapters=4).configure_roles(roles)
    with pytest.raises(ConfigError, match="'adapter'"):
        FedSCA().configure_roles(_roles(nn.Sequential(nn.Linear(2, 2)), []))


def test_adapters_are_ordered_by_depth_then_model_order():
    names = [
        "b.blocks.10.Space_Adapter.fc.weight",
        "b.blocks.2.Space_Adapter.fc.weight",
        "b.blocks.2.MLP_Adapter.fc.weight",
        "head.weight",
        "b.extra_adapter.w",
    ]
    from fedlit.strategies.fedsca import adapter_prefixes

    assert adapter_prefixes(names) == [
        "b.blocks.2.Space_Adapter",
        "b.blocks.2.MLP_Adapter",
        "b.blocks.10.Space_Adapter",
        "b.extra_adapter",
    ]


def test_bad_arguments_name_the_option():
    for kwargs, option in [
        ({"num_shared_adapters": 0}, "num_shared_adapters"),
        ({"alpha": -1}, "alpha"),
        ({"beta": -0.1}, "beta"),
    ]:
        with pytest.raises(ConfigError, match=f"strategy.init_args.{option}"):
            FedSCA(**kwargs)


# --- end to end -----------------------------------------------------------------------------------------------------


@pytest.fixture
def adapter_model(monkeypatch):
    """make_federation builds its module on ``AdapterNet`` instead of ``TinyMLP``."""
    monkeypatch.setattr(tests.conftest, "TinyMLP", AdapterNet)


def _losses(tmp_path):
    events = EventAccumulator(str(tmp_path / "tensorboard")).Reload()
    return [e.value for e in events.Scalars("server/train/loss_mean")] + [
        events.Scalars("server/val/loss_mean")[-1].value
    ]


# Seed 0, 3 clients, 2 rounds, every adapter shared (L = 3), normalized distances: train loss mean per round,
# validation loss mean after round 2, and client c0's row of W in round 2. FedAvg on the same shared tensors
# gives [1.066311, 1.017569, 1.093135] (round 1 is the same: every client starts from the same model).
PINNED_LOSSES = [1.066311, 1.017486, 1.093572]
PINNED_W0 = [0.7997, 0.0688, 0.1315]


def test_two_rounds_pinned_and_unlike_fedavg(tmp_path, adapter_model):
    strategy = FedSCA(num_shared_adapters=3, alpha=1.0, beta=0.5, normalize_distances=True)
    make_federation(tmp_path / "fedsca", strategy, roles=ADAPTER_ROLES).fit()
    payload = torch.load(tmp_path / "fedsca" / "checkpoints" / "last.ckpt", weights_only=True)
    assert payload["server_round"] == 2
    assert set(strategy.global_state) == {
        f"backbone.blocks.{k}.adapter.{i}.{p}" for k in range(3) for i in (0, 2) for p in ("weight", "bias")
    }  # the head stays personal
    assert set(strategy.mixes) == {"c0", "c1", "c2"} and strategy.weight_clients == ["c0", "c1", "c2"]
    assert strategy.weights.sum(dim=1).tolist() == pytest.approx([1.0] * 3)
    assert strategy.weights[0].tolist() == pytest.approx(PINNED_W0, abs=1e-3)  # FedAvg's would be [1/3] * 3
    events = EventAccumulator(str(tmp_path / "fedsca" / "tensorboard")).Reload()
    for j in range(3):  # W, logged every round; the last round's is the strategy's
        logged = events.Scalars(f"sgca/weight/c0/c{j}")
        assert [e.step for e in logged] == [1, 2]
        assert logged[-1].value == pytest.approx(strategy.weights[0, j].item(), abs=1e-6)
    own = events.Scalars("sgca/own_weight_mean")[-1].value
    assert own == pytest.approx(strategy.weights.diagonal().mean().item(), abs=1e-6)
    ours = _losses(tmp_path / "fedsca")
    assert ours == pytest.approx(PINNED_LOSSES, abs=2e-5)
    make_federation(tmp_path / "fedavg", FedAvg(), roles=[*ADAPTER_ROLES, RoleRule("head.*", "personal")]).fit()
    theirs = _losses(tmp_path / "fedavg")
    assert abs(ours[-1] - theirs[-1]) > 2e-4


def test_resume_is_exact(tmp_path, adapter_model):
    straight, _ = assert_resume_is_exact(
        tmp_path, lambda: FedSCA(alpha=1.0, beta=0.5, normalize_distances=True), roles=ADAPTER_ROLES
    )
    assert set(straight.strategy.mixes) == {"c0", "c1", "c2"}
    assert set(straight.strategy.global_state) == {
        f"backbone.blocks.0.adapter.{i}.{p}" for i in (0, 2) for p in ("weight", "bias")
    }  # L = 1: block 0's adapter only
