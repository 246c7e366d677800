"""FedSLD: Federated Learning with Shared Label Distribution.

Luo, Wu. "FedSLD: Federated Learning with Shared Label Distribution for Medical Image Classification." IEEE ISBI
2022; a chapter of Jun Luo's thesis. https://arxiv.org/abs/2110.08378

Before round 1 every client reports its training samples per class ``n_ic``; the server forms the shared label
distribution and sends it to the clients (as the paper describes it; no code is published):

    (1)  P(c) = sum_i n_ic / sum_i n_i.

A client re-weights each sample of a batch of size B by how much rarer its class is in the batch than in P:

    (2)  p_b(c) = |{k : y_k = c}| / B,
    (3)  L = -(1 / B) sum_k [P(y_k) / p_b(y_k)] log softmax(f(x_k))_{y_k}.

When the batch's class shares equal P every weight is 1 and (3) is plain cross-entropy. The server aggregates as
FedAvg (``w_{t+1} = sum_k (n_k / n) w^k``).

Symbols -> code: ``n_ic`` -> ``class_counts[client][c]`` (given to :meth:`FedSLD.initialize`); ``P`` ->
``self.prior`` on the server, the ``prior`` extra on the client (``self._received_prior``); ``p_b`` and the
weights -> :func:`sld_weights`; (3) -> :func:`sld_loss` on the ``logits`` and ``targets`` that ``training_step``
returns (no second forward pass).

Deviation: the paper treats multi-class classification. A binary task (one logit z, BCE) is handled as the
two-class softmax over logits ``[0, z]`` (whose log-probabilities are BCE's), with P from the clients'
``[negatives, positives]`` counts. Multilabel tasks have no single label per sample and are refused.
Deviation: P travels as one float32 tensor in every round's download (counted as communication); the counts
clients report once before round 1 are a few integers and are not counted (the loop reports them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor
from typing_extensions import override

from fedlit.core.contexts import Batch, StepOutput
from fedlit.core.errors import ConfigError, DataError
from fedlit.module import FederatedModule
from fedlit.strategies.common.aggregators import Aggregator
from fedlit.strategies.fedavg import FedAvg

_NEEDS = (
    "FedSLD re-weights the loss per sample, so {module}.training_step must return a dict with 'logits' "
    "(B, C) and 'targets' (B,) besides 'loss' (fedlit.tasks.ClassificationModule does); got {got}."
)


def class_prior(counts: Sequence[Sequence[int]]) -> Tensor:
    """``P(c) = sum_i n_ic / sum_i n_i`` from each client's samples per class (FedSLD's shared label
    distribution), in float64. Raises on ragged, negative or all-zero counts."""
    if not counts:
        raise ValueError("class_prior needs the class counts of at least one client.")
    if len({len(c) for c in counts}) != 1:
        raise ValueError(f"Clients report different numbers of classes: {sorted({len(c) for c in counts})}.")
    n = torch.as_tensor([list(c) for c in counts], dtype=torch.float64)
    if (n < 0).any() or n.sum() <= 0:
        raise ValueError(f"Class counts must be >= 0 with a positive total, got {n.tolist()}.")
    return n.sum(0) / n.sum()


def sld_weights(targets: Tensor, prior: Tensor) -> Tensor:
    """``w_k = P(y_k) / p_b(y_k)`` with ``p_b(c)`` = (samples of class c in the batch) / B (FedSLD).

    Args:
        targets: Class indices (B,).
        prior: P(c), shape (C,).

    Returns:
        The weights (B,), in ``prior``'s dtype; they sum to B when every class of ``prior`` is in the batch.
    """
    targets = targets.long().reshape(-1)
    batch_share = torch.bincount(targets, minlength=len(prior)).to(prior.dtype) / len(targets)
    return prior[targets] / batch_share[targets]


def sld_loss(logits: Tensor, targets: Tensor, prior: Tensor) -> Tensor:
    """``-(1/B) sum_k [P(y_k) / p_b(y_k)] log softmax(logits_k)_{y_k}``: cross-entropy re-weighted toward the
    shared label distribution (FedSLD). Equals plain cross-entropy when the batch's class shares are ``prior``."""
    log_probs = torch.log_softmax(logits, dim=-1).gather(-1, targets.long().reshape(-1, 1)).squeeze(-1)
    weights = sld_weights(targets, prior.to(logits.device)).to(log_probs.dtype)
    return -(weights * log_probs).mean()


class FedSLD(FedAvg):
    """FedAvg whose clients minimize cross-entropy re-weighted toward the federation's label distribution.

    Args:
        weighting: As in :class:`FedAvg`.
        aggregator: As in :class:`FedAvg` (default: the weighted mean).
    """

    accepted_tasks = frozenset({"multiclass", "binary"})
    secure_aggregation = False  # its aggregate is FedAvg's, but it sends the prior P as an extra each round

    def __init__(
        self,
        *,
        weighting: Literal["num_examples", "uniform"] = "num_examples",
        aggregator: Aggregator | None = None,
    ) -> None:
        super().__init__(weighting=weighting, aggregator=aggregator)
        self.prior: Tensor = torch.zeros(0)
        self._received_prior: Tensor | None = None

    @override
    def setup_server_state(self) -> None:
        """Compute P(c) (Eq. 1) from the class counts the clients reported before round 1."""
        super().setup_server_state()
        class_counts = self.class_counts
        if class_counts is None:
            raise ConfigError(
                "FedSLD needs every client's training samples per class (class_counts) before round 1, which only "
                "a classification task (multiclass or binary) has: the data module reported none "
                "(FederatedDataModule.class_counts returns None for a task without classes, such as survival or "
                "regression). Use another strategy (e.g. FedAvg) for such data."
            )
        missing = sorted(set(self.client_ids) - set(class_counts))
        if missing:
            raise DataError(f"FedSLD: clients {missing[:5]} reported no class counts.")
        self.prior = class_prior([class_counts[c] for c in self.client_ids]).float()

    @override
    def configure_client_extras(self, server_round: int, client_id: str) -> dict[str, Any]:
        """Send P (counted as download)."""
        return {"prior": self.prior.clone()}

    def on_client_fit_start(self, received_extras: dict[str, Any]) -> None:
        """The client keeps the P it received for its local training."""
        self._received_prior = received_extras["prior"]

    @override
    def training_loss(
        self, pl_module: FederatedModule, loss: Tensor, batch: Batch, outputs: StepOutput = None
    ) -> Tensor:
        """Eq. (3) on the batch's logits and targets; replaces the module's loss."""
        if not isinstance(outputs, Mapping) or "logits" not in outputs or "targets" not in outputs:
            got = f"keys {sorted(outputs)}" if isinstance(outputs, Mapping) else type(outputs).__name__
            raise TypeError(_NEEDS.format(module=type(pl_module).__name__, got=got))
        if self._received_prior is None:
            raise RuntimeError("FedSLD.training_loss ran before on_client_fit_start gave the client P.")
        logits, targets = outputs["logits"], outputs["targets"]
        prior = self._received_prior.to(logits.device)
        if targets.dim() > 1:
            raise ConfigError(
                f"FedSLD needs one class per sample (multiclass or binary, model.init_args.task); the targets have "
                f"shape {tuple(targets.shape)}, as for multilabel tasks, which FedSLD does not define."
            )
        if targets.is_floating_point() or logits.dim() == 1 or logits.shape[-1] == 1:
            # Binary: BCE on z is the two-class softmax over [0, z].
            z = logits.reshape(len(targets))
            logits, targets = torch.stack([torch.zeros_like(z), z], dim=-1), targets.round().long()
        if logits.shape[-1] != len(prior):
            raise ConfigError(
                f"FedSLD: the model gives {logits.shape[-1]} class scores but the clients reported counts for "
                f"{len(prior)} classes; model.init_args.num_classes must match the data."
            )
        return sld_loss(logits, targets, prior)

    @override
    def state_dict(self) -> dict[str, Any]:
        """The server state plus P, so a resumed run keeps the P computed before round 1."""
        return {**super().state_dict(), "prior": self.prior}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        super().load_state_dict(state_dict)
        self.prior = state_dict["prior"]
