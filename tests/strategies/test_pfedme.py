"""pFedMe (T. Dinh, Tran, Nguyen, NeurIPS 2020): the inner step by hand, K inner steps on a quadratic against the
closed-form prox, the local step of w by hand, the server's beta step, two rounds end to end, evaluation with theta,
the CLI name and bad options."""

from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedlit.commands.fit import build_parser
from fedlit.core.errors import ConfigError
from fedlit.strategies import ClientUpdate, FedAvg, pFedMe
from fedlit.strategies.pfedme import pfedme_inner_step, pfedme_server_mix
from tests.conftest import make_federation
from tests.strategies.personal_fixtures import Lin, W, fake_client

ROOT = Path(__file__).resolve().parents[2]


def t(*values):
    return torch.tensor(values, dtype=torch.float32)


def test_the_inner_step_by_hand():
    # theta - lr (g + lam (theta - w)) = [1, 2] - 0.1 ([1, -1] + 2 [1, 1]) = [0.7, 1.9]; no gradient: zero
    out = pfedme_inner_step(
        {"p": t(1.0, 2.0), "q": t(1.0)},
        {"p": t(1.0, -1.0), "q": None},
        {"p": t(0.0, 1.0), "q": t(0.0)},
        lam=2.0,
        lr=0.1,
    )
    assert out["p"].tolist() == pytest.approx([0.7, 1.9]) and out["q"].tolist() == pytest.approx([0.8])


# The quadratic: x = [[1, 0], [0, 2]], y = [1, 1], f(theta) = mean((x theta - y)^2) = 1/2 theta' H theta - c' theta
# + const with H = x'x = diag(1, 4), c = x'y = [1, 2]. Prox at w = 0, lam = 1: (H + lam I) theta = c + lam w, so
# theta* = [1/2, 2/5]. Gradient steps of lr 0.1 from w contract each coordinate's error by 1 - 0.1 (h + lam):
# 0.8 and 0.5, so theta_K = theta* - [0.8^K * 0.5, 0.5^K * 0.4].
BATCH = (torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([1.0, 1.0]))


def _start(K, w=(0.0, 0.0)):  # noqa: N803
    strategy = pFedMe(lam=1.0, K=K, personal_lr=0.1)
    module = Lin()
    with torch.no_grad():
        module.shared.weight.copy_(torch.tensor([list(w)]))
    strategy.on_client_fit_start(pl_module=module, client=fake_client())
    return strategy, module


@pytest.mark.parametrize("K", [1, 2, 5, 40])
def test_K_inner_steps_approach_the_closed_form_prox(K):  # noqa: N802, N803
    strategy, module = _start(K)
    strategy.solve_inner(module, BATCH)
    theta = strategy._turn["theta"][W].detach()[0]
    expected = [0.5 - 0.8**K * 0.5, 0.4 - 0.5**K * 0.4]
    assert theta.tolist() == pytest.approx(expected, abs=1e-6)
    if K == 40:
        assert theta.tolist() == pytest.approx([0.5, 0.4], abs=1e-4)  # the prox itself


def test_the_local_step_of_w_by_hand():
    strategy, module = _start(K=2)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    loss = module.training_step(BATCH, 0)["loss"]
    total = strategy.training_loss(module, loss, BATCH)
    # theta = [0.18, 0.3]; lam/2 ||w - theta||^2 = 0.5 (0.0324 + 0.09) = 0.0612
    assert float(total.detach()) == pytest.approx(0.0612)
    total.backward()
    optimizer.step()
    optimizer.zero_grad()
    # w - eta lam (w - theta) = 0 - 0.1 * 1 * ([0, 0] - [0.18, 0.3]) = [0.018, 0.03]
    assert module.shared.weight.detach()[0].tolist() == pytest.approx([0.018, 0.03])
    # the next inner solve starts from theta (warm start), pulled toward the new w: one step from [0.18, 0.3]:
    # grad f = H theta - c = [0.18 - 1, 1.2 - 2] = [-0.82, -0.8]; + lam (theta - w) = [0.162, 0.27];
    # theta - 0.1 [-0.658, -0.53] = [0.2458, 0.353] (from w it would be [0.1162, 0.218])
    strategy.K = 1
    strategy.solve_inner(module, BATCH)
    assert strategy._turn["theta"][W].detach()[0].tolist() == pytest.approx([0.2458, 0.353], abs=1e-6)
    state = {}
    strategy.on_client_fit_end(client_state=state, client=fake_client())
    strategy.on_client_evaluate_start(pl_module=module, client_state=state)
    assert module.shared.weight.detach()[0].tolist() == pytest.approx([0.2458, 0.353], abs=1e-6)


def test_the_server_step_by_hand():
    # (1 - 2) [1, 1] + 2 [2, 4] = [3, 7]; beta = 1 is the mean
    assert pfedme_server_mix({"p": t(1.0, 1.0)}, {"p": t(2.0, 4.0)}, 2.0)["p"].tolist() == [3.0, 7.0]
    strategy = pFedMe(beta=2.0)
    strategy.initialize({"p": t(1.0, 1.0), "n": torch.tensor(4)}, ["a", "b"])
    updates = [
        ClientUpdate("a", 1, {"p": t(1.0, 3.0), "n": torch.tensor(6)}),
        ClientUpdate("b", 3, {"p": t(3.0, 5.0), "n": torch.tensor(10)}),
    ]
    # mean (n_k-weighted) = [2.5, 4.5]: w = -[1, 1] + 2 [2.5, 4.5] = [4, 8]; the integer buffer takes the mean, 9
    new = strategy.aggregate(1, updates)
    assert new["p"].tolist() == [4.0, 8.0] and int(new["n"]) == 9


def _losses(out_dir):
    events = EventAccumulator(str(out_dir / "tensorboard")).Reload()
    return [e.value for e in events.Scalars("server/train/loss_mean")] + [
        events.Scalars("server/val/loss_mean")[-1].value,
        events.Scalars("global/server/val/loss_mean")[-1].value,
    ]


# Seed 0, 3 clients, all selected, 2 rounds, the defaults: train loss mean per round (f(w_i) before each step),
# validation loss mean after round 2 with each client's theta, then with the global w.
PINNED = [1.103646, 1.00843, 1.149857, 1.120877]


def test_two_rounds_end_to_end(tmp_path):
    federation = make_federation(tmp_path / "pfedme", pFedMe(), rounds=2)
    federation.fit()
    assert _losses(tmp_path / "pfedme") == pytest.approx(PINNED, abs=2e-5)
    payload = torch.load(tmp_path / "pfedme" / "checkpoints" / "last.ckpt", weights_only=False)
    assert payload["server_round"] == 2
    key = federation.strategy.state_key
    theta = federation.store.extra("c0", key)["theta"]
    federation.evaluate_client(2, "c0", "val")
    live = federation.module.named_tensors("shared", "personal")
    assert set(theta) == set(live) and all(torch.equal(live[n], theta[n]) for n in live)
    # theta is not w: the personalized evaluation differs from the global one
    assert _losses(tmp_path / "pfedme")[2] != pytest.approx(_losses(tmp_path / "pfedme")[3], abs=1e-3)


def test_beta_one_aggregates_as_fedavg():
    updates = [ClientUpdate("a", 1, {"p": t(1.0, 3.0)}), ClientUpdate("b", 3, {"p": t(3.0, 5.0)})]
    ours, fedavg = pFedMe(), FedAvg()
    for strategy in (ours, fedavg):
        strategy.initialize({"p": t(7.0, 7.0)}, ["a", "b"])
    assert torch.equal(ours.aggregate(1, updates)["p"], fedavg.aggregate(1, updates)["p"])


def test_the_cli_selects_pfedme_by_its_short_name():
    cfg = (
        build_parser()
        .parse_args(
            ["fit", "--config", str(ROOT / "recipes" / "quickstart.yaml"), "--strategy", "pFedMe", "--strategy.K", "3"]
        )
        .fit
    )
    assert cfg.strategy.class_path == "fedlit.strategies.pFedMe" and cfg.strategy.init_args.K == 3


def test_bad_options_are_named():
    with pytest.raises(ConfigError) as err:
        pFedMe(lam=0.0, K=0, personal_lr=-1.0, beta=0.0)
    for option in ("lam=0.0", "K=0", "personal_lr=-1.0", "beta=0.0"):
        assert option in str(err.value)
    assert repr(pFedMe()) == "pFedMe(lam=15.0, K=5, personal_lr=0.01, beta=1.0, weighting='num_examples')"
