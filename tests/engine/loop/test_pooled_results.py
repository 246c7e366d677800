"""Metrics pooled over clients (FLamby's "pooled" figure): a real tiny federation's ``pooled`` in results.json against
lifelines' C-index and scikit-learn's accuracy, balanced accuracy and AUROC, computed here on the concatenated test
predictions of the model saved in the checkpoint; off with ``pooled_metrics: false``; absent when a client gave no
predictions (a Flower node never sends them)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from lifelines.utils import concordance_index as lifelines_c_index
from sklearn.metrics import accuracy_score, balanced_accuracy_score, log_loss, roc_auc_score

from fedlit import FedAvg, Federation, RoleRule
from fedlit.data import SyntheticSurvival
from fedlit.engine.loop.evaluate import pooled_metrics
from fedlit.models import Identity
from fedlit.tasks import ClassificationModule, CoxModule, cox_loss
from tests.conftest import TinyMLP, make_federation


def _checkpoint_state(out_dir, name: str) -> dict[str, torch.Tensor]:
    """The server's model saved in ``checkpoints/<name>`` (FedAvg's global state: every tensor is shared here)."""
    checkpoint = torch.load(out_dir / "checkpoints" / name, weights_only=False)
    return checkpoint["strategy"]["global_state"]


def _test_rows(fed: Federation) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each client's test inputs and targets, in client order."""
    data = fed.datamodule.data
    rows = []
    for client in sorted(data.splits):
        idx = torch.as_tensor(data.splits[client]["test"])
        rows.append((torch.as_tensor(data.inputs[idx]), torch.as_tensor(data.targets[idx])))
    return rows


def test_survival_pooled_c_index_is_lifelines_on_the_concatenated_test_predictions(tmp_path):
    torch.manual_seed(0)
    module = CoxModule(backbone=Identity(num_features=8), optimizer="adam", lr=0.05)
    data = SyntheticSurvival(num_clients=3, samples_per_client=60, batch_size=16)
    fed = Federation(module, data, FedAvg(), rounds=2, out_dir=tmp_path, progress_bar=False, accelerator="cpu")
    fed.fit()
    saved = json.loads((tmp_path / "results.json").read_text())
    rows = _test_rows(fed)
    for key, ckpt in (("last", "last.ckpt"), ("best", "best.ckpt")):
        weight = _checkpoint_state(tmp_path, ckpt)["head.weight"]  # the linear Cox model: risk = x . w
        risk = torch.cat([inputs @ weight.reshape(-1) for inputs, _ in rows])
        targets = torch.cat([t for _, t in rows])
        time, event = targets[:, 0].numpy(), targets[:, 1].numpy()
        assert len(np.unique(time)) == len(time)  # no tied times: Harrell's pairs are lifelines' exactly
        expected = lifelines_c_index(time, -risk.numpy(), event)  # lifelines ranks survival times: minus the risk
        pooled = saved[key]["pooled"]
        assert pooled["c_index"] == pytest.approx(expected, abs=1e-12)
        assert pooled["loss"] == pytest.approx(float(cox_loss(risk, targets[:, 0], targets[:, 1])), rel=1e-5)
        # not a mean over clients: the pairs across clients count
        assert abs(pooled["c_index"] - saved[key]["summary"]["c_index_mean"]) > 1e-3
    printed = (tmp_path / "results.md").read_text()
    assert f"| **pooled** | {saved['last']['pooled']['c_index']:.4f} |" in printed
    assert 'FLamby\'s "pooled" figure' in printed


def test_classification_pooled_accuracy_and_auroc_are_sklearns_on_the_concatenated_test_predictions(tmp_path):
    fed = make_federation(tmp_path, FedAvg(), rounds=2)
    fed.fit()
    saved = json.loads((tmp_path / "results.json").read_text())
    torch.manual_seed(0)  # a fresh model of the same architecture, the checkpoint's tensors loaded into it
    model = ClassificationModule(backbone=TinyMLP(), num_classes=3, roles=[RoleRule("backbone.*", "shared")])
    state = _checkpoint_state(tmp_path, "last.ckpt")
    assert set(state) == set(model.state_dict())
    model.load_state_dict(state)
    model.eval()
    rows = _test_rows(fed)
    with torch.no_grad():
        probs = torch.cat([model(inputs).softmax(-1) for inputs, _ in rows]).double().numpy()
    labels = torch.cat([t for _, t in rows]).numpy()
    assert set(labels) == {0, 1, 2}
    pooled = saved["last"]["pooled"]
    assert pooled["accuracy"] == pytest.approx(accuracy_score(labels, probs.argmax(1)), abs=1e-6)
    assert pooled["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(labels, probs.argmax(1)), abs=1e-6)
    assert pooled["auroc"] == pytest.approx(roc_auc_score(labels, probs, multi_class="ovr", average="macro"), abs=1e-5)
    assert pooled["loss"] == pytest.approx(log_loss(labels, probs, labels=[0, 1, 2]), abs=1e-5)
    assert set(pooled) == {"accuracy", "balanced_accuracy", "f1", "auroc", "auprc", "loss"}
    # the evaluation of the checkpoint (``fedlit test``) gives the same pooled figures
    again = fed.evaluate("test", ckpt_path=tmp_path / "checkpoints" / "last.ckpt")
    assert again["pooled"] == pytest.approx(pooled, abs=1e-6)


def test_pooled_metrics_false_computes_none(tmp_path):
    fed = make_federation(tmp_path, FedAvg(), rounds=1, pooled_metrics=False)
    results = fed.fit()
    assert "pooled" not in results["last"] and "pooled" not in results["best"]
    assert "**pooled**" not in (tmp_path / "results.md").read_text()


def test_no_pooled_figure_when_a_client_gave_no_predictions():
    calls = []
    module = SimpleNamespace(pooled_metrics=lambda predictions: calls.append(predictions) or {"m": 1.0})
    run = SimpleNamespace(module=module)
    per_client = {"a": {"m": 0.5}, "b": {"m": 0.7}}
    # a Flower node's evaluation comes back without predictions, a module without a pooled form keeps none
    assert pooled_metrics(run, per_client, {"a": [1]}) == {}
    assert calls == []
    assert pooled_metrics(run, per_client, {"b": [2], "a": [1], "c": [3]}) == {"m": 1.0}
    assert calls == [[[1], [2]]]  # in the order of the clients' metrics; a client without metrics left out
