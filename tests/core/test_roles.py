import pytest
from torch import nn

from fedlit.core.roles import ParameterRoles, RoleRule


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)) for _ in range(4))
        self.head = nn.Linear(2, 1)


def test_last_matching_rule_wins_and_unmatched_get_default():
    roles = ParameterRoles.from_module(Net(), [RoleRule("blocks.*", "frozen"), RoleRule("blocks.1.*", "personal")])
    assert roles["blocks.0.0.weight"] == "frozen"
    assert roles["blocks.1.0.weight"] == "personal"
    assert roles["head.bias"] == "shared"


def test_buffers_follow_the_parameters_of_their_layer():
    roles = ParameterRoles.from_module(Net(), [RoleRule("*", "frozen"), RoleRule("blocks.2.1.weight", "personal")])
    assert roles["blocks.2.1.running_mean"] == "personal"
    assert roles["blocks.2.1.num_batches_tracked"] == "personal"
    assert roles["blocks.0.1.running_var"] == "frozen"
    assert roles.is_buffer("blocks.2.1.running_mean") and not roles.is_buffer("blocks.2.1.weight")


def test_depth_selection_first_and_last_layers():
    net = Net()
    first = ParameterRoles.from_module(net, [RoleRule("*", "frozen"), RoleRule("blocks.*", "shared", first=2)])
    assert first["blocks.1.0.weight"] == "shared" and first["blocks.2.0.weight"] == "frozen"
    last = ParameterRoles.from_module(net, [RoleRule("*", "frozen"), RoleRule("blocks.*", "shared", last=1)])
    assert [n for n in last.names("shared", buffers=False)] == [
        "blocks.3.0.weight",
        "blocks.3.0.bias",
        "blocks.3.1.weight",
        "blocks.3.1.bias",
    ]


def test_regex_patterns_and_norm_detection():
    roles = ParameterRoles.from_module(Net(), [RoleRule(r"re:\.0\.bias$", "personal")])
    assert roles["blocks.3.0.bias"] == "personal" and roles["blocks.3.0.weight"] == "shared"
    assert roles.is_norm("blocks.0.1.weight") and roles.is_norm("blocks.0.1.running_mean")
    assert not roles.is_norm("blocks.0.0.weight")


def test_with_roles_and_replace_return_new_objects():
    roles = ParameterRoles.from_module(Net(), [])
    fedbn = roles.replace(lambda n, r: roles.is_norm(n), "personal")
    assert fedbn["blocks.0.1.weight"] == "personal" and roles["blocks.0.1.weight"] == "shared"
    with pytest.raises(KeyError, match="not in the model"):
        roles.with_roles({"nope": "shared"})
    assert fedbn.counts()["personal"] == 4 * 5


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"role": "global"}, "not one of"),
        ({"role": "shared", "first": 1, "last": 1}, "not both"),
        ({"role": "shared", "first": 0}, "must be >= 1"),
    ],
)
def test_invalid_rules_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RoleRule("x", **kwargs)
