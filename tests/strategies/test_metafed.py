"""MetaFed (Chen et al., IEEE TNNLS 2023): the feature distillation loss, the copy-or-distil flag, the accuracies
behind it (correct / total in double, at the threshold), the personalization weight by hand, the ring's order over
the rounds, a copying ring being FedAvg with one client per round in ring order, distillation moving the ring's
models, two rounds end to end, the CLI name and bad options."""

import contextlib
import math
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedlit.commands.fit import build_parser
from fedlit.core.errors import ConfigError
from fedlit.models import MLP
from fedlit.strategies import FedAvg, MetaFed
from fedlit.strategies.metafed import (
    correct_count,
    distills,
    feature_distillation,
    personal_lambda,
    ring_client,
    ring_stage,
)
from fedlit.tasks import ClassificationModule
from tests.conftest import make_federation

ROOT = Path(__file__).resolve().parents[2]


def test_feature_distillation_by_hand():
    student = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    teacher = torch.tensor([[0.0, 2.0], [3.0, 6.0]], requires_grad=True)
    loss = feature_distillation(student, teacher)
    # differences 1, 0, 0, -2: squares 1, 0, 0, 4, mean over the 4 elements 5 / 4
    assert float(loss.detach()) == 1.25
    loss.backward()
    # d/ds mean (s - t)^2 = 2 (s - t) / 4; the teacher is detached
    assert student.grad.tolist() == [[0.5, 0.0], [0.0, -1.0]] and teacher.grad is None


def test_the_flag_is_set_above_the_threshold_and_never_cleared():
    assert distills(False, 0.7, 0.6) is True
    assert distills(False, 0.6, 0.6) is False  # strictly above, as the code's `val_acc > threshold`
    assert distills(True, 0.1, 0.6) is True
    assert distills(False, 1.0, 1.1) is False  # the code's MedMNIST script: above 1, always copy


def identity_classifier() -> ClassificationModule:
    """Linear(2, 2) = I -> ReLU -> head Linear(2, 2) = I: the logits of a non-negative input are the input."""
    module = ClassificationModule(backbone=MLP(num_features=2, hidden=[2], norm="none"), num_classes=2)
    with torch.no_grad():
        for layer in (module.backbone.layers[0].linear, module.head):
            layer.weight.copy_(torch.eye(2))
            layer.bias.zero_()
    return module


class ValSplit:
    """The part of a ClientContext that MetaFed.accuracy reads: a validation split of the given batches."""

    def __init__(self, *batches):
        self.batches = batches

    def eval_dataloader(self, split):
        return list(self.batches)

    def num_examples(self, split):
        return sum(len(y) for _, y in self.batches)

    def prepare_batch(self, batch):
        return batch

    def autocast(self):
        return contextlib.nullcontext()

    def convert_output(self, output):
        return output


# one-hot inputs: the predicted class is the position of the 1
A, B = [1.0, 0.0], [0.0, 1.0]


def test_accuracy_is_correct_over_total_in_double_so_a_client_at_the_threshold_does_not_pass_it():
    module = identity_classifier()
    # 3 of 5 right (predicted 0 0 1 0 1 against 0 0 1 1 0): exactly 0.6, as the code's Python `3 / 5`, which is
    # not above the default threshold 0.6; a float32 accuracy, 0.6000000238, would be
    three_of_five = ValSplit((torch.tensor([A, A, B, A, B]), torch.tensor([0, 0, 1, 1, 0])))
    accuracy = MetaFed().accuracy(module, three_of_five, "c0")
    assert accuracy == 0.6 and distills(False, accuracy, MetaFed().threshold) is False
    assert float(torch.tensor(3 / 5, dtype=torch.float32)) > 0.6  # what the float32 metric would have let pass
    # 4 of 7 over two batches (3 of 4, then 1 of 3): exactly 4 / 7, not above a threshold of 4 / 7
    four_of_seven = ValSplit(
        (torch.tensor([A, A, B, B]), torch.tensor([0, 0, 1, 0])), (torch.tensor([A, B, B]), torch.tensor([1, 0, 1]))
    )
    strategy = MetaFed(threshold=4 / 7)
    accuracy = strategy.accuracy(module, four_of_seven, "c0")
    assert accuracy == 4 / 7 and distills(False, accuracy, strategy.threshold) is False
    assert float(torch.tensor(4 / 7, dtype=torch.float32)) > 4 / 7
    # lam_p reads the same accuracies: 7 of 10 for the client and the common model against zeta_p = 0.7 is not
    # below it, so lam_p = 10^0 / 10 lam; float32's 0.69999999 would be below it and give 0
    assert personal_lambda(7 / 10, 7 / 10, lam=1.0, threshold=0.7) == pytest.approx(0.1)
    assert float(torch.tensor(7 / 10, dtype=torch.float32)) < 0.7
    assert module.training  # back in train mode


def test_correct_count_by_hand():
    # multi-class: the arg max of each row (1, 0, 2) against (1, 2, 2): 2 of 3
    logits = torch.tensor([[0.1, 0.9, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 3.0]])
    assert correct_count(logits, torch.tensor([1, 2, 2])) == (2, 3)
    # binary, one logit: positive above 0 (predictions 1, 0, 1) against (1, 1, 0): 1 of 3
    assert correct_count(torch.tensor([[2.0], [-1.0], [0.5]]), torch.tensor([1.0, 1.0, 0.0])) == (1, 3)


def test_personalization_weight_by_hand():
    # the common model no better than the client's and below zeta_p = 0.5: no distillation
    assert personal_lambda(0.6, 0.4, lam=1.0, threshold=0.5) == 0.0
    # no better but not below zeta_p: 10^(5 (0.7 - 0.8)) / 10 = 10^-0.5 / 10 = 0.0316228
    assert personal_lambda(0.8, 0.7, lam=1.0, threshold=0.5) == pytest.approx(0.0316228, abs=1e-7)
    # equal accuracies: 10^0 / 10 = 0.1 lam
    assert personal_lambda(0.7, 0.7, lam=2.0, threshold=0.5) == pytest.approx(0.2)
    # better by 0.1: 10^0.5 / 10 = 0.316228; by 0.2 or more: 10^1 / 10 = lam
    assert personal_lambda(0.5, 0.6, lam=1.0, threshold=0.5) == pytest.approx(0.316228, abs=1e-6)
    assert personal_lambda(0.3, 0.9, lam=3.0, threshold=0.5) == pytest.approx(3.0)


def test_the_ring_runs_one_client_per_round_in_order_between_warm_up_and_personalization():
    ids = ["a", "b", "c"]
    # W = 1 warm-up round, R = 6: hops 0..3 in rounds 2..5 (a, b, c, a), personalization in round 6
    stages = [ring_stage(r, 1, 6) for r in range(1, 7)]
    assert stages == [("warmup", -1), ("ring", 0), ("ring", 1), ("ring", 2), ("ring", 3), ("personalize", -1)]
    assert [ring_client(hop, ids) for _, hop in stages[1:5]] == ["a", "b", "c", "a"]
    strategy = MetaFed(warmup_rounds=1, rounds=6)
    strategy.initialize({"w": torch.zeros(2)}, ids)
    generator = torch.Generator().manual_seed(0)
    assert [strategy.select_clients(r, ids, 3, generator) for r in range(1, 7)] == [
        ids,
        ["a"],
        ["b"],
        ["c"],
        ["a"],
        ids,
    ]
    extras = [strategy.configure_client_extras(r, "a") for r in range(1, 7)]
    # the first hop has no teacher; the flag is set after the warm-up's last round and after every hop
    assert [e["teacher"] for e in extras] == [False, False, True, True, True, True]
    assert [e["check"] for e in extras] == [True, True, True, True, True, False]
    # a hop's upload is the common model passed on; the warm-up's and the personalization's are not kept
    from fedlit.strategies.base import ClientUpdate

    strategy.global_state = strategy.aggregate(1, [ClientUpdate("a", 1, {"w": torch.ones(2)})])  # as the loop does
    assert strategy.global_state["w"].tolist() == [0.0, 0.0]
    strategy.global_state = strategy.aggregate(3, [ClientUpdate("b", 1, {"w": torch.full((2,), 2.0)})])
    strategy.global_state = strategy.aggregate(6, [ClientUpdate("a", 1, {"w": torch.ones(2)})])
    assert strategy.global_state["w"].tolist() == [2.0, 2.0]


class RingFedAvg(FedAvg):
    """FedAvg whose round r trains the one client of MetaFed's ring hop r - 1 (no warm-up)."""

    def select_clients(self, server_round, client_ids, num_clients, generator):
        return [ring_client(server_round - 1, client_ids)]


def test_a_copying_ring_is_fedavg_with_one_client_per_round_in_ring_order(tmp_path):
    # threshold above 1: no flag is ever set, each hop copies its teacher and trains it; no warm-up, R = 5: four
    # hops (c0 from the initial model, c1 from c0's upload, c2 from c1's, c0 again from c2's, not from its own),
    # then the personalization
    metafed = make_federation(tmp_path / "metafed", MetaFed(threshold=1.5, warmup_rounds=0, rounds=5), rounds=5)
    metafed.fit()
    ring = make_federation(tmp_path / "ring", RingFedAvg(), rounds=4)
    ring.fit()
    ours, theirs = metafed.strategy.global_state, ring.strategy.global_state
    assert all(torch.equal(ours[n], theirs[n]) for n in ours)
    key = metafed.strategy.state_key
    states = {c: metafed.store.extra(c, key) for c in metafed.client_ids}
    assert [s["flag"] for s in states.values()] == [False, False, False]
    # the personalization copied the common model into every client, which then trained it on its own data
    for state in states.values():
        assert set(state["own"]) == set(ours) and not all(torch.equal(state["own"][n], ours[n]) for n in ours)


def test_distilling_clients_keep_their_model_and_learn_from_the_teacher(tmp_path):
    def run(name, lam, threshold=0.0):
        strategy = MetaFed(lam=lam, threshold=threshold, warmup_rounds=1, rounds=4)
        federation = make_federation(tmp_path / name, strategy, rounds=3)
        federation.fit()
        return federation

    distil, plain, copy = run("distil", 10.0), run("plain", 0.0), run("copy", 0.0, threshold=1.5)
    key = distil.strategy.state_key
    # threshold 0: every flag is set after the warm-up, so c1 (hop 1, round 3) keeps its own warm-up model and,
    # with lam > 0, distils c0's features into it; with lam = 0 it trains its own model on CE alone
    assert all(distil.store.extra(c, key)["flag"] for c in distil.client_ids)
    assert not any(copy.store.extra(c, key)["flag"] for c in copy.client_ids)
    a, b = distil.store.extra("c0", key)["own"], plain.store.extra("c0", key)["own"]
    assert all(torch.equal(a[n], b[n]) for n in a)  # hop 0 had no teacher: the same either way
    a, b = distil.store.extra("c1", key)["own"], plain.store.extra("c1", key)["own"]
    assert not all(torch.equal(a[n], b[n]) for n in a)
    assert all(torch.equal(distil.strategy.global_state[n], a[n]) for n in a)  # c1's model is passed on
    # without the flag c1 copies c0's model instead of keeping its own: another model after the same hop
    c = copy.store.extra("c1", key)["own"]
    assert not all(torch.equal(c[n], b[n]) for n in b)


def _losses(out_dir):
    events = EventAccumulator(str(out_dir / "tensorboard")).Reload()
    return [e.value for e in events.Scalars("server/train/loss_mean")] + [
        events.Scalars("server/val/loss_mean")[-1].value
    ]


# Seed 0, 3 clients, W = 0, R = 2: c0 trains alone in round 1 (no teacher), every client personalizes in round 2
# (flags unset: each copies c0's model); train loss mean per round (round 1: c0's alone), validation loss mean after
# round 2 (each client's own model).
PINNED = [1.063971, 0.942829, 1.115433]


def test_two_rounds_end_to_end(tmp_path):
    federation = make_federation(tmp_path / "metafed", MetaFed(warmup_rounds=0), rounds=2)
    federation.fit()
    payload = torch.load(tmp_path / "metafed" / "checkpoints" / "last.ckpt", weights_only=False)
    assert payload["server_round"] == 2
    key = federation.strategy.state_key
    states = {c: federation.store.extra(c, key) for c in federation.client_ids}
    assert all(set(s["own"]) == set(federation.module.named_tensors("shared")) for s in states.values())
    # each client is evaluated with its own model, the common model (c0's round-1 upload) beside it
    federation.evaluate_client(2, "c1", "val")
    live = federation.module.named_tensors("shared")
    assert all(torch.equal(live[n], states["c1"]["own"][n]) for n in live)
    assert federation.strategy.global_model_state("c1").keys() == live.keys()
    losses = _losses(tmp_path / "metafed")
    assert all(math.isfinite(v) for v in losses)
    assert losses == pytest.approx(PINNED, abs=2e-5)


def test_the_cli_selects_metafed_by_its_short_name():
    cfg = (
        build_parser()
        .parse_args(
            [
                "fit",
                "--config",
                str(ROOT / "recipes" / "quickstart.yaml"),
                "--strategy",
                "MetaFed",
                "--strategy.lam",
                "0.5",
            ]
        )
        .fit
    )
    assert cfg.strategy.class_path == "fedlit.strategies.MetaFed" and cfg.strategy.init_args.lam == 0.5


def test_bad_options_and_schedules_are_named(tmp_path):
    with pytest.raises(ConfigError, match=r"lam=-1.*warmup_rounds=-2.*rounds=0"):
        MetaFed(lam=-1, warmup_rounds=-2, rounds=0)
    assert repr(MetaFed()) == (
        "MetaFed(lam=1.0, threshold=0.6, personal_threshold=0.5, warmup_rounds=30, rounds=None, head='head.*')"
    )
    with pytest.raises(ConfigError, match=r"warmup_rounds=30.*at least 32"):
        make_federation(tmp_path / "short", MetaFed(), rounds=2).fit()
    with pytest.raises(ConfigError, match=r"rounds=2, but federation.rounds=3"):
        make_federation(tmp_path / "past", MetaFed(warmup_rounds=0, rounds=2), rounds=3).fit()
