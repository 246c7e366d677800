"""The model side of fused multi-client training (:mod:`fedlit.engine.speedups.fused`): per-client trainable tensors
on one live module, and one forward pass that routes each sample to its own client's tensors.

Every client of a fused group gets its own ``nn.Parameter`` objects for the module's trainable (shared and
personal) parameters; the frozen ones stay the live module's, once. :meth:`ClientParameters.bind` points the live
module at one client's objects (a swap of references, no copy), so whatever reads the module as one client's model
(``load_client``, ``configure_optimizers``, a strategy's ``training_loss``, the store) sees that client, as in a
sequential turn. :meth:`ClientParameters.fused` makes every ``nn.Linear`` that owns trainable parameters (LoRA's
``A`` and ``B``, a head) compute, for a batch made of the clients' batches one after the other, each client's
segment with that client's weights: a batched matrix product when the segments are of one size (as multi-adapter
serving systems batch LoRA), one product per segment otherwise. The frozen layers run once on the whole batch.

Since each sample's output depends only on its own client's tensors and the frozen ones, the sum of the clients'
losses has, for each client's tensors, the gradient of that client's loss alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import cast

import torch
from torch import nn
from torch.nn import functional as F

from fedlit.core.errors import ConfigError, broken
from fedlit.module import FederatedModule

#: Train-mode layers whose output for a sample would depend on the other samples of the batch.
_BATCH_STATISTICS = (nn.modules.batchnorm._BatchNorm,)


def trainable_names(module: FederatedModule) -> list[str]:
    """The parameters of ``module`` that train (shared and personal), in module order."""
    return [n for n, p in module.named_parameters() if p.requires_grad]


def module_problems(module: FederatedModule) -> list[str]:
    """Why ``module`` (its roles set) cannot be trained fused, each naming the layer or tensor; [] if it can.

    Fused training is exact when every trainable parameter belongs to an ``nn.Linear``, no shared or personal
    tensor is a buffer, and no layer in train mode mixes samples (BatchNorm) or draws random numbers (dropout with a
    rate above 0), since a fused pass would draw them in another order than the sequential turns.
    """
    problems = []
    modes = {name: m.training for name, m in module.named_modules()}
    module.set_train_mode()
    try:
        for name, m in module.named_modules():
            if not m.training:
                continue
            if isinstance(m, _BATCH_STATISTICS):
                problems.append(
                    f"the BatchNorm layer {name!r} normalizes with the statistics of the batch in train "
                    "mode, which a fused batch of several clients would mix (freeze it, or keep "
                    "federation.fused_clients: 1)"
                )
            rate = (
                getattr(m, "p", None) if isinstance(m, nn.modules.dropout._DropoutNd) else getattr(m, "drop_prob", None)
            )
            if rate:
                problems.append(
                    f"the dropout layer {name!r} (rate {rate}) draws random numbers in train mode, in "
                    "another order in a fused pass (set its rate to 0, or keep fused_clients: 1)"
                )
    finally:
        for name, m in module.named_modules():
            m.train(modes[name])
    roles = module.parameter_roles()
    buffers = [n for n, _ in module.named_buffers() if roles[n] != "frozen"]
    if buffers:
        problems.append(
            f"the buffers {buffers[:3]} are {roles[buffers[0]]}: each client would need its own copy in "
            "one pass (make them frozen, or keep federation.fused_clients: 1)"
        )
    for name in trainable_names(module):
        owner_name = name.rpartition(".")[0]
        owner = module.get_submodule(owner_name)
        if type(owner) is not nn.Linear:
            problems.append(
                f"the trainable tensor {name!r} belongs to a {type(owner).__name__}, but fused training "
                "routes only the weights of nn.Linear layers (LoRA's A and B, heads) per client (freeze "
                "it, or keep federation.fused_clients: 1)"
            )
            break
    return problems


class ClientParameters:
    """Each client's own trainable parameters for the live ``module``, and the fused forward pass over them.

    Args:
        module: The live module (its roles set).
        num_clients: The clients of the group.
    """

    def __init__(self, module: FederatedModule, num_clients: int) -> None:
        self.module = module
        self.names = trainable_names(module)
        self.owners = {n: (module.get_submodule(n.rpartition(".")[0]), n.rpartition(".")[2]) for n in self.names}
        self.live: dict[str, nn.Parameter] = {}
        for n, (owner, leaf) in self.owners.items():
            param = owner._parameters[leaf]
            if not (param is not None):  # named by trainable_names, so a parameter
                raise broken("a name from trainable_names is a parameter")
            self.live[n] = param
        self.clients: list[dict[str, nn.Parameter]] = [
            {n: nn.Parameter(p.detach().clone()) for n, p in self.live.items()} for _ in range(num_clients)
        ]

    def bind(self, k: int | None) -> None:
        """Point the live module at client ``k``'s parameters (None: at its own again)."""
        chosen = self.live if k is None else self.clients[k]
        for name, (owner, leaf) in self.owners.items():
            owner._parameters[leaf] = chosen[name]
        self.module.tensors_replaced()  # the module's kept parameter lists and optimizers name the tensors it held

    def restore(self, k: int) -> None:
        """Point the live module at its own parameters, holding client ``k``'s values (as after a sequential turn
        of ``k``)."""
        self.bind(None)
        with torch.no_grad():
            for name, param in self.live.items():
                param.copy_(self.clients[k][name])

    @contextlib.contextmanager
    def fused(self, clients: Sequence[int], sizes: Sequence[int]) -> Iterator[None]:
        """Within it, a forward pass of the live module on a batch made of segments of ``sizes`` samples computes
        segment ``i`` with the trainable parameters of client ``clients[i]``."""
        linears: dict[nn.Module, str] = {}
        for name, (owner, _) in self.owners.items():
            linears.setdefault(owner, name.rpartition(".")[0])
        try:
            for owner, prefix in linears.items():
                vars(owner)["forward"] = self._linear(owner, prefix, clients, sizes)  # popped in finally
            yield
        finally:
            for owner in linears:
                vars(owner).pop("forward", None)

    def _linear(
        self, owner: nn.Module, prefix: str, clients: Sequence[int], sizes: Sequence[int]
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        def per_client(leaf: str) -> list[torch.Tensor | None]:
            name = f"{prefix}.{leaf}"
            if name in self.live:
                return [self.clients[k][name] for k in clients]
            return [getattr(owner, leaf)] * len(clients)

        weights, biases = cast("list[torch.Tensor]", per_client("weight")), per_client("bias")  # weights: never None
        total = sum(sizes)

        def forward(x: torch.Tensor) -> torch.Tensor:
            if x.dim() < 2 or x.shape[0] != total:
                raise ConfigError(
                    f"federation.fused_clients: the layer {prefix!r} received a tensor of shape "
                    f"{tuple(x.shape)} whose first dimension is not the fused batch's {total} samples "
                    "(this model reshapes its batch): keep federation.fused_clients: 1 for it."
                )
            if len(set(sizes)) == 1:
                k, rest = len(sizes), x.shape[1:-1]
                w = torch.stack(weights)
                out = torch.bmm(x.reshape(k, -1, x.shape[-1]), w.transpose(1, 2))
                if biases[0] is not None:
                    out = out + torch.stack(cast("list[torch.Tensor]", biases)).unsqueeze(1)  # all or none
                return out.reshape(total, *rest, w.shape[1])
            parts = x.split(list(sizes))
            return torch.cat([F.linear(p, w, b) for p, w, b in zip(parts, weights, biases, strict=True)])

        return forward
