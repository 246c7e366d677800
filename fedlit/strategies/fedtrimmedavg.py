"""FedTrimmedAvg: coordinate-wise trimmed-mean aggregation.

Yin, Chen, Ramchandran, Bartlett. "Byzantine-Robust Distributed Learning: Towards Optimal Statistical Rates."
ICML 2018. https://arxiv.org/abs/1803.01498

Definition 2 (trimmed-mean-based gradient descent), applied to the uploaded models as Flower's ``FedTrimmedAvg``
does: per coordinate j, sort the n client values, remove the ``k = int(beta n)`` smallest and ``k`` largest, and
``w_{t+1}[j] = 1 / (n - 2k) sum`` of the rest (unweighted).

Symbols -> code: ``beta`` -> ``beta``; ``w_{t+1}^k`` -> ``update.state``; the trimmed mean ->
:func:`fedlit.strategies.common.aggregate.trimmed_mean`.

Flower equivalence: ``FedTrimmedAvg(beta=b)`` equals ``flwr.server.strategy.FedTrimmedAvg(beta=b)`` (flwr 1.41,
whose ``_trim_mean`` follows ``scipy.stats.trim_mean``) on the same client arrays; both default to b = 0.2 and
ignore the number of examples.

Deviation: the paper trims gradients at every step; like Flower, fedlit trims the models after local training.
Integer buffers (``num_batches_tracked``) get the rounded trimmed mean.

With few clients per round ``int(beta n)`` can be 0 (beta = 0.2 and n = 4): nothing is trimmed, the result is
the plain mean and one poisoned update passes through; a warning then gives the smallest beta that trims one
client at each end, ``1 / n`` (5 clients are the fewest that beta = 0.2 protects).
"""

from __future__ import annotations

from fedlit.strategies.common.aggregators import TrimmedMeanAggregator, check_beta
from fedlit.strategies.fedavg import FedAvg


class FedTrimmedAvg(FedAvg):
    """FedAvg whose average is the coordinate-wise beta-trimmed mean of the client updates (weights ignored).

    Args:
        beta: Fraction of the clients cut at each end, per coordinate, in [0, 0.5) (Flower's default 0.2).
    """

    secure_aggregation = False  # the trimmed mean sorts each coordinate over the individual uploads

    def __init__(self, *, beta: float = 0.2) -> None:
        check_beta(beta, "strategy.init_args.beta")
        aggregator = TrimmedMeanAggregator(beta=beta)
        aggregator.option = "strategy.init_args.beta"  # warnings name the option as the recipe spells it
        super().__init__(aggregator=aggregator)
        self.beta = beta
