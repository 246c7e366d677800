"""Per-FedAvg, first-order (Fallah, Mokhtari, Ozdaglar, NeurIPS 2020): the adaptation by hand, one local FO step
by hand on a quadratic, the one-step adaptation before evaluation by hand, two rounds end to end, the CLI name and
bad options."""

from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedlit.commands.fit import build_parser
from fedlit.core.errors import ConfigError
from fedlit.strategies import PerFedAvg
from fedlit.strategies.perfedavg import perfedavg_adapt
from tests.conftest import make_federation
from tests.strategies.personal_fixtures import Lin, fake_client

ROOT = Path(__file__).resolve().parents[2]
D = (torch.tensor([[1.0, 1.0]]), torch.tensor([0.0]))
D2 = (torch.tensor([[1.0, 0.0]]), torch.tensor([1.0]))


def _module(w=(1.0, 2.0)):
    module = Lin()
    with torch.no_grad():
        module.shared.weight.copy_(torch.tensor([list(w)]))
    return module


def test_the_adaptation_by_hand():
    w = {"p": torch.tensor([1.0, 2.0], requires_grad=True), "q": torch.tensor([3.0])}
    out = perfedavg_adapt(w, {"p": torch.tensor([6.0, 6.0]), "q": None}, 0.1)
    assert out["p"].tolist() == pytest.approx([0.4, 1.4]) and out["q"] is w["q"]
    assert out["p"].requires_grad  # differentiable in w: the FO step's gradient flows to w


def test_one_first_order_step_by_hand():
    strategy = PerFedAvg(alpha=0.1)
    module = _module()
    client = fake_client(batches=[D2])
    strategy.on_client_fit_start(pl_module=module, server_round=1, client_id="c0", client=client)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)  # beta
    total = strategy.training_loss(module, module.training_step(D, 0)["loss"], D)
    # temp = w - alpha grad f(w; D) = [1, 2] - 0.1 * 2 * 3 [1, 1] = [0.4, 1.4]; f(temp; D') = (0.4 - 1)^2 = 0.36
    assert float(total.detach()) == pytest.approx(0.36)
    total.backward()
    optimizer.step()
    # grad f(temp; D') = 2 (-0.6) [1, 0] = [-1.2, 0], applied to w: [1, 2] - 0.1 [-1.2, 0] = [1.12, 2]
    # (at w it would be 0; with the Hessian term (I - 0.2 [[1, 1], [1, 1]]) [-1.2, 0] = [-0.96, 0.24]: [1.096, 1.976])
    assert module.shared.weight.detach()[0].tolist() == pytest.approx([1.12, 2.0])


def test_evaluation_adapts_by_one_plain_step_on_a_training_batch():
    strategy = PerFedAvg(alpha=0.1)
    module = _module()
    assert strategy.eval_finetune_steps == 1
    optimizer = strategy.configure_eval_finetune(module)
    module.training_step(D, 0)["loss"].backward()
    optimizer.step()
    # w - alpha grad f(w; D) = [1, 2] - 0.1 [6, 6] = [0.4, 1.4]: plain SGD at alpha, whatever the module's optimizer
    assert module.shared.weight.detach()[0].tolist() == pytest.approx([0.4, 1.4])
    assert optimizer.defaults["momentum"] == 0 and optimizer.defaults["weight_decay"] == 0


def _losses(out_dir):
    events = EventAccumulator(str(out_dir / "tensorboard")).Reload()
    return [e.value for e in events.Scalars("server/train/loss_mean")] + [
        events.Scalars("server/val/loss_mean")[-1].value,
        events.Scalars("global/server/val/loss_mean")[-1].value,
    ]


# Seed 0, 3 clients, all selected, 2 rounds, alpha = 0.1: train loss mean per round (f(w; D) before each step),
# validation loss mean after round 2 of the adapted models, then of w itself.
PINNED = [1.075439, 0.941262, 1.102556, 1.103138]


def test_two_rounds_end_to_end(tmp_path):
    federation = make_federation(tmp_path / "perfedavg", PerFedAvg(alpha=0.1), rounds=2)
    federation.fit()
    assert _losses(tmp_path / "perfedavg") == pytest.approx(PINNED, abs=2e-5)
    payload = torch.load(tmp_path / "perfedavg" / "checkpoints" / "last.ckpt", weights_only=False)
    assert payload["server_round"] == 2
    # one adaptation step per client and evaluated round, counted as compute: 3 clients x 2 rounds
    assert payload["compute"] == {"eval_finetune_steps": 6}
    # the same adaptation at every evaluation of a round (seeded), and it is not w
    first = federation.evaluate_client(2, "c0", "val")
    assert federation.evaluate_client(2, "c0", "val") == first
    live = federation.module.named_tensors("shared")
    assert any(not torch.equal(live[n], federation.strategy.global_state[n]) for n in live)


def test_the_cli_selects_perfedavg_by_its_short_name():
    cfg = (
        build_parser()
        .parse_args(
            [
                "fit",
                "--config",
                str(ROOT / "recipes" / "quickstart.yaml"),
                "--strategy",
                "PerFedAvg",
                "--strategy.alpha",
                "0.02",
            ]
        )
        .fit
    )
    assert cfg.strategy.class_path == "fedlit.strategies.PerFedAvg" and cfg.strategy.init_args.alpha == 0.02


def test_bad_options_are_named():
    with pytest.raises(ConfigError, match=r"alpha=0\.0"):
        PerFedAvg(alpha=0.0)
    assert repr(PerFedAvg()) == "PerFedAvg(alpha=0.005, weighting='num_examples')"
