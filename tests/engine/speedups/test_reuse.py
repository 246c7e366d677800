"""Evaluations reused while a client's inputs are unchanged (federation.reuse_evaluations)."""

from __future__ import annotations

import csv

import pytest
import torch

from fedlit import FedAvg, RoleRule
from fedlit.core import tensors
from fedlit.core.tensors import DigestMemo
from fedlit.core.tensors import digest as fingerprint
from fedlit.engine.loop import resume
from fedlit.strategies import APFL, Local
from tests.conftest import make_federation


def _scalars(out_dir, metric):
    with open(out_dir / "metrics.csv", newline="", encoding="utf-8") as f:
        return {
            int(r["round"]): float(r["value"])
            for r in csv.DictReader(f)
            if r["split"] == "system" and r["metric"] == metric
        }


def _run(out_dir, strategy, reuse, **kwargs):
    federation = make_federation(out_dir, strategy, rounds=4, num_clients=4, reuse_evaluations=reuse, **kwargs)
    calls = []
    original = federation.module.validation_step
    federation.module.validation_step = lambda batch, idx: calls.append(1) or original(batch, idx)
    results = federation.fit()
    return federation, results, calls


def test_local_clients_that_did_not_train_keep_their_metrics_without_being_evaluated(tmp_path):
    off, off_results, off_calls = _run(tmp_path / "off", Local(), False, clients_per_round=0.5)
    on, on_results, on_calls = _run(tmp_path / "on", Local(), True, clients_per_round=0.5)
    assert on.history.rounds == off.history.rounds  # the same metrics, exactly, every round and client
    assert on_results["last"] == off_results["last"]
    # 4 clients, 2 trained a round: from round 2 on, the 2 others are given their last metrics again
    assert _scalars(tmp_path / "on", "eval_reused") == {1: 0.0, 2: 2.0, 3: 2.0, 4: 2.0}
    assert _scalars(tmp_path / "off", "eval_reused") == {}
    assert len(on_calls) == len(off_calls) * (4 + 2 + 2 + 2) / 16  # validation_step runs for evaluated clients only


class Unmoved(FedAvg):
    """FedAvg whose server keeps its global model whatever the clients send."""

    def aggregate(self, server_round, updates):
        return dict(self.global_state)


def _comm(out_dir, metric):
    with open(out_dir / "metrics.csv", newline="", encoding="utf-8") as f:
        return {
            int(r["round"]): float(r["value"])
            for r in csv.DictReader(f)
            if r["split"] == "comm" and r["metric"] == metric
        }


def test_fedavg_clients_are_reused_only_while_the_global_model_is_unchanged(tmp_path):
    # the global model never moves: from round 2 on every client's evaluation is reused (its download still counted:
    # the traffic is the protocol's, whatever the simulation recomputes)
    make_federation(tmp_path / "still", Unmoved(), rounds=3, num_clients=3).fit()
    assert _scalars(tmp_path / "still", "eval_reused") == {1: 0.0, 2: 3.0, 3: 3.0}
    downloads = _comm(tmp_path / "still", "eval_download_bytes")
    assert downloads[1] > 0 and downloads[2] == downloads[3] == downloads[1]
    # a model that trains: every round sends a new global model, nothing is reused
    make_federation(tmp_path / "moving", FedAvg(), rounds=3, num_clients=3).fit()
    assert _scalars(tmp_path / "moving", "eval_reused") == {1: 0.0, 2: 0.0, 3: 0.0}
    assert _comm(tmp_path / "moving", "eval_download_bytes")[3] == downloads[1]


def test_a_strategy_with_an_evaluation_hook_evaluates_every_client(tmp_path):
    federation = make_federation(tmp_path, APFL(alpha=0.5), rounds=2, num_clients=3, clients_per_round=0.5)
    federation.fit()
    assert federation.evaluation_reuse is None
    assert _scalars(tmp_path, "eval_reused") == {}


def test_fingerprint_tells_values_apart():
    a = {"w": torch.arange(6.0).reshape(2, 3), "n": 3, "s": [1.5, "x", None]}
    same = {"s": [1.5, "x", None], "n": 3, "w": torch.arange(6.0).reshape(2, 3)}
    assert fingerprint(a) == fingerprint(same)
    changed = {**same, "w": same["w"].clone()}
    changed["w"][1, 2] = 5.000001
    assert fingerprint(changed) != fingerprint(a)
    assert fingerprint({**a, "w": a["w"].reshape(3, 2)}) != fingerprint(a)  # same bytes, another shape
    assert fingerprint({**a, "w": a["w"].double()}) != fingerprint(a)
    assert fingerprint({**a, "n": 4}) != fingerprint(a)
    assert fingerprint({**a, "n": 3.0}) != fingerprint(a)
    assert fingerprint({**a, "other": object()}) is None
    memo = DigestMemo()
    t = torch.zeros(3)
    first = fingerprint(t, memo)
    t.add_(1.0)  # in place: a new version, hashed again
    assert fingerprint(t, memo) != first
    assert fingerprint(torch.empty(0)) != fingerprint(torch.empty(0, dtype=torch.int64))


@pytest.mark.parametrize("value", [torch.tensor(True), torch.tensor(2, dtype=torch.bfloat16), torch.ones(2, 2).t()])
def test_fingerprint_takes_any_dense_tensor(value):
    assert fingerprint(value) == fingerprint(value.clone())


@pytest.mark.parametrize(("memo", "hashed"), [("1", 1), ("0", 3)])
def test_frozen_buffers_are_hashed_once_per_run(tmp_path, monkeypatch, memo, hashed):
    """3 rounds, 3 evaluations: the frozen BatchNorm's running mean is hashed once for the evaluation fingerprints
    (3 times with FEDLIT_DIGEST_MEMO=0, once per evaluation) and once for the checkpoints' frozen fingerprint."""
    monkeypatch.setenv("FEDLIT_DIGEST_MEMO", memo)
    seen: dict[object, list[torch.Tensor]] = {tensors: [], resume: []}
    for owner, kept in seen.items():  # each module's own name for it
        read = owner.raw_bytes
        monkeypatch.setattr(owner, "raw_bytes", lambda t, read=read, kept=kept: kept.append(t) or read(t))
    roles = [RoleRule("backbone.0.*", "shared"), RoleRule("backbone.1.*", "frozen")]
    federation = make_federation(tmp_path, FedAvg(), rounds=3, roles=roles)
    federation.fit()
    running_mean = federation.module.get_buffer("backbone.1.running_mean")
    assert sum(t is running_mean for t in seen[tensors]) == hashed
    assert sum(t is running_mean for t in seen[resume]) == 1
    assert len(list((tmp_path / "checkpoints").glob("*.ckpt"))) >= 1
