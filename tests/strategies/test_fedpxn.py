"""FedPxN (Yang et al., "Towards the Practical Utility of Federated Learning in the Medical Domain", CHIL 2023) =
FedBN + FedProx on the non-normalization shared tensors, and the variant of the authors' code."""

import pytest
import torch
from torch import nn

from fedlit.core.roles import RoleRule
from fedlit.module import FederatedModule
from fedlit.strategies import FedProx, FedPxN
from fedlit.strategies.common.aggregators import MedianAggregator
from tests.conftest import make_federation


class LinNorm(FederatedModule):
    """lin (2 -> 1, no bias) then a BatchNorm1d(1): one shared weight vector, one normalization layer."""

    def __init__(self, roles=None):
        super().__init__(roles=roles if roles is not None else [RoleRule("*", "shared")])
        self.lin = nn.Linear(2, 1, bias=False)
        self.norm = nn.BatchNorm1d(1)


def prepared(strategy):
    module = LinNorm()
    module.set_parameter_roles(strategy.configure_roles(module.parameter_roles()))
    return module


def set_trained_values(module):
    with torch.no_grad():
        module.lin.weight.copy_(torch.tensor([[3.0, 1.0]]))
        module.norm.weight.fill_(2.0)
        module.norm.bias.fill_(0.5)
        module.norm.running_mean.fill_(7.0)  # a buffer: never in the proximal term


def test_roles_are_fedbns():
    roles = prepared(FedPxN()).parameter_roles()
    assert roles.names("shared") == ["lin.weight"]
    assert set(roles.names("personal")) == {
        "norm.weight",
        "norm.bias",
        "norm.running_mean",
        "norm.running_var",
        "norm.num_batches_tracked",
    }


def test_normalization_layers_are_left_out_of_the_proximal_term():
    strategy = FedPxN(mu=0.5)
    module = prepared(strategy)
    received = {n: torch.ones_like(t) for n, t in module.named_tensors("shared").items()}  # w^t = [[1, 1]]
    assert set(received) == {"lin.weight"}
    set_trained_values(module)
    strategy.on_client_fit_start(received=received)
    loss = strategy.training_loss(module, torch.tensor(2.0), batch=None)
    # 2 + mu/2 ||w_s - w_s^t||^2 = 2 + 0.25 * ((3 - 1)^2 + (1 - 1)^2) = 3; norm.weight = 2, norm.bias = 0.5 and
    # the running mean 7 add nothing
    assert loss.item() == pytest.approx(3.0)
    loss.backward()
    # d/dw_s = mu (w_s - w_s^t) = 0.5 * [2, 0]; the normalization parameters get no gradient at all
    assert module.lin.weight.grad.tolist() == [[1.0, 0.0]]
    assert module.norm.weight.grad is None and module.norm.bias.grad is None


def test_plain_fedprox_on_the_same_module_would_pull_the_norm_layer():
    # The contrast that makes the test above meaningful: with FedProx's roles the norm layer is shared and pulled.
    strategy = FedProx(mu=0.5)
    module = prepared(strategy)
    received = {
        n: torch.ones_like(t) if t.is_floating_point() else t.clone() for n, t in module.named_tensors("shared").items()
    }
    set_trained_values(module)
    strategy.on_client_fit_start(received=received)
    # 2 + 0.25 * (4 + (2 - 1)^2 + (0.5 - 1)^2) = 3.3125
    assert strategy.training_loss(module, torch.tensor(2.0), None).item() == pytest.approx(3.3125)


def test_prox_on_norm_initial_pulls_norm_parameters_toward_their_initial_values():
    strategy = FedPxN(mu=0.5, prox_on_norm_initial=True)
    module = prepared(strategy)
    strategy.on_fit_start(trainer=None, pl_module=module)  # before round 1: BN weight 1, bias 0
    assert {n: t.tolist() for n, t in strategy.state_dict()["norm_initial"].items()} == {
        "norm.weight": [1.0],
        "norm.bias": [0.0],
    }
    set_trained_values(module)
    strategy.on_client_fit_start(received={"lin.weight": torch.ones(1, 2)})
    loss = strategy.training_loss(module, torch.tensor(2.0), batch=None)
    # 2 + mu/2 (||w_s - w_s^t||^2 + ||w_n - w_n^0||^2) = 2 + 0.25 * (4 + (2 - 1)^2 + (0.5 - 0)^2) = 3.3125
    assert loss.item() == pytest.approx(3.3125)
    loss.backward()
    # d/dw_n = mu (w_n - w_n^0): weight 0.5 * 1 = 0.5, bias 0.5 * 0.5 = 0.25
    assert module.lin.weight.grad.tolist() == [[1.0, 0.0]]
    assert module.norm.weight.grad.tolist() == [0.5] and module.norm.bias.grad.tolist() == [0.25]


def test_frozen_normalization_is_never_pulled():
    strategy = FedPxN(mu=0.5, prox_on_norm_initial=True)
    module = LinNorm(roles=[RoleRule("*", "shared"), RoleRule("norm.*", "frozen")])
    module.set_parameter_roles(strategy.configure_roles(module.parameter_roles()))
    strategy.on_fit_start(trainer=None, pl_module=module)
    assert strategy.state_dict()["norm_initial"] == {}


def with_distinct_norm(federation):
    """TinyMLP's BatchNorm1d(8) set to values that neither its initialization (weight 1, bias 0) nor training
    produce, so that the initial values the strategy keeps can be told from any other capture."""
    bn = federation.module.backbone[1]
    with torch.no_grad():
        bn.weight.copy_(torch.linspace(0.5, 1.5, 8))
        bn.bias.copy_(torch.linspace(-0.3, 0.4, 8))
    return federation


def test_runs_keep_the_initial_norm_values_and_resume_exactly(tmp_path):
    def strategy():
        return FedPxN(mu=0.5, prox_on_norm_initial=True)

    initial = {"backbone.1.weight": torch.linspace(0.5, 1.5, 8), "backbone.1.bias": torch.linspace(-0.3, 0.4, 8)}
    straight = with_distinct_norm(make_federation(tmp_path / "straight", strategy(), rounds=4))
    straight_results = straight.fit()
    with_distinct_norm(make_federation(tmp_path / "resumed", strategy(), rounds=2)).fit()
    # The resumed run's live model holds BatchNorm's own initialization (weight 1, bias 0): the values before
    # round 1 can only come from the checkpoint.
    resumed = make_federation(tmp_path / "resumed", strategy(), rounds=4)
    resumed_results = resumed.fit(ckpt_path=tmp_path / "resumed" / "checkpoints" / "last.ckpt")
    for federation in (straight, resumed):
        kept = federation.strategy.state_dict()["norm_initial"]
        assert kept.keys() == initial.keys()
        assert all(torch.equal(kept[n], initial[n]) for n in initial)
    # After 4 rounds every client's normalization parameters have moved away from those values: a strategy that
    # took them at any later time (a round's start, a resume) would keep other values.
    for client in straight.client_ids:
        trained = straight.store.tensors(client)
        assert all((trained[n] - initial[n]).abs().max() > 1e-3 for n in initial)
    # and the proximal term pulled toward the same anchor in both runs
    assert resumed_results["last"] == straight_results["last"]
    # The default run keeps nothing of the sort and shares no normalization tensor.
    paper = make_federation(tmp_path / "paper", FedPxN(), rounds=1)
    paper.fit()
    assert paper.strategy.state_dict()["norm_initial"] == {}
    assert not any("backbone.1." in n for n in paper.strategy.global_state)


def test_constructor_names_bad_options_and_repr():
    with pytest.raises(ValueError, match=r"strategy.init_args.mu=-1"):
        FedPxN(mu=-1)
    with pytest.raises(ValueError, match=r"strategy.init_args.prox_on_norm_initial='yes'"):
        FedPxN(prox_on_norm_initial="yes")
    assert repr(FedPxN()) == "FedPxN(mu=0.01, weighting='num_examples', prox_on_norm_initial=False)"
    # FedAvg's options reach FedAvg through FedProx (FedBN's constructor takes no mu).
    strategy = FedPxN(mu=0.2, weighting="uniform", aggregator=MedianAggregator())
    assert (strategy.mu, strategy.weighting, type(strategy.aggregator)) == (0.2, "uniform", MedianAggregator)
