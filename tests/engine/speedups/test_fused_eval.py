"""Fused evaluation (federation.fused_clients): K clients' evaluation batches in one forward pass must give each
client the metrics of its own sequential evaluation, on the CPU and, under the ``gpu`` marker (``make test-gpu``), on
CUDA (the ``accelerator`` fixture)."""

from __future__ import annotations

import math

import pytest
import torch

from fedlit import FedAvg
from fedlit.strategies import FedPer
from tests.engine.speedups.test_fused import TRAIN, Images, _vit_federation

#: Validation and test samples per client: with evaluation batches of 8, clients have 1 or 2 batches of other
#: sizes, so a fused pass has segments of unequal sizes and clients that leave it early.
HELD_OUT = ((3, 5), (9, 4), (1, 2), (12, 6))


class UnevenImages(Images):
    """``Images`` with ``HELD_OUT`` validation and test samples per client."""

    held_out = HELD_OUT


class PerWithGlobal(FedPer):
    """FedPer that also has every client evaluated with a global model: the shared tensors scaled by 0.5 (so the
    global evaluation differs from the personalized one)."""

    fusable = True

    def global_model_state(self, client_id):
        return {n: 0.5 * t for n, t in self.configure_evaluate(0, client_id).items()}


class FineTunedFedAvg(FedAvg):
    """FedAvg-FT: two local steps before each evaluation (such tasks are evaluated alone, in their place)."""

    fusable = True
    eval_finetune_steps = 2


class BatchSizes:
    """Counts the samples of every forward pass of the backbone."""

    def __init__(self, module) -> None:
        self.sizes: list[int] = []
        module.backbone.register_forward_hook(lambda m, args, out: self.sizes.append(len(args[0])))


def _run(tmp_path, strategy, fused, accelerator="cpu"):
    federation, _ = _vit_federation(
        tmp_path,
        strategy,
        fused=fused,
        rounds=2,
        local_epochs=1,
        data=UnevenImages(batch_size=8, seed=0),
        accelerator=accelerator,
    )
    sizes = BatchSizes(federation.module)
    results = federation.fit()
    return federation, results, sizes


def _assert_same_metrics(a, b):
    assert a.keys() == b.keys()
    for client, metrics in a.items():
        assert metrics.keys() == b[client].keys(), client
        for name, value in metrics.items():
            assert b[client][name] == pytest.approx(value, rel=1e-5, abs=1e-6, nan_ok=True), (client, name)


@pytest.mark.parametrize(
    ("strategy_factory", "fused"),
    [
        pytest.param(FedPer, 4, id="FedPer"),  # personal heads: every client evaluates another model
        pytest.param(PerWithGlobal, 3, id="global-model"),  # a group of 3 (6 models) and one client alone
        pytest.param(FineTunedFedAvg, 4, id="fine-tuned-alone"),
    ],
)
def test_fused_evaluation_gives_each_client_its_sequential_metrics(tmp_path, strategy_factory, fused, accelerator):
    seq, seq_results, _ = _run(tmp_path / "seq", strategy_factory(), 1, accelerator)
    fus, fus_results, _ = _run(tmp_path / "fused", strategy_factory(), fused, accelerator)
    assert seq.history.rounds.keys() == fus.history.rounds.keys() == {1, 2}
    for server_round, splits in seq.history.rounds.items():
        assert splits.keys() == fus.history.rounds[server_round].keys()
        for split, per_client in splits.items():
            assert len(per_client) == 4, split
            _assert_same_metrics(per_client, fus.history.rounds[server_round][split])
    if strategy_factory is PerWithGlobal:
        assert "global/val" in seq.history.rounds[2]
        assert seq.history.rounds[2]["global/val"]["c1"]["loss"] != seq.history.rounds[2]["val"]["c1"]["loss"]
    _assert_same_metrics(seq_results["last"]["clients"], fus_results["last"]["clients"])
    live_seq, live_fus = dict(seq.module.named_parameters()), dict(fus.module.named_parameters())
    assert all(torch.allclose(live_seq[n], live_fus[n], rtol=1e-5, atol=1e-6) for n in live_seq)


def test_fused_evaluation_runs_one_forward_pass_per_batch_index(tmp_path):
    _, _, seq = _run(tmp_path / "seq", FedPer(), 1)
    _, _, fus = _run(tmp_path / "fused", FedPer(), 4)

    def batches(n):  # batches of 8 over n samples
        return [min(8, n - 8 * b) for b in range(math.ceil(n / 8))]

    # sequential: each client's batches alone, client after client (val then test)
    seq_train = [s for n in TRAIN for s in batches(n)]
    seq_eval = [s for n_val, n_test in HELD_OUT for s in (*batches(n_val), *batches(n_test))]
    assert seq.sizes == [*seq_train, *seq_eval] * 2
    # fused: batch b of every client that has one, in one pass (training is fused too)
    fused_train = [8 + 8 + 7 + 8, 4 + 8 + 8, 4]
    fused_eval = [
        3 + 8 + 1 + 8,
        1 + 4,  # validation: first batches of c0..c3, then c1's and c3's second ones
        5 + 4 + 2 + 6,
    ]  # test
    assert fus.sizes == [*fused_train, *fused_eval] * 2


def test_fused_training_and_evaluation_read_cached_features(tmp_path):
    # head-only FedAvg on cached features: the fused passes concatenate the cached features, not the images
    def run(name, fused):
        federation, _ = _vit_federation(
            tmp_path / name,
            FedAvg(),
            fused=fused,
            roles=[],
            rounds=2,
            local_epochs=1,
            data=UnevenImages(batch_size=8, seed=0),
            cache_features="memory",
        )
        sizes = BatchSizes(federation.module)
        federation.fit()
        return federation, sizes

    seq, seq_sizes = run("seq", 1)
    fus, fus_sizes = run("fused", 4)
    for server_round, splits in seq.history.rounds.items():
        for split, per_client in splits.items():
            _assert_same_metrics(per_client, fus.history.rounds[server_round][split])
    # the backbone ran once per split and client to fill the cache (the same passes in both runs), never again
    assert fus_sizes.sizes == seq_sizes.sizes and sum(fus_sizes.sizes) == sum(TRAIN) + sum(map(sum, HELD_OUT))
