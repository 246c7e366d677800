"""A client's turn: precision, non-finite quarantine, failing clients, per-callback state, skipped 16-bit steps."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch
from lightning.fabric import Fabric
from lightning.fabric.plugins.precision import MixedPrecision
from lightning.pytorch import Callback
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedlit import FedAvg, RoleRule
from fedlit.core.errors import ConfigError, FedlitError, NonFiniteError
from fedlit.strategies import SCAFFOLD
from tests.conftest import TinyMLP, TinyTabular, make_federation


class HeadDtype(Callback):
    """Records the dtype of the head's output during local training."""

    def __init__(self) -> None:
        self.dtypes: set[torch.dtype] = set()

    def on_fit_start(self, trainer, pl_module) -> None:
        pl_module.head.register_forward_hook(lambda _m, _i, out: self.dtypes.add(out.dtype))


def test_bf16_mixed_computes_the_head_in_bfloat16(tmp_path):
    recorder = HeadDtype()
    federation = make_federation(tmp_path, FedAvg(), rounds=1, precision="bf16-mixed", callbacks=[recorder])
    results = federation.fit()
    # under autocast a Linear layer runs in bfloat16; before, training_step ran outside autocast (float32)
    assert recorder.dtypes == {torch.bfloat16}
    assert federation.strategy.global_state["head.weight"].dtype == torch.float32  # master weights stay fp32
    assert math.isfinite(results["last"]["summary"]["loss_mean"])


def test_bf16_true_runs_with_bfloat16_weights_and_inputs(tmp_path):
    recorder = HeadDtype()
    federation = make_federation(tmp_path, FedAvg(), rounds=1, precision="bf16-true", callbacks=[recorder])
    results = federation.fit()  # float32 inputs into bfloat16 weights crashed with a dtype mismatch before
    assert recorder.dtypes == {torch.bfloat16}
    assert federation.strategy.global_state["head.weight"].dtype == torch.bfloat16
    assert math.isfinite(results["last"]["summary"]["loss_mean"])


class Poison(FedAvg):
    """FedAvg whose training loss becomes NaN for the clients in ``bad`` from round ``start``."""

    def __init__(self, bad: tuple[str, ...], start: int = 1) -> None:
        super().__init__()
        self.bad, self.start, self.client, self.uploads = bad, start, "", {}

    def on_client_fit_start(self, server_round, client_id) -> None:
        self.client, self.round = client_id, server_round

    def training_loss(self, pl_module, loss, batch, outputs=None):
        return loss * math.nan if self.client in self.bad and self.round >= self.start else loss

    def on_before_aggregate(self, updates) -> None:
        self.uploads = {u.client_id: {n: t.clone() for n, t in u.state.items()} for u in updates}
        self.steps = [u.metrics["steps"] for u in updates]


def test_a_non_finite_client_is_quarantined_and_reported(tmp_path):
    strategy = Poison(bad=("c1",))
    federation = make_federation(tmp_path, strategy, rounds=1, roles=None)
    with pytest.warns(UserWarning, match=r"Round 1: client 'c1' is quarantined"):
        results = federation.fit()
    # the server averaged c0 and c2 only (15 training samples each): the plain mean of their uploads
    assert set(strategy.uploads) == {"c0", "c2"}
    name = "head.weight"
    expected = (strategy.uploads["c0"][name] + strategy.uploads["c2"][name]) / 2
    assert torch.allclose(strategy.global_state[name], expected, atol=1e-7)
    assert torch.isfinite(strategy.global_state[name]).all()
    assert results["faults"] == [
        {
            "round": 1,
            "client": "c1",
            "kind": "non-finite",
            "detail": "training loss nan at step 1 (after Poison.training_loss)",
        }
    ]
    assert json.loads((tmp_path / "results.json").read_text())["faults"][0]["client"] == "c1"
    assert "left out of aggregation" in (tmp_path / "results.md").read_text()
    events = EventAccumulator(str(tmp_path / "tensorboard")).Reload()
    assert events.Scalars("client/c1/train/quarantined")[0].value == 1.0
    assert events.Scalars("server/train/clients_left_out")[0].value == 1.0
    # nothing of c1's poisoned turn was stored: it still holds the initial personal state (nothing personal here)
    assert "c1" not in federation.store.client_ids


def test_every_client_non_finite_stops_with_the_last_good_checkpoint_and_no_results(tmp_path):
    federation = make_federation(tmp_path, Poison(bad=("c0", "c1", "c2"), start=2), rounds=3)
    with pytest.warns(UserWarning, match="quarantined"), pytest.raises(NonFiniteError) as err:
        federation.fit()
    message = str(err.value)
    assert "Round 2: every client's update is non-finite" in message and "model.init_args.lr" in message
    assert "last good checkpoint" in message
    payload = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert payload["server_round"] == 1  # round 1's checkpoint, not overwritten
    assert not (tmp_path / "results.json").exists()


class FailFor(Callback):
    def __init__(self, client: str) -> None:
        self.client = client

    def on_client_fit_start(self, client_id) -> None:
        if client_id == self.client:
            raise RuntimeError("scanner archive unreadable")


def test_on_client_error_raise_is_the_default(tmp_path):
    with pytest.raises(RuntimeError, match="scanner archive unreadable"):
        make_federation(tmp_path, FedAvg(), rounds=1, callbacks=[FailFor("c1")]).fit()


def test_on_client_error_skip_leaves_the_client_out_of_the_round(tmp_path):
    strategy = Poison(bad=())
    federation = make_federation(tmp_path, strategy, rounds=1, callbacks=[FailFor("c1")], on_client_error="skip")
    with pytest.warns(UserWarning, match=r"client 'c1' raised RuntimeError: scanner archive unreadable"):
        results = federation.fit()
    assert set(strategy.uploads) == {"c0", "c2"}
    assert results["faults"] == [
        {"round": 1, "client": "c1", "kind": "error", "detail": "RuntimeError: scanner archive unreadable"}
    ]


def test_min_clients_stops_a_round_with_too_few_updates(tmp_path):
    federation = make_federation(
        tmp_path, FedAvg(), rounds=1, callbacks=[FailFor("c1")], on_client_error="skip", min_clients=3
    )
    with pytest.warns(UserWarning, match="left out"), pytest.raises(FedlitError, match=r"only 2 of 3 clients"):
        federation.fit()


class Notes(Callback):
    """A callback with per-client state of its own."""

    def on_client_fit_start(self, client_id, client_state) -> None:
        client_state["turns"] = client_state.get("turns", 0) + 1


def test_each_callback_has_its_own_per_client_state(tmp_path):
    federation = make_federation(tmp_path, SCAFFOLD(), rounds=2, callbacks=[Notes()], roles=None)
    with pytest.warns(UserWarning, match="SCAFFOLD"):
        federation.fit()
    own = federation.store.extra("c0", "Notes")
    scaffold = federation.store.extra("c0", federation.strategy.state_key)
    assert own == {"turns": 2}
    assert "turns" not in scaffold and "c_i" in scaffold  # before, both wrote into SCAFFOLD's dict


class InfGradientOnce(Callback):
    """Makes one gradient infinite at the second optimizer step of each client turn; records ``stepped``."""

    def __init__(self) -> None:
        self.step, self.stepped = 0, []

    def on_client_fit_start(self) -> None:
        self.step = 0

    def on_after_backward(self, pl_module) -> None:
        self.step += 1
        if self.step == 2:
            pl_module.head.weight.grad[0, 0] = math.inf

    def on_before_zero_grad(self, stepped) -> None:
        self.stepped.append(stepped)


def test_a_step_skipped_by_the_gradient_scaler_is_not_counted(tmp_path):
    recorder = InfGradientOnce()
    strategy = Poison(bad=())
    federation = make_federation(tmp_path, strategy, rounds=1, callbacks=[recorder], local_steps=3, clients_per_round=1)
    # a CPU float16 gradient scaler (Fabric only builds one on CUDA): the loop's skip detection is device-agnostic
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    federation.fabric = Fabric(
        accelerator="cpu",
        plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)],
        callbacks=list(federation.callbacks),
        loggers=federation.fabric.loggers,
    )
    federation.fit()
    # the scaler found the inf at the second batch and skipped that step: local_steps=3 took 4 batches
    assert recorder.stepped == [True, False, True, True]
    assert scaler.get_scale() == 2.0**7  # halved once, by the skipped step
    assert strategy.steps == [3.0]


class FailIn(Callback):
    """Makes ``client``'s turn raise in round ``round`` only."""

    def __init__(self, client: str, round: int) -> None:
        self.client, self.round = client, round

    def on_client_fit_start(self, server_round, client_id) -> None:
        if client_id == self.client and server_round == self.round:
            raise OSError("site link down")


class Uploads(Callback):
    """The clients whose updates reach aggregation, per round."""

    def __init__(self) -> None:
        self.rounds: dict[int, list[str]] = {}

    def on_before_aggregate(self, server_round, updates) -> None:
        self.rounds[server_round] = [u.client_id for u in updates]


def test_a_client_failing_in_round_2_is_left_out_of_round_2_only(tmp_path):
    seen = Uploads()
    federation = make_federation(
        tmp_path, FedAvg(), rounds=3, callbacks=[FailIn("c1", 2), seen], on_client_error="skip"
    )
    with pytest.warns(UserWarning, match=r"Round 2: client 'c1' raised OSError: site link down") as caught:
        results = federation.fit()
    assert not [w for w in caught if "Round 1" in str(w.message) or "Round 3" in str(w.message)]
    assert seen.rounds == {1: ["c0", "c1", "c2"], 2: ["c0", "c2"], 3: ["c0", "c1", "c2"]}
    assert results["faults"] == [{"round": 2, "client": "c1", "kind": "error", "detail": "OSError: site link down"}]
    events = EventAccumulator(str(tmp_path / "tensorboard")).Reload()
    assert [e.value for e in events.Scalars("server/train/clients_left_out")] == [0.0, 1.0, 0.0]


def test_too_few_survivors_stop_at_the_last_good_checkpoint_which_resumes_with_a_lower_min_clients(tmp_path):
    federation = make_federation(
        tmp_path, FedAvg(), rounds=3, callbacks=[FailIn("c1", 2)], on_client_error="skip", min_clients=3
    )
    with pytest.warns(UserWarning, match="c1"), pytest.raises(FedlitError) as err:
        federation.fit()
    message = str(err.value)
    assert "Round 2: only 2 of 3 clients" in message and "federation.min_clients=3" in message
    assert "last good checkpoint" in message and "c1: OSError: site link down" in message
    checkpoint = tmp_path / "checkpoints" / "last.ckpt"
    assert torch.load(checkpoint, weights_only=True)["server_round"] == 1
    seen = Uploads()
    again = make_federation(
        tmp_path, FedAvg(), rounds=3, callbacks=[FailIn("c1", 2), seen], on_client_error="skip", min_clients=2
    )
    with pytest.warns(UserWarning, match=r"Round 2: client 'c1' raised"):
        results = again.fit(ckpt_path=checkpoint)
    assert seen.rounds == {2: ["c0", "c2"], 3: ["c0", "c1", "c2"]}  # it went on from round 2
    assert results["last"]["round"] == 3
    assert [f["round"] for f in results["faults"]] == [2]  # the stopped run's round 2 is not counted twice


class SlowFor(Callback):
    """Advances the fake clock of ``federation.client_timeout`` by ``seconds`` at each of ``client``'s steps in
    ``round``; counts each client's finished turns in its ``client_state``."""

    def __init__(self, clock: list[float], client: str, round: int, seconds: float) -> None:
        self.clock, self.client, self.round, self.seconds = clock, client, round, seconds
        self.current = ("", 0)
        self.store = None  # the client store its turns use (a ServerContext shows no store)

    def on_client_fit_start(self, client, server_round, client_id) -> None:
        self.current = (client_id, server_round)
        self.store = client.store

    def on_train_batch_end(self) -> None:
        self.clock[0] += self.seconds if self.current == (self.client, self.round) else 0.001

    def on_client_fit_end(self, client_state) -> None:
        client_state["turns"] = client_state.get("turns", 0) + 1

    def on_round_end(self, server_round) -> None:
        self.stored = getattr(self, "stored", {})
        if self.store is not None:  # a Flower server's callback sees no turn: the store is on the nodes
            self.stored[server_round] = {n: t.clone() for n, t in self.store.tensors(self.client).items()}


def test_a_client_past_client_timeout_is_left_out_and_keeps_its_stored_state(tmp_path, monkeypatch):
    from fedlit.engine.loop import client as local

    clock = [0.0]
    monkeypatch.setattr(local, "_clock", lambda: clock[0])
    seen, slow = Uploads(), SlowFor(clock, "c2", round=2, seconds=30.0)
    federation = make_federation(
        tmp_path,
        FedAvg(),
        rounds=2,
        callbacks=[slow, seen],
        client_timeout=10.0,
        roles=[RoleRule("backbone.*", "shared"), RoleRule("head.*", "personal")],
    )
    with pytest.warns(UserWarning, match=r"Round 2: client 'c2' timed out, its update is left out") as caught:
        results = federation.fit()
    assert len([w for w in caught if "timed out" in str(w.message)]) == 1
    assert seen.rounds == {1: ["c0", "c1", "c2"], 2: ["c0", "c1"]}
    fault = results["faults"][0]
    assert (fault["round"], fault["client"], fault["kind"]) == (2, "c2", "timeout") and len(results["faults"]) == 1
    assert fault["detail"] == "timed out: 30 s after 1 steps, over federation.client_timeout=10 s"  # stopped at once
    assert federation.store.extra("c2", "SlowFor") == {"turns": 1}  # round 2's turn left nothing behind
    assert slow.stored[1].keys() == {"head.weight", "head.bias"}
    assert all(torch.equal(slow.stored[1][n], slow.stored[2][n]) for n in slow.stored[1])
    assert federation.store.extra("c1", "SlowFor") == {"turns": 2}
    events = EventAccumulator(str(tmp_path / "tensorboard")).Reload()
    assert events.Scalars("client/c2/train/timed_out")[0].value == 1.0


def test_client_timeout_must_be_positive(tmp_path):
    with pytest.raises(ConfigError, match=r"federation.client_timeout=0 must be > 0 seconds"):
        make_federation(tmp_path, FedAvg(), client_timeout=0)


class DropLast(TinyTabular):
    """TinyTabular whose train loaders drop an incomplete last batch (the same shuffle otherwise)."""

    def train_dataloader(self, client_id, generator):
        loader = super().train_dataloader(client_id, generator)
        return torch.utils.data.DataLoader(
            loader.dataset, batch_size=loader.batch_size, shuffle=True, generator=generator, drop_last=True
        )


class TurnMetrics(Callback):
    """Records what each turn uploads as metrics (its steps and mean loss)."""

    def __init__(self) -> None:
        self.metrics: list[tuple[int, str, dict[str, float]]] = []

    def on_client_fit_end(self, server_round, client_id, update) -> None:
        self.metrics.append((server_round, client_id, dict(update.metrics)))


def _bn_federation(out_dir, data, recorder):
    from fedlit import Federation
    from fedlit.tasks import ClassificationModule

    torch.manual_seed(0)
    module = ClassificationModule(
        backbone=TinyMLP(), num_classes=3, lr=0.1, momentum=0.9, roles=[RoleRule("backbone.*", "shared")]
    )
    return Federation(
        module,
        data,
        FedAvg(),
        rounds=2,
        local_epochs=2,
        out_dir=out_dir,
        progress_bar=False,
        accelerator="cpu",
        callbacks=[recorder],
    )


def test_a_batch_of_one_sample_is_left_out_with_batchnorm_and_said_once_per_client(tmp_path):
    # 34 samples per client: 17 to train on, in batches of 8, 8 and 1; BatchNorm1d cannot train on the 1
    turns, reference_turns = TurnMetrics(), TurnMetrics()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fed = _bn_federation(tmp_path / "skip", TinyTabular(samples=34), turns)
        results = fed.fit()
    said = [str(w.message) for w in caught if "a training batch of one sample is left out" in str(w.message)]
    assert [m.split(":")[0] for m in said] == ["Client 'c0'", "Client 'c1'", "Client 'c2'"]  # once per run each
    assert "one sample per pass over its 17 training samples" in said[0] and "['backbone.1']" in said[0]
    assert {m["steps"] for _, _, m in turns.metrics} == {4.0}  # 2 epochs of 2 batches: the batch of one is no step
    # the same as loaders that drop that batch: no step, not in the mean loss, nothing else changed
    reference = _bn_federation(tmp_path / "drop", DropLast(samples=34), reference_turns)
    assert reference.fit()["last"] == results["last"] and reference_turns.metrics == turns.metrics
    state, again = fed.strategy.global_state, reference.strategy.global_state
    assert all(torch.equal(state[n], again[n]) for n in state)


def test_without_a_batch_of_one_nothing_changes(tmp_path):
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*batch of one sample")
        fed = make_federation(tmp_path, FedAvg(), rounds=2, local_epochs=2)  # 15 to train on: 8 and 7
        results = fed.fit()
    # the numbers of this run before single-sample batches were handled
    assert results["last"]["summary"]["loss_mean"] == pytest.approx(0.7313775420188904, rel=1e-6)
    assert results["last"]["summary"]["accuracy_mean"] == 0.875
    assert float(fed.strategy.global_state["backbone.1.running_mean"].sum()) == pytest.approx(
        -0.4528324604034424, rel=1e-6
    )


def test_a_client_with_one_training_sample_and_batchnorm_gets_a_clear_error(tmp_path):
    from fedlit.core.errors import DataError

    with pytest.raises(
        DataError,
        match=r"Client 'c0' has no training batch: its train split is one sample, which "
        r"the BatchNorm layers \['backbone.1'\] cannot train on",
    ):
        _bn_federation(tmp_path, TinyTabular(samples=2), TurnMetrics()).fit()
