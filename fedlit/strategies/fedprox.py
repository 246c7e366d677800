"""FedProx: federated optimization in heterogeneous networks.

Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith. "Federated Optimization in Heterogeneous Networks." MLSys 2020.
https://arxiv.org/abs/1812.06127

Client objective (Eq. 2): ``h_k(w; w^t) = F_k(w) + (mu / 2) ||w - w^t||^2``, over the shared parameters.
Server: FedAvg. ``mu = 0`` gives FedAvg exactly.

Symbols -> code: ``w^t`` -> ``self._anchor`` (what the server sent this round); ``mu`` -> ``self.mu``;
``F_k`` -> the module's loss.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import torch
from torch import Tensor
from typing_extensions import override

from fedlit.core.contexts import Batch, StepOutput
from fedlit.core.errors import ConfigError
from fedlit.module import FederatedModule
from fedlit.strategies.common.aggregators import Aggregator
from fedlit.strategies.fedavg import FedAvg


def squared_distance(params: Mapping[str, Tensor], anchor: Mapping[str, Tensor]) -> Tensor:
    """``sum_k ||params_k - anchor_k||_2^2`` over the keys of ``params`` (differentiable in ``params``)."""
    if not params:
        raise ValueError("squared_distance of an empty set of tensors.")
    terms = [(p - anchor[n].to(p.device, p.dtype)).pow(2).sum() for n, p in params.items()]
    return torch.stack(terms).sum()


class FedProx(FedAvg):
    """FedAvg with a proximal term on the client.

    Args:
        mu: Weight of the proximal term (default 0.01).
        weighting: As in :class:`FedAvg`.
        aggregator: As in :class:`FedAvg` (default: the weighted mean).
    """

    fusable = True

    def __init__(
        self,
        *,
        mu: float = 0.01,
        weighting: Literal["num_examples", "uniform"] = "num_examples",
        aggregator: Aggregator | None = None,
    ) -> None:
        super().__init__(weighting=weighting, aggregator=aggregator)
        if mu < 0:
            raise ConfigError(f"strategy.init_args.mu={mu} must be >= 0 (0 gives FedAvg).")
        self.mu = mu
        self._anchor: dict[str, Tensor] = {}

    def on_client_fit_start(self, received: dict[str, Tensor]) -> None:
        """Keep ``w^t``, the tensors the server sent, as the anchor of the proximal term."""
        self._anchor = {n: t.detach().clone() for n, t in received.items()}

    def proximal_parameters(self, pl_module: FederatedModule) -> dict[str, Tensor]:
        """The parameters the proximal term pulls toward the server's (all shared parameters)."""
        return {n: p for n, p in pl_module.shared_parameters() if n in self._anchor}

    @override
    def training_loss(
        self, pl_module: FederatedModule, loss: Tensor, batch: Batch, outputs: StepOutput = None
    ) -> Tensor:
        """``F_k(w) + (mu / 2) ||w - w^t||^2`` (Eq. 2)."""
        params = self.proximal_parameters(pl_module)
        if self.mu == 0 or not params:
            return loss
        return loss + self.mu / 2 * squared_distance(params, self._anchor)
