"""FedALA (Zhang et al., AAAI 2023): the element-wise W step, its clipping, the merge and the stopping rule by hand;
a client's Adaptive Local Aggregation by hand (first time until the losses settle, later one pass, W stored and
reused); which tensors are merged; two rounds end to end; the CLI name and bad options."""

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
from fedlit.strategies import FedALA, FedAvg
from fedlit.strategies.fedala import ala_converged, ala_merge, ala_weight_step, subset_batches
from tests.conftest import assert_resume_is_exact, make_federation

ROOT = Path(__file__).resolve().parents[2]
W = "shared.weight"


def t(*values):
    return torch.tensor(values, dtype=torch.float32)


def test_the_weight_step_and_its_clipping_by_hand():
    weight, grad = t(1.0, 0.5, 0.2), t(1.0, -2.0, 3.0)
    local, global_ = t(0.0, 0.0, 0.0), t(0.5, 1.0, 1.0)
    # W - eta grad (theta - theta_i) = [1 - 0.5, 0.5 + 2, 0.2 - 3] = [0.5, 2.5, -2.8] -> clipped [0.5, 1, 0]
    assert ala_weight_step(weight, grad, local, global_, 1.0).tolist() == [0.5, 1.0, 0.0]
    # eta = 0.5: [1 - 0.25, 0.5 + 1, 0.2 - 1.5] = [0.75, 1.5, -1.3] -> [0.75, 1, 0]
    assert ala_weight_step(weight, grad, local, global_, 0.5).tolist() == [0.75, 1.0, 0.0]
    # theta_i not at zero: theta - theta_i = [2 - 1, 1 - 3] = [1, -2]; [0.5 - 0.1 * 1 * 1, 0.5 - 0.1 * 2 * -2]
    assert ala_weight_step(t(0.5, 0.5), t(1.0, 2.0), t(1.0, 3.0), t(2.0, 1.0), 0.1).tolist() == pytest.approx(
        [0.4, 0.9]
    )


def test_the_merge_and_the_stopping_rule_by_hand():
    # theta_i + (theta - theta_i) W = [1 + 2 * 0.25, 2 - 2 * 1] = [1.5, 0]
    assert ala_merge(t(1.0, 2.0), t(3.0, 0.0), t(0.25, 1.0)).tolist() == [1.5, 0.0]
    assert not ala_converged([1.0] * 10, 10, 0.1)  # needs more than num_pre_loss losses
    assert ala_converged([5.0] + [1.0] * 10, 10, 0.1)  # the first loss is out of the window
    # population std of [0, 0.3] x 5 is 0.15: not below 0.1; of the last 2, [0.3, 0.3]: 0
    assert not ala_converged([0.0, 0.3] * 5 + [0.0], 10, 0.1)
    assert ala_converged([0.0, 0.3, 0.3], 2, 0.1)


def test_the_subset_takes_whole_batches_up_to_the_share():
    batches = [torch.zeros(4), torch.zeros(4), torch.zeros(4), torch.zeros(1)]
    assert len(subset_batches(batches, 8)) == 2 and len(subset_batches(batches, 11)) == 2
    assert len(subset_batches(batches, 2)) == 1  # at least one batch
    assert len(subset_batches([torch.zeros(1), torch.zeros(3)], 4, single_ok=False)) == 1


class Lin(FederatedModule):
    """y ~ shared(x), squared error."""

    def __init__(self):
        super().__init__(roles=[RoleRule("shared.*", "shared")])
        self.shared = nn.Linear(2, 1, bias=False)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return {"loss": (self.shared(x).squeeze(-1) - y).pow(2).mean()}


def turn(strategy, state, received=(1.0, 2.0)):
    """Client "a" starts a turn of round 2 having received ``received``; one batch x = [1, 1], y = 0."""
    module = Lin()
    with torch.no_grad():
        module.shared.weight.copy_(torch.tensor([received]))
    batch = (torch.tensor([[1.0, 1.0]]), torch.tensor([0.0]))
    client = SimpleNamespace(
        autocast=contextlib.nullcontext,
        convert_output=lambda out: out,
        prepare_batch=lambda b: b,
        num_examples=lambda split: 1,
        derive_seed=lambda *parts: 0,
        train_dataloader=lambda generator: [batch],
        store=SimpleNamespace(device="cpu"),
    )
    strategy.on_client_fit_start(pl_module=module, server_round=2, client_id="a", client_state=state, client=client)
    return module.shared.weight.detach()[0].tolist()


def test_later_turns_learn_w_for_one_pass_from_the_stored_w():
    state = {"model": {W: torch.tensor([[0.0, 0.0]])}, "weights": {W: torch.tensor([[1.0, 0.5]])}}
    got = turn(FedALA(eta=0.1, layer_idx=1), state)
    # theta_hat = 0 + ([1, 2] - 0) [1, 0.5] = [1, 1]; loss (1 + 1)^2 = 4; grad 2 * 2 * [1, 1] = [4, 4];
    # W = clip([1, 0.5] - 0.1 [4, 4] [1, 2]) = clip([0.6, -0.3]) = [0.6, 0]; theta_hat = [0.6, 0]
    assert state["weights"][W][0].tolist() == pytest.approx([0.6, 0.0])
    assert got == pytest.approx([0.6, 0.0]) and state["ala_passes"] == 1


def test_the_first_time_w_learns_until_the_last_losses_settle():
    state = {"model": {W: torch.tensor([[0.0, 0.0]])}}
    got = turn(FedALA(eta=0.1, layer_idx=1, num_pre_loss=3, threshold=0.1), state)
    # W = 1: theta_hat = [1, 2], loss 9, grad [6, 6], W = clip(1 - 0.1 [6, 6] [1, 2]) = [0.4, 0]; then each pass
    # theta_hat = [W_1, 0], loss W_1^2, grad 2 W_1, W_1 <- W_1 - 0.1 * 2 W_1 = 0.8 W_1. Losses 9, 0.16, 0.1024,
    # 0.065536: after the 4th pass the last 3 have std 0.0387 < 0.1. W_1 = 0.4 * 0.8^3 = 0.2048.
    assert state["ala_passes"] == 4
    assert state["weights"][W][0].tolist() == pytest.approx([0.2048, 0.0])
    assert got == pytest.approx([0.2048, 0.0])
    bounded = {"model": {W: torch.tensor([[0.0, 0.0]])}}
    turn(FedALA(eta=0.1, layer_idx=1, num_pre_loss=3, threshold=0.1, max_init_passes=2), bounded)
    assert bounded["ala_passes"] == 2 and bounded["weights"][W][0].tolist() == pytest.approx([0.32, 0.0])


def test_a_first_turn_trains_from_the_global_model():
    state = {}
    assert turn(FedALA(), state) == [1.0, 2.0] and state == {}


class Two(FederatedModule):
    def __init__(self):
        super().__init__(roles=[RoleRule("*", "shared"), RoleRule("frozen.*", "frozen")])
        self.lower, self.frozen, self.upper = nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 1)
        self.frozen.requires_grad_(False)


@pytest.mark.parametrize(
    ("layer_idx", "names"),
    [
        (1, ["upper.bias"]),
        (2, ["upper.weight", "upper.bias"]),
        (0, ["lower.weight", "lower.bias", "upper.weight", "upper.bias"]),
    ],
)
def test_the_higher_tensors_are_the_last_shared_trainable_ones(layer_idx, names):
    assert FedALA(layer_idx=layer_idx).higher_names(Two()) == names


def _losses(out_dir):
    events = EventAccumulator(str(out_dir / "tensorboard")).Reload()
    return [e.value for e in events.Scalars("server/train/loss_mean")] + [
        events.Scalars("server/val/loss_mean")[-1].value
    ]


# Seed 0, 3 clients, all selected, 2 rounds: train loss mean per round, validation loss mean after round 2 (each
# client evaluates its own trained model). FedAvg on the same federation gives [1.102971, 0.952829, 1.100733]:
# round 1 is the same (no ALA at a first turn), round 2 starts from the ALA merge.
PINNED = [1.102971, 0.952579, 1.103654]


def test_two_rounds_learn_and_store_w_and_differ_from_fedavg(tmp_path):
    federation = make_federation(tmp_path / "fedala", FedALA(), rounds=2)
    federation.fit()
    key = federation.strategy.state_key
    states = {c: federation.store.extra(c, key) for c in federation.client_ids}
    head = ["head.weight", "head.bias"]  # the default layer_idx = 2: the classifier's weight and bias
    assert all(set(s["weights"]) == set(head) for s in states.values())
    assert all(s["ala_passes"] > 10 for s in states.values())  # round 2 is every client's first ALA
    assert any(not torch.equal(w, torch.ones_like(w)) for s in states.values() for w in s["weights"].values())
    assert all(set(s["model"]) == set(federation.module.named_tensors("shared")) for s in states.values())
    payload = torch.load(tmp_path / "fedala" / "checkpoints" / "last.ckpt", weights_only=False)
    assert payload["server_round"] == 2
    ours = _losses(tmp_path / "fedala")
    assert ours == pytest.approx(PINNED, abs=2e-5)
    make_federation(tmp_path / "fedavg", FedAvg(), rounds=2).fit()
    theirs = _losses(tmp_path / "fedavg")
    assert ours[0] == pytest.approx(theirs[0], abs=1e-6)
    assert abs(ours[1] - theirs[1]) > 1e-4
    federation.evaluate_client(2, "c0", "val")  # with the client's own model
    live = federation.module.named_tensors("shared")
    assert all(torch.equal(live[n], states["c0"]["model"][n]) for n in live)


def test_the_cli_selects_fedala_by_its_short_name():
    cfg = (
        build_parser()
        .parse_args(
            [
                "fit",
                "--config",
                str(ROOT / "recipes" / "quickstart.yaml"),
                "--strategy",
                "FedALA",
                "--strategy.layer_idx",
                "1",
            ]
        )
        .fit
    )
    assert cfg.strategy.class_path == "fedlit.strategies.FedALA" and cfg.strategy.init_args.layer_idx == 1
    assert cfg.strategy.init_args.eta == 1.0 and cfg.strategy.init_args.rand_percent == 80


def test_bad_options_are_named():
    with pytest.raises(ConfigError) as err:
        FedALA(eta=0.0, rand_percent=150, layer_idx=-1, threshold=-1.0, num_pre_loss=0, max_init_passes=0)
    for option in (
        "eta=0.0",
        "rand_percent=150",
        "layer_idx=-1",
        "threshold=-1.0",
        "num_pre_loss=0",
        "max_init_passes=0",
    ):
        assert option in str(err.value)
    assert repr(FedALA()).startswith("FedALA(eta=1.0, rand_percent=80.0, layer_idx=2, threshold=0.1, num_pre_loss=10")


def test_resume_is_exact_across_a_reuse_of_the_stored_w(tmp_path):
    # 2 rounds, a checkpoint, 2 more: W is learned in round 2 (each client's first ALA) and reused in round 3, after
    # the resume (the generated resume test stops at round 2, before any reuse)
    straight, _ = assert_resume_is_exact(tmp_path, FedALA)
    key = straight.strategy.state_key
    assert all(straight.store.extra(c, key)["ala_passes"] == 1 for c in straight.client_ids)
