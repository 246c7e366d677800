"""FedMedian: coordinate-wise median aggregation.

Yin, Chen, Ramchandran, Bartlett. "Byzantine-Robust Distributed Learning: Towards Optimal Statistical Rates."
ICML 2018. https://arxiv.org/abs/1803.01498

Definition 1 (median-based gradient descent), applied to the uploaded models as Flower's ``FedMedian`` does:
``w_{t+1}[j] = med{w_{t+1}^k[j] : k in S_t}`` for every coordinate j of every shared tensor, unweighted; with an
even number of clients the two middle values are averaged (``numpy.median``).

Symbols -> code: ``w_{t+1}^k`` -> ``update.state``; ``med`` ->
:func:`fedlit.strategies.common.aggregate.coordinate_median`.

Flower equivalence: equal to ``flwr.server.strategy.FedMedian`` (flwr 1.41) on the same client arrays; the number
of examples is ignored by both.

Deviation: the paper takes the median of gradients at every step; like Flower, fedlit takes it of the models after
local training (one communication per round). Integer buffers (``num_batches_tracked``) get the rounded median.
"""

from __future__ import annotations

from fedlit.strategies.common.aggregators import MedianAggregator
from fedlit.strategies.fedavg import FedAvg


class FedMedian(FedAvg):
    """FedAvg whose average is the coordinate-wise median of the client updates (weights ignored)."""

    secure_aggregation = False  # the median needs each coordinate of every upload

    def __init__(self) -> None:
        super().__init__(aggregator=MedianAggregator())
