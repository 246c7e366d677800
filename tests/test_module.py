"""FederatedModule's views of its tensors by role: built once, rebuilt after any change of structure or roles."""

from __future__ import annotations

import torch
from torch import nn

from fedlit import FedAvg, RoleRule
from fedlit.core.roles import ParameterRoles
from fedlit.tasks import ClassificationModule
from tests.conftest import TinyMLP, make_federation


def _module() -> ClassificationModule:
    torch.manual_seed(0)
    return ClassificationModule(
        backbone=TinyMLP(), num_classes=3, roles=[RoleRule("backbone.*", "shared"), RoleRule("head.*", "personal")]
    )


def test_named_tensors_are_the_live_tensors_of_each_role():
    module = _module()
    personal = module.named_tensors("personal")
    assert sorted(personal) == ["head.bias", "head.weight"]
    assert personal["head.weight"] is module.head.weight
    personal.clear()  # the caller's own dict: the next call is whole
    assert sorted(module.named_tensors("personal")) == ["head.bias", "head.weight"]


def test_named_tensors_follow_a_replaced_submodule():
    module = _module()
    old = module.named_tensors("personal")["head.weight"]
    module.head = nn.Linear(old.shape[1], old.shape[0])
    assert module.named_tensors("personal")["head.weight"] is module.head.weight


def test_named_tensors_follow_a_conversion_that_replaces_buffers():
    module = _module()
    before = module.named_tensors("shared")["backbone.1.running_mean"]
    module.to(torch.float64)  # buffers become new tensors, without registering anything
    after = module.named_tensors("shared")["backbone.1.running_mean"]
    assert after is not before and after.dtype == torch.float64
    assert after is dict(module.named_buffers())["backbone.1.running_mean"]


def test_new_roles_give_new_views_and_train_mode():
    module = _module()
    assert "head.weight" in module.named_tensors("personal")
    module.set_train_mode()
    assert module.backbone.training
    frozen_backbone = [RoleRule("backbone.*", "frozen"), RoleRule("head.*", "personal")]
    module.set_parameter_roles(ParameterRoles.from_module(module, frozen_backbone))
    assert not any(n.startswith("backbone.") for n in module.named_tensors("shared", "personal"))
    module.set_train_mode()
    assert not module.backbone[1].training and module.head.training


def test_a_client_turn_walks_no_module_once_the_views_are_built(tmp_path, monkeypatch):
    """A small model's step costs less than walking its modules (named_tensors, set_train_mode, the BatchNorm
    layers): a turn reuses what the first one built."""
    federation = make_federation(tmp_path, FedAvg(), rounds=1, local_steps=1)
    federation.setup()
    federation.fit_client(1, "c0")
    walks = []
    original = nn.Module.named_modules

    def counted(self, *args, **kwargs):
        walks.append(type(self).__name__)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(nn.Module, "named_modules", counted)
    federation.fit_client(1, "c1")
    assert walks == []


def test_a_copy_or_pickle_of_a_trained_module_carries_none_of_its_views(tmp_path):
    import copy
    import pickle

    federation = make_federation(tmp_path, FedAvg(), rounds=1, local_steps=1)
    federation.setup()
    federation.fit_client(1, "c0")  # builds the views and keeps an optimizer wrapped by this Fabric
    module = federation.module
    assert module._derived
    for twin in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
        assert twin._derived == {}
        assert twin.named_tensors("shared")["backbone.0.weight"] is twin.backbone[0].weight
