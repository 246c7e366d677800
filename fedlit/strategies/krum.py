"""Krum and Multi-Krum: Byzantine-tolerant selection of client updates.

Blanchard, El Mhamdi, Guerraoui, Stainer. "Machine Learning with Adversaries: Byzantine Tolerant Gradient
Descent." NeurIPS 2017. https://arxiv.org/abs/1703.02757

Section 4: for each update ``V_i``, ``s(i) = sum_{i -> j} ||V_i - V_j||^2`` over the ``n - f - 2`` updates
closest to ``V_i``; Krum keeps ``V_{i*}`` with ``i* = argmin_i s(i)``. Multi-Krum, the paper's m-vector variant,
keeps the m lowest-scored updates and averages them.

Symbols -> code: ``V_i`` -> ``update.state`` (flattened over its floating tensors); ``f`` -> ``num_malicious``;
``m`` -> ``num_selected``; ``s(i)`` -> :func:`fedlit.strategies.common.aggregate.krum_scores`.

Flower equivalence: ``Krum(num_malicious=f, num_selected=1)`` equals ``flwr.server.strategy.Krum(
num_malicious_clients=f, num_clients_to_keep=0)`` and ``Krum(num_malicious=f, num_selected=m)`` with m > 1 equals
``num_clients_to_keep=m`` (flwr 1.41), on floating-point client arrays.

Deviation: Multi-Krum's average is weighted by the clients' examples, as Flower's is; ``weighting="uniform"``
gives the paper's plain mean.
Deviation: the paper applies Krum to gradients at every step; like Flower, fedlit applies it to the models after
local training. Like Flower, fewer than ``n - f - 2 >= 1`` neighbours fall back to 1 (with a warning when
``n <= 2f + 2``, where the guarantee is lost). Distances skip integer buffers (``num_batches_tracked``), which
Flower would include: they count steps, not weights.
"""

from __future__ import annotations

from typing import Literal

from fedlit.strategies.common.aggregators import KrumAggregator, check_krum
from fedlit.strategies.fedavg import FedAvg


class Krum(FedAvg):
    """FedAvg whose aggregate is the Krum choice (or the Multi-Krum average) of the client updates.

    Args:
        num_malicious: ``f``, the number of Byzantine clients tolerated (Flower's ``num_malicious_clients``).
        num_selected: ``m``: 1 for Krum, more for Multi-Krum (Flower's ``num_clients_to_keep``, where 0 means 1).
        weighting: How Multi-Krum weighs the kept updates, as in :class:`FedAvg`.
    """

    secure_aggregation = False  # Krum scores each upload by its distances to the others

    def __init__(
        self,
        *,
        num_malicious: int = 0,
        num_selected: int = 1,
        weighting: Literal["num_examples", "uniform"] = "num_examples",
    ) -> None:
        check_krum(num_malicious, num_selected, "strategy.init_args")
        super().__init__(
            weighting=weighting, aggregator=KrumAggregator(num_malicious=num_malicious, num_selected=num_selected)
        )
        self.num_malicious = num_malicious
        self.num_selected = num_selected
