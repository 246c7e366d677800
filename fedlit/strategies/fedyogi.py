"""FedYogi: Yogi as the server optimizer of federated averaging.

Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar, McMahan. "Adaptive Federated Optimization." ICLR 2021.
https://arxiv.org/abs/2003.00295

Algorithm 2 with the Yogi rule (line 13), per coordinate:

- ``Delta_t = aggregate(x_{t,k}) - x_t``;  ``m_t = beta_1 m_{t-1} + (1 - beta_1) Delta_t``   (lines 9-11)
- ``v_t = v_{t-1} - (1 - beta_2) Delta_t^2 sign(v_{t-1} - Delta_t^2)``        (line 13)
- ``x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)``                            (line 15)

``m_{-1} = v_{-1} = 0`` (so the first ``v`` is ``(1 - beta_2) Delta^2``; ``v`` never goes negative), no bias correction.
Defaults eta = 0.01, tau = 0.01, beta_1 = 0.9, beta_2 = 0.99 (the FedPxN authors' code).

Symbols -> code, and the Deviations shared by FedAdagrad, FedAdam and FedYogi (v starts at 0, clients weighted
by examples, integer buffers only aggregated, Delta through the aggregator): see :mod:`fedlit.strategies.fedopt`.

Flower equivalence: ``FedYogi(eta=e, tau=u, beta_1=b1, beta_2=b2)`` equals ``flwr.server.strategy.FedYogi(
initial_parameters=<x_0>, eta=e, tau=u, beta_1=b1, beta_2=b2)`` (flwr 1.41, which starts m and v at 0 and has no
bias correction) fed the same ``FitRes(num_examples=n_k)``; Flower's defaults are eta = 0.01, tau = 1e-3.
"""

from __future__ import annotations

import torch
from torch import Tensor
from typing_extensions import override

from fedlit.strategies.fedopt import FedOpt


class FedYogi(FedOpt):
    """Federated averaging with a Yogi server optimizer (Reddi et al. 2021).

    Takes :class:`FedOpt`'s arguments.
    """

    @override
    def second_moment(self, v: Tensor, delta_sq: Tensor) -> Tensor:
        """``v_t = v_{t-1} - (1 - beta_2) Delta_t^2 sign(v_{t-1} - Delta_t^2)`` (line 13)."""
        return v - (1 - self.beta_2) * delta_sq * torch.sign(v - delta_sq)
