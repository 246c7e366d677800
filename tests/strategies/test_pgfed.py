"""PGFed and PGFedMo (Luo et al., ICCV 2023): the local step and the a_ij update by hand, PGFedMo's momentum, the
extra pass against autograd, the server's storage, two rounds end to end (unlike FedAvg) and exact resume."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lightning.fabric import Fabric
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

from fedlit.commands.fit import build_parser
from fedlit.core.errors import ConfigError
from fedlit.core.roles import ParameterRoles, RoleRule
from fedlit.module import FederatedModule
from fedlit.strategies import ClientUpdate, FedAvg, PGFed, PGFedMo
from fedlit.strategies.pgfed import (
    mean_loss_and_gradient,
    momentum_mix,
    pgfed_auxiliary_gradient,
    pgfed_coefficient_step,
    pgfed_risk_offset,
)
from tests.conftest import assert_resume_is_exact, make_federation

ROOT = Path(__file__).resolve().parents[2]
W = "shared.weight"


class Lin(FederatedModule):
    """y ~ shared(x) + personal(x), squared error: a tiny linear model with one shared and one personal layer."""

    def __init__(self):
        super().__init__(roles=[RoleRule("personal.*", "personal")])
        self.shared = nn.Linear(2, 1, bias=False)
        self.personal = nn.Linear(2, 1, bias=False)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return {"loss": ((self.shared(x) + self.personal(x)).squeeze(-1) - y).pow(2).mean()}


def server(strategy=None):
    """A strategy whose last round aggregated clients a and b: grad f_a = [1, 2], grad f_b = [3, -2],
    mu l_a = 0.2, mu l_b = -2.9; client a's row holds a_ab = 0.25 (a_aa unset: 1 / M = 0.5)."""
    strategy = strategy or PGFed(mu=0.5, lam=0.1)
    strategy.initialize({W: torch.tensor([[3.0, 1.0]])}, ["a", "b", "c"], roles=ParameterRoles({W: "shared"}))
    strategy.grads = {"a": {W: torch.tensor([[1.0, 2.0]])}, "b": {W: torch.tensor([[3.0, -2.0]])}}
    strategy.mu_losses = {"a": 0.2, "b": -2.9}
    strategy.coefficients = {"a": {"b": 0.25}}
    return strategy


def client_turn(strategy, client_state=None):
    module = Lin()
    with torch.no_grad():
        module.shared.weight.copy_(torch.tensor([[3.0, 1.0]]))
        module.personal.weight.copy_(torch.tensor([[5.0, 5.0]]))
    extras = strategy.configure_client_extras(2, "a")
    state = {} if client_state is None else client_state
    strategy.on_client_fit_start(pl_module=module, received_extras=extras, client_state=state)
    return module, extras, state


def step(module, strategy, optimizer, grad):
    module.shared.weight.grad = torch.tensor([grad])
    module.personal.weight.grad = torch.tensor([[1.0, 1.0]])
    strategy.on_before_optimizer_step(optimizer=optimizer)
    corrected = module.shared.weight.grad.clone()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return corrected


def test_what_client_a_receives():
    _, extras, _ = client_turn(server())
    # g~_a = mu (a_aa grad f_a + a_ab grad f_b) = 0.5 (0.5 [1, 2] + 0.25 [3, -2]) = 0.5 [1.25, 0.5]
    assert extras["g_tilde"][W].tolist() == [[0.625, 0.25]]
    # gbar = (mu / M) (grad f_a + grad f_b) = 0.25 [4, 0]
    assert extras["g_bar"][W].tolist() == [[1.0, 0.0]]
    assert extras["mu_l"].tolist() == [0.2, -2.9] and extras["a"].tolist() == [0.5, 0.25]
    assert server().configure_client_extras(1, "c")["a"].tolist() == [0.5, 0.5]  # nothing set yet: 1 / M


def test_local_steps_add_g_tilde_and_move_a_with_theta_before_the_step():
    strategy = server()
    module, _, _ = client_turn(strategy)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    # step 1: grad = [2, 4] + g~ = [2.625, 4.25]; <theta, gbar> = <[3, 1], [1, 0]> = 3
    assert step(module, strategy, optimizer, [2.0, 4.0]).tolist() == [[2.625, 4.25]]
    # a_aa = max(0, 0.5 - 0.1 (0.2 + 3)) = 0.18; a_ab = max(0, 0.25 - 0.1 (-2.9 + 3)) = 0.24
    assert strategy._turn["a"].tolist() == pytest.approx([0.18, 0.24])
    # theta = [3, 1] - 0.1 [2.625, 4.25] = [2.7375, 0.575]; the personal layer: a plain step, 5 - 0.1
    assert torch.allclose(module.shared.weight, torch.tensor([[2.7375, 0.575]]))
    assert torch.allclose(module.personal.weight, torch.tensor([[4.9, 4.9]]))
    # step 2: grad = 0 + g~; <theta, gbar> = 2.7375 (theta before this step; after it, 2.675, a_ab would be 0.2625)
    assert step(module, strategy, optimizer, [0.0, 0.0]).tolist() == [[0.625, 0.25]]
    # a_aa = max(0, 0.18 - 0.1 (0.2 + 2.7375)) = max(0, -0.11375) = 0; a_ab = 0.24 - 0.1 (-2.9 + 2.7375) = 0.25625
    assert strategy._turn["a"].tolist() == pytest.approx([0.0, 0.25625])


def test_round_one_trains_plainly():
    strategy = PGFed()
    strategy.initialize({W: torch.tensor([[3.0, 1.0]])}, ["a", "b"], roles=ParameterRoles({W: "shared"}))
    module, extras, _ = client_turn(strategy)
    assert extras == {}
    assert step(module, strategy, torch.optim.SGD(module.parameters(), lr=0.1), [2.0, 4.0]).tolist() == [[2.0, 4.0]]


@pytest.mark.parametrize("cls", [PGFed, PGFedMo])
def test_momentum_mixes_the_correction_with_the_clients_previous_one(cls):
    strategy = server(cls(mu=0.5, lam=0.1, beta=0.25) if cls is PGFedMo else cls(mu=0.5, lam=0.1))
    state = {"g_tilde": {W: torch.tensor([[1.0, -1.0]])}}
    module, _, _ = client_turn(strategy, state)
    corrected = step(module, strategy, torch.optim.SGD(module.parameters(), lr=0.1), [0.0, 0.0])
    if cls is PGFedMo:
        # (1 - beta) g~_new + beta g~_prev = 0.75 [0.625, 0.25] + 0.25 [1, -1] = [0.71875, -0.0625]
        assert corrected.tolist() == [[0.71875, -0.0625]]
    else:  # PGFed uses the new correction alone and keeps nothing
        assert corrected.tolist() == [[0.625, 0.25]]
    # a first correction is used as it is
    fresh = server(PGFedMo(mu=0.5, lam=0.1, beta=0.25))
    module, _, _ = client_turn(fresh, {})
    assert step(module, fresh, torch.optim.SGD(module.parameters(), lr=0.1), [0.0, 0.0]).tolist() == [[0.625, 0.25]]
    assert momentum_mix({W: torch.tensor([2.0])}, {W: torch.tensor([6.0])}, 0.25)[W].tolist() == [3.0]


BATCHES = [
    (torch.tensor([[1.0, 2.0], [0.0, 1.0], [2.0, -1.0]]), torch.tensor([1.0, 0.0, 2.0])),
    (torch.tensor([[1.0, 1.0], [-1.0, 3.0], [0.5, 0.5]]), torch.tensor([0.0, 1.0, -1.0])),
    (torch.tensor([[3.0, 0.0], [1.0, -2.0]]), torch.tensor([2.0, 1.0])),
]


def fake_client(batches):
    """What a client's turn gives the hooks as ``client``: ``batches`` as its training data, on the CPU."""
    fabric = Fabric(accelerator="cpu", devices=1)
    return SimpleNamespace(
        train_dataloader=lambda *stream, generator=None: batches,
        prepare_batch=lambda batch: fabric.to_device(batch),
        autocast=fabric.autocast,
        convert_output=lambda out: out,
    )


def test_the_extra_pass_uploads_the_mean_batch_gradient_and_the_risk_offset():
    strategy = server(PGFedMo(mu=0.5, lam=0.1, beta=0.25))
    module, _, state = client_turn(strategy, {})
    step(module, strategy, torch.optim.SGD(module.parameters(), lr=0.1), [2.0, 4.0])  # theta = [2.7375, 0.575]
    theta = module.shared.weight.detach().clone()
    # independently: each batch's gradient of its mean squared error by autograd, on a copy of the model
    w_s, w_p = theta.clone().requires_grad_(True), module.personal.weight.detach().clone()
    grads, losses = [], []
    for x, y in BATCHES:
        loss = ((x @ w_s.T + x @ w_p.T).squeeze(-1) - y).pow(2).mean()
        grads.append(torch.autograd.grad(loss, w_s)[0])
        losses.append(loss.item())
    mean_grad, mean_loss = sum(grads) / 3, sum(losses) / 3
    update = ClientUpdate("a", 8, state={W: theta.clone()})
    strategy.on_client_fit_end(
        client=fake_client(BATCHES), pl_module=module, server_round=2, client_id="a", update=update, client_state=state
    )
    assert torch.allclose(update.extras["grad"][W], mean_grad, atol=1e-6)
    # l_i = f_i - <grad f_i, theta_i>
    offset = mean_loss - float((mean_grad * theta).sum())
    assert update.extras["l"].item() == pytest.approx(offset, abs=1e-5)
    assert update.extras["a"].tolist() == pytest.approx([0.18, 0.24])
    assert torch.equal(module.shared.weight, theta)  # no step was taken
    assert state["g_tilde"][W].tolist() == [[0.625, 0.25]]  # PGFedMo keeps the correction it used


def test_the_extra_pass_restores_batchnorm_statistics():
    bn = nn.BatchNorm1d(2)
    module = SimpleNamespace(
        named_buffers=bn.named_buffers,
        set_train_mode=bn.train,
        modules=bn.modules,
        training_step=lambda batch, i: {"loss": bn(batch[0]).pow(3).mean()},
    )
    before = {n: b.clone() for n, b in bn.named_buffers()}
    loss, grad = mean_loss_and_gradient(module, dict(bn.named_parameters()), BATCHES[:2])
    assert all(torch.equal(before[n], b) for n, b in bn.named_buffers())
    assert grad["weight"].abs().sum() > 0


def test_the_extra_pass_leaves_out_a_batch_of_one_with_batchnorm_as_the_local_loop_does():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))
    module = SimpleNamespace(
        named_buffers=net.named_buffers,
        set_train_mode=net.train,
        modules=net.modules,
        training_step=lambda batch, i: {"loss": net(batch[0]).pow(2).sum(-1).mean()},
    )
    pair, lone = (torch.tensor([[1.0, 2.0], [3.0, -1.0]]), None), (torch.tensor([[0.5, 0.5]]), None)
    params = dict(net.named_parameters())
    loss, grad = mean_loss_and_gradient(module, params, [pair, lone])  # BatchNorm refuses one sample in train mode
    expected_loss = net(pair[0]).pow(2).sum(-1).mean()  # independently: the pair's batch alone
    expected = torch.autograd.grad(expected_loss, list(params.values()))
    assert loss == pytest.approx(expected_loss.item())
    assert all(torch.allclose(grad[n], g) for n, g in zip(params, expected, strict=True))
    net.eval()  # running statistics: one sample is a batch like any other
    module.set_train_mode = lambda: None
    _, with_lone = mean_loss_and_gradient(module, params, [lone])
    assert with_lone["0.weight"].abs().sum() > 0


def test_the_server_averages_and_stores_each_clients_gradient_loss_row_and_model():
    strategy = server()  # S_{t-1} = [a, b]; mu = 0.5
    updates = [
        ClientUpdate(
            "a",
            10,
            {W: torch.tensor([[1.0, 0.0]])},
            extras={
                "grad": {W: torch.tensor([[5.0, 5.0]])},
                "l": torch.tensor(0.4, dtype=torch.float64),
                "a": torch.tensor([0.1, 0.3], dtype=torch.float64),
            },
        ),
        ClientUpdate(
            "c",
            30,
            {W: torch.tensor([[5.0, 4.0]])},
            extras={
                "grad": {W: torch.tensor([[-1.0, 1.0]])},
                "l": torch.tensor(-2.0, dtype=torch.float64),
                "a": torch.tensor([0.0, 0.7], dtype=torch.float64),
            },
        ),
    ]
    out = strategy.global_state = strategy.aggregate(2, updates)  # as the loop stores it
    # theta_glob = 1/4 [1, 0] + 3/4 [5, 4] = [4, 3]
    assert out[W].tolist() == [[4.0, 3.0]]
    assert list(strategy.grads) == ["a", "c"] and strategy.grads["c"][W].tolist() == [[-1.0, 1.0]]
    assert strategy.mu_losses == {"a": 0.2, "c": -1.0}  # mu l = 0.5 * [0.4, -2]
    assert strategy.coefficients == {"a": {"a": 0.1, "b": 0.3}, "c": {"a": 0.0, "b": 0.7}}
    # each client evaluates its own model; b never trained here: theta_glob
    assert strategy.configure_evaluate(3, "c")[W].tolist() == [[5.0, 4.0]]
    assert strategy.configure_evaluate(3, "b")[W].tolist() == [[4.0, 3.0]]
    # round 3, S_{t-1} = [a, c]; client c's row: a_ca = 0 (just uploaded), a_cc unset: 1 / M = 0.5
    # g~_c = mu (a_ca grad f_a + a_cc grad f_c) = 0.5 (0 [5, 5] + 0.5 [-1, 1]) = [-0.25, 0.25]
    extras = strategy.configure_client_extras(3, "c")
    assert extras["a"].tolist() == [0.0, 0.5] and extras["g_tilde"][W].tolist() == [[-0.25, 0.25]]
    assert strategy.configure_client_extras(3, "b")["g_tilde"][W].tolist() == [[1.0, 1.5]]  # 0.5 (0.5 g_a + 0.5 g_c)
    with pytest.raises(KeyError, match="uploaded no PGFed extras"):
        strategy.aggregate(3, [ClientUpdate("a", 1, {W: torch.zeros(1, 2)})])


def test_bad_options_are_named():
    with pytest.raises(ConfigError) as err:
        PGFedMo(mu=-1.0, lam=-0.1, beta=1.0)
    for option in ("strategy.init_args.mu=-1.0", "strategy.init_args.lam=-0.1", "strategy.init_args.beta=1.0"):
        assert option in str(err.value)
    assert repr(PGFedMo()) == "PGFedMo(mu=0.1, lam=0.01, beta=0.5)" and repr(PGFed()) == "PGFed(mu=0.1, lam=0.01)"


def _losses(out_dir):
    events = EventAccumulator(str(out_dir / "tensorboard")).Reload()
    return [e.value for e in events.Scalars("server/train/loss_mean")] + [
        events.Scalars("server/val/loss_mean")[-1].value
    ]


# Seed 0, 3 clients, all selected, 2 rounds: train loss mean per round, validation loss mean after round 2 (each
# client evaluates its own trained model). FedAvg on the same federation gives [1.102971, 0.952829, 1.100733]:
# round 1 is the same (no correction yet), round 2 trains with the corrections g~_i.
PINNED = [1.102971, 0.951721, 1.101461]


def test_two_rounds_exchange_gradients_and_differ_from_fedavg(tmp_path):
    federation = make_federation(tmp_path / "pgfed", PGFed(), rounds=2)
    federation.fit()
    strategy = federation.strategy
    payload = torch.load(tmp_path / "pgfed" / "checkpoints" / "last.ckpt", weights_only=True)
    assert payload["server_round"] == 2 and set(payload["strategy"]["coefficients"]) == {"c0", "c1", "c2"}
    model = sum(t.numel() * t.element_size() for t in federation.module.named_tensors("shared").values())
    params = sum(p.numel() * p.element_size() for _, p in federation.module.shared_parameters())
    # up: theta_i + grad f_i + l_i (8 bytes) + a row (8 bytes per client of the previous round: 0, then 3)
    # down: theta_glob, and from round 2 g~_i + gbar + mu l_j and a_ij (3 + 3 float64)
    assert federation.state.comm["upload_bytes"] == 6 * (model + params + 8) + 3 * 24
    assert federation.state.comm["download_bytes"] == 6 * model + 3 * (2 * params + 48)
    # each client's own theta_i, as FedAvg's shared tensors, and theta_glob for the global-model evaluation
    assert federation.state.comm["eval_download_bytes"] == 2 * 6 * model
    assert all(0 < a < 1 / 3 for row in strategy.coefficients.values() for a in row.values())
    ours = _losses(tmp_path / "pgfed")
    assert ours == pytest.approx(PINNED, abs=2e-5)
    make_federation(tmp_path / "fedavg", FedAvg(), rounds=2).fit()
    theirs = _losses(tmp_path / "fedavg")
    assert ours[0] == pytest.approx(theirs[0], abs=1e-6)
    assert abs(ours[1] - theirs[1]) > 5e-4 and abs(ours[2] - theirs[2]) > 5e-4


@pytest.mark.parametrize("factory", [PGFed, PGFedMo], ids=["PGFed", "PGFedMo"])
def test_resume_is_exact(tmp_path, factory):
    straight, _ = assert_resume_is_exact(tmp_path, factory, clients_per_round=2)
    strategy = straight.strategy
    assert len(strategy.grads) == 2 and set(strategy.local_states) <= set(straight.client_ids)
    kept = [straight.store.extra(c, strategy.state_key).get("g_tilde") for c in straight.client_ids]
    if factory is PGFedMo:
        assert any(k is not None for k in kept)  # some client trained in two rounds after round 1
    else:
        assert all(k is None for k in kept)


def test_pgfedmo_parts_from_pgfed_once_a_client_trains_again(tmp_path):
    runs = {}
    for name, strategy in (("pgfed", PGFed()), ("pgfedmo", PGFedMo(beta=0.5)), ("beta0", PGFedMo(beta=0.0))):
        make_federation(tmp_path / name, strategy, rounds=3).fit()
        runs[name] = _losses(tmp_path / name)
    assert runs["beta0"] == runs["pgfed"]
    assert runs["pgfedmo"][:2] == runs["pgfed"][:2]  # round 2 is every client's first correction
    assert abs(runs["pgfedmo"][2] - runs["pgfed"][2]) > 1e-6


@pytest.mark.parametrize(
    ("name", "cls"), [("pgfed_pneumoniamnist.yaml", PGFed), ("pgfedmo_pneumoniamnist.yaml", PGFedMo)]
)
def test_recipes_select_the_strategy_by_name(name, cls):
    cfg = build_parser().parse_args(["fit", "--config", str(ROOT / "recipes" / name)]).fit
    assert cfg.strategy.class_path == f"fedlit.strategies.{cls.__name__}"
    assert cfg.strategy.init_args.mu == 0.1 and cfg.strategy.init_args.lam == 0.01
    assert cfg.model.init_args.optimizer == "sgd" and cfg.model.init_args.momentum == 0.9


def test_the_pure_math_on_its_own():
    half = torch.float16
    grads = [{"w": torch.tensor([1.0, 2.0], dtype=half)}, {"w": torch.tensor([3.0, -2.0], dtype=half)}]
    # mu (a_1 g_1 + a_2 g_2) = 2 (0.5 [1, 2] + 0 [3, -2]) = [1, 2], not normalized by sum a, dtype kept
    out = pgfed_auxiliary_gradient(grads, [0.5, 0.0], 2.0)["w"]
    assert out.tolist() == [1.0, 2.0] and out.dtype == torch.float16
    # max(0, a - lam (mu l + d)) with d = 1: [0.5 - 0.1 * 3, 0.1 - 0.1 * 2] = [0.2, -0.1 -> 0]
    a = pgfed_coefficient_step(torch.tensor([0.5, 0.1]), torch.tensor([2.0, 1.0]), 1.0, 0.1)
    assert a.tolist() == pytest.approx([0.2, 0.0]) and a.dtype == torch.float64
    # l = f - <g, theta> = 1.5 - (1 * 3 + 2 * -1) = 0.5
    theta, grad = {"w": torch.tensor([3.0, -1.0])}, {"w": torch.tensor([1.0, 2.0])}
    assert pgfed_risk_offset(1.5, grad, theta).item() == 0.5
    with pytest.raises(ValueError, match="2 gradients but 1 coefficients"):
        pgfed_auxiliary_gradient(grads, [1.0], 1.0)
