"""IDA: Inverse Distance Aggregation, FedAvg whose client weights fall with each model's distance from the mean.

Yeganeh, Farshad, Navab, Albarqouni. "Inverse Distance Aggregation for Federated Learning with Non-IID Data."
MICCAI DART/DCL workshop 2020. https://arxiv.org/abs/2008.07665

The server weighs client k of the round by the inverse of its model's distance to the average of the round's
models, normalized:

    d_k = ||theta_avg - theta_k||,  theta_avg = (1 / K) sum_j theta_j
    a_k = (1 / Z) d_k^-1,           Z = sum_j d_j^-1
    theta_{t+1} = sum_k a_k theta_k

(:func:`ida_weights`): a model far from the others (a client with out-of-distribution or noisy data, or one that
over-fits) counts less. ``theta_k`` is every uploaded floating tensor of client k, flattened into one vector;
integer buffers (BatchNorm's ``num_batches_tracked``) are averaged with the same weights, as FedAvg.

Variants (arguments): ``weighting="num_examples"`` multiplies ``d_k^-1`` by client k's ``n_k`` before normalizing
(IDA combined with FedAvg's coefficients); the default ``"uniform"`` is the paper's IDA alone.
``reference="global"`` measures the distances from the previous global model instead of the round's mean.
``p`` is the norm's order (2: Euclidean).

Symbols -> code: ``theta_k`` -> ``update.state``; ``theta_avg`` -> the uniform mean of the round's uploads
(``reference="mean"``); ``a_k`` -> :meth:`IDA.client_weights`; ``n_k`` -> ``update.num_examples``.

Deviation: a client at distance 0 (its model is the reference) would have an infinite weight; fedlit gives the
whole weight to the clients at distance 0 (shared as the other weights would be) and 0 to the others, the limit of
the formula. With one client, or identical models, that is the plain (or sample-weighted) mean. Deviation: the
paper also studies a weight from the clients' training accuracy (INTRAC); it is not offered here. The server keeps
FedAvg's state only; each client's model must be seen separately, so SecAgg+ cannot carry the uploads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor
from typing_extensions import override

from fedlit.core.errors import ConfigError
from fedlit.strategies.base import ClientUpdate
from fedlit.strategies.common.aggregate import common_keys
from fedlit.strategies.fedavg import FedAvg


def ida_weights(
    states: Sequence[Mapping[str, Tensor]],
    reference: Mapping[str, Tensor] | None = None,
    prior: Sequence[float] | None = None,
    p: float = 2.0,
) -> list[float]:
    """IDA's normalized weights ``a_k = prior_k d_k^-1 / sum_j prior_j d_j^-1``, ``d_k = ||reference - theta_k||_p``
    over the floating tensors the states share (flattened together), in float64.

    Args:
        states: The clients' models, by tensor name.
        reference: The model the distances are measured from; None: the uniform mean of ``states``.
        prior: A non-negative weight per client multiplying ``d_k^-1`` (None: 1 each).
        p: The order of the norm.

    Where some ``d_k`` is 0, those clients share the whole weight in proportion to ``prior`` (the limit).
    """
    if not states:
        return []
    prior_t = (
        torch.ones(len(states), dtype=torch.float64)
        if prior is None
        else torch.tensor([float(w) for w in prior], dtype=torch.float64)
    )
    if prior_t.shape[0] != len(states) or bool((prior_t < 0).any()) or not float(prior_t.sum()) > 0:
        raise ValueError(
            f"ida_weights: prior {list(prior_t.tolist())} must give {len(states)} non-negative weights, not all 0."
        )
    names = [n for n in common_keys(states) if states[0][n].is_floating_point()]
    vectors = torch.stack(
        [
            torch.cat([s[n].detach().reshape(-1).to("cpu", torch.float64) for n in names])
            if names
            else torch.zeros(0, dtype=torch.float64)
            for s in states
        ]
    )
    if reference is None:
        ref = vectors.mean(dim=0)
    else:
        ref = (
            torch.cat([reference[n].detach().reshape(-1).to("cpu", torch.float64) for n in names])
            if names
            else torch.zeros(0, dtype=torch.float64)
        )
    distances = torch.linalg.vector_norm(vectors - ref, ord=p, dim=1)
    at_zero = distances == 0
    raw = prior_t * at_zero if bool(at_zero.any()) else prior_t / distances
    if not float(raw.sum()) > 0:  # every client at distance 0 has prior 0: fall back to the prior
        raw = prior_t
    return (raw / raw.sum()).tolist()


class IDA(FedAvg):
    """Inverse Distance Aggregation: the weighted mean of the uploads, client k weighted by ``1 / d_k``.

    Args:
        weighting: ``uniform`` (default, the paper's IDA) or ``num_examples`` (``n_k / d_k``, combined with
            FedAvg's coefficients).
        reference: ``mean`` (default, the paper's: the round's uniform mean of the uploads) or ``global`` (the
            previous global model).
        p: Order of the distance's norm (default 2).
    """

    #: Each client's model is needed for its distance: SecAgg+ (which reveals the sum only) cannot carry it.
    secure_aggregation = False

    def __init__(
        self,
        *,
        weighting: Literal["uniform", "num_examples"] = "uniform",
        reference: Literal["mean", "global"] = "mean",
        p: float = 2.0,
    ) -> None:
        problems = []
        if reference not in ("mean", "global"):
            problems.append(f"strategy.init_args.reference={reference!r} is not one of ['mean', 'global']")
        if isinstance(p, bool) or not isinstance(p, int | float) or not p >= 1:
            problems.append(f"strategy.init_args.p={p!r} must be a number >= 1 (2: Euclidean)")
        if problems:
            raise ConfigError("Invalid IDA settings: " + "; ".join(problems) + ".")
        super().__init__(weighting=weighting)
        self.reference, self.p = reference, float(p)

    @override
    def client_weights(self, updates: list[ClientUpdate]) -> list[float]:
        """``a_k`` of each update (:func:`ida_weights`, ``weighting``'s weights as the prior)."""
        reference = None if self.reference == "mean" else self.global_state
        return ida_weights([u.state for u in updates], reference, super().client_weights(updates), self.p)

    @override
    def hparams(self) -> dict[str, Any]:
        """The arguments, ``weighting`` last (as earlier versions wrote it: a resume compares the repr)."""
        hparams = super().hparams()
        hparams["weighting"] = hparams.pop("weighting", self.weighting)
        return hparams
