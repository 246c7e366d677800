"""FedSA: which tensors stay personal (LoRA and bottleneck adapters), and a run where only A is averaged."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import tests.conftest
from fedlit import RoleRule
from fedlit.core.errors import ConfigError
from fedlit.core.roles import ParameterRoles
from fedlit.models import Backbone
from fedlit.models.lora import LoRA
from fedlit.strategies import ClientUpdate, FedSA
from tests.conftest import make_federation


class _LoRABlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return torch.relu(self.fc(x))


class LoRANet(Backbone):
    """Two Linear + ReLU blocks with LoRA (r = 2) on each ``fc``."""

    def __init__(self, *, in_features: int = 4) -> None:
        self.in_features = in_features

    def build(self) -> nn.Module:
        net = nn.Sequential()
        net.blocks = nn.Sequential(*[_LoRABlock(self.in_features) for _ in range(2)])
        LoRA(r=2, alpha=4, target_modules=["fc"]).apply(net)
        net.num_features = self.in_features
        return net


class _SamBlock(nn.Module):
    """A block with Medical-SAM-Adapter's adapter names (D_fc1 down, D_fc2 up) and one adapter of plain layers."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.attn = nn.Linear(width, width)
        self.Space_Adapter = nn.Module()
        self.Space_Adapter.D_fc1 = nn.Linear(width, 2)
        self.Space_Adapter.D_fc2 = nn.Linear(2, width)
        self.mlp_adapter = nn.Sequential(nn.Linear(width, 2), nn.GELU(), nn.Linear(2, width))


def _roles(module, rules):
    return ParameterRoles.from_module(module, rules)


def test_lora_b_and_head_become_personal():
    torch.manual_seed(0)
    module = nn.Sequential()
    module.backbone = LoRANet().build()
    module.head = nn.Linear(4, 3)
    roles = _roles(module, [RoleRule("backbone.*", "frozen"), RoleRule("*lora_*", "shared")])
    refined = FedSA().configure_roles(roles)
    assert refined.names("shared") == [f"backbone.blocks.{i}.fc.lora_A.default.weight" for i in range(2)]
    assert refined.names("personal") == [f"backbone.blocks.{i}.fc.lora_B.default.weight" for i in range(2)] + [
        "head.weight",
        "head.bias",
    ]
    assert refined.names("frozen") == roles.names("frozen")
    # Sharing the head: leave its pattern out.
    shared_head = FedSA(personal_patterns=["*lora_B*"]).configure_roles(roles)
    assert "head.weight" in shared_head.names("shared")


def test_adapter_up_projections_become_personal():
    module = nn.Sequential()
    module.blocks = nn.Sequential(*[_SamBlock(4) for _ in range(2)])
    module.head = nn.Linear(4, 3)
    roles = _roles(module, [RoleRule("blocks.*", "frozen"), RoleRule("*[Aa]dapter*", "shared")])
    refined = FedSA().configure_roles(roles)
    down = [
        f"blocks.{i}.{a}.{p}"
        for i in range(2)
        for a in ("Space_Adapter.D_fc1", "mlp_adapter.0")
        for p in ("weight", "bias")
    ]
    up = [
        f"blocks.{i}.{a}.{p}"
        for i in range(2)
        for a in ("Space_Adapter.D_fc2", "mlp_adapter.2")
        for p in ("weight", "bias")
    ]
    assert sorted(refined.names("shared")) == sorted(down)
    assert sorted(refined.names("personal")) == sorted(up + ["head.weight", "head.bias"])
    # By name only: ``mlp_adapter.2`` is not recognised and stays shared.
    by_name = FedSA(adapter_up_by_order=False).configure_roles(roles)
    assert "blocks.0.mlp_adapter.2.weight" in by_name.names("shared")
    assert "blocks.0.Space_Adapter.D_fc2.weight" in by_name.names("personal")


def test_clear_errors_without_lora_or_adapters():
    plain = _roles(nn.Sequential(nn.Linear(2, 2)), [])
    with pytest.raises(ConfigError, match="no shared tensor is a LoRA matrix"):
        FedSA().configure_roles(plain)
    module = nn.Sequential()
    module.backbone = LoRANet().build()
    roles = _roles(module, [RoleRule("backbone.*", "frozen"), RoleRule("*lora_*", "shared")])
    with pytest.raises(ConfigError, match="match none of the shared LoRA"):
        FedSA(personal_patterns=["head.*"]).configure_roles(roles)
    with pytest.raises(ConfigError, match="every shared tensor"):
        FedSA(personal_patterns=["*lora_*"]).configure_roles(roles)
    for kwargs, option in [
        ({"personal_patterns": "head.*"}, "personal_patterns"),
        ({"personal_patterns": ["re:("]}, "personal_patterns"),
        ({"adapter_up_by_order": "yes"}, "adapter_up_by_order"),
        ({"weighting": "size"}, "weighting"),
    ]:
        with pytest.raises(ConfigError, match=f"strategy.init_args.{option}"):
            FedSA(**kwargs)


def test_server_averages_what_is_uploaded():
    # A = (1 * [1, 2] + 3 * [5, 2]) / 4 = [4, 2]; the server never holds B.
    strategy = FedSA()
    strategy.initialize({"a": torch.zeros(2)}, ["c0", "c1"])
    out = strategy.aggregate(
        1,
        [
            ClientUpdate("c0", 1, {"a": torch.tensor([1.0, 2.0])}),
            ClientUpdate("c1", 3, {"a": torch.tensor([5.0, 2.0])}),
        ],
    )
    assert out["a"].tolist() == [4.0, 2.0]
    with pytest.raises(KeyError, match="does not share"):
        strategy.aggregate(2, [ClientUpdate("c0", 1, {"b": torch.zeros(2)})])


@pytest.fixture
def lora_model(monkeypatch):
    """make_federation builds its module on ``LoRANet`` instead of ``TinyMLP``."""
    monkeypatch.setattr(tests.conftest, "TinyMLP", LoRANet)


class _Recorder(FedSA):
    """FedSA that keeps a copy of each round's uploads."""

    def __init__(self) -> None:
        super().__init__()
        self.uploads: list[list[ClientUpdate]] = []

    def aggregate(self, server_round, updates):
        self.uploads.append(
            [ClientUpdate(u.client_id, u.num_examples, {n: t.clone() for n, t in u.state.items()}) for u in updates]
        )
        return super().aggregate(server_round, updates)


def test_run_averages_a_only_and_b_stays_each_clients_own(tmp_path, lora_model):
    strategy = _Recorder()
    fed = make_federation(
        tmp_path, strategy, rounds=2, roles=[RoleRule("backbone.*", "frozen"), RoleRule("*lora_*", "shared")]
    )
    fed.fit()
    a_names = [f"backbone.blocks.{i}.fc.lora_A.default.weight" for i in range(2)]
    b_names = [f"backbone.blocks.{i}.fc.lora_B.default.weight" for i in range(2)]
    assert set(strategy.global_state) == set(a_names)
    last = strategy.uploads[-1]
    assert [set(u.state) for u in last] == [set(a_names)] * 3  # no B, no head in the uploads
    n = sum(u.num_examples for u in last)
    for name in a_names:
        expected = sum(u.num_examples / n * u.state[name].double() for u in last).float()
        assert torch.allclose(strategy.global_state[name], expected, atol=1e-7)
    stored = {c: fed.store.tensors(c) for c in fed.client_ids}
    for name in b_names + ["head.weight"]:
        values = [stored[c][name] for c in fed.client_ids]
        assert all(v.abs().sum() > 0 for v in values)  # trained away from B = 0
        assert not torch.equal(values[0], values[1]) and not torch.equal(values[1], values[2])
