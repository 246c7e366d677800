"""FedFomo (Zhang et al., ICLR 2021): the weights (Eq. 4) and the update (Eq. 5) by hand, the epsilon-greedy choice,
one client's update from its validation loss by hand, two rounds end to end (P is the sum of the uploaded weights,
worked out from the round-1 models), bad options."""

import contextlib
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.func import functional_call

from fedlit.core.errors import ConfigError
from fedlit.core.roles import RoleRule
from fedlit.module import FederatedModule
from fedlit.strategies import ClientUpdate, FedFomo
from fedlit.strategies.fedfomo import EXTRAS_KEY, fomo_choice, fomo_update, fomo_weights
from tests.strategies.test_fedper import CLIENTS, tiny_federation, tiny_module, train_split


def test_the_weights_by_hand():
    # L_i = 1; L_n = [0.5, 1.5, 0.2], d_n = [2, 1, 4]: w = [0.5 / 2, -0.5 / 1, 0.8 / 4] = [0.25, -0.5, 0.2]
    assert fomo_weights(1.0, [0.5, 1.5, 0.2], [2.0, 1.0, 4.0]).tolist() == pytest.approx([0.25, -0.5, 0.2])
    assert fomo_weights(1.0, [1.0], [0.0]).tolist() == [0.0]  # the same model: no gain, no division by 0


def test_the_update_by_hand():
    own = {"p": torch.tensor([0.0, 0.0])}
    others = [{"p": torch.tensor([1.0, 0.0])}, {"p": torch.tensor([5.0, 5.0])}, {"p": torch.tensor([0.0, 9.0])}]
    # w~ = [0.25, 0, 0.2] / 0.45 = [5/9, 0, 4/9]: [0, 0] + 5/9 [1, 0] + 4/9 [0, 9] = [0.5556, 4]
    got = fomo_update(own, others, torch.tensor([0.25, -0.5, 0.2], dtype=torch.float64))["p"]
    assert got.tolist() == pytest.approx([5 / 9, 4.0])
    # no positive weight: unchanged
    got = fomo_update(own, others, torch.tensor([-1.0, 0.0, -0.1], dtype=torch.float64))["p"]
    assert got.tolist() == [0.0, 0.0]


def test_the_epsilon_greedy_choice():
    affinity = torch.tensor([0.1, 3.0, -1.0, 2.0], dtype=torch.float64)
    assert fomo_choice(affinity, 2, 0.0, torch.Generator().manual_seed(0)) == [1, 3]  # greedy: the top 2
    assert fomo_choice(affinity, 9, 0.0, torch.Generator().manual_seed(0)) == [1, 3, 0, 2]  # fewer than M: all
    picks = [tuple(fomo_choice(affinity, 2, 1.0, torch.Generator().manual_seed(s))) for s in range(40)]
    assert len(set(picks)) > 3 and all(len(set(p)) == 2 for p in picks)  # uniform: many pairs, never a repeat
    assert fomo_choice(affinity, 2, 1.0, torch.Generator().manual_seed(5)) == list(picks[5])  # seeded


class Lin(FederatedModule):
    """y ~ w . x, squared error."""

    def __init__(self):
        super().__init__(roles=[RoleRule("w.*", "shared")])
        self.w = nn.Linear(2, 1, bias=False)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return {"loss": (self.w(x).squeeze(-1) - y).pow(2).mean()}


def test_one_client_update_by_hand():
    module = Lin()
    with torch.no_grad():
        module.w.weight.copy_(torch.tensor([[1.0, 0.0]]))
    val = [(torch.tensor([[1.0, 0.0]]), torch.tensor([2.0]))]
    client = SimpleNamespace(
        eval_dataloader=lambda split: val,
        num_examples=lambda split: 1,
        autocast=contextlib.nullcontext,
        prepare_batch=lambda b: b,
        convert_output=lambda out: out,
    )
    models = {"a": {"w.weight": torch.tensor([[2.0, 0.0]])}, "b": {"w.weight": torch.tensor([[1.5, 2.0]])}}
    strategy = FedFomo()
    strategy.on_client_fit_start(
        pl_module=module,
        server_round=2,
        client_id="i",
        client=client,
        received_extras={"models": models, "clients": ["a", "i", "b"]},
    )
    # L_i = (1 - 2)^2 = 1; a: L = 0, d = 1, w = 1; b: L = (1.5 - 2)^2 = 0.25, d = |[0.5, 2]| = 2.061553, w = 0.363803
    # w~ = [1, 0.363803] / 1.363803 = [0.733244, 0.266756]; w = [1, 0] + 0.733244 [1, 0] + 0.266756 [0.5, 2]
    assert module.w.weight[0].tolist() == pytest.approx([1.866622, 0.533512], abs=1e-5)
    update = SimpleNamespace(extras={})
    strategy.on_client_fit_end(update=update)
    assert update.extras[EXTRAS_KEY].tolist() == pytest.approx([1.0, 0.0, 0.363803], abs=1e-5)


def val_loss(fed, client, params):
    x, y = train_split(fed, client, "val")
    return F.cross_entropy(functional_call(tiny_module(), params, (x,)), y).item()


def test_two_rounds_the_affinities_are_the_weights_worked_out_from_the_round_one_models(tmp_path):
    one = tiny_federation(tmp_path / "one", FedFomo(), rounds=1)
    one.fit()
    models = {c: dict(m) for c, m in one.strategy.models.items()}
    assert set(models) == set(CLIENTS) and not one.strategy.affinity.any()  # round 1: nothing to weigh
    fed = tiny_federation(tmp_path / "two", FedFomo(), rounds=2)
    results = fed.fit()
    for i, client in enumerate(CLIENTS):
        own = models[client]
        expected = torch.zeros(3, dtype=torch.float64)
        for j, other in enumerate(CLIENTS):
            if other != client:
                distance = math.sqrt(sum(float((models[other][n] - own[n]).double().pow(2).sum()) for n in own))
                expected[j] = (val_loss(fed, client, own) - val_loss(fed, client, models[other])) / distance
        torch.testing.assert_close(fed.strategy.affinity[i], expected, atol=1e-5, rtol=0)
    assert (fed.strategy.affinity > 0).any()
    # downloads: round 1 each client's model (43 floats), round 2 its own and the 2 others'; uploads: the model
    # each round, plus the 3 weights of round 2... and round 1 (zeros, as every client sends its vector)
    assert results["comm"]["download_bytes"] == 3 * 43 * 4 + 3 * 3 * 43 * 4
    assert results["comm"]["upload_bytes"] == 3 * 2 * (43 + 3) * 4


def test_the_server_keeps_each_upload_and_sums_the_weights_into_the_affinities():
    strategy = FedFomo(num_models=1, eps=0.0)
    strategy.initialize({"p": torch.zeros(2)}, ["a", "b", "c"])
    for k, weights in enumerate(([0.0, 0.5, -1.0], [0.0, 0.25, 2.0])):
        update = ClientUpdate("a", 1, {"p": torch.full((2,), float(k))}, extras={EXTRAS_KEY: torch.tensor(weights)})
        returned = strategy.aggregate(k + 1, [update])
        assert returned["p"].tolist() == [0.0, 0.0]  # the initial model, whatever is uploaded
        strategy.global_state = returned
    assert strategy.affinity[0].tolist() == [0.0, 0.75, 1.0] and not strategy.affinity[1:].any()
    assert strategy.models["a"]["p"].tolist() == [1.0, 1.0] and strategy.global_state["p"].tolist() == [0.0, 0.0]
    # greedy: "a" is sent the model of the highest affinity among those uploaded ("b" has none: only "a" is there)
    strategy.global_state = strategy.aggregate(
        3, [ClientUpdate("c", 1, {"p": torch.full((2,), 7.0)}), ClientUpdate("b", 1, {"p": torch.full((2,), 5.0)})]
    )
    assert list(strategy.configure_client_extras(4, "a")["models"]) == ["c"]
    assert strategy.configure_client(4, "a")["p"].tolist() == [1.0, 1.0]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_models": 0}, "num_models=0 must be"),
        ({"eps": 1.5}, "eps=1.5 must be in"),
        ({"split": "test"}, "split='test' is not one of"),
    ],
)
def test_bad_options_are_named(kwargs, match):
    with pytest.raises(ConfigError, match=r"strategy\.init_args\." + match):
        FedFomo(**kwargs)
