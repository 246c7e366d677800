"""APPLE (Luo & Wu, IJCAI 2022): the mixed forward and its gradients by hand, the p step with the proximal term,
coef(r), the bandwidth-limited draw, the server's storage, two rounds end to end (unlike FedAvg) and exact
resume."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

from fedlit.commands.fit import build_parser
from fedlit.core.errors import ConfigError
from fedlit.core.roles import ParameterRoles
from fedlit.module import FederatedModule
from fedlit.strategies import APPLE, ClientUpdate, FedAvg
from fedlit.strategies.apple import (
    apple_download_choice,
    apple_proximal,
    apple_proximal_coefficient,
    reinitialized_parameters,
    swapped_parameters,
)
from fedlit.strategies.common.aggregate import weighted_average
from tests.conftest import assert_resume_is_exact, make_federation

ROOT = Path(__file__).resolve().parents[2]
W, B = "shared.weight", "shared.bias"
SIZES = {"a": 2, "b": 1, "c": 1}  # p0 = [0.5, 0.25, 0.25]


class Lin(FederatedModule):
    """y ~ w x + b, squared error; both tensors shared."""

    def __init__(self, w=3.0, b=-1.0):
        super().__init__(roles=[])
        self.shared = nn.Linear(1, 1)
        with torch.no_grad():
            self.shared.weight.fill_(w)
            self.shared.bias.fill_(b)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return {"loss": (self.shared(x).squeeze(-1) - y).pow(2).mean()}


def server(**kwargs):
    """Clients a, b, c; rounds 20 (R_d = 2); b's core w = 2, b = 2 and c's w = -1, b = 0.5 (a's: initial)."""
    strategy = APPLE(**{"mu": 1.0, "lr_p": 0.01, "p_momentum": 0.0, "schedule": "cosine", **kwargs})
    strategy.initialize(
        {W: torch.tensor([[0.0]]), B: torch.tensor([0.0])},
        ["a", "b", "c"],
        roles=ParameterRoles({W: "shared", B: "shared"}),
    )
    strategy.on_fit_start(
        trainer=SimpleNamespace(settings=SimpleNamespace(rounds=20), num_examples=lambda c, split: SIZES[c])
    )
    strategy.cores = {
        "b": {W: torch.tensor([[2.0]]), B: torch.tensor([2.0])},
        "c": {W: torch.tensor([[-1.0]]), B: torch.tensor([0.5])},
    }
    return strategy


def client(strategy, client_state):
    trainer = SimpleNamespace(
        scaler=None, store=SimpleNamespace(device=torch.device("cpu")), derive_seed=lambda *parts: 7
    )  # the turn's ClientContext, as hooks get it
    module = Lin()  # a's live core: w = 3, b = -1
    strategy.on_client_fit_start(
        pl_module=module,
        server_round=2,
        client_id="a",
        received_extras=strategy.configure_client_extras(2, "a"),
        client_state=client_state,
    )
    return module, trainer


BATCH = (torch.tensor([[2.0]]), torch.tensor([1.0]))


def test_the_mixed_forward_and_its_gradients_by_hand():
    strategy = server()
    assert strategy.p0.tolist() == [0.5, 0.25, 0.25]
    state = {"p": torch.tensor([0.6, 0.3, -0.2])}
    module, _ = client(strategy, state)
    with strategy.client_forward(module):
        out = module.training_step(BATCH, 0)
    assert isinstance(module.shared.weight, nn.Parameter) and module.shared.weight.item() == 3.0  # put back
    # w = 0.6 * 3 + 0.3 * 2 - 0.2 * -1 = 2.6; b = 0.6 * -1 + 0.3 * 2 - 0.2 * 0.5 = -0.1; 2.6 * 2 - 0.1 - 1 = 4.1
    assert out["loss"].item() == pytest.approx(4.1**2)
    # coef(r = 1) = mu (cos(pi / 2) + 1) / 2 = 0.5; ||p - p0||^2 = 0.1^2 + 0.05^2 + 0.45^2 = 0.215
    loss = strategy.training_loss(module, out["loss"], BATCH)
    assert loss.item() == pytest.approx(16.81 + 0.5 * 0.215)
    loss.backward()
    # dL/dw_mix = 2 * 4.1 * x = 16.4, dL/db_mix = 8.2; the own core gets p_aa times them
    assert module.shared.weight.grad.item() == pytest.approx(0.6 * 16.4)
    assert module.shared.bias.grad.item() == pytest.approx(0.6 * 8.2)
    # dL/dp_j = 16.4 w_j + 8.2 b_j + 2 coef (p_j - p0_j): [49.2 - 8.2 + 0.1, 32.8 + 16.4 + 0.05, -16.4 + 4.1 - 0.45]
    p = strategy._turn["p"]
    assert p.grad.tolist() == pytest.approx([41.1, 49.25, -12.75])
    others = [strategy._turn["cores"][W][1], strategy._turn["cores"][W][2]]
    assert all(not t.requires_grad and t.grad is None for t in others)  # the other cores are constants
    assert strategy.cores["b"][W].item() == 2.0 and strategy.cores["c"][W].item() == -1.0


def test_p_steps_with_the_proximal_term_and_the_client_keeps_its_personalized_model():
    strategy = server()
    state = {"p": torch.tensor([0.6, 0.3, -0.2])}
    module, trainer = client(strategy, state)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    with strategy.client_forward(module):
        out = module.training_step(BATCH, 0)
    strategy.training_loss(module, out["loss"], BATCH).backward()
    strategy.on_before_optimizer_step(client=trainer)
    optimizer.step()
    strategy.on_before_zero_grad(stepped=True)
    # p - lr_p grad = [0.6 - 0.411, 0.3 - 0.4925, -0.2 + 0.1275]; own core: w = 3 - 0.984, b = -1 - 0.492
    assert strategy._turn["p"].tolist() == pytest.approx([0.189, -0.1925, -0.0725])
    assert strategy._turn["p"].grad is None
    update = ClientUpdate("a", 2, {W: module.shared.weight.detach().clone(), B: module.shared.bias.detach().clone()})
    strategy.on_client_fit_end(client=trainer, server_round=2, client_id="a", update=update, client_state=state)
    assert state["p"].tolist() == pytest.approx([0.189, -0.1925, -0.0725]) and update.extras == {}
    # the mix with the trained core: w = 0.189 * 2.016 - 0.1925 * 2 - 0.0725 * -1, b = 0.189 * -1.492 - 0.385 - 0.03625
    assert state["model"][W].item() == pytest.approx(0.068524, abs=1e-6)
    assert state["model"][B].item() == pytest.approx(-0.703238, abs=1e-6)
    fresh = Lin(w=9.0, b=9.0)
    strategy.on_client_evaluate_start(pl_module=fresh, client_state=state)
    assert fresh.shared.weight.item() == pytest.approx(0.068524, abs=1e-6)


def test_a_step_the_scaler_skipped_leaves_p_and_the_first_turn_starts_at_p0():
    strategy = server()
    state = {}
    module, _ = client(strategy, state)
    assert strategy._turn["p"].tolist() == [0.5, 0.25, 0.25]
    with strategy.client_forward(module):
        out = module.training_step(BATCH, 0)
    # p = p0: no proximal gradient; loss unchanged by it
    assert strategy.training_loss(module, out["loss"], BATCH).item() == pytest.approx(out["loss"].item())
    out["loss"].backward()
    strategy.on_before_zero_grad(stepped=False)
    assert strategy._turn["p"].tolist() == [0.5, 0.25, 0.25]


def test_the_proximal_coefficient_schedules():
    exp = [apple_proximal_coefficient(r, 3, 0.1) for r in range(5)]
    assert exp == pytest.approx([0.1, 0.01, 0.001, 0.0, 0.0])  # mu eps^(r / R_d), eps = 1e-3; 0 from R_d
    cos = [apple_proximal_coefficient(r, 4, 2.0, "cosine") for r in range(5)]
    assert cos == pytest.approx([2.0, 1 + 2**-0.5, 1.0, 1 - 2**-0.5, 0.0])
    assert apple_proximal_coefficient(0, 3, 0.0) == 0.0
    assert apple_proximal(torch.tensor([1.0, 2.0]), torch.tensor([0.0, 4.0]), 0.5).item() == 2.5
    # R_d = int(0.1 R): R = 20 gives 2 (server round 3 is r = 2: none); R = 9 gives 0 (never)
    strategy = server(schedule="exponential", mu=0.1)
    assert [strategy.coefficient(t) for t in (1, 2, 3)] == pytest.approx([0.1, 0.1 * 1e-3**0.5, 0.0])
    strategy.rounds = 9
    assert strategy.coefficient(1) == 0.0
    assert APPLE(decay_rounds=3).coefficient(2) == pytest.approx(0.01)


def test_the_bandwidth_limited_draw():
    gen = lambda seed: torch.Generator().manual_seed(seed)  # noqa: E731
    p = torch.tensor([0.0, 3.0, 0.0, 0.0])
    touched_own = torch.tensor([True, False, False, False])
    # never-downloaded cores first: with 3 of them and M = 2, two of them, never the own core
    for seed in range(20):
        pick = apple_download_choice(p, 0, touched_own, 2, 5, gen(seed))
        assert len(pick) == 2 and 0 not in pick
    # one never downloaded (3) and M = 2: it, plus one drawn among the others
    one_fresh = torch.tensor([True, True, True, False])
    assert all(3 in apple_download_choice(p, 0, one_fresh, 2, 5, gen(s)) for s in range(20))
    # all touched, M = 1, r = 0: base = thresh = 1.5, P(core 1) = 1.5^3 / (1.5^3 + 1 + 1) = 3.375 / 5.375
    touched = torch.ones(4, dtype=torch.bool)
    draws = [apple_download_choice(p, 0, touched, 1, 0, gen(s))[0] for s in range(3000)]
    assert draws.count(1) / 3000 == pytest.approx(3.375 / 5.375, abs=0.03)
    # r = 20: base = lamb r M / N = 5, P(core 1) = 125 / 127
    draws = [apple_download_choice(p, 0, touched, 1, 20, gen(s))[0] for s in range(1000)]
    assert draws.count(1) / 1000 == pytest.approx(125 / 127, abs=0.02)
    # seeded: the same stream gives the same draw; M = 2 of 3 candidates never repeats one
    assert apple_download_choice(p, 0, touched, 2, 3, gen(5)) == apple_download_choice(p, 0, touched, 2, 3, gen(5))
    assert all(len(set(apple_download_choice(p, 2, touched, 2, 3, gen(s)))) == 2 for s in range(20))
    with pytest.raises(ValueError, match="limit=4 must be in"):
        apple_download_choice(p, 0, touched, 4, 0, gen(0))


def test_the_server_stores_every_core_and_sends_the_requested_ones():
    strategy = server(max_downloads=1)
    assert set(strategy.configure_client_extras(2, "a")["cores"]) == {"b", "c"}  # no request yet: all of them
    updates = [
        ClientUpdate("a", 2, {W: torch.tensor([[4.0]]), B: torch.tensor([0.0])}, extras={"request": torch.tensor([2])})
    ]
    out = strategy.aggregate(2, updates)
    # global = p0 mix of the cores: 0.5 * 4 + 0.25 * 2 + 0.25 * -1 = 2.25
    assert out[W].item() == pytest.approx(2.25) and strategy.requests == {"a": [2]}
    extras = strategy.configure_client_extras(3, "a")
    assert list(extras["cores"]) == ["c"] and extras["cores"]["c"][W].item() == -1.0
    assert strategy.configure_client(3, "a")[W].item() == 4.0  # its own core
    assert strategy.configure_evaluate(3, "a")[W].item() == 4.0  # the client puts its own model over it
    assert strategy.expected_upload_extras("a")["request"].shape == (1,)
    assert APPLE().expected_upload_extras("a") == {}


def test_under_the_bandwidth_limit_a_core_not_downloaded_keeps_its_last_downloaded_value():
    strategy = server(max_downloads=1)
    state = {}
    module, trainer = client(strategy, state)  # first turn: every core, which are not marked as downloaded
    update = ClientUpdate("a", 2, {W: torch.tensor([[3.0]]), B: torch.tensor([-1.0])})
    strategy.on_client_fit_end(client=trainer, server_round=2, client_id="a", update=update, client_state=state)
    assert state["touched"].tolist() == [True, False, False] and set(state["cores"]) == {"b", "c"}
    request = update.extras["request"].tolist()
    assert len(request) == 1 and request[0] in (1, 2)
    strategy.global_state = strategy.aggregate(2, [update])
    strategy.cores["b"] = {W: torch.tensor([[10.0]]), B: torch.tensor([0.0])}
    strategy.cores["c"] = {W: torch.tensor([[20.0]]), B: torch.tensor([0.0])}
    client(strategy, state)
    fresh, stale = (1, 2) if request == [1] else (2, 1)
    assert strategy._turn["cores"][W][fresh].item() == [10.0, 20.0][fresh - 1]
    assert strategy._turn["cores"][W][stale].item() == [2.0, -1.0][stale - 1]


def test_bad_options_are_named():
    with pytest.raises(ConfigError) as err:
        APPLE(mu=-1.0, lr_p=0.0, schedule="linear", eps=2.0, decay_rounds=-1, max_downloads=0)
    for option in ("mu=-1.0", "lr_p=0.0", "schedule='linear'", "eps=2.0", "decay_rounds=-1", "max_downloads=0"):
        assert f"strategy.init_args.{option}" in str(err.value)
    assert repr(APPLE()).startswith("APPLE(mu=0.1, lr_p=0.001, p_momentum=0.9, schedule='exponential'")


def _losses(out_dir):
    events = EventAccumulator(str(out_dir / "tensorboard")).Reload()
    return [e.value for e in events.Scalars("server/train/loss_mean")] + [
        events.Scalars("server/val/loss_mean")[-1].value
    ]


# Seed 0, 3 clients, all selected, 2 rounds, lr_p = 0.1 (so p moves visibly): train loss mean per round, validation
# loss mean after round 2 (each client's personalized model). FedAvg on the same federation: [1.102971, 0.952829,
# 1.100733]: round 1 starts from the same model, but the own core's gradient is scaled by p_ii = 1/3.
PINNED = [1.106671, 1.039599, 1.131313]


def test_two_rounds_differ_from_fedavg(tmp_path):
    federation = make_federation(tmp_path / "apple", APPLE(lr_p=0.1, decay_rounds=2, core_init="shared"), rounds=2)
    federation.fit()
    strategy = federation.strategy
    payload = torch.load(tmp_path / "apple" / "checkpoints" / "last.ckpt", weights_only=True)
    assert payload["server_round"] == 2 and set(payload["strategy"]["cores"]) == {"c0", "c1", "c2"}
    ps = {c: federation.store.extra(c, "APPLE")["p"] for c in federation.client_ids}
    assert all(p.shape == (3,) and not torch.allclose(p, torch.full((3,), 1 / 3)) for p in ps.values())
    assert not torch.equal(ps["c0"], ps["c1"])
    shared = federation.module.named_tensors("shared")
    model = sum(t.numel() * t.element_size() for t in shared.values())
    params = sum(p.numel() * p.element_size() for _, p in federation.module.shared_parameters())
    assert federation.state.comm["upload_bytes"] == 6 * model  # the cores only: p never leaves a client
    assert federation.state.comm["download_bytes"] == 6 * (model + 12 + 2 * params)  # own core, p0, two other cores
    # the server keeps one core per client and the p0 (uniform) mix of them
    mean = weighted_average(list(strategy.cores.values()), [1.0, 1.0, 1.0])
    assert all(torch.allclose(strategy.global_state[n], mean[n]) for n in mean if mean[n].is_floating_point())
    # a client is evaluated with its personalized model, which differs from its own core
    federation.evaluate_client(2, "c1", "val")
    model, live = federation.store.extra("c1", "APPLE")["model"], dict(federation.module.shared_parameters())
    assert set(model) == set(live) and all(torch.equal(live[n], model[n]) for n in model)
    assert not torch.equal(model["head.weight"], strategy.cores["c1"]["head.weight"])
    ours = _losses(tmp_path / "apple")
    assert ours == pytest.approx(PINNED, abs=2e-5)
    make_federation(tmp_path / "fedavg", FedAvg(), rounds=2).fit()
    theirs = _losses(tmp_path / "fedavg")
    assert all(abs(a - b) > 1e-3 for a, b in zip(ours, theirs, strict=True))


@pytest.mark.parametrize("kwargs", [{}, {"max_downloads": 1}], ids=["all", "bandwidth"])
def test_resume_is_exact(tmp_path, kwargs):
    straight, _ = assert_resume_is_exact(tmp_path, lambda: APPLE(decay_rounds=3, **kwargs), clients_per_round=2)
    states = [straight.store.extra(c, "APPLE") for c in straight.client_ids]
    assert all("p" in s and "model" in s for s in states)  # every client trained at least once in 4 rounds
    assert ("cores" in states[0]) == bool(kwargs)


def test_the_recipe_selects_apple():
    cfg = build_parser().parse_args(["fit", "--config", str(ROOT / "recipes" / "apple_pneumoniamnist.yaml")]).fit
    assert cfg.strategy.class_path == "fedlit.strategies.APPLE"
    assert cfg.strategy.init_args.mu == 0.1 and cfg.strategy.init_args.lr_p == 0.001
    assert cfg.model.init_args.lr == 0.01 and cfg.model.init_args.momentum == 0.9
    assert cfg.data.init_args.partitioner.class_path == "fedlit.data.Shards"


def test_swapped_parameters_puts_the_parameters_back_in_order_even_after_an_error():
    module = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    order = [(n, id(p)) for n, p in module.named_parameters()]
    with pytest.raises(RuntimeError, match="boom"), swapped_parameters(module, {"0.bias": torch.ones(2)}):
        assert torch.equal(module[0].bias, torch.ones(2)) and not isinstance(module[0].bias, nn.Parameter)
        raise RuntimeError("boom")
    assert [(n, id(p)) for n, p in module.named_parameters()] == order


def _p_after_one_round(tmp_path, core_init):
    """Every client's ``p_i - p0`` after one round of 1 epoch (lr_p = 0.1, no proximal term)."""
    federation = make_federation(tmp_path / core_init, APPLE(lr_p=0.1, decay_rounds=0, core_init=core_init), rounds=1)
    federation.fit()
    return {c: federation.store.extra(c, "APPLE")["p"].double() - 1 / 3 for c in federation.client_ids}, federation


def test_own_cores_let_p_leave_the_all_ones_direction_in_round_one(tmp_path):
    # shared: the other clients' cores are all the initial model in round 1, so dL/dp_j = <dL/dtheta_p, theta_c,j>
    # is one number for every j != i: those entries of p move together (only p_ii, on the live core, differs)
    shared, _ = _p_after_one_round(tmp_path, "shared")
    for i, delta in enumerate(shared.values()):
        others = torch.cat([delta[:i], delta[i + 1 :]])
        assert others.abs().max() > 1e-3 and (others.max() - others.min()) < 1e-6
    # own: each core its own draw, so the entries of p - p0 of the other cores differ by far more than rounding
    own, federation = _p_after_one_round(tmp_path, "own")
    for i, delta in enumerate(own.values()):
        others = torch.cat([delta[:i], delta[i + 1 :]])
        assert (others.max() - others.min()) > 1e-3
    # the drawn cores differ from each other
    cores = federation.strategy.cores
    weight = next(n for n, t in cores["c0"].items() if t.ndim == 2)
    assert not torch.equal(cores["c0"][weight], cores["c1"][weight])


def test_reinitialized_parameters_draw_from_the_layers_own_init_and_leave_the_module_as_it_was():
    module = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    with torch.no_grad():
        module[2].bias.zero_()  # a constant init (as a LoRA B at 0) is the model's choice: kept
    before = {n: t.clone() for n, t in module.state_dict().items()}
    names = ["0.weight", "0.bias", "1.weight", "2.weight", "2.bias"]
    torch.manual_seed(99)
    outside = torch.rand(1)
    drawn, kept = reinitialized_parameters(module, names, seed=5)
    again, _ = reinitialized_parameters(module, names, seed=5)
    other, _ = reinitialized_parameters(module, names, seed=6)
    assert all(torch.equal(module.state_dict()[n], before[n]) for n in before)
    torch.manual_seed(99)
    assert torch.equal(torch.rand(1), outside)  # the global random state is not consumed ...
    assert kept == ["1.weight", "2.bias"]  # BatchNorm's scale (ones) and the zero bias keep their constants
    # ... and the draw is nn.Linear's own reset_parameters() under seed 5, layer by layer in model order
    torch.manual_seed(5)
    reference = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    torch.manual_seed(5)
    for layer in reference:
        layer.reset_parameters()
    assert torch.equal(drawn["0.weight"], reference[0].weight) and torch.equal(drawn["2.weight"], reference[2].weight)
    assert all(torch.equal(drawn[n], again[n]) for n in names)
    assert not torch.equal(drawn["0.weight"], other["0.weight"])
    assert torch.equal(drawn["2.bias"], torch.zeros(2))
