"""FedAvg-FT and FedProx-FT: the federation is FedAvg's (FedProx's), each client is evaluated after k plain local
steps from the global model on its own train split; values recomputed here with plain torch."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from fedlit import Federation, RoleRule
from fedlit.commands.cost import estimate_costs, format_table
from fedlit.core.errors import ConfigError
from fedlit.models import MLP
from fedlit.strategies import FedAvg, FedAvgFT, FedProx, FedProxFT
from fedlit.tasks import ClassificationModule
from tests.conftest import TinyTabular

HEAD_PERSONAL = [RoleRule("backbone.*", "shared"), RoleRule("head.*", "personal")]


def _federation(out_dir, strategy, roles=None, rounds=2) -> Federation:
    # batch 16 >= the 15 training samples of a client: a fine-tuning step is a full-batch gradient step, whatever
    # the order of the samples; SGD without momentum, so k steps are worked out by hand below
    torch.manual_seed(0)
    module = ClassificationModule(
        backbone=MLP(num_features=4, hidden=[5], norm="none"),
        num_classes=3,
        lr=0.5,
        roles=roles or [RoleRule("backbone.*", "shared"), RoleRule("head.*", "shared")],
    )
    return Federation(
        module,
        TinyTabular(batch_size=16),
        strategy,
        rounds=rounds,
        out_dir=out_dir,
        progress_bar=False,
        accelerator="cpu",
        local_steps=2,
        seed=0,
    )


def _split(fed: Federation, client: str, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    data = fed.datamodule.data
    idx = torch.as_tensor(data.splits[client][split])
    return data.inputs[idx], data.targets[idx]


def _finetuned_loss(fed: Federation, state: dict[str, torch.Tensor], client: str, steps: int, split: str) -> float:
    """Cross-entropy on ``split`` of the model with ``state`` after ``steps`` full-batch gradient steps (lr 0.5)."""
    model = copy.deepcopy(fed.module)
    model.load_state_dict({**model.state_dict(), **state})
    x, y = _split(fed, client, "train")
    params = [p for p in model.parameters() if p.requires_grad]
    for _ in range(steps):
        grads = torch.autograd.grad(F.cross_entropy(model(x), y), params)
        with torch.no_grad():
            for p, g in zip(params, grads, strict=True):
                p -= 0.5 * g
    x, y = _split(fed, client, split)
    with torch.no_grad():
        return F.cross_entropy(model(x), y).item()


def test_each_client_is_evaluated_after_k_steps_from_the_global_model_and_the_federation_is_fedavgs(tmp_path):
    fed = _federation(tmp_path / "ft", FedAvgFT(finetune_steps=3))
    results = fed.fit()
    plain = _federation(tmp_path / "avg", FedAvg())
    plain_results = plain.fit()
    # the federation is FedAvg's, bit for bit: fine-tuning before evaluating leaves nothing behind
    assert all(torch.equal(fed.strategy.global_state[n], t) for n, t in plain.strategy.global_state.items())
    state = fed.strategy.global_state
    for client in ("c0", "c1", "c2"):
        assert results["last"]["clients"][client]["loss"] == pytest.approx(
            _finetuned_loss(fed, state, client, 3, "test"), abs=1e-5
        )
        # the global model, evaluated beside without fine-tuning, is plain FedAvg's evaluation
        assert results["global"]["last"]["clients"][client]["loss"] == pytest.approx(
            plain_results["last"]["clients"][client]["loss"], abs=1e-6
        )
        assert abs(results["last"]["clients"][client]["loss"] - plain_results["last"]["clients"][client]["loss"]) > 1e-3
    # 3 clients x 3 steps x 2 evaluated rounds, counted as compute and said in results.md
    assert results["compute"] == {"eval_finetune_steps": 18}
    assert json.loads((tmp_path / "ft" / "results.json").read_text())["compute"]["eval_finetune_steps"] == 18
    assert "Fine-tuning before evaluation: 18 local steps" in (tmp_path / "ft" / "results.md").read_text()
    assert plain_results["compute"] == {"eval_finetune_steps": 0}


def test_a_personal_head_is_fine_tuned_from_the_stored_one_and_never_saved(tmp_path):
    fed = _federation(tmp_path / "ft", FedAvgFT(finetune_steps=2), roles=HEAD_PERSONAL)
    results = fed.fit()
    plain = _federation(tmp_path / "avg", FedAvg(), roles=HEAD_PERSONAL)
    plain.fit()
    for client in ("c0", "c1", "c2"):
        stored, plain_stored = fed.store.tensors(client), plain.store.tensors(client)
        assert stored.keys() == plain_stored.keys() and all(torch.equal(stored[n], plain_stored[n]) for n in stored)
        state = {**fed.strategy.global_state, **stored}
        assert results["last"]["clients"][client]["loss"] == pytest.approx(
            _finetuned_loss(fed, state, client, 2, "test"), abs=1e-5
        )


def test_fedprox_ft_trains_as_fedprox_and_fine_tunes_without_the_proximal_term(tmp_path):
    fed = _federation(tmp_path / "ft", FedProxFT(finetune_steps=1, mu=0.5))
    results = fed.fit()
    prox = _federation(tmp_path / "prox", FedProx(mu=0.5))
    prox.fit()
    assert all(torch.equal(fed.strategy.global_state[n], t) for n, t in prox.strategy.global_state.items())
    for client in ("c0", "c1", "c2"):
        assert results["last"]["clients"][client]["loss"] == pytest.approx(
            _finetuned_loss(fed, fed.strategy.global_state, client, 1, "test"), abs=1e-5
        )


def test_the_cost_report_counts_the_fine_tuning_steps(tmp_path):
    torch.manual_seed(0)
    module = ClassificationModule(backbone=MLP(num_features=4, hidden=[5], norm="none"), num_classes=3)
    report = estimate_costs(module, [FedAvgFT(finetune_steps=4), FedAvg()], num_clients=3, rounds=5, eval_every=1)
    rows = {row["name"]: row for row in report["strategies"]}
    assert rows["FedAvgFT"]["eval_finetune_steps"] == {"per_client_per_evaluation": 4, "run": 4 * 3 * 5}
    assert rows["FedAvg"]["eval_finetune_steps"] == {"per_client_per_evaluation": 0, "run": 0}
    assert (
        "FedAvgFT fine-tunes before every evaluation: 4 local steps per client and evaluation, 60 over the run"
        in format_table(report)
    )


@pytest.mark.parametrize("steps", [0, -2, 1.5, True])
def test_bad_fine_tuning_steps_are_named(steps):
    with pytest.raises(ConfigError, match=r"strategy.init_args.finetune_steps=.* must be an int >= 1"):
        FedAvgFT(finetune_steps=steps)
