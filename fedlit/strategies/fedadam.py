"""FedAdam: Adam as the server optimizer of federated averaging.

Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar, McMahan. "Adaptive Federated Optimization." ICLR 2021.
https://arxiv.org/abs/2003.00295

Algorithm 2 with the Adam rule (line 14), per coordinate:

- ``Delta_t = aggregate(x_{t,k}) - x_t``;  ``m_t = beta_1 m_{t-1} + (1 - beta_1) Delta_t``   (lines 9-11)
- ``v_t = beta_2 v_{t-1} + (1 - beta_2) Delta_t^2``                         (line 14)
- ``x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)``                            (line 15)

``m_{-1} = v_{-1} = 0``, no bias correction (the FedPxN authors' code). Defaults eta = 0.01, tau = 0.01,
beta_1 = 0.9, beta_2 = 0.99.

Symbols -> code, and the Deviations shared by FedAdagrad, FedAdam and FedYogi (v starts at 0, clients weighted
by examples, integer buffers only aggregated, Delta through the aggregator): see :mod:`fedlit.strategies.fedopt`.

Deviation (``bias_correction``, a switch): the paper and the FedPxN code have no bias correction
(default ``False``). ``True`` reproduces Flower's FedAdam (flwr 1.41, ``flwr/server/strategy/fedadam.py``), which
scales the step as ``eta_t = eta sqrt(1 - beta_2^(t + 1)) / (1 - beta_1^(t + 1))`` with ``t`` the server round
(counted from 1, so one step ahead of Kingma & Ba's ``t``) and leaves ``tau`` unscaled.

Flower equivalence: ``FedAdam(eta=e, tau=u, beta_1=b1, beta_2=b2, bias_correction=True)`` equals
``flwr.server.strategy.FedAdam(initial_parameters=<x_0>, eta=e, tau=u, beta_1=b1, beta_2=b2)`` fed the same
``FitRes(num_examples=n_k)``, round by round (Flower's defaults are eta = 0.1, tau = 1e-9).
"""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor
from typing_extensions import override

from fedlit.strategies.fedopt import FedOpt


class FedAdam(FedOpt):
    """Federated averaging with an Adam server optimizer (Reddi et al. 2021).

    Args:
        bias_correction: ``False``: none (the paper, the FedPxN authors' code). ``True``: Flower's step-size correction.
        kwargs: :class:`FedOpt`'s ``eta``, ``tau``, ``beta_1``, ``beta_2``, ``optimize_buffers``, ``weighting``,
            ``aggregator``.
    """

    def __init__(self, *, bias_correction: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bias_correction = bias_correction

    @override
    def second_moment(self, v: Tensor, delta_sq: Tensor) -> Tensor:
        """``v_t = beta_2 v_{t-1} + (1 - beta_2) Delta_t^2`` (line 14)."""
        return self.beta_2 * v + (1 - self.beta_2) * delta_sq

    @override
    def step_size(self, server_round: int) -> float:
        """``eta``, or Flower's ``eta sqrt(1 - beta_2^(t+1)) / (1 - beta_1^(t+1))`` with ``bias_correction``."""
        if not self.bias_correction:
            return self.eta
        t = server_round + 1.0
        return self.eta * math.sqrt(1 - self.beta_2**t) / (1 - self.beta_1**t)

    @override
    def hparams(self) -> dict[str, Any]:
        """The arguments, ``bias_correction`` last (as earlier versions wrote it: a resume compares the repr)."""
        hparams = super().hparams()
        hparams["bias_correction"] = hparams.pop("bias_correction", self.bias_correction)
        return hparams
