"""EPFL: the mixing weights by hand, zero distances, psi, roles, A mixed while B and the head stay, a 2-round run
and an exact resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from lightning.pytorch import Callback
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

import tests.conftest
from fedlit import RoleRule
from fedlit.core.errors import ConfigError
from fedlit.core.roles import ParameterRoles
from fedlit.models import Backbone, LoRA
from fedlit.strategies import EPFL, ClientUpdate, FedAvg
from fedlit.strategies.epfl import epfl_weights, mean_tensor_distances
from tests.conftest import assert_resume_is_exact, make_federation

LORA_ROLES = [RoleRule("backbone.*", "frozen"), RoleRule("backbone.*lora_*", "shared")]


class LoRAMLP(Backbone):
    """Linear(4, 8) -> ReLU -> Linear(8, 8), both with peft LoRA (r = 2, scale 8): two A and two B tensors."""

    def build(self) -> nn.Module:
        net = nn.Sequential()
        net.fc1, net.act, net.fc2 = nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8)
        LoRA(r=2, alpha=16, target_modules=["fc1", "fc2"]).apply(net)
        net.num_features = 8
        return net


@pytest.fixture
def lora_model(monkeypatch):
    """make_federation builds its module on ``LoRAMLP`` instead of ``TinyMLP``."""
    monkeypatch.setattr(tests.conftest, "TinyMLP", LoRAMLP)


# --- the weights -----------------------------------------------------------------------------------------------------

NAMES = [
    "blocks.0.lora_A.weight",
    "blocks.0.lora_B.weight",
    "blocks.1.lora_A.weight",
    "blocks.1.lora_B.weight",
    "head.weight",
]
B0, B1 = "blocks.0.lora_B.weight", "blocks.1.lora_B.weight"
# Client B tensors (b1 = block 0's B, b2 = block 1's), chosen for round distances:
#   c0: b1 = [0, 0], b2 = [0, 0];  c1: b1 = [3, 4], b2 = [0, 2];  c2: b1 = [0, 0], b2 = [0, 6].
# Per tensor: d01 = (5, 2), d02 = (0, 6), d12 = (5, 4); means dbar01 = 3.5, dbar02 = 3, dbar12 = 4.5.
B_UPLOADS = {"c0": ([0.0, 0.0], [0.0, 0.0]), "c1": ([3.0, 4.0], [0.0, 2.0]), "c2": ([0.0, 0.0], [0.0, 6.0])}
A_UPLOADS = {"c0": 1.0, "c1": 2.0, "c2": 4.0}  # blocks.0.lora_A.weight (1 x 1) per client


def _strategy(**kwargs) -> EPFL:
    strategy = EPFL(**kwargs)
    roles = strategy.configure_roles(ParameterRoles(dict.fromkeys(NAMES, "shared")))
    state = {n: torch.zeros(1, 1) for n in NAMES if roles[n] == "shared"}
    strategy.initialize(state, ["c0", "c1", "c2"], roles=roles)
    return strategy


def _aggregate(strategy: EPFL) -> None:
    updates = []
    for i, client in enumerate(("c0", "c1", "c2")):
        b1, b2 = B_UPLOADS[client]
        state = {
            "blocks.0.lora_A.weight": torch.tensor([[A_UPLOADS[client]]]),
            "blocks.1.lora_A.weight": torch.tensor([[float(i)]]),
        }
        extras = {"lora_B": {B0: torch.tensor([b1]).T, B1: torch.tensor([b2]).T}}
        updates.append(ClientUpdate(client, num_examples=10 * (i + 1), state=state, extras=extras))
    strategy.global_state = strategy.aggregate(1, updates)  # as the loop stores it


def test_weights_and_mixes_of_three_clients_by_hand():
    strategy = _strategy()
    _aggregate(strategy)
    # Row 0: 1/3.5 = 2/7 and 1/3, sum 13/21: s^ = (6/13, 7/13), times (1 - 0.5): 3/13, 7/26.
    # Row 1: 2/7 and 2/9, sum 32/63: s^ = (9/16, 7/16) -> 9/32, 7/32.  Row 2: 1/3 and 2/9, sum 5/9: (3/5, 2/5).
    expected = [[0.5, 3 / 13, 7 / 26], [9 / 32, 0.5, 7 / 32], [0.3, 0.2, 0.5]]
    assert strategy.weights.tolist() == [pytest.approx(row) for row in expected]
    assert strategy.distances.tolist() == [pytest.approx(r) for r in [[0, 3.5, 3], [3.5, 0, 4.5], [3, 4.5, 0]]]
    # A_0 <- 0.5 * 1 + 3/13 * 2 + 7/26 * 4 = 0.5 + 20/13; A_2 <- 0.3 * 1 + 0.2 * 2 + 0.5 * 4 = 2.7.
    assert strategy.mixes["c0"]["blocks.0.lora_A.weight"].item() == pytest.approx(0.5 + 20 / 13)
    assert strategy.mixes["c2"]["blocks.0.lora_A.weight"].item() == pytest.approx(2.7)
    # FedAvg (sizes 10, 20, 30) would send everyone (1 + 4 + 12) / 6 = 17/6: that is global_state here.
    assert strategy.global_state["blocks.0.lora_A.weight"].item() == pytest.approx(17 / 6)
    assert set(strategy.global_state) == {"blocks.0.lora_A.weight", "blocks.1.lora_A.weight"}


def test_lam_weights_the_own_value():
    strategy = _strategy(lam=0.2)
    _aggregate(strategy)
    assert strategy.weights[2].tolist() == pytest.approx([0.8 * 0.6, 0.8 * 0.4, 0.2])


def test_psi_second_half_and_an_explicit_list():
    for psi in ("second_half", [B1]):
        strategy = _strategy(psi=psi)
        assert strategy.distance_names == [B1]
        _aggregate(strategy)
        # b2 only: d01 = 2, d02 = 6, d12 = 4. Row 0: 1/2, 1/6 -> (3/4, 1/4); row 1: 1/2, 1/4 -> (2/3, 1/3);
        # row 2: 1/6, 1/4 -> (2/5, 3/5); each times 0.5.
        expected = [[0.5, 0.375, 0.125], [1 / 3, 0.5, 1 / 6], [0.2, 0.3, 0.5]]
        assert strategy.weights.tolist() == [pytest.approx(row) for row in expected]


def test_psi_first_half_has_a_zero_distance():
    strategy = _strategy(psi="first_half")
    assert strategy.distance_names == [B0]
    _aggregate(strategy)
    # b1 only: d01 = 5, d02 = 0, d12 = 5. c0 and c2 are identical: each takes all of 1 - lam from the other.
    expected = [[0.5, 0.0, 0.5], [0.25, 0.5, 0.25], [0.5, 0.0, 0.5]]
    assert strategy.weights.tolist() == [pytest.approx(row) for row in expected]
    # With eps = 1: row 0 is 1/(5 + 1), 1/(0 + 1), sum 7/6 -> (1/7, 6/7) -> (1/14, 3/7).
    strategy = _strategy(psi="first_half", eps=1.0)
    _aggregate(strategy)
    assert strategy.weights[0].tolist() == pytest.approx([0.5, 1 / 14, 3 / 7])


def test_all_b_equal_gives_equal_weights_to_the_others_not_nan():
    zeros = [{"b": torch.zeros(4, 2)} for _ in range(4)]
    distances = mean_tensor_distances(zeros, ["b"])
    assert distances.tolist() == [[0.0] * 4] * 4
    for eps in (0.0, 1e-6):
        weights = epfl_weights(distances, lam=0.5, eps=eps)
        expected = [[0.5 if i == j else 0.5 / 3 for j in range(4)] for i in range(4)]
        assert weights.tolist() == [pytest.approx(row) for row in expected]
    assert epfl_weights(torch.zeros(1, 1), lam=0.5).tolist() == [[1.0]]  # one client keeps its own A


def test_distances_are_frobenius_per_tensor_then_averaged():
    states = [{"x": torch.zeros(2, 2), "y": torch.zeros(3)}, {"x": torch.ones(2, 2), "y": torch.tensor([0, 3.0, 4])}]
    # ||1_(2x2)||_F = 2 and ||(0, 3, 4)|| = 5: mean 3.5 (a distance over the concatenation would be sqrt(29)).
    assert mean_tensor_distances(states, ["x", "y"])[0, 1].item() == pytest.approx(3.5)
    assert mean_tensor_distances(states, ["y"])[1, 0].item() == pytest.approx(5.0)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 6), st.integers(0, 2**31 - 1), st.floats(0.0, 1.0), st.floats(0.1, 10.0))
def test_epfl_weights_properties(n, seed, lam, scale):
    generator = torch.Generator().manual_seed(seed)
    points = torch.randn(n, 3, generator=generator, dtype=torch.float64)
    d = torch.cdist(points, points)
    w = epfl_weights(d, lam=lam)
    assert w.sum(dim=1).tolist() == pytest.approx([1.0] * n)  # every row is a mix
    assert (w >= 0).all() and torch.diagonal(w).tolist() == pytest.approx([lam] * n)
    assert torch.allclose(epfl_weights(scale * d, lam=lam), w)  # only relative distances matter
    order = torch.randperm(n, generator=generator)
    assert torch.allclose(epfl_weights(d[order][:, order], lam=lam), w[order][:, order])  # client order
    if n > 2 and lam < 1:  # a closer client gets more: row 0 is ordered by inverse distance
        others = list(range(1, n))
        nearest, farthest = min(others, key=lambda j: d[0, j]), max(others, key=lambda j: d[0, j])
        assert w[0, nearest] >= w[0, farthest]


def test_epfl_weights_refuse_bad_input():
    with pytest.raises(ValueError, match="lam=1.5"):
        epfl_weights(torch.ones(2, 2), lam=1.5)
    with pytest.raises(ValueError, match="finite and >= 0"):
        epfl_weights(torch.tensor([[0.0, -1.0], [1.0, 0.0]]))


# --- roles and arguments ---------------------------------------------------------------------------------------------


def test_only_lora_a_stays_shared():
    roles = EPFL().configure_roles(ParameterRoles({**dict.fromkeys(NAMES, "shared"), "backbone.w": "frozen"}))
    assert roles.names("shared") == ["blocks.0.lora_A.weight", "blocks.1.lora_A.weight"]
    assert roles.names("personal") == [B0, B1, "head.weight"]
    assert roles["backbone.w"] == "frozen"


def test_roles_and_psi_on_a_vit_with_qv_slice_lora():
    from fedlit.models import TimmBackbone
    from fedlit.tasks import ClassificationModule

    with pytest.warns(UserWarning, match="randomly initialized"):
        module = ClassificationModule(
            backbone=TimmBackbone(name="fedlit_test_vit", lora=LoRA(fused_qkv="qv")),
            num_classes=3,
            roles=[RoleRule("backbone.*lora_*", "shared")],
        )
    roles = EPFL(psi="first_half").configure_roles(module.parameter_roles())
    lora = [f"backbone.blocks.{i}.attn.qkv.lora_{m}.{s}.weight" for i in (0, 1) for m in "AB" for s in "qv"]
    assert roles.names("shared") == [n for n in lora if "lora_A" in n]
    assert roles.names("personal") == [n for n in lora if "lora_B" in n] + ["head.weight", "head.bias"]
    strategy = EPFL(psi="first_half")
    strategy.configure_roles(module.parameter_roles())
    assert strategy.distance_names == [
        "backbone.blocks.0.attn.qkv.lora_B.q.weight",
        "backbone.blocks.0.attn.qkv.lora_B.v.weight",
    ]  # block 0 of 2


def test_bad_arguments_name_the_option():
    with pytest.raises(ConfigError) as err:
        EPFL(lam=-0.1, eps=-1.0, psi="middle")  # type: ignore[arg-type]
    for option in ("strategy.init_args.lam=-0.1", "strategy.init_args.eps=-1.0", "strategy.init_args.psi='middle'"):
        assert option in str(err.value)
    with pytest.raises(ConfigError, match=r"psi: \['blocks.0.lora_B.wieght'\] are not shared LoRA B"):
        EPFL(psi=["blocks.0.lora_B.wieght"]).configure_roles(ParameterRoles(dict.fromkeys(NAMES, "shared")))
    with pytest.raises(ConfigError, match="EPFL mixes LoRA A by the similarity of LoRA B"):
        EPFL().configure_roles(ParameterRoles({"head.weight": "shared"}))
    one_b = ParameterRoles(dict.fromkeys(["l.lora_A.weight", "l.lora_B.weight"], "shared"))
    with pytest.raises(ConfigError, match="psi='first_half' needs at least 2 LoRA B tensors"):
        EPFL(psi="first_half").configure_roles(one_b)
    assert repr(EPFL(psi="second_half")) == "EPFL(lam=0.5, psi='second_half', eps=0.0, evaluation='after_mix')"


# --- end to end ------------------------------------------------------------------------------------------------------


class Recorder(Callback):
    """What each client uploads (A, B, head) and what it holds when its next turn starts."""

    def __init__(self) -> None:
        self.ends, self.starts = {}, {}

    def on_client_fit_end(self, pl_module, server_round, client_id, update):
        head = {n: t.detach().clone() for n, t in pl_module.named_tensors("personal").items() if n.startswith("head")}
        self.ends[server_round, client_id] = (dict(update.state), dict(update.extras["lora_B"]), head)

    def on_client_fit_start(self, pl_module, server_round, client_id, received):
        live = {n: t.detach().clone() for n, t in pl_module.named_tensors("shared", "personal").items()}
        self.starts[server_round, client_id] = ({n: t.clone() for n, t in received.items()}, live)


def _by_hand(b_uploads: list[dict[str, torch.Tensor]], lam: float = 0.5) -> np.ndarray:
    """EPFL's weights in numpy, written from the equations (no zero distance expected)."""
    n = len(b_uploads)
    d = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            d[i, j] = np.mean([np.linalg.norm((b_uploads[i][k] - b_uploads[j][k]).numpy()) for k in b_uploads[i]])
    w = np.zeros((n, n))
    for i in range(n):
        inv = np.array([0.0 if j == i else 1 / d[i, j] for j in range(n)])
        w[i] = (1 - lam) * inv / inv.sum()
        w[i, i] = lam
    return w


def test_a_is_mixed_while_b_and_head_stay_each_clients_own(tmp_path, lora_model):
    recorder = Recorder()
    strategy = EPFL()
    make_federation(tmp_path, strategy, roles=LORA_ROLES, callbacks=[recorder]).fit()
    clients = ["c0", "c1", "c2"]
    a_names = sorted(strategy.global_state)
    assert a_names == ["backbone.fc1.lora_A.default.weight", "backbone.fc2.lora_A.default.weight"]
    assert strategy.b_names == ["backbone.fc1.lora_B.default.weight", "backbone.fc2.lora_B.default.weight"]
    uploads = [recorder.ends[1, c] for c in clients]
    weights = _by_hand([b for _, b, _ in uploads])
    assert not np.allclose(weights[0], [0.5, 0.25, 0.25], atol=1e-3)  # the distances matter
    for i, client in enumerate(clients):
        received, live = recorder.starts[2, client]
        assert sorted(received) == a_names  # only A is sent down
        for name in a_names:
            mix = sum(weights[i, j] * uploads[j][0][name].double() for j in range(3))
            assert torch.allclose(received[name].double(), mix, atol=1e-6)
            assert not torch.allclose(received[name], uploads[i][0][name])  # mixed, not its own
        own_b, own_head = uploads[i][1], uploads[i][2]
        for name, tensor in {**own_b, **own_head}.items():
            assert torch.equal(live[name], tensor), name  # the client's own B and head, never overwritten
        other_b = uploads[(i + 1) % 3][1]
        assert not torch.equal(own_b[strategy.b_names[0]], other_b[strategy.b_names[0]])


def _losses(tmp_path):
    events = EventAccumulator(str(tmp_path / "tensorboard")).Reload()
    return [e.value for e in events.Scalars("server/train/loss_mean")] + [
        events.Scalars("server/val/loss_mean")[-1].value
    ]


# Seed 0, 3 clients, 2 rounds: train loss mean per round and validation loss mean after round 2. FedAvg on the same
# roles (A averaged, B and head personal: FedSA-LoRA's split) gives [1.142255, 1.035587, 1.091283]: the same round 1
# (every client starts from the same A), then other A. Client c0's row of s in round 2 (FedAvg's: [1/3] * 3).
PINNED_LOSSES = [1.142255, 1.035558, 1.091750]
PINNED_S0 = [0.5, 0.241693, 0.258307]


def test_two_rounds_pinned_and_unlike_fedavg(tmp_path, lora_model):
    strategy = EPFL()
    make_federation(tmp_path / "epfl", strategy, roles=LORA_ROLES).fit()
    payload = torch.load(tmp_path / "epfl" / "checkpoints" / "last.ckpt", weights_only=True)
    assert payload["server_round"] == 2
    assert set(strategy.mixes) == {"c0", "c1", "c2"} and strategy.weight_clients == ["c0", "c1", "c2"]
    assert strategy.weights.sum(dim=1).tolist() == pytest.approx([1.0] * 3)
    assert strategy.weights[0].tolist() == pytest.approx(PINNED_S0, abs=1e-5)
    ours = _losses(tmp_path / "epfl")
    assert ours == pytest.approx(PINNED_LOSSES, abs=2e-5)
    personal = [*LORA_ROLES, RoleRule("backbone.*lora_B*", "personal"), RoleRule("head.*", "personal")]
    make_federation(tmp_path / "fedavg", FedAvg(), roles=personal).fit()
    theirs = _losses(tmp_path / "fedavg")
    assert ours[0] == pytest.approx(theirs[0], abs=1e-6)
    assert abs(ours[-1] - theirs[-1]) > 2e-4


def test_resume_is_exact(tmp_path, lora_model):
    straight, _ = assert_resume_is_exact(tmp_path, lambda: EPFL(psi="second_half"), roles=LORA_ROLES)
    assert set(straight.strategy.mixes) == {"c0", "c1", "c2"}
    assert straight.strategy.distance_names == ["backbone.fc2.lora_B.default.weight"]


@pytest.mark.parametrize("evaluation", ["after_mix", "fhbench"])
def test_fhbench_evaluation_takes_the_trained_a_before_the_mix_at_each_clients_best_round(
    tmp_path, lora_model, evaluation
):
    strategy = EPFL(evaluation=evaluation)
    federation = make_federation(tmp_path, strategy, rounds=3, roles=LORA_ROLES)
    results = federation.fit()
    assert ("best_per_client" in results) == (evaluation == "fhbench")
    for client in federation.client_ids:
        trained = federation.store.extra(client, "EPFL").get("trained")
        federation.evaluate_client(3, client, "val")
        live = federation.module.named_tensors("shared")
        mix = strategy.mixes[client]
        if evaluation == "after_mix":
            assert trained is None and all(torch.equal(live[n], mix[n]) for n in mix)
        else:  # the A the client uploaded in round 3, not the mix it was sent after the aggregation
            assert all(torch.equal(live[n], trained[n]) for n in mix)
            assert not all(torch.allclose(trained[n], mix[n]) for n in mix)
    if evaluation == "fhbench":
        # each client's own best validation accuracy round (earliest on ties), worked out from the history
        history = federation.history
        best = results["best_per_client"]
        for client in federation.client_ids:
            values = [(history.rounds[r]["val"][client]["accuracy"], -r) for r in sorted(history.rounds)]
            round_ = -max(values)[1]
            assert best["rounds"][client] == round_
            assert best["clients"][client] == history.rounds[round_]["test"][client]
