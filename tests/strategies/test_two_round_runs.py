"""Every strategy end to end: a 2-round run on the tiny federation, its checkpoint, its TensorBoard events, and
its pinned losses (seed 0: the values change only if the strategy's or the loop's math changes).

The settings are chosen so that the pins tell the strategies apart (checked by
:func:`test_pins_tell_every_pair_of_strategies_apart`):

- 5 clients, so that ``FedTrimmedAvg(beta=0.2)`` trims ``int(0.2 * 5) = 1`` value at each end (with 3 clients it
  trims nothing and is FedAvg) and its middle-3 mean differs from FedMedian's middle value.
- FedAdam and FedYogi with ``beta_2 = 0.5``: from ``v = 0`` both rules give ``v = (1 - beta_2) Delta^2`` after
  round 1, so their round-2 training is identical and they part only in round 2's server step; with
  ``beta_2 = 0.99`` that step differs by ~1e-5 in the validation loss, with 0.5 by ~1e-3.
- Every client starts round 1 from the same initial model, so the round-1 train loss is the same for every
  strategy but FedSLD (whose loss is re-weighted), FedRep and FedBABU (whose second step follows a step that
  moved only the head, or only the body). SiloBN's train losses equal FedAvg's by construction: in
  training mode BatchNorm normalizes with the batch's statistics, so keeping the running statistics personal
  changes only evaluation; its validation loss is what tells it apart.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedlit import strategies as S
from tests.conftest import make_federation

NUM_CLIENTS = 5
TOL = 2e-5  # the runs agree to ~1e-7 across thread counts; the closest two pins are 9e-4 apart

# name: (factory, train loss mean per round, validation loss mean after round 2)
PINNED = {
    "FedAvg": (S.FedAvg, [1.130441, 1.011368], 1.052633),
    "FedProx": (lambda: S.FedProx(mu=0.5), [1.130441, 1.012336], 1.053612),
    "FedBN": (S.FedBN, [1.130441, 1.008361], 1.060509),
    "Local": (S.Local, [1.130441, 0.972494], 1.054158),
    "FedAdam": (lambda: S.FedAdam(eta=0.05, beta_2=0.5), [1.130441, 1.064484], 1.101039),
    "FedAdagrad": (lambda: S.FedAdagrad(eta=0.05), [1.130441, 1.066930], 1.106058),
    "FedYogi": (lambda: S.FedYogi(eta=0.05, beta_2=0.5), [1.130441, 1.064484], 1.101962),
    "SCAFFOLD": (S.SCAFFOLD, [1.130441, 1.027277], 1.052601),
    "FedDyn": (lambda: S.FedDyn(alpha=0.1), [1.130441, 0.958317], 1.026879),
    "SiloBN": (S.SiloBN, [1.130441, 1.011368], 1.062191),
    "FedPxN": (lambda: S.FedPxN(mu=0.5), [1.130441, 1.009705], 1.061373),
    "FedSLD": (S.FedSLD, [1.129539, 1.003298], 1.053157),
    "FedMedian": (S.FedMedian, [1.130441, 1.004408], 1.054688),
    "FedTrimmedAvg": (lambda: S.FedTrimmedAvg(beta=0.2), [1.130441, 1.009600], 1.053045),
    "Krum": (lambda: S.Krum(num_selected=2), [1.130441, 1.008271], 1.055870),
    "FedPer": (S.FedPer, [1.130441, 0.984388], 1.044717),
    "LGFedAvg": (S.LGFedAvg, [1.130441, 0.997608], 1.060469),
    "FedRep": (lambda: S.FedRep(head_steps=1), [1.135816, 1.041134], 1.092413),
    "FedBABU": (lambda: S.FedBABU(finetune_steps=2), [1.127960, 1.061147], 1.070378),
}


def pins(name: str) -> list[float]:
    _, train, val = PINNED[name]
    return [*train, val]


@pytest.mark.parametrize("name", list(PINNED))
def test_two_rounds_checkpoint_events_and_pinned_losses(tmp_path, name):
    factory, pinned, val_loss = PINNED[name]
    federation = make_federation(tmp_path, factory(), num_clients=NUM_CLIENTS)
    federation.fit()
    payload = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert payload["server_round"] == 2
    assert set(payload["store"]["tensors"]) == {f"c{k}" for k in range(NUM_CLIENTS)}
    events = EventAccumulator(str(tmp_path / "tensorboard")).Reload()
    assert {"server/val/accuracy_mean", "comm/upload_bytes", "server/test/accuracy_mean"} <= set(
        events.Tags()["scalars"]
    )
    losses = [e.value for e in events.Scalars("server/train/loss_mean")]
    assert losses == pytest.approx(pinned, abs=TOL)
    assert events.Scalars("server/val/loss_mean")[-1].value == pytest.approx(val_loss, abs=TOL)


def test_trimmed_mean_trims_one_client_at_each_end():
    assert int(0.2 * NUM_CLIENTS) == 1


@pytest.mark.parametrize(("a", "b"), list(itertools.combinations(PINNED, 2)))
def test_pins_tell_every_pair_of_strategies_apart(a, b):
    # More than 2 * TOL apart in at least one value: no run can lie within TOL of both pins, so a strategy
    # that silently computed another one's math would fail its pinned test.
    gap = max(abs(x - y) for x, y in zip(pins(a), pins(b), strict=True))
    assert gap > 2 * TOL, f"{a} and {b} have pins {pins(a)} and {pins(b)}: a tolerance of {TOL} cannot tell them apart"
