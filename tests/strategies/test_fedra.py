"""FedRA: allocation sizes and seeding, per-block means by hand, the client side (frozen and skipped blocks), runs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

import tests.conftest
from fedlit import RoleRule
from fedlit.core.errors import ConfigError
from fedlit.core.roles import ParameterRoles
from fedlit.strategies import ClientUpdate, FedRA
from fedlit.strategies.fedra import partial_weighted_average, random_allocation
from tests.conftest import assert_resume_is_exact, make_federation
from tests.strategies.test_fedsca import ADAPTER_ROLES, AdapterNet

CLIENTS = ["c0", "c1", "c2", "c3", "c4"]


def _state(blocks=3):
    state = {f"b.blocks.{i}.adapter.w": torch.zeros(1) for i in range(blocks)}
    state.update({"b.blocks.0.linear.w": torch.zeros(1), "head.w": torch.zeros(1)})
    return state


def _initialized(strategy, blocks=3, clients=CLIENTS):
    state = _state(blocks)
    roles = ParameterRoles({n: "frozen" if "linear" in n else "shared" for n in state})
    strategy.initialize({n: t for n, t in state.items() if roles[n] == "shared"}, clients, roles=roles)
    return strategy


def test_blocks_are_the_adapters_by_layer_index():
    strategy = _initialized(FedRA(block_counts=[2]))
    assert strategy.blocks == [0, 1, 2]
    assert strategy.block_of == {f"b.blocks.{i}.adapter.w": i for i in range(3)}  # head.w is outside the blocks
    assert strategy.block_modules == {i: [f"b.blocks.{i}"] for i in range(3)}


def test_allocation_sizes_and_seeding():
    strategy = _initialized(FedRA(block_counts=[3, 2, 1], seed=5))
    assert [strategy.block_count(c) for c in CLIENTS] == [3, 2, 1, 3, 2]  # cycle: block_counts[k % 3]
    contiguous = _initialized(FedRA(block_counts=[3, 2, 1], size_assignment="contiguous", seed=5))
    assert [contiguous.block_count(c) for c in CLIENTS] == [3, 3, 2, 2, 1]  # block_counts[k * 3 // 5]
    for server_round in (1, 2, 3):
        for client in CLIENTS:
            rows = strategy.allocation(server_round, client)
            assert len(rows) == strategy.block_count(client) and rows == sorted(set(rows))
            assert set(rows) <= {0, 1, 2}
            assert strategy.allocation(server_round, client) == rows  # the same draw every time
    # Each draw is its own: rounds and clients differ, and so do seeds.
    draws = {tuple(strategy.allocation(r, "c2")) for r in range(1, 40)}
    assert draws == {(0,), (1,), (2,)}
    other = _initialized(FedRA(block_counts=[3, 2, 1], seed=6))
    assert [strategy.allocation(r, "c1") for r in range(1, 20)] != [other.allocation(r, "c1") for r in range(1, 20)]
    # seed None: the federation's seed, taken at fit start.
    run = _initialized(FedRA(block_counts=[3, 2, 1]))
    run.on_fit_start(trainer=SimpleNamespace(settings=SimpleNamespace(seed=5)), pl_module=None)
    assert [run.allocation(r, c) for r in (1, 2) for c in CLIENTS] == [
        strategy.allocation(r, c) for r in (1, 2) for c in CLIENTS
    ]
    # The draw is torch.randperm's first c_k entries, sorted.
    g = torch.Generator().manual_seed(0)
    assert random_allocation(5, 2, g) == sorted(
        torch.randperm(5, generator=torch.Generator().manual_seed(0))[:2].tolist()
    )


class _Fixed(FedRA):
    """FedRA with a hand-written allocation."""

    table = {"c0": [0, 1], "c1": [0], "c2": [1]}

    def allocation(self, server_round, client_id):
        return self.table[client_id]


def test_per_block_means_by_hand():
    # Examples n = [1, 2, 3]. Block 0 (c0, c1): (1 * 1 + 2 * 4) / 3 = 3. Block 1 (c0, c2): (1 * 2 + 3 * 6) / 4 = 5.
    # Block 2: nobody had it, it keeps 7. The head (every client): (1 * 1 + 2 * 2 + 3 * 3) / 6 = 14 / 6.
    strategy = _initialized(_Fixed(block_counts=[1]), clients=["c0", "c1", "c2"])
    strategy.global_state["b.blocks.2.adapter.w"] = torch.tensor([7.0])
    uploads = {"c0": {0: 1.0, 1: 2.0}, "c1": {0: 4.0}, "c2": {1: 6.0}}
    updates = [
        ClientUpdate(
            c,
            n,
            {
                **{f"b.blocks.{b}.adapter.w": torch.tensor([v]) for b, v in uploads[c].items()},
                "head.w": torch.tensor([float(n)]),
            },
        )
        for c, n in zip(("c0", "c1", "c2"), (1, 2, 3), strict=True)
    ]
    out = strategy.aggregate(1, updates)
    assert out["b.blocks.0.adapter.w"].item() == pytest.approx(3.0)
    assert out["b.blocks.1.adapter.w"].item() == pytest.approx(5.0)
    assert out["b.blocks.2.adapter.w"].item() == 7.0
    assert out["head.w"].item() == pytest.approx(14 / 6)
    uniform = _initialized(_Fixed(block_counts=[1], weighting="uniform"), clients=["c0", "c1", "c2"])
    assert uniform.aggregate(1, updates)["b.blocks.1.adapter.w"].item() == pytest.approx(4.0)  # (2 + 6) / 2
    # A client that uploads more than its blocks: the extra tensors are ignored; less: an error.
    extra = [
        ClientUpdate(
            "c1",
            1,
            {
                "b.blocks.0.adapter.w": torch.tensor([4.0]),
                "b.blocks.1.adapter.w": torch.tensor([100.0]),
                "head.w": torch.tensor([0.0]),
            },
        )
    ]
    assert (
        _initialized(_Fixed(block_counts=[1]), clients=["c0", "c1", "c2"])
        .aggregate(1, extra)["b.blocks.1.adapter.w"]
        .item()
        == 0.0
    )
    with pytest.raises(KeyError, match="did not upload"):
        strategy.aggregate(2, [ClientUpdate("c1", 1, {"head.w": torch.tensor([0.0])})])


def test_partial_weighted_average_keeps_integers_and_unheld_tensors():
    ref = {"a": torch.tensor([1.0]), "n": torch.tensor(3), "z": torch.tensor([9.0])}
    out = partial_weighted_average(
        ref, [{"a": torch.tensor([2.0]), "n": torch.tensor(4)}, {"n": torch.tensor(7)}], [1.0, 1.0]
    )
    assert out["a"].item() == 2.0 and out["n"].item() == 6 and out["n"].dtype == torch.long  # 5.5 rounds to 6
    assert out["z"].item() == 9.0
    with pytest.raises(ValueError, match="lacks"):
        partial_weighted_average(ref, [{"q": torch.tensor([1.0])}], [1.0])


class _Client(nn.Module):
    def __init__(self):
        super().__init__()
        self.b = AdapterNet().build()
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return self.head(self.b.blocks(x))


def _client_side(skip):
    torch.manual_seed(0)
    module = _Client()
    roles = ParameterRoles.from_module(module, [RoleRule("b.*", "frozen"), RoleRule("*adapter*", "shared")])
    module.requires_grad_(False)
    for name, param in module.named_parameters():
        param.requires_grad_(roles[name] != "frozen")
    strategy = _Fixed(block_counts=[1], skip_unallocated=skip)
    state = {n: t.detach().clone() for n, t in module.state_dict().items() if roles[n] == "shared"}
    strategy.initialize(state, ["c0", "c1", "c2"], roles=roles)
    return module, strategy, roles


@pytest.mark.parametrize("skip", [True, False])
def test_client_trains_and_uploads_only_its_blocks(skip):
    module, strategy, roles = _client_side(skip)
    x = torch.randn(5, 4)
    full = module(x).detach()
    strategy.on_client_fit_start(pl_module=module, server_round=1, client_id="c1")  # block 0 only
    out = module(x)
    # Skipping blocks 1 and 2 changes the forward pass; keeping them does not.
    assert torch.equal(out.detach(), full) is not skip
    if skip:
        expected = module.head(module.b.blocks[0](x))
        assert torch.allclose(out, expected)
    out.sum().backward()
    optimizer = torch.optim.SGD(
        [p for p in module.parameters() if p.requires_grad], lr=0.1, momentum=0.9, weight_decay=0.1
    )
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    strategy.on_before_optimizer_step(optimizer=optimizer)
    optimizer.step()
    moved = {n for n, p in module.named_parameters() if not torch.equal(p, before[n])}
    assert moved == {n for n in roles.names("shared") if n.startswith("b.blocks.0.adapter") or n.startswith("head")}
    update = ClientUpdate(
        "c1", 4, {n: t.detach().clone() for n, t in module.state_dict().items() if roles[n] == "shared"}
    )
    strategy.on_client_fit_end(update=update, server_round=1, client_id="c1")
    assert set(update.state) == {n for n in roles.names("shared") if ".blocks.1." not in n and ".blocks.2." not in n}
    assert update.extras["fedra_blocks"] == [0]
    assert torch.equal(module(x), module.head(module.b.blocks(x)))  # hooks removed: the full model again


def test_a_block_that_cannot_be_skipped_says_how_to_go_on():
    from fedlit.strategies.fedra import _identity

    hook = _identity("backbone.blocks.4")
    x = torch.ones(2, 4)
    assert hook(nn.Identity(), (x,), torch.zeros(2, 4)) is x
    with pytest.raises(ConfigError, match="'backbone.blocks.4'.*skip_unallocated=false"):
        hook(nn.Identity(), (x,), torch.zeros(2, 3))
    with pytest.raises(ConfigError, match="skip_unallocated=false"):
        hook(nn.Identity(), (x, x), (x, x))


def test_bad_arguments_name_the_option():
    for kwargs, option in [
        ({"block_counts": []}, "block_counts"),
        ({"block_counts": [3, 0]}, "block_counts"),
        ({"block_counts": 3}, "block_counts"),
        ({"size_assignment": "random"}, "size_assignment"),
        ({"seed": -1}, "seed"),
        ({"weighting": "size"}, "weighting"),
        ({"block_tensors": "all"}, "block_tensors"),
        ({"skip_unallocated": 1}, "skip_unallocated"),
    ]:
        with pytest.raises(ConfigError, match=f"strategy.init_args.{option}"):
            FedRA(**kwargs)
    with pytest.raises(ConfigError, match=r"block_counts=\[4, 2\] but the model has 3 blocks"):
        _initialized(FedRA(block_counts=[4, 2]))
    with pytest.raises(ConfigError, match="no shared LoRA or adapter tensor"):
        FedRA().initialize({"head.w": torch.zeros(1)}, ["c0"])


# --- end to end ---------------------------------------------------------------------------------------------------


@pytest.fixture
def adapter_model(monkeypatch):
    """make_federation builds its module on ``AdapterNet`` (3 blocks with a bottleneck adapter each)."""
    monkeypatch.setattr(tests.conftest, "TinyMLP", AdapterNet)


class _Recorder(FedRA):
    """FedRA that keeps a copy of the server state before each round's aggregation and of the uploads."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.rounds: list[tuple[dict, list[ClientUpdate]]] = []

    def aggregate(self, server_round, updates):
        self.rounds.append(
            (
                {n: t.clone() for n, t in self.global_state.items()},
                [ClientUpdate(u.client_id, u.num_examples, dict(u.state), extras=dict(u.extras)) for u in updates],
            )
        )
        return super().aggregate(server_round, updates)


def test_two_rounds_cover_blocks_as_allocated(tmp_path, adapter_model):
    strategy = _Recorder(block_counts=[1], seed=3)
    fed = make_federation(tmp_path, strategy, roles=ADAPTER_ROLES)
    fed.fit()
    assert strategy.blocks == [0, 1, 2]
    for server_round, (before, updates) in enumerate(strategy.rounds, 1):
        had = {c: strategy.allocation(server_round, c) for c in fed.client_ids}
        assert [u.extras["fedra_blocks"] for u in updates] == [had[u.client_id] for u in updates]
        for update in updates:
            assert {strategy.block_of[n] for n in update.state if n in strategy.block_of} == set(had[update.client_id])
            assert {n for n in update.state if n not in strategy.block_of} == {"head.weight", "head.bias"}
        covered = {b for rows in had.values() for b in rows}
        after = strategy.global_state if server_round == 2 else strategy.rounds[1][0]
        for name, block in strategy.block_of.items():
            assert torch.equal(after[name], before[name]) is (block not in covered)
    uncovered = [{0, 1, 2} - {b for c in fed.client_ids for b in strategy.allocation(r, c)} for r in (1, 2)]
    assert any(uncovered), "seed 3 leaves a block uncovered in some round (the check above then means something)"
    # Each client uploads one block of three and the head: less than every shared tensor.
    full = sum(t.numel() * t.element_size() for t in strategy.global_state.values())
    assert fed.state.comm["upload_bytes"] < 2 * 3 * full


def test_resume_is_exact(tmp_path, adapter_model):
    straight, _ = assert_resume_is_exact(tmp_path, lambda: FedRA(block_counts=[3, 2, 1]), roles=ADAPTER_ROLES)
    assert straight.strategy.blocks == [0, 1, 2]
