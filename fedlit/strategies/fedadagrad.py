"""FedAdagrad: Adagrad as the server optimizer of federated averaging.

Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar, McMahan. "Adaptive Federated Optimization." ICLR 2021.
https://arxiv.org/abs/2003.00295

Algorithm 2 with the Adagrad rule (line 12), per coordinate:

- ``Delta_t = aggregate(x_{t,k}) - x_t``;  ``m_t = beta_1 m_{t-1} + (1 - beta_1) Delta_t``   (lines 9-11)
- ``v_t = v_{t-1} + Delta_t^2``                                              (line 12)
- ``x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)``                            (line 15)

``m_{-1} = v_{-1} = 0``. Defaults eta = 0.01, tau = 0.01, beta_1 = 0.9 (the FedPxN authors' code).

Symbols -> code, and the Deviations shared by FedAdagrad, FedAdam and FedYogi (v starts at 0, clients weighted
by examples, integer buffers only aggregated, Delta through the aggregator): see :mod:`fedlit.strategies.fedopt`.

Flower equivalence: Flower's FedAdagrad (flwr 1.41) fixes beta_1 = 0 (no momentum, ``m_t = Delta_t``), so
``FedAdagrad(eta=e, tau=u, beta_1=0.0)`` equals ``flwr.server.strategy.FedAdagrad(initial_parameters=<x_0>,
eta=e, tau=u)`` fed the same ``FitRes(num_examples=n_k)`` (Flower's defaults are eta = 0.1, tau = 1e-9).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor
from typing_extensions import override

from fedlit.strategies.fedopt import FedOpt


class FedAdagrad(FedOpt):
    """Federated averaging with an Adagrad server optimizer (Reddi et al. 2021).

    Args:
        kwargs: :class:`FedOpt`'s arguments but ``beta_2`` (Adagrad's ``v`` has no decay): ``eta``, ``tau``,
            ``beta_1``, ``optimize_buffers``, ``weighting``, ``aggregator``.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(beta_2=0.0, **kwargs)

    @override
    def second_moment(self, v: Tensor, delta_sq: Tensor) -> Tensor:
        """``v_t = v_{t-1} + Delta_t^2`` (line 12)."""
        return v + delta_sq

    @override
    def hparams(self) -> dict[str, Any]:
        """The arguments but ``beta_2``, which Adagrad does not have."""
        return {k: v for k, v in super().hparams().items() if k != "beta_2"}
