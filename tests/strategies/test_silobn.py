"""SiloBN: normalization statistics personal, normalization parameters shared (Andreux et al. 2020)."""

import torch
from lightning.pytorch import Callback
from torch import nn

from fedlit.core.roles import ParameterRoles, RoleRule
from fedlit.strategies import SiloBN
from tests.conftest import make_federation

BN = "backbone.1"  # TinyMLP's BatchNorm1d
STATS = (f"{BN}.running_mean", f"{BN}.running_var", f"{BN}.num_batches_tracked")


class WithNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2))
        self.adapter = nn.Sequential(nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2), nn.LayerNorm(2))
        self.head = nn.Linear(2, 2)


def test_statistics_become_personal_affine_parameters_stay_shared_frozen_stays_frozen():
    roles = SiloBN().configure_roles(ParameterRoles.from_module(WithNorm(), [RoleRule("backbone.*", "frozen")]))
    for stat in ("running_mean", "running_var", "num_batches_tracked"):
        assert roles[f"adapter.1.{stat}"] == "personal"
        assert roles[f"backbone.1.{stat}"] == "frozen"
    for name in ("adapter.1.weight", "adapter.1.bias", "adapter.2.weight", "adapter.0.weight", "head.weight"):
        assert roles[name] == "shared"
    assert roles["backbone.1.weight"] == "frozen"
    # Exactly the trainable norm buffers changed role.
    before = ParameterRoles.from_module(WithNorm(), [RoleRule("backbone.*", "frozen")])
    assert {n for n in roles if roles[n] != before[n]} == {
        f"adapter.1.{s}" for s in ("running_mean", "running_var", "num_batches_tracked")
    }


class Recorder(Callback):
    """What each client starts and ends its local training with."""

    def __init__(self):
        self.start, self.end, self.received, self.uploaded = {}, {}, {}, {}

    def on_client_fit_start(self, pl_module, server_round, client_id, received):
        self.start[server_round, client_id] = {n: t.detach().clone() for n, t in pl_module.state_dict().items()}
        self.received[server_round, client_id] = set(received)

    def on_client_fit_end(self, pl_module, server_round, client_id, update):
        self.end[server_round, client_id] = {n: t.detach().clone() for n, t in pl_module.state_dict().items()}
        self.uploaded[server_round, client_id] = update


def test_two_rounds_keep_each_clients_statistics_and_share_the_bn_weights(tmp_path):
    recorder = Recorder()
    strategy = SiloBN()
    fed = make_federation(tmp_path, strategy, rounds=2, callbacks=[recorder])
    fed.fit()
    clients = fed.client_ids
    # Statistics never leave a client: not sent, not uploaded, not on the server.
    for key in recorder.received:
        assert not set(STATS) & recorder.received[key]
        assert not set(STATS) & set(recorder.uploaded[key].state)
        assert f"{BN}.weight" in recorder.received[key] and f"{BN}.weight" in recorder.uploaded[key].state
    assert not set(STATS) & set(strategy.global_state)
    for c in clients:
        # Round 2 starts from the client's own round-1 statistics ...
        for stat in STATS:
            assert torch.equal(recorder.start[2, c][stat], recorder.end[1, c][stat])
        # ... and from the server's BN weights: the n_k-weighted mean of the round-1 uploads, worked out here in
        # float64: (15 w_0 + 15 w_1 + 15 w_2) / 45 (every client trains on 15 of its 30 samples).
        ups = [recorder.uploaded[1, k] for k in clients]
        assert [u.num_examples for u in ups] == [15, 15, 15]
        for name in (f"{BN}.weight", f"{BN}.bias"):
            values = [u.state[name].double() for u in ups]
            mean = (15 * values[0] + 15 * values[1] + 15 * values[2]) / 45
            # the uploads differ far more than the tolerance: keeping one client's values would fail
            assert (
                min(
                    (a - b).abs().max().item()
                    for a, b in ((values[0], values[1]), (values[1], values[2]), (values[0], values[2]))
                )
                > 1e-3
            )
            assert torch.allclose(recorder.start[2, c][name].double(), mean, rtol=0, atol=1e-6)
    # After training the clients hold different statistics but evaluate with the same aggregated BN weights.
    means = [fed.store.tensors(c)[f"{BN}.running_mean"] for c in clients]
    assert all(not torch.allclose(means[i], means[j]) for i in range(3) for j in range(i + 1, 3))
    sent = [strategy.configure_evaluate(3, c) for c in clients]
    assert all(torch.equal(s[f"{BN}.weight"], strategy.global_state[f"{BN}.weight"]) for s in sent)
    assert all(not set(STATS) & set(s) for s in sent)
