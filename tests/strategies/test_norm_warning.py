"""FedBN, SiloBN and FedPxN warn at fit start when the model has nothing for them to keep personal."""

import warnings

import pytest
from torch import nn

from fedlit.core.roles import RoleRule
from fedlit.module import FederatedModule
from fedlit.strategies import FedBN, FedPxN, SiloBN


class Net(FederatedModule):
    def __init__(self, norm, freeze_norm=False):
        super().__init__(roles=[RoleRule("backbone.1.*", "frozen")] if freeze_norm else [])
        self.backbone = nn.Sequential(nn.Linear(2, 2), norm)
        self.head = nn.Linear(2, 1)


def start(strategy, module):
    """What the federation does before round 1: adopt the strategy's roles, then ``on_fit_start``."""
    module.set_parameter_roles(strategy.configure_roles(module.parameter_roles()))
    strategy.on_fit_start(trainer=None, pl_module=module)


@pytest.mark.parametrize(("strategy", "like"), [(FedBN(), "FedAvg"), (FedPxN(), "FedProx"), (SiloBN(), "FedAvg")])
def test_a_model_without_normalization_layers_warns_and_names_the_model(strategy, like):
    with pytest.warns(UserWarning, match=rf"no trainable normalization.*behaves like {like} here") as record:
        start(strategy, Net(nn.Identity()))
    message = str(record[0].message)
    assert message.startswith(f"{type(strategy).__name__}: the model Net(backbone=Sequential)")
    assert "no normalization-like module" in message and f"or use {like}" in message


def test_a_frozen_normalization_layer_warns_and_is_listed():
    with pytest.warns(UserWarning, match=r"its normalization-like modules \['BatchNorm1d'\] are frozen or not"):
        start(FedBN(), Net(nn.BatchNorm1d(2), freeze_norm=True))


def test_silobn_warns_when_the_trainable_norm_has_no_statistics():
    match = r"SiloBN: .*no trainable normalization statistics .*\['LayerNorm'\] are frozen, without running"
    with pytest.warns(UserWarning, match=match):
        start(SiloBN(), Net(nn.LayerNorm(2)))


@pytest.mark.parametrize(
    ("strategy", "norm"), [(FedBN(), nn.LayerNorm(2)), (FedPxN(), nn.BatchNorm1d(2)), (SiloBN(), nn.BatchNorm1d(2))]
)
def test_a_trainable_normalization_layer_does_not_warn(strategy, norm):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        start(strategy, Net(norm))
