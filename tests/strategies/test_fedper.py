"""FedPer: the head stays personal, the body is FedAvg'd; a 2-round run recomputed here with plain torch.

The reference below (also used by the tests of LG-FedAvg, FedRep and FedBABU) replays a federation of full-batch
gradient steps: batch 16 >= a client's 15 training samples, SGD without momentum, so each local step is
``p <- p - lr * grad`` of the client's mean cross-entropy, whatever the order of its samples."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch.func import functional_call

from fedlit import Federation, RoleRule
from fedlit.core.errors import ConfigError
from fedlit.models import MLP
from fedlit.strategies import FedAvg, FedPer
from fedlit.tasks import ClassificationModule
from tests.conftest import TinyTabular

LR = 0.5
CLIENTS = ("c0", "c1", "c2")
HEAD = {"head.weight", "head.bias"}
BODY = {"backbone.layers.0.linear.weight", "backbone.layers.0.linear.bias"}


def tiny_module() -> ClassificationModule:
    """Linear(4, 5) -> ReLU -> Linear(5, 3), every tensor shared unless the strategy says otherwise (seed 0)."""
    torch.manual_seed(0)
    return ClassificationModule(
        backbone=MLP(num_features=4, hidden=[5], norm="none"),
        num_classes=3,
        lr=LR,
        roles=[RoleRule("backbone.*", "shared"), RoleRule("head.*", "shared")],
    )


def tiny_federation(out_dir, strategy, rounds: int = 2, local_steps: int = 2) -> Federation:
    return Federation(
        tiny_module(),
        TinyTabular(batch_size=16),
        strategy,
        rounds=rounds,
        out_dir=out_dir,
        progress_bar=False,
        accelerator="cpu",
        local_steps=local_steps,
        seed=0,
    )


def train_split(fed: Federation, client: str, split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
    data = fed.datamodule.data
    idx = torch.as_tensor(data.splits[client][split])
    return data.inputs[idx], data.targets[idx]


def replay(
    fed: Federation, shared: set[str], trained: Callable[[int], set[str]], rounds: int = 2, local_steps: int = 2
) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """The server's shared tensors and each client's personal ones after ``rounds`` rounds, by hand: each client
    starts from the server's ``shared`` tensors and its own others, takes ``local_steps`` full-batch gradient steps
    in which only the tensors ``trained(step)`` move, and the server takes the plain mean of the ``shared`` ones
    (every client has 15 training samples)."""
    module = tiny_module()
    start = {n: p.detach().clone() for n, p in module.named_parameters()}
    server = {n: t for n, t in start.items() if n in shared}
    personal = {c: {n: t for n, t in start.items() if n not in shared} for c in CLIENTS}
    for _ in range(rounds):
        uploads = []
        for client in CLIENTS:
            params = {n: t.clone().requires_grad_(True) for n, t in {**server, **personal[client]}.items()}
            x, y = train_split(fed, client)
            for step in range(local_steps):
                loss = F.cross_entropy(functional_call(module, params, (x,)), y)
                grads = dict(zip(params, torch.autograd.grad(loss, list(params.values())), strict=True))
                params = {
                    n: (p - LR * grads[n] if n in trained(step) else p).detach().requires_grad_(True)
                    for n, p in params.items()
                }
            uploads.append({n: p.detach() for n, p in params.items() if n in shared})
            personal[client] = {n: p.detach() for n, p in params.items() if n not in shared}
        server = {n: torch.stack([u[n] for u in uploads]).mean(0) for n in shared}
    return server, personal


def assert_close(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, atol=1e-6, rtol=0, msg=name)


def test_the_head_is_kept_the_body_averaged_and_only_the_body_uploaded(tmp_path):
    fed = tiny_federation(tmp_path / "fedper", FedPer())
    results = fed.fit()
    assert {n for n, r in fed.module.parameter_roles().items() if r == "personal"} == HEAD
    server, personal = replay(fed, BODY, lambda step: BODY | HEAD)
    assert_close(fed.strategy.global_state, server)
    for client in CLIENTS:
        assert_close(fed.store.tensors(client), personal[client])
    # the heads part: each client keeps its own
    assert not torch.allclose(personal["c0"]["head.weight"], personal["c1"]["head.weight"], atol=1e-3)
    # uploads: the body only, 3 clients x 2 rounds x (5 x 4 + 5) float32
    assert results["comm"]["upload_bytes"] == 3 * 2 * 25 * 4


def test_fedper_differs_from_fedavg(tmp_path):
    # the same run with a shared head (FedAvg) ends elsewhere: the role rule is what FedPer changes
    fed = tiny_federation(tmp_path / "avg", FedAvg())
    fed.fit()
    server, _ = replay(fed, BODY | HEAD, lambda step: BODY | HEAD)
    assert_close(fed.strategy.global_state, server)
    fedper_server, _ = replay(fed, BODY, lambda step: BODY | HEAD)
    weight = "backbone.layers.0.linear.weight"
    assert not torch.allclose(server[weight], fedper_server[weight], atol=1e-4)


def test_frozen_tensors_stay_frozen():
    module = tiny_module()
    roles = module.parameter_roles().with_roles({"head.bias": "frozen"})
    refined = FedPer().configure_roles(roles)
    assert refined["head.weight"] == "personal" and refined["head.bias"] == "frozen"
    assert refined["backbone.layers.0.linear.weight"] == "shared"


@pytest.mark.parametrize(
    ("head", "match"),
    [
        ("classifier.*", r"head='classifier\.\*' matches no trainable"),
        ("re:(", r"head='re:\(': .*not a valid regular expression"),
        ("", "head=.. must be a non-empty glob"),
    ],
)
def test_a_head_that_matches_nothing_is_named(head, match):
    with pytest.raises(ConfigError, match=r"strategy\.init_args\." + match):
        FedPer(head=head).configure_roles(tiny_module().parameter_roles())
