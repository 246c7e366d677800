"""FHBench's backbones under EPFL: a tiny RoBERTa on token ids and a tiny MOMENT-style encoder on multichannel
signals, each with LoRA r = 2 on its attention's query and value, train 2 rounds (LoRA A mixed per client, LoRA B
and the head kept, the pretrained weights untouched) and resume exactly."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import tests.conftest
from fedlit import RoleRule
from fedlit.data import FederatedDataModule, PartitionedData
from fedlit.models import HFEncoder, LoRA, MomentEncoder, tiny_moment_config, tiny_roberta_config
from fedlit.strategies import EPFL
from tests.conftest import assert_resume_is_exact, make_federation

ROLES = [RoleRule("backbone.*", "frozen"), RoleRule("backbone.*lora_*", "shared")]


class TinyTokens(FederatedDataModule):
    """Clients of 12 packed texts (B, 2, 10): ids and a mask whose length varies; classes 0, 1, 2 in turn, marked by
    the first token (id 3 + class)."""

    def __init__(self, *, num_clients: int = 3, names: list[str] | None = None, seed: int = 0) -> None:
        super().__init__(batch_size=4, seed=seed)
        self.names = list(names) if names else [f"c{k}" for k in range(num_clients)]

    def inputs(self, rng: np.random.Generator, y: np.ndarray) -> np.ndarray:
        n = len(y)
        ids = rng.integers(6, 2000, size=(n, 10))
        ids[:, 0] = 3 + y
        mask = (np.arange(10) < rng.integers(4, 11, size=(n, 1))).astype(np.int64)
        return np.stack([np.where(mask == 1, ids, 1), mask], axis=1)  # padding id 1, RoBERTa's

    def build(self) -> PartitionedData:
        rng = np.random.default_rng(self.seed)
        n = 12 * len(self.names)
        y = np.arange(n) % 3  # every split of every client holds all three classes
        x, y = torch.from_numpy(self.inputs(rng, y)), torch.from_numpy(y)
        splits = {
            name: {
                "train": np.arange(12 * k, 12 * k + 6),
                "val": np.arange(12 * k + 6, 12 * k + 9),
                "test": np.arange(12 * k + 9, 12 * k + 12),
            }
            for k, name in enumerate(self.names)
        }
        return PartitionedData(
            name="tiny_tokens",
            task="multiclass",
            num_classes=3,
            inputs=x,
            targets=y,
            splits=splits,
            partitioner="natural",
        )


class TinySignals(TinyTokens):
    """Clients of 12 two-channel signals (B, 2, 32): sines whose frequency is 1 + class + client, plus noise."""

    def inputs(self, rng: np.random.Generator, y: np.ndarray) -> np.ndarray:
        n, t = len(y), np.arange(32) / 32
        frequency = 1 + y[:, None, None] + np.repeat(np.arange(len(self.names)), 12)[:, None, None]
        return (np.sin(2 * np.pi * frequency * t) + 0.1 * rng.normal(size=(n, 2, 32))).astype(np.float32)


def roberta() -> HFEncoder:
    return HFEncoder(config=tiny_roberta_config(), lora=LoRA(r=2, alpha=16))


def moment() -> MomentEncoder:
    return MomentEncoder(config=tiny_moment_config(), seq_len=None, lora=LoRA(r=2, alpha=16))


BACKBONES = {
    "roberta": (roberta, TinyTokens, "roberta.encoder.layer.0.attention.self.query"),
    "moment": (moment, TinySignals, "encoder.block.0.layer.0.SelfAttention.q"),
}


@pytest.fixture(params=list(BACKBONES))
def backbone(request, monkeypatch):
    """make_federation builds its module on this backbone and its data on this data module."""
    spec, data, query = BACKBONES[request.param]
    monkeypatch.setattr(tests.conftest, "TinyMLP", spec)
    monkeypatch.setattr(tests.conftest, "TinyTabular", data)
    warnings.filterwarnings("ignore", "(HFEncoder|MomentEncoder): built from config", UserWarning)
    return query


def test_two_epfl_rounds_mix_a_keep_b_and_leave_the_base_weights(tmp_path, backbone):
    federation = make_federation(tmp_path, EPFL(), rounds=2, roles=ROLES)
    before = {n: t.clone() for n, t in federation.module.backbone.state_dict().items()}
    federation.fit()
    a, b = f"backbone.{backbone}.lora_A.default.weight", f"backbone.{backbone}.lora_B.default.weight"
    stored = {c: federation.store.tensors(c) for c in federation.client_ids}
    mixes = federation.strategy.mixes
    assert set(mixes) == {"c0", "c1", "c2"}
    # each client keeps its own B (trained from zero, so non-zero and different per client) ...
    bs = [stored[c][b] for c in federation.client_ids]
    assert all(bool(t.abs().sum() > 0) for t in bs) and not torch.equal(bs[0], bs[1])
    # ... and receives its own mix of the clients' A
    assert a in mixes["c0"] and not torch.equal(mixes["c0"][a], mixes["c1"][a])
    base = backbone + ".base_layer.weight"
    after = federation.module.backbone.state_dict()
    assert torch.equal(after[base], before[base])


def test_resume_is_exact(tmp_path, backbone):
    straight, _ = assert_resume_is_exact(tmp_path, EPFL, roles=ROLES)
    assert straight.history  # the run evaluated its clients


def test_tiny_roberta_is_a_roberta_with_lora_on_query_and_value():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        model = roberta().build()
    assert type(model.hf_model).__name__ == "RobertaModel" and model.num_features == 32
    assert [n for n, _ in model.named_parameters() if "lora_A" in n] == [
        f"roberta.encoder.layer.{i}.attention.self.{p}.lora_A.default.weight"
        for i in range(2)
        for p in ("query", "value")
    ]
    assert model.hf_model.embeddings.position_embeddings.padding_idx == 1
