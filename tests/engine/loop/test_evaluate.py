"""Evaluating personalized methods: the global model beside the personalized ones, unseen clients (with and
without fine-tuning), their tags in metrics.csv and TensorBoard; values recomputed here with plain torch."""

from __future__ import annotations

import copy
import csv
import json

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import tests.conftest
from fedlit import Federation, RoleRule
from fedlit.commands.cost import estimate_costs
from fedlit.core.errors import ConfigError
from fedlit.core.tensors import nbytes as state_nbytes
from fedlit.models import MLP
from fedlit.strategies import APPLE, EPFL, FedMetaMed, PGFed
from fedlit.strategies.fedavg import FedAvg
from fedlit.tasks import ClassificationModule
from tests.conftest import TinyTabular, make_federation
from tests.strategies.test_epfl import LORA_ROLES, LoRAMLP, _aggregate, _strategy


def _split(fed: Federation, client: str, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    data = fed.datamodule.data
    idx = torch.as_tensor(data.splits[client][split])
    return data.inputs[idx], data.targets[idx]


def _test_loss(module: torch.nn.Module, state: dict[str, torch.Tensor], fed: Federation, client: str) -> float:
    """Cross-entropy of a copy of ``module`` with ``state`` loaded, on ``client``'s test split, by hand."""
    model = copy.deepcopy(module)
    model.load_state_dict({**model.state_dict(), **state})
    model.eval()
    x, y = _split(fed, client, "test")
    with torch.no_grad():
        return F.cross_entropy(model(x), y).item()


def _csv(path) -> list[dict[str, str]]:
    with open(path / "metrics.csv", newline="") as file:
        return list(csv.DictReader(file))


def test_pgfed_is_also_evaluated_with_theta_glob(tmp_path):
    fed = make_federation(tmp_path, PGFed(), rounds=2)
    results = fed.fit()
    strategy = fed.strategy
    ours, glob = results["last"]["clients"], results["global"]["last"]["clients"]
    assert set(glob) == {"c0", "c1", "c2"} and results["global"]["last"]["round"] == 2
    for client in ("c0", "c1", "c2"):  # every tensor is shared here: theta_i against theta_glob
        assert ours[client]["loss"] == pytest.approx(
            _test_loss(fed.module, strategy.local_states[client], fed, client), abs=1e-5
        )
        assert glob[client]["loss"] == pytest.approx(
            _test_loss(fed.module, strategy.global_state, fed, client), abs=1e-5
        )
        assert abs(glob[client]["loss"] - ours[client]["loss"]) > 1e-3
    rows = _csv(tmp_path)
    assert {(r["round"], r["split"]) for r in rows if r["client"] == "c0" and r["metric"] == "accuracy"} == {
        (str(t), s) for t in (1, 2) for s in ("val", "test", "global/val", "global/test")
    }
    server = {(r["split"], r["metric"]): float(r["value"]) for r in rows if r["round"] == "2" and not r["client"]}
    assert server["global/test", "loss_mean"] == pytest.approx(
        sum(_test_loss(fed.module, strategy.global_state, fed, c) for c in ("c0", "c1", "c2")) / 3, abs=1e-5
    )
    tags = EventAccumulator(str(tmp_path / "tensorboard")).Reload().Tags()["scalars"]
    assert {
        "global/client/c0/val/accuracy",
        "global/server/val/accuracy_mean",
        "global/server/test/loss_mean",
        "server/val/accuracy_mean",
    } <= set(tags)
    text = (tmp_path / "results.md").read_text()
    assert "## Global model" in text and "### Global model: test, last round (round 2)" in text
    assert json.loads((tmp_path / "results.json").read_text())["global"]["last"]["clients"]["c1"] == glob["c1"]
    # the evaluation downloads theta_i and theta_glob; `fedlit cost` counts both
    fresh = make_federation(tmp_path / "fresh", PGFed()).module
    estimate = estimate_costs(fresh, [PGFed()], num_clients=3, rounds=2)["strategies"][0]["eval_download_bytes"]
    assert estimate["run"] == fed.state.comm["eval_download_bytes"] == 2 * 3 * 2 * state_nbytes(strategy.global_state)
    # `fedlit test` of the last checkpoint evaluates the global model too
    tested = fed.evaluate("test", tmp_path / "checkpoints" / "last.ckpt")
    assert tested["global"]["clients"] == glob and tested["clients"] == ours


@pytest.mark.parametrize(
    "strategy", [APPLE(lr_p=0.1, decay_rounds=2), FedMetaMed(schedule_rounds=1)], ids=["apple", "fedmetamed"]
)
def test_apple_and_fedmetamed_are_also_evaluated_with_their_global_model(tmp_path, strategy):
    # APPLE: sum_j p0_j core_j; FedMetaMed: the client's deputy. Each client keeps its personal tensors.
    fed = make_federation(tmp_path, strategy, rounds=1)
    results = fed.fit()
    ours, glob = results["last"]["clients"], results["global"]["last"]["clients"]
    for client in ("c0", "c1", "c2"):
        state = {**fed.store.tensors(client), **strategy.global_model_state(client)}
        assert glob[client]["loss"] == pytest.approx(_test_loss(fed.module, state, fed, client), abs=1e-5)
    assert any(abs(glob[c]["loss"] - ours[c]["loss"]) > 1e-4 for c in ours)
    assert FedMetaMed(evaluate="deputy").global_model_state("c0") is None


def test_fedavg_has_no_global_section(tmp_path):
    results = make_federation(tmp_path, FedAvg(), rounds=1).fit()
    assert "global" not in results and "Global model" not in (tmp_path / "results.md").read_text()
    assert not [r for r in _csv(tmp_path) if r["split"].startswith("global")]


def test_epfl_is_also_evaluated_with_the_mean_a_under_each_clients_own_b_and_head(tmp_path, monkeypatch):
    monkeypatch.setattr(tests.conftest, "TinyMLP", LoRAMLP)
    fed = make_federation(tmp_path, EPFL(), rounds=2, roles=LORA_ROLES)
    results = fed.fit()
    strategy = fed.strategy
    glob, ours = results["global"]["last"]["clients"], results["last"]["clients"]
    for client in ("c0", "c1", "c2"):
        personal = fed.store.tensors(client)  # its B and head, kept under the global A
        assert glob[client]["loss"] == pytest.approx(
            _test_loss(fed.module, {**personal, **strategy.global_state}, fed, client), abs=1e-5
        )
        assert ours[client]["loss"] == pytest.approx(
            _test_loss(fed.module, {**personal, **strategy.mixes[client]}, fed, client), abs=1e-5
        )
    assert any(abs(glob[c]["loss"] - ours[c]["loss"]) > 1e-5 for c in glob)


def test_epfl_global_model_state_by_hand():
    strategy = _strategy()
    _aggregate(strategy)  # A of block 0: 1, 2, 4 from clients of 10, 20, 30 samples
    glob = strategy.global_model_state("c0")
    assert glob["blocks.0.lora_A.weight"].item() == pytest.approx((10 * 1 + 20 * 2 + 30 * 4) / 60)
    assert glob.keys() == strategy.mixes["c0"].keys()  # every shared tensor: the A only
    assert FedAvg().global_model_state("c0") is None


# --- unseen clients ---------------------------------------------------------------------------------------------------


def _unseen_federation(out_dir, steps: int, unseen=1, strategy=None) -> Federation:
    """3 clients of 15 training samples, one batch of 16: each local step is a full-batch gradient step."""
    torch.manual_seed(0)
    module = ClassificationModule(
        backbone=MLP(num_features=4, hidden=[5], norm="none"),
        num_classes=3,
        lr=0.5,
        roles=[RoleRule("backbone.*", "shared")],
    )
    return Federation(
        module,
        TinyTabular(batch_size=16),
        strategy or FedAvg(),
        rounds=2,
        out_dir=out_dir,
        progress_bar=False,
        accelerator="cpu",
        unseen_clients=unseen,
        unseen_finetune_steps=steps,
    )


def test_unseen_clients_never_train_and_are_tested_before_and_after_k_sgd_steps(tmp_path):
    trained = []

    class Recording(FedAvg):
        def on_client_fit_start(self, client_id: str) -> None:
            trained.append(client_id)

    fed = _unseen_federation(tmp_path, steps=3, strategy=Recording())
    results = fed.fit()
    assert sorted(set(trained)) == ["c0", "c1"] and fed.strategy.client_ids == ["c0", "c1"]
    assert set(results["last"]["clients"]) == {"c0", "c1"}  # the means leave c2 out
    assert results["last"]["summary"]["loss_mean"] == pytest.approx(
        (results["last"]["clients"]["c0"]["loss"] + results["last"]["clients"]["c1"]["loss"]) / 2
    )
    unseen = results["unseen"]
    assert unseen["round"] == 2 and unseen["finetune_steps"] == 3
    assert results["unseen_clients"] == ["c2"] and results["evaluation_only"] == []
    # by hand: c2 gets the global model, then 3 plain gradient steps (SGD, lr 0.5, no momentum) on its 15 samples
    model = copy.deepcopy(fed.module)
    model.load_state_dict({**model.state_dict(), **fed.strategy.global_state})
    before = _test_loss(model, {}, fed, "c2")
    x, y = _split(fed, "c2", "train")
    params = [p for p in model.parameters() if p.requires_grad]
    for _ in range(3):
        grads = torch.autograd.grad(F.cross_entropy(model(x), y), params)
        with torch.no_grad():
            for p, g in zip(params, grads, strict=True):
                p -= 0.5 * g
    after = _test_loss(model, {}, fed, "c2")
    assert unseen["global"]["clients"]["c2"]["loss"] == pytest.approx(before, abs=1e-5)
    assert unseen["finetuned"]["clients"]["c2"]["loss"] == pytest.approx(after, abs=1e-5)
    assert abs(after - before) > 1e-3
    rows = [r for r in _csv(tmp_path) if r["client"] == "c2"]
    assert {(r["round"], r["split"]) for r in rows} == {("2", "unseen/test"), ("2", "unseen_finetuned/test")}
    tags = EventAccumulator(str(tmp_path / "tensorboard")).Reload().Tags()["scalars"]
    assert {"unseen/client/c2/test/loss", "unseen_finetuned/server/test/loss_mean"} <= set(tags)
    text = (tmp_path / "results.md").read_text()
    assert "## Unseen clients" in text and "after 3 local fine-tuning steps" in text
    tested = fed.evaluate("test", tmp_path / "checkpoints" / "last.ckpt")  # the same from the checkpoint
    assert tested["unseen"]["finetuned"]["clients"]["c2"]["loss"] == pytest.approx(after, abs=1e-5)
    assert set(tested["clients"]) == {"c0", "c1"}


def test_unseen_clients_by_name_without_fine_tuning(tmp_path):
    results = _unseen_federation(tmp_path, steps=0, unseen=["c0"]).fit()
    assert set(results["last"]["clients"]) == {"c1", "c2"}
    assert set(results["unseen"]["global"]["clients"]) == {"c0"} and "finetuned" not in results["unseen"]


@pytest.mark.parametrize(
    ("unseen", "steps", "expected"),
    [
        (["c9"], 0, r"\['c9'\] are not clients"),
        (3, 0, "holds out every client that trains"),
        (["c0", "c0"], 0, "lists a client twice"),
        (1, -1, "unseen_finetune_steps=-1 must be >= 0"),
    ],
)
def test_bad_unseen_settings_are_named(tmp_path, unseen, steps, expected):
    with pytest.raises(ConfigError, match=expected):
        _unseen_federation(tmp_path, steps=steps, unseen=unseen).fit()
