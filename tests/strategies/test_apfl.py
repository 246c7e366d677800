"""APFL (Deng, Kamani, Mahdavi, 2020): the alpha step and the mix by hand, one local step of w, v and alpha by hand,
w being FedAvg's model, two rounds end to end, evaluation with vbar, the CLI name and bad options."""

import contextlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

from fedlit.commands.fit import build_parser
from fedlit.core.errors import ConfigError
from fedlit.core.roles import RoleRule
from fedlit.module import FederatedModule
from fedlit.strategies import APFL, FedAvg, Local
from fedlit.strategies.apfl import apfl_alpha_step, apfl_mix
from tests.conftest import make_federation

ROOT = Path(__file__).resolve().parents[2]
W = "shared.weight"


def t(*values):
    return torch.tensor(values, dtype=torch.float32)


def test_the_alpha_step_by_hand():
    v, w = {"p": t(1.0, 2.0)}, {"p": t(0.0, 1.0)}
    grad_v, grad_w = {"p": t(0.5, -1.0)}, {"p": t(1.0, 2.0)}
    # v - w = [1, 1]; a grad_v + (1 - a) grad_w = 0.5 [0.5, -1] + 0.5 [1, 2] = [0.75, 0.5]; <., .> = 1.25;
    # + 0.02 * 0.5 = 1.26; a = 0.5 - 0.1 * 1.26 = 0.374
    assert apfl_alpha_step(0.5, v, w, grad_v, grad_w, 0.1) == pytest.approx(0.374, abs=1e-12)
    # without the penalty: 0.5 - 0.1 * 1.25 = 0.375
    assert apfl_alpha_step(0.5, v, w, grad_v, grad_w, 0.1, penalty=0.0) == pytest.approx(0.375, abs=1e-12)
    # clipped at 0: 0.5 - 1.0 * 1.26 < 0
    assert apfl_alpha_step(0.5, v, w, grad_v, grad_w, 1.0) == 0.0
    # clipped at 1: a grad = [-5, -5], <[1, 1], .> = -10, + 0.01: 0.5 + 0.1 * 9.99 > 1
    neg = {"p": t(-5.0, -5.0)}
    assert apfl_alpha_step(0.5, v, w, neg, neg, 0.1) == 1.0
    # a missing gradient counts as zero: a = 0.25, grad = 0.25 [0.5, -1] = [0.125, -0.25], <[1, 1], .> = -0.125,
    # + 0.02 * 0.25 = -0.12; 0.25 + 0.1 * 0.12 = 0.262
    assert apfl_alpha_step(0.25, v, w, grad_v, {"p": None}, 0.1) == pytest.approx(0.262, abs=1e-12)


def test_the_mix_by_hand():
    # (1 - 0.25) [0, 4] + 0.25 [2, 0] = [0.5, 3], dtype of v kept
    out = apfl_mix({"p": t(0.0, 4.0)}, {"p": torch.tensor([2.0, 0.0], dtype=torch.float64)}, 0.25)["p"]
    assert out.tolist() == [0.5, 3.0] and out.dtype == torch.float64


class Lin(FederatedModule):
    """y ~ shared(x), squared error."""

    def __init__(self):
        super().__init__(roles=[RoleRule("shared.*", "shared")])
        self.shared = nn.Linear(2, 1, bias=False)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return {"loss": (self.shared(x).squeeze(-1) - y).pow(2).mean()}


def fake_client():
    return SimpleNamespace(
        autocast=contextlib.nullcontext,
        convert_output=lambda out: out,
        scaler=None,
        local=SimpleNamespace(optimizer_state="reset"),
        store=SimpleNamespace(device="cpu"),
    )


def test_one_local_step_moves_w_v_and_alpha_as_worked_by_hand():
    strategy = APFL(alpha=0.5)
    module = Lin()
    with torch.no_grad():
        module.shared.weight.copy_(torch.tensor([[1.0, 2.0]]))
    client = fake_client()
    state = {"v": {W: torch.tensor([[0.0, 1.0]])}, "alpha": 0.5}
    strategy.on_client_fit_start(pl_module=module, client_state=state, client=client)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    batch = (torch.tensor([[1.0, 1.0]]), torch.tensor([0.0]))
    loss = module.training_step(batch, 0)["loss"]
    total = strategy.training_loss(module, loss, batch)
    # f(w) = (1 + 2)^2 = 9, f(v) = (0 + 1)^2 = 1
    assert float(total.detach()) == pytest.approx(10.0)
    total.backward()
    strategy.on_before_optimizer_step(client=client)
    optimizer.step()
    strategy.on_before_zero_grad(pl_module=module, optimizer=optimizer, stepped=True)
    optimizer.zero_grad()
    # grad f(w) = 2 * 3 * [1, 1] = [6, 6]: w = [1, 2] - 0.1 [6, 6] = [0.4, 1.4]
    assert module.shared.weight.detach()[0].tolist() == pytest.approx([0.4, 1.4])
    # grad f(v) = 2 * 1 * [1, 1] = [2, 2]: v = [0, 1] - 0.1 [2, 2] = [-0.2, 0.8]
    assert strategy._turn["v"][W].detach()[0].tolist() == pytest.approx([-0.2, 0.8])
    # a: v - w = [-0.6, -0.6]; 0.5 [2, 2] + 0.5 [6, 6] = [4, 4]; <., .> = -4.8; + 0.01 = -4.79; 0.5 + 0.479 = 0.979
    assert strategy._turn["alpha"] == pytest.approx(0.979, abs=1e-6)
    strategy.on_client_fit_end(pl_module=module, client_state=state, client=client)
    # v <- vbar = 0.021 [0.4, 1.4] + 0.979 [-0.2, 0.8] = [-0.1874, 0.8126]
    assert state["alpha"] == pytest.approx(0.979, abs=1e-6)
    assert state["v"][W][0].tolist() == pytest.approx([-0.1874, 0.8126], abs=1e-6)
    # evaluation puts vbar into the live module
    strategy.on_client_evaluate_start(pl_module=module, client_state=state)
    assert module.shared.weight.detach()[0].tolist() == pytest.approx([-0.1874, 0.8126], abs=1e-6)


def test_a_skipped_step_moves_neither_v_nor_alpha():
    strategy = APFL(alpha=0.5)
    module = Lin()
    client = fake_client()
    state = {"v": {W: torch.tensor([[0.0, 1.0]])}}
    strategy.on_client_fit_start(pl_module=module, client_state=state, client=client)
    batch = (torch.tensor([[1.0, 1.0]]), torch.tensor([0.0]))
    strategy.training_loss(module, module.training_step(batch, 0)["loss"], batch).backward()
    strategy.on_before_zero_grad(
        pl_module=module, optimizer=torch.optim.SGD(module.parameters(), lr=0.1), stepped=False
    )
    assert strategy._turn["v"][W].tolist() == [[0.0, 1.0]] and strategy._turn["alpha"] == 0.5
    assert strategy._turn["v"][W].grad is None


def _losses(out_dir, tag="server/train/loss_mean"):
    events = EventAccumulator(str(out_dir / "tensorboard")).Reload()
    return [e.value for e in events.Scalars(tag)] + [events.Scalars("server/val/loss_mean")[-1].value]


# Seed 0, 3 clients, all selected, 2 rounds: train loss mean per round (w's loss), validation loss mean after round 2
# (each client evaluates its vbar). FedAvg gives the same training losses (w is its model) and 1.100733.
PINNED = [1.102971, 0.952829, 1.103893]


def test_two_rounds_w_is_fedavg_and_each_client_is_evaluated_with_its_mix(tmp_path):
    federation = make_federation(tmp_path / "apfl", APFL(), rounds=2)
    federation.fit()
    fedavg = make_federation(tmp_path / "fedavg", FedAvg(), rounds=2)
    fedavg.fit()
    # w trains as FedAvg's (v shares no leaf with it): the same server model, exactly
    ours, theirs = federation.strategy.global_state, fedavg.strategy.global_state
    assert all(torch.equal(ours[n], theirs[n]) for n in ours)
    key = federation.strategy.state_key
    states = {c: federation.store.extra(c, key) for c in federation.client_ids}
    assert all(0 < s["alpha"] < 1 and s["alpha"] != 0.5 for s in states.values())
    assert all(set(s["v"]) == set(federation.module.named_tensors("shared", "personal")) for s in states.values())
    payload = torch.load(tmp_path / "apfl" / "checkpoints" / "last.ckpt", weights_only=False)
    assert payload["server_round"] == 2
    assert _losses(tmp_path / "apfl") == pytest.approx(PINNED, abs=2e-5)
    assert _losses(tmp_path / "apfl")[:2] == pytest.approx(_losses(tmp_path / "fedavg")[:2], abs=1e-6)
    # the personalized evaluation (vbar) is not the global one (w)
    assert abs(_losses(tmp_path / "apfl")[2] - _losses(tmp_path / "fedavg")[2]) > 1e-3
    got = federation.evaluate_client(2, "c0", "val")
    live = federation.module.named_tensors("shared", "personal")
    assert all(torch.equal(live[n], states["c0"]["v"][n]) for n in live)
    assert got["loss"] != pytest.approx(fedavg.evaluate_client(2, "c0", "val")["loss"], abs=1e-4)


def test_alpha_one_held_still_is_local_training(tmp_path):
    # vbar = v, trained on its own loss from the initial model, turn after turn: the Local strategy's model
    federation = make_federation(tmp_path / "apfl", APFL(alpha=1.0, lr_alpha=0.0), rounds=2)
    federation.fit()
    local = make_federation(tmp_path / "local", Local(), rounds=2)
    local.fit()
    key = federation.strategy.state_key
    assert all(federation.store.extra(c, key)["alpha"] == 1.0 for c in federation.client_ids)
    for client in federation.client_ids:
        assert federation.evaluate_client(2, client, "val") == local.evaluate_client(2, client, "val")


def test_the_cli_selects_apfl_by_its_short_name():
    cfg = (
        build_parser()
        .parse_args(
            [
                "fit",
                "--config",
                str(ROOT / "recipes" / "quickstart.yaml"),
                "--strategy",
                "APFL",
                "--strategy.alpha",
                "0.7",
            ]
        )
        .fit
    )
    assert cfg.strategy.class_path == "fedlit.strategies.APFL" and cfg.strategy.init_args.alpha == 0.7


def test_bad_options_are_named():
    with pytest.raises(ConfigError) as err:
        APFL(alpha=1.5, lr_alpha=-1.0, alpha_penalty=-0.1)
    for option in ("alpha=1.5", "lr_alpha=-1.0", "alpha_penalty=-0.1"):
        assert option in str(err.value)
    assert repr(APFL()) == "APFL(alpha=0.5, lr_alpha=None, alpha_penalty=0.02, weighting='num_examples')"
