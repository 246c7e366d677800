"""The role summary printed at the start of a fit lists the recipe's rules that match nothing, not the module's
own defaults (a classifier over ``Identity`` has no ``backbone.*`` tensor)."""

from __future__ import annotations

import pytest

from fedlit.core.roles import RoleRule
from fedlit.engine.loop import rounds
from fedlit.models import Identity
from fedlit.tasks import ClassificationModule


class _Run:
    def __init__(self, module):
        self.module, self.strategy = module, "FedAvg()"
        self.fabric = type("Fabric", (), {"loggers": []})()
        self.server_round = 0


def test_a_default_rule_that_matches_nothing_is_not_reported(capsys):
    rounds.log_role_summary(_Run(ClassificationModule(backbone=Identity(num_features=4), num_classes=2)))
    printed = capsys.readouterr().out
    assert "| shared | 2 | 10 |" in printed  # head.weight (2 x 4) and head.bias (2)
    assert "match no tensor" not in printed


def test_a_recipe_rule_that_matches_nothing_is_reported(capsys):
    module = ClassificationModule(
        backbone=Identity(num_features=4), num_classes=2, roles=[RoleRule("backbone.fc.*", "personal")]
    )
    with pytest.warns(UserWarning, match="role rule pattern 'backbone.fc.\\*'"):
        rounds.log_role_summary(_Run(module))
    assert "Role rules that match no tensor: 'backbone.fc.*' -> personal" in capsys.readouterr().out
