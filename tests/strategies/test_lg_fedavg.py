"""LG-FedAvg: the head (global layers) is FedAvg'd, the representation stays personal; a 2-round run recomputed
with plain torch (the reference of tests/strategies/test_fedper.py)."""

from __future__ import annotations

import pytest

from fedlit import RoleRule
from fedlit.core.errors import ConfigError
from fedlit.models import MLP
from fedlit.strategies import LGFedAvg
from fedlit.tasks import ClassificationModule
from tests.conftest import TinyMLP
from tests.strategies.test_fedper import BODY, CLIENTS, HEAD, assert_close, replay, tiny_federation, tiny_module


def test_the_representation_is_kept_the_head_averaged_and_only_the_head_uploaded(tmp_path):
    fed = tiny_federation(tmp_path / "lg", LGFedAvg())
    results = fed.fit()
    roles = fed.module.parameter_roles()
    assert {n for n, r in roles.items() if r == "personal"} == BODY
    assert {n for n, r in roles.items() if r == "shared"} == HEAD
    server, personal = replay(fed, HEAD, lambda step: BODY | HEAD)
    assert_close(fed.strategy.global_state, server)
    for client in CLIENTS:
        assert_close(fed.store.tensors(client), personal[client])
    # uploads: the head only, 3 clients x 2 rounds x (3 x 5 + 3) float32
    assert results["comm"]["upload_bytes"] == 3 * 2 * 18 * 4


def test_normalization_statistics_of_the_representation_are_personal_and_frozen_tensors_stay_frozen():
    module = ClassificationModule(
        backbone=TinyMLP(),
        num_classes=3,
        roles=[RoleRule("backbone.0.*", "frozen"), RoleRule("backbone.1.*", "shared")],
    )
    roles = LGFedAvg().configure_roles(module.parameter_roles())
    assert roles["backbone.0.weight"] == "frozen"
    assert {roles[n] for n in ("backbone.1.weight", "backbone.1.running_mean", "backbone.1.num_batches_tracked")} == {
        "personal"
    }
    assert roles["head.weight"] == roles["head.bias"] == "shared"


def test_a_personal_head_rule_of_the_model_is_overridden():
    module = ClassificationModule(
        backbone=MLP(num_features=4, hidden=[5], norm="none"),
        num_classes=3,
        roles=[RoleRule("backbone.*", "shared"), RoleRule("head.*", "personal")],
    )
    assert LGFedAvg().configure_roles(module.parameter_roles())["head.weight"] == "shared"


def test_a_head_that_matches_nothing_is_named():
    with pytest.raises(ConfigError, match=r"strategy\.init_args\.head='fc\.\*' matches no trainable parameter"):
        LGFedAvg(head="fc.*").configure_roles(tiny_module().parameter_roles())
