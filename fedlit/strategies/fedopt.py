"""FedOpt: adaptive server optimizers on the averaged client update (the base of FedAdagrad, FedAdam, FedYogi).

Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar, McMahan. "Adaptive Federated Optimization." ICLR 2021.
https://arxiv.org/abs/2003.00295

Algorithm 2 (server side), per coordinate, in the form of the FedPxN authors' code (Yang et al., CHIL 2023):

- lines 9-10 (pseudo-gradient): ``Delta_t = sum_{k in S_t} w_k (x_{t,k} - x_t) = aggregate(x_{t,k}) - x_t``
- line 11: ``m_t = beta_1 m_{t-1} + (1 - beta_1) Delta_t``
- lines 12-14: ``v_t`` by the subclass's rule (12 Adagrad, 13 Yogi, 14 Adam)
- line 15: ``x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)``

``m_{-1} = v_{-1} = 0``; no bias correction (FedAdam offers Flower's as an option).

Symbols -> code: ``x_t`` -> ``self.global_state``; ``x_{t,k}`` -> ``update.state``; ``Delta_t`` -> ``delta``;
``m_t``, ``v_t`` -> ``self.m``, ``self.v`` (checkpointed); ``eta`` (server learning rate) -> ``eta``; ``tau``
(adaptivity) -> ``tau``; ``beta_1``, ``beta_2`` -> ``beta_1``, ``beta_2``; ``w_k`` -> the FedAvg weights.

Flower equivalence (flwr 1.41, ``flwr.server.strategy``): with the same ``initial_parameters``, ``eta``, ``tau``,
``beta_1``, ``beta_2`` and FitRes ``num_examples``, fedlit's FedAdagrad(beta_1=0) equals Flower's FedAdagrad
(which fixes beta_1 = 0), FedYogi equals FedYogi, and FedAdam(bias_correction=True) equals FedAdam. Flower's
defaults differ from ours (eta 0.1, tau 1e-9; FedYogi eta 0.01, tau 1e-3), so pass every value explicitly.

Deviation: line 1 initializes ``v_{-1} >= tau^2``; the FedPxN code and Flower start ``v`` at 0.
Deviation: line 10 averages the clients uniformly; fedlit weighs them by examples like FedAvg (the FedPxN
code's ``w_k``, Flower's); ``weighting="uniform"`` gives the paper's mean.
Deviation (``optimize_buffers``, a switch): only parameters get the server optimizer. Buffers are
aggregated as FedAvg does: BatchNorm's running statistics are not trained by gradients, and an Adam step on a
running variance can overshoot below zero; integer buffers (``num_batches_tracked``) are always only aggregated.
``optimize_buffers=True`` gives floating buffers the optimizer too, as Flower (which sees only arrays) does.
Deviation: ``Delta_t`` goes through the strategy's ``aggregator`` (default: the weighted mean of line 10), so
a robust rule can replace the mean: ``Delta_t = aggregator(x_{t,k}) - x_t``.
Deviation: ``m`` and ``v`` are kept in float32 for half-precision tensors (in the tensor's dtype otherwise).
"""

from __future__ import annotations

import abc
from typing import Any, Literal

import torch
from torch import Tensor
from typing_extensions import override

from fedlit.core.errors import ConfigError
from fedlit.strategies.base import ClientUpdate
from fedlit.strategies.common.aggregators import Aggregator
from fedlit.strategies.fedavg import FedAvg

OPTION = "strategy.init_args"


class FedOpt(FedAvg):
    """FedAvg's average turned into a pseudo-gradient for an adaptive server optimizer (Reddi et al., Alg. 2).

    Subclasses define the second-moment rule :meth:`second_moment` and take these arguments (FedYogi all of
    them, FedAdam adds ``bias_correction``, FedAdagrad has no ``beta_2``).

    Args:
        eta: Server learning rate (> 0).
        tau: Adaptivity, added to ``sqrt(v)`` (> 0).
        beta_1: Momentum of ``m`` in [0, 1) (Algorithm 2 has it; 0 gives Flower's FedAdagrad).
        beta_2: Decay of ``v`` in [0, 1), in Adam's and Yogi's rules.
        optimize_buffers: Also apply the optimizer to floating buffers (BatchNorm statistics), as Flower does;
            default: average them.
        weighting: As in :class:`FedAvg`.
        aggregator: As in :class:`FedAvg`; the pseudo-gradient is ``aggregator(x_k) - x``.
    """

    #: :meth:`aggregate` reads the uploads only through :meth:`combine`, FedAvg's weighted mean (``m``, ``v`` are the
    #: server's own), so SecAgg+ can replace them as for FedAvg.
    secure_aggregation = True

    def __init__(
        self,
        *,
        eta: float = 0.01,
        tau: float = 0.01,
        beta_1: float = 0.9,
        beta_2: float = 0.99,
        optimize_buffers: bool = False,
        weighting: Literal["num_examples", "uniform"] = "num_examples",
        aggregator: Aggregator | None = None,
    ) -> None:
        super().__init__(weighting=weighting, aggregator=aggregator)
        problems = []
        if not eta > 0:
            problems.append(f"{OPTION}.eta={eta} must be > 0 (the server learning rate; default 0.01).")
        if not tau > 0:
            problems.append(f"{OPTION}.tau={tau} must be > 0 (it keeps m / (sqrt(v) + tau) finite where v = 0).")
        for name, value in (("beta_1", beta_1), ("beta_2", beta_2)):
            if not 0 <= value < 1:
                problems.append(f"{OPTION}.{name}={value} must be in [0, 1).")
        if problems:
            raise ConfigError(" ".join(problems))
        self.eta, self.tau, self.beta_1, self.beta_2 = eta, tau, beta_1, beta_2
        self.optimize_buffers = optimize_buffers
        self.m: dict[str, Tensor] = {}
        self.v: dict[str, Tensor] = {}

    @override
    def setup_server_state(self) -> None:
        """Start ``m = v = 0``."""
        super().setup_server_state()
        self.m, self.v = {}, {}

    @abc.abstractmethod
    def second_moment(self, v: Tensor, delta_sq: Tensor) -> Tensor:
        """``v_t`` from ``v_{t-1}`` and ``Delta_t^2`` (Algorithm 2, lines 12-14)."""

    def step_size(self, server_round: int) -> float:
        """The factor of ``m / (sqrt(v) + tau)`` in line 15: ``eta`` (FedAdam may bias-correct it)."""
        return self.eta

    @override
    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> dict[str, Tensor]:
        """``x += eta m / (sqrt(v) + tau)`` with ``Delta = aggregate(x_k) - x`` on floating tensors (Alg. 2)."""
        if not updates:
            return dict(self.global_state)
        target = self.combine(updates)
        lr = self.step_size(server_round)
        new_state = dict(self.global_state)
        for name, new in target.items():
            x = self.global_state[name]
            if not x.is_floating_point() or (self.roles.is_buffer(name) and not self.optimize_buffers):
                new_state[name] = new
                continue
            dtype = torch.promote_types(x.dtype, torch.float32)
            delta = new.to(dtype) - x.to(dtype)  # lines 9-10
            m = self.m.get(name, torch.zeros_like(delta))
            v = self.v.get(name, torch.zeros_like(delta))
            m = self.beta_1 * m + (1 - self.beta_1) * delta  # line 11
            v = self.second_moment(v, delta * delta)  # lines 12-14
            self.m[name], self.v[name] = m, v
            new_state[name] = (x.to(dtype) + lr * m / (v.sqrt() + self.tau)).to(x.dtype)  # line 15
        return new_state

    @override
    def state_dict(self) -> dict[str, Any]:
        """The server model and the moments ``m``, ``v``."""
        return {**super().state_dict(), "m": dict(self.m), "v": dict(self.v)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        super().load_state_dict(state_dict)
        self.m, self.v = dict(state_dict["m"]), dict(state_dict["v"])

    @override
    def hparams(self) -> dict[str, Any]:
        """The arguments, with ``optimize_buffers`` only when it is on."""
        hparams = super().hparams()
        if not self.optimize_buffers:
            hparams.pop("optimize_buffers", None)
        return hparams
