"""Fused multi-client training (federation.fused_clients) against the sequential turns it must reproduce: the
equalities run on the CPU and, under the ``gpu`` marker (``make test-gpu``), on CUDA (the ``accelerator`` fixture)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from lightning.pytorch import Callback

from fedlit import FedAvg, Federation, RoleRule
from fedlit.core.errors import ConfigError
from fedlit.data import FederatedDataModule, PartitionedData
from fedlit.engine.speedups.fused_model import ClientParameters
from fedlit.models import LoRA, TimmBackbone
from fedlit.strategies import SCAFFOLD, FedPer, FedProx, FedSA
from fedlit.tasks import ClassificationModule
from tests.conftest import make_federation

#: Training samples per client: with batches of 8, clients take 2, 3, 1 and 2 steps per epoch, with last batches
#: of other sizes, so a fused group has segments of unequal sizes and clients that leave it early.
TRAIN = (12, 20, 7, 16)


class Images(FederatedDataModule):
    """4 clients of 1-channel 16x16 images with per-client shifts, ``TRAIN`` training samples each and ``held_out``
    validation and test samples."""

    held_out = ((4, 4),) * len(TRAIN)

    def build(self) -> PartitionedData:
        rng = np.random.default_rng(self.seed)
        inputs, targets, splits, start = [], [], {}, 0
        for k, (n_train, (n_val, n_test)) in enumerate(zip(TRAIN, self.held_out, strict=True)):
            n = n_train + n_val + n_test
            inputs.append(rng.normal(0.3 * k, 1.0, size=(n, 1, 16, 16)).astype(np.float32))
            targets.append(rng.integers(0, 3, size=n))
            idx = np.arange(start, start + n)
            splits[f"c{k}"] = {
                "train": idx[:n_train],
                "val": idx[n_train : n_train + n_val],
                "test": idx[n_train + n_val :],
            }
            start += n
        return PartitionedData(
            name="images",
            task="multiclass",
            num_classes=3,
            inputs=torch.from_numpy(np.concatenate(inputs)),
            targets=torch.from_numpy(np.concatenate(targets)),
            splits=splits,
            partitioner="natural",
        )


class Uploads(Callback):
    """Keeps every round's uploads (copies)."""

    def __init__(self) -> None:
        self.rounds: list[dict[str, object]] = []

    def on_before_aggregate(self, server_round, updates) -> None:
        self.rounds.append({u.client_id: (dict(u.state), dict(u.metrics)) for u in updates})


class ScaledPerClient(FedAvg):
    """FedAvg whose client loss is scaled by a per-client factor set in ``on_client_fit_start``: fused training must
    put each client's attribute back before its ``training_loss`` (FedProx's anchor is the same for every client)."""

    fusable = True

    def on_client_fit_start(self, client_id) -> None:
        self.scale = 1.0 + 2 * int(client_id[1])

    def training_loss(self, pl_module, loss, batch, outputs=None):
        return loss * self.scale


class NonFiniteForC2(ScaledPerClient):
    """Client c2's loss is NaN: it is quarantined, the others of its group go on."""

    fusable = True

    def on_client_fit_start(self, client_id) -> None:
        self.scale = math.nan if client_id == "c2" else 1.0


def _vit_federation(
    out_dir, strategy, fused=1, roles=None, rounds=2, optimizer="sgd", data=None, accelerator="cpu", **kwargs
):
    torch.manual_seed(0)
    module = ClassificationModule(
        backbone=TimmBackbone(name="fedlit_test_vit", lora=LoRA(r=2, alpha=4), model_args={"in_chans": 1}),
        num_classes=3,
        lr=0.05,
        momentum=0.9 if optimizer == "sgd" else 0.0,
        optimizer=optimizer,
        roles=roles if roles is not None else [RoleRule("backbone.*lora_*", "shared")],
    )
    uploads = Uploads()
    data = data if data is not None else Images(batch_size=8, seed=0)
    federation = Federation(
        module,
        data,
        strategy,
        rounds=rounds,
        out_dir=out_dir,
        progress_bar=False,
        seed=0,
        accelerator=accelerator,
        fused_clients=fused,
        callbacks=[uploads],
        **kwargs,
    )
    return federation, uploads


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def _assert_same_run(tmp_path, strategy_factory, fused, **kwargs):
    kwargs.setdefault("local_epochs", 2)
    seq, seq_up = _vit_federation(tmp_path / "seq", strategy_factory(), **kwargs)
    seq_results = seq.fit()
    fus, fus_up = _vit_federation(tmp_path / "fused", strategy_factory(), fused=fused, **kwargs)
    fus_results = fus.fit()
    assert len(seq_up.rounds) == len(fus_up.rounds) == 2
    for seq_round, fus_round in zip(seq_up.rounds, fus_up.rounds, strict=True):
        assert seq_round.keys() == fus_round.keys()
        for client, (state, metrics) in seq_round.items():
            fused_state, fused_metrics = fus_round[client]
            assert state.keys() == fused_state.keys()
            assert all(_close(state[n], fused_state[n]) for n in state), client
            assert (
                fused_metrics["steps"]
                == metrics["steps"]
                == (kwargs["local_epochs"] * math.ceil(TRAIN[int(client[1])] / 8))
            )
            assert fused_metrics["loss"] == pytest.approx(metrics["loss"], rel=1e-5)
    for client in seq.client_ids:
        a, b = seq.store.tensors(client), fus.store.tensors(client)
        assert a.keys() == b.keys() and all(_close(a[n], b[n]) for n in a)
    g_seq, g_fus = seq.strategy.global_state, fus.strategy.global_state
    assert g_seq.keys() == g_fus.keys() and all(_close(g_seq[n], g_fus[n]) for n in g_seq)
    for name, value in seq_results["last"]["summary"].items():
        assert fus_results["last"]["summary"][name] == pytest.approx(value, rel=1e-4, abs=1e-6, nan_ok=True), name
    # the live module ends as after the sequential loop: holding the last client's trained tensors
    live_seq, live_fus = dict(seq.module.named_parameters()), dict(fus.module.named_parameters())
    assert all(_close(live_seq[n], live_fus[n]) for n in live_seq)
    return seq, fus


@pytest.mark.parametrize(
    ("strategy_factory", "fused"),
    [
        pytest.param(FedAvg, 4, id="FedAvg"),
        pytest.param(lambda: FedProx(mu=0.5), 3, id="FedProx"),  # a group of 3 and one client alone
        pytest.param(FedSA, 4, id="FedSA"),
        pytest.param(FedPer, 2, id="FedPer"),
        pytest.param(ScaledPerClient, 4, id="per-client-attribute"),
        pytest.param(NonFiniteForC2, 4, id="quarantine"),
    ],
)
def test_fused_training_equals_the_sequential_turns(tmp_path, strategy_factory, fused, accelerator):
    seq, fus = _assert_same_run(tmp_path, strategy_factory, fused, accelerator=accelerator)
    if type(seq.strategy) in (FedSA, FedPer):  # personal tensors compared (FedSA's B, FedPer's head)
        assert seq.store.tensors("c0")
    if type(seq.strategy) is NonFiniteForC2:
        assert seq.state.faults == fus.state.faults and [f["client"] for f in fus.state.faults] == ["c2", "c2"]


def test_fused_training_with_adam_and_persisted_optimizer_state(tmp_path, accelerator):
    _assert_same_run(
        tmp_path, FedPer, 4, optimizer="adam", optimizer_state="persist", local_epochs=1, accelerator=accelerator
    )


def test_fused_training_refuses_a_strategy_not_marked_fusable(tmp_path):
    federation, _ = _vit_federation(tmp_path, SCAFFOLD(), fused=2)
    with pytest.raises(ConfigError, match=r"federation.fused_clients=2 .*SCAFFOLD has not declared .*fusable"):
        federation.fit()


def test_fused_training_refuses_a_subclass_that_does_not_declare_it_again(tmp_path):
    class Mine(FedAvg):
        def training_loss(self, pl_module, loss, batch, outputs=None):
            return loss

    federation, _ = _vit_federation(tmp_path, Mine(), fused=2)
    with pytest.raises(ConfigError, match="Mine has not declared"):
        federation.fit()


def test_fused_training_refuses_batchnorm_in_train_mode(tmp_path):
    federation = make_federation(tmp_path, FedAvg(), fused_clients=2)  # TinyMLP: a trainable BatchNorm1d
    with pytest.raises(ConfigError, match=r"BatchNorm layer 'backbone.1' normalizes with the statistics"):
        federation.fit()


def test_fused_training_refuses_per_step_callbacks_and_dropout(tmp_path):
    class Clip(Callback):
        def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
            pass

    torch.manual_seed(0)
    module = ClassificationModule(
        backbone=TimmBackbone(name="fedlit_test_vit", lora=LoRA(r=2, alpha=4), model_args={"in_chans": 1}),
        num_classes=3,
        roles=[RoleRule("backbone.*lora_*", "shared")],
    )
    # the backbone, frozen, stays in eval mode (its dropout is off); a dropout before the head trains
    module.head = torch.nn.Sequential(torch.nn.Dropout(0.1), module.head)
    federation = Federation(
        module,
        Images(batch_size=8),
        FedAvg(),
        rounds=1,
        out_dir=tmp_path,
        progress_bar=False,
        accelerator="cpu",
        fused_clients=2,
        callbacks=[Clip()],
    )
    with pytest.raises(ConfigError) as err:
        federation.fit()
    assert "Clip implements on_before_optimizer_step" in str(err.value)
    assert "the dropout layer 'head.0' (rate 0.1)" in str(err.value)


def test_fused_clients_must_be_a_positive_integer(tmp_path):
    with pytest.raises(ConfigError, match=r"federation.fused_clients=0 must be an integer >= 1"):
        _vit_federation(tmp_path, FedAvg(), fused=0)


def test_resume_with_fused_training_continues_the_run(tmp_path):
    straight, _ = _vit_federation(tmp_path / "straight", FedProx(mu=0.1), fused=4, rounds=3)
    straight.fit()
    _vit_federation(tmp_path / "resumed", FedProx(mu=0.1), fused=4, rounds=1)[0].fit()
    torch.manual_seed(1234)
    second, _ = _vit_federation(tmp_path / "resumed", FedProx(mu=0.1), fused=4, rounds=3)
    second.fit(ckpt_path=tmp_path / "resumed" / "checkpoints" / "last.ckpt")
    for name, value in straight.strategy.global_state.items():
        assert torch.equal(second.strategy.global_state[name], value), name


@pytest.mark.parametrize("sizes", [(3, 3, 3), (1, 4, 2)])  # one batched product per layer; one per segment
def test_the_fused_forward_computes_each_segment_with_its_clients_tensors(sizes):
    torch.manual_seed(0)
    module = ClassificationModule(
        backbone=TimmBackbone(name="fedlit_test_vit", lora=LoRA(r=2, alpha=4), model_args={"in_chans": 1}),
        num_classes=3,
        roles=[RoleRule("backbone.*lora_*", "shared")],
    )
    module.set_parameter_roles(module.parameter_roles())
    module.eval()
    params = ClientParameters(module, 3)
    with torch.no_grad():  # distinct tensors per client (LoRA B starts at zero)
        for k, tensors in enumerate(params.clients):
            for tensor in tensors.values():
                tensor.normal_(0.0, 0.2 * (k + 1))
    x = torch.randn(sum(sizes), 1, 16, 16)
    expected = []
    for k, part in enumerate(x.split(list(sizes))):
        params.bind(k)
        expected.append(module(part))
    params.bind(None)
    with params.fused([0, 1, 2], sizes):
        fused = module(x)
    assert torch.allclose(fused, torch.cat(expected), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(expected[0], module(x.split(list(sizes))[0]), atol=1e-3)  # the live tensors differ
