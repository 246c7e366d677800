"""Pluggable aggregation rules: how a strategy that averages combines the clients' uploaded tensors.

Every strategy built on :class:`~fedlit.strategies.FedAvg` (FedProx, FedBN, FedOpt and their subclasses) takes
an ``aggregator``; the default is the weighted mean. The robust rules reproduce Flower's functions of the same
name (``flwr/server/strategy/aggregate.py``, flwr 1.41) on the same inputs; the math is
:mod:`fedlit.strategies.common.aggregate`, these classes make it configurable (``class_path`` + ``init_args``):

- :class:`WeightedMeanAggregator`: ``sum_k w_k x_k / sum_k w_k`` (McMahan et al., AISTATS 2017); Flower's
  ``aggregate`` / ``aggregate_inplace``.
- :class:`MedianAggregator`: coordinate-wise median, unweighted (Yin, Chen, Ramchandran, Bartlett, "Byzantine-
  Robust Distributed Learning: Towards Optimal Statistical Rates", ICML 2018, https://arxiv.org/abs/1803.01498,
  Definition 1); Flower's ``aggregate_median``.
- :class:`TrimmedMeanAggregator`: coordinate-wise beta-trimmed mean, unweighted (Yin et al. 2018, Definition 2);
  Flower's ``aggregate_trimmed_avg(results, proportiontocut=beta)``.
- :class:`KrumAggregator`: Krum / Multi-Krum (Blanchard, El Mhamdi, Guerraoui, Stainer, "Machine Learning with
  Adversaries: Byzantine Tolerant Gradient Descent", NeurIPS 2017, https://arxiv.org/abs/1703.02757,
  Section 4); Flower's ``aggregate_krum(results, num_malicious, to_keep)``.

Symbols -> code: ``x_k`` -> the k-th client state; ``w_k`` -> its weight (``num_examples`` or 1); ``beta`` ->
``beta``; Krum's ``f`` -> ``num_malicious``; Multi-Krum's ``m`` -> ``num_selected``.

Deviation: Krum's distances skip integer tensors (BatchNorm's ``num_batches_tracked``): they count steps, and a
client that ran more steps would otherwise look far from everyone. Flower measures every array it receives; on
floating-point states the two are equal.
"""

from __future__ import annotations

import abc
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor
from typing_extensions import override

from fedlit.core.errors import ConfigError
from fedlit.strategies.common.aggregate import coordinate_median, krum_select, trimmed_mean, weighted_average

OPTION = "strategy.init_args.aggregator.init_args"


class Aggregator(abc.ABC):
    """Combines client states into one: ``aggregator(states, weights) -> state``."""

    @abc.abstractmethod
    def __call__(self, states: Sequence[Mapping[str, Tensor]], weights: Sequence[float]) -> dict[str, Tensor]:
        """The combined state.

        Args:
            states: One ``{name: tensor}`` per client, all with the same keys.
            weights: One non-negative weight per client (rules that ignore weights say so).

        Returns:
            A new ``{name: tensor}``, each tensor in the dtype of the clients' (integers rounded).
        """

    def hparams(self) -> dict[str, Any]:
        """Hyperparameters shown by ``repr``."""
        return {}

    @override
    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.hparams().items())
        return f"{type(self).__name__}({args})"


class WeightedMeanAggregator(Aggregator):
    """``sum_k w_k x_k / sum_k w_k`` per tensor (FedAvg's rule, the default)."""

    @override
    def __call__(self, states: Sequence[Mapping[str, Tensor]], weights: Sequence[float]) -> dict[str, Tensor]:
        return weighted_average(states, weights)


class MedianAggregator(Aggregator):
    """Coordinate-wise median; ignores the weights (as Flower's FedMedian does)."""

    @override
    def __call__(self, states: Sequence[Mapping[str, Tensor]], weights: Sequence[float]) -> dict[str, Tensor]:
        return coordinate_median(states)


def check_beta(beta: float, option: str) -> None:
    """Raise a ``ConfigError`` naming ``option`` unless ``0 <= beta < 0.5``."""
    if not 0.0 <= beta < 0.5:
        raise ConfigError(
            f"{option}={beta} is the fraction trimmed at each end and must be in [0, 0.5) "
            f"(0 gives the plain unweighted mean; Flower's default is 0.2)."
        )


def warn_if_trims_nothing(beta: float, num_updates: int, option: str) -> None:
    """Warn when ``beta > 0`` but ``int(beta * n)`` is 0 for this round's ``n`` updates: nothing is trimmed, the
    trimmed mean is the plain mean and a single poisoned update passes through."""
    if beta <= 0 or num_updates == 0 or int(beta * num_updates) > 0:
        return
    if num_updates <= 2:
        fix = f"no beta below 0.5 trims any of {num_updates}: let at least 3 clients train per round"
    else:
        fix = f"the smallest beta that trims one client at each end is 1/{num_updates} = {1 / num_updates:.4g}"
    warnings.warn(
        f"{option}={beta} trims int({beta} * {num_updates}) = 0 of the {num_updates} client updates of this round "
        f"at each end: the trimmed mean is the plain mean, and one poisoned update passes through; {fix}.",
        stacklevel=3,
    )


def check_krum(num_malicious: int, num_selected: int, option: str) -> None:
    """Raise a ``ConfigError`` naming the options unless ``num_malicious >= 0`` and ``num_selected >= 1``."""
    problems = []
    if num_malicious < 0:
        problems.append(f"{option}.num_malicious={num_malicious} must be >= 0 (the number of Byzantine clients f).")
    if num_selected < 1:
        problems.append(
            f"{option}.num_selected={num_selected} must be >= 1 (1 for Krum, m > 1 for Multi-Krum's average of the "
            f"m best-scored updates)."
        )
    if problems:
        raise ConfigError(" ".join(problems))


class TrimmedMeanAggregator(Aggregator):
    """Coordinate-wise trimmed mean; ignores the weights (as Flower's FedTrimmedAvg does).

    Args:
        beta: Fraction cut at each end: ``int(beta * n)`` of the n client values per coordinate (Flower's
            ``beta``, default 0.2).
    """

    def __init__(self, *, beta: float = 0.2) -> None:
        check_beta(beta, f"{OPTION}.beta")
        self.beta = beta
        self.option = f"{OPTION}.beta"  # how warnings name beta (FedTrimmedAvg's is strategy.init_args.beta)

    @override
    def __call__(self, states: Sequence[Mapping[str, Tensor]], weights: Sequence[float]) -> dict[str, Tensor]:
        warn_if_trims_nothing(self.beta, len(states), self.option)
        return trimmed_mean(states, self.beta)

    @override
    def hparams(self) -> dict[str, Any]:
        return {"beta": self.beta}


class KrumAggregator(Aggregator):
    """Krum (``num_selected=1``): the update with the lowest Krum score; Multi-Krum (``num_selected=m > 1``):
    the weighted mean of the m lowest-scored updates, weighted like FedAvg (as Flower does).

    Args:
        num_malicious: ``f``, the number of Byzantine clients tolerated; each score sums the squared distances to
            the ``max(1, n - f - 2)`` nearest other updates (Flower's ``num_malicious_clients``).
        num_selected: ``m``, how many updates are kept (Flower's ``num_clients_to_keep``, where 0 means Krum).
    """

    def __init__(self, *, num_malicious: int = 0, num_selected: int = 1) -> None:
        check_krum(num_malicious, num_selected, OPTION)
        self.num_malicious = num_malicious
        self.num_selected = num_selected

    @override
    def __call__(self, states: Sequence[Mapping[str, Tensor]], weights: Sequence[float]) -> dict[str, Tensor]:
        n = len(states)
        if n <= 2 * self.num_malicious + 2:
            # Blanchard et al.'s guarantee needs n > 2f + 2; Flower (and so fedlit) still aggregates.
            warnings.warn(
                f"Krum with num_malicious={self.num_malicious} needs more than {2 * self.num_malicious + 2} updates "
                f"per round to be Byzantine-robust; this round has {n}.",
                stacklevel=2,
            )
        chosen = krum_select(states, self.num_malicious, self.num_selected)
        if self.num_selected == 1:
            return {k: t.detach().clone() for k, t in states[chosen[0]].items()}
        return weighted_average([states[i] for i in chosen], [weights[i] for i in chosen])

    @override
    def hparams(self) -> dict[str, Any]:
        return {"num_malicious": self.num_malicious, "num_selected": self.num_selected}
