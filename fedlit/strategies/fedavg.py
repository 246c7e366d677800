"""FedAvg: Federated Averaging.

McMahan, Moore, Ramage, Hampson, Agüera y Arcas. "Communication-Efficient Learning of Deep Networks from
Decentralized Data." AISTATS 2017. https://arxiv.org/abs/1602.05629

Algorithm 1 (server): ``w_{t+1} = sum_{k in S_t} (n_k / n) w_{t+1}^k`` with ``n = sum_{k in S_t} n_k``.

Symbols -> code: ``w_t`` -> ``self.global_state``; ``w_{t+1}^k`` -> ``update.state``; ``n_k`` ->
``update.num_examples``; ``S_t`` -> the ``updates`` of the round.

The sum is the default ``aggregator`` (:class:`~fedlit.strategies.common.aggregators.WeightedMeanAggregator`); any
other rule (median, trimmed mean, Krum) can replace it here and in every subclass (FedProx, FedBN, FedOpt...).

Applied to every shared tensor, buffers included: BatchNorm running statistics are averaged like parameters,
and the integer ``num_batches_tracked`` is averaged and rounded (it only matters for BatchNorm with
``momentum=None``). Tensors whose role is personal are never uploaded, so the server never changes them.
"""

from __future__ import annotations

from typing import Any, Literal

from torch import Tensor
from typing_extensions import override

from fedlit.core.errors import ConfigError
from fedlit.strategies.base import ClientUpdate, Strategy
from fedlit.strategies.common.aggregate import WEIGHTINGS, client_weights
from fedlit.strategies.common.aggregators import Aggregator, WeightedMeanAggregator


class FedAvg(Strategy):
    """Federated Averaging of the shared tensors.

    Args:
        weighting: ``num_examples`` weighs client k by n_k (the paper); ``uniform`` weighs every client equally.
        aggregator: How the uploads are combined; ``None`` is the weighted mean of Algorithm 1. Robust rules:
            ``MedianAggregator``, ``TrimmedMeanAggregator``, ``KrumAggregator``
            (``fedlit.strategies.common.aggregators``).
    """

    #: The weighted mean is all :meth:`aggregate` reads, so SecAgg+ can replace the uploads; only with the default
    #: aggregator and ``weighting="num_examples"`` (checked by :func:`fedlit.flower.secagg.check_secure_aggregation`).
    secure_aggregation = True
    fusable = True

    def __init__(
        self,
        *,
        weighting: Literal["num_examples", "uniform"] = "num_examples",
        aggregator: Aggregator | None = None,
    ) -> None:
        super().__init__()
        if weighting not in WEIGHTINGS:
            raise ConfigError(f"strategy.init_args.weighting={weighting!r} is not one of {list(WEIGHTINGS)}.")
        if aggregator is not None and not isinstance(aggregator, Aggregator):
            raise TypeError(
                f"strategy.init_args.aggregator={aggregator!r} is not an Aggregator: give one of "
                f"WeightedMeanAggregator, MedianAggregator, TrimmedMeanAggregator, KrumAggregator (class_path + "
                f"init_args) or leave it out for the weighted mean."
            )
        self.weighting = weighting
        self.aggregator: Aggregator = aggregator if aggregator is not None else WeightedMeanAggregator()

    def client_weights(self, updates: list[ClientUpdate]) -> list[float]:
        """The aggregation weight of each update."""
        return client_weights(updates, self.weighting)

    def combine(self, updates: list[ClientUpdate]) -> dict[str, Tensor]:
        """The ``aggregator``'s combination of the uploaded tensors, on the server's devices (checks the keys)."""
        self.check_uploads(updates)
        combined = self.aggregator([u.state for u in updates], self.client_weights(updates))
        return {n: t.to(self.global_state[n].device) for n, t in combined.items()}

    @override
    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> dict[str, Tensor]:
        """``w_{t+1} = sum_k (n_k / n) w_{t+1}^k`` over the uploaded tensors (Algorithm 1), or the aggregator's."""
        if not updates:
            return dict(self.global_state)
        return {**self.global_state, **self.combine(updates)}

    @override
    def hparams(self) -> dict[str, Any]:
        """The arguments, without the ``aggregator`` when it is the weighted mean (the default)."""
        hparams = super().hparams()
        if isinstance(self.aggregator, WeightedMeanAggregator):
            hparams.pop("aggregator", None)
        return hparams
