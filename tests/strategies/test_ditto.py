"""Ditto (Li, Hu, Beirami, Smith, ICML 2021): the personal step by hand (anchored at the received w^t), w being
FedAvg's model, two rounds end to end, evaluation with v, lam = 0 being Local, the CLI name and bad options."""

from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedlit.commands.fit import build_parser
from fedlit.core.errors import ConfigError
from fedlit.strategies import Ditto, FedAvg, Local
from tests.conftest import make_federation
from tests.strategies.personal_fixtures import Lin, W, fake_client

ROOT = Path(__file__).resolve().parents[2]


def _step(strategy, module, optimizer, client, batch):
    total = strategy.training_loss(module, module.training_step(batch, 0)["loss"], batch)
    total.backward()
    strategy.on_before_optimizer_step(client=client)
    optimizer.step()
    strategy.on_before_zero_grad(pl_module=module, optimizer=optimizer, stepped=True)
    optimizer.zero_grad()
    return float(total.detach())


def test_two_personal_steps_by_hand_are_anchored_at_the_received_model():
    strategy = Ditto(lam=0.5)
    module = Lin()
    with torch.no_grad():
        module.shared.weight.copy_(torch.tensor([[1.0, 2.0]]))
    client = fake_client()
    state = {"v": {W: torch.tensor([[0.0, 1.0]])}}
    received = {W: torch.tensor([[1.0, 2.0]])}
    strategy.on_client_fit_start(pl_module=module, received=received, client_state=state, client=client)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    batch = (torch.tensor([[1.0, 1.0]]), torch.tensor([0.0]))
    # f(w) = 3^2 = 9, f(v) = 1^2 = 1, lam/2 ||v - w^t||^2 = 0.25 * (1 + 1) = 0.5
    assert _step(strategy, module, optimizer, client, batch) == pytest.approx(10.5)
    # w: grad 2 * 3 [1, 1] = [6, 6] -> [0.4, 1.4]
    assert module.shared.weight.detach()[0].tolist() == pytest.approx([0.4, 1.4])
    # v: grad f(v) + lam (v - w^t) = [2, 2] + 0.5 [-1, -1] = [1.5, 1.5] -> [0, 1] - 0.1 [1.5, 1.5] = [-0.15, 0.85]
    assert strategy._turn["v"][W].detach()[0].tolist() == pytest.approx([-0.15, 0.85])
    _step(strategy, module, optimizer, client, batch)
    # v: f(v) = 0.7^2: grad [1.4, 1.4]; anchor still w^t = [1, 2] (not the moving w = [0.4, 1.4]):
    # 0.5 [-1.15, -1.15] = [-0.575, -0.575]; [0.825, 0.825]: v = [-0.2325, 0.7675]
    assert strategy._turn["v"][W].detach()[0].tolist() == pytest.approx([-0.2325, 0.7675])
    strategy.on_client_fit_end(client_state=state, client=client)
    assert state["v"][W][0].tolist() == pytest.approx([-0.2325, 0.7675])
    # evaluation puts v into the live module
    strategy.on_client_evaluate_start(pl_module=module, client_state=state)
    assert module.shared.weight.detach()[0].tolist() == pytest.approx([-0.2325, 0.7675])


def test_a_skipped_step_does_not_move_v():
    strategy = Ditto()
    module = Lin()
    client = fake_client()
    state = {"v": {W: torch.tensor([[0.0, 1.0]])}}
    strategy.on_client_fit_start(
        pl_module=module, received={W: module.shared.weight.detach()}, client_state=state, client=client
    )
    batch = (torch.tensor([[1.0, 1.0]]), torch.tensor([0.0]))
    strategy.training_loss(module, module.training_step(batch, 0)["loss"], batch).backward()
    strategy.on_before_zero_grad(
        pl_module=module, optimizer=torch.optim.SGD(module.parameters(), lr=0.1), stepped=False
    )
    assert strategy._turn["v"][W].tolist() == [[0.0, 1.0]] and strategy._turn["v"][W].grad is None


def _losses(out_dir):
    events = EventAccumulator(str(out_dir / "tensorboard")).Reload()
    return [e.value for e in events.Scalars("server/train/loss_mean")] + [
        events.Scalars("server/val/loss_mean")[-1].value
    ]


# Seed 0, 3 clients, all selected, 2 rounds: train loss mean per round (w's loss: FedAvg's), validation loss mean
# after round 2 (each client evaluates its v; FedAvg's model gives 1.100733).
PINNED = [1.102971, 0.952829, 1.105028]


def test_two_rounds_w_is_fedavg_and_each_client_is_evaluated_with_v(tmp_path):
    federation = make_federation(tmp_path / "ditto", Ditto(), rounds=2)
    federation.fit()
    fedavg = make_federation(tmp_path / "fedavg", FedAvg(), rounds=2)
    fedavg.fit()
    ours, theirs = federation.strategy.global_state, fedavg.strategy.global_state
    assert all(torch.equal(ours[n], theirs[n]) for n in ours)  # w trains as FedAvg's, exactly
    key = federation.strategy.state_key
    states = {c: federation.store.extra(c, key) for c in federation.client_ids}
    assert all(set(s["v"]) == set(federation.module.named_tensors("shared", "personal")) for s in states.values())
    payload = torch.load(tmp_path / "ditto" / "checkpoints" / "last.ckpt", weights_only=False)
    assert payload["server_round"] == 2
    assert _losses(tmp_path / "ditto") == pytest.approx(PINNED, abs=2e-5)
    got = federation.evaluate_client(2, "c0", "val")
    live = federation.module.named_tensors("shared", "personal")
    assert all(torch.equal(live[n], states["c0"]["v"][n]) for n in live)
    assert got["loss"] != pytest.approx(fedavg.evaluate_client(2, "c0", "val")["loss"], abs=1e-4)


def test_lam_zero_is_local_training(tmp_path):
    # v trains on its own loss from the initial model, turn after turn: the Local strategy's model
    federation = make_federation(tmp_path / "ditto", Ditto(lam=0.0), rounds=2)
    federation.fit()
    local = make_federation(tmp_path / "local", Local(), rounds=2)
    local.fit()
    for client in federation.client_ids:
        assert federation.evaluate_client(2, client, "val") == local.evaluate_client(2, client, "val")


def test_the_cli_selects_ditto_by_its_short_name():
    cfg = (
        build_parser()
        .parse_args(
            [
                "fit",
                "--config",
                str(ROOT / "recipes" / "quickstart.yaml"),
                "--strategy",
                "Ditto",
                "--strategy.lam",
                "0.5",
            ]
        )
        .fit
    )
    assert cfg.strategy.class_path == "fedlit.strategies.Ditto" and cfg.strategy.init_args.lam == 0.5


def test_bad_options_are_named():
    with pytest.raises(ConfigError, match=r"lam=-1\.0"):
        Ditto(lam=-1.0)
    assert repr(Ditto()) == "Ditto(lam=1.0, weighting='num_examples')"
