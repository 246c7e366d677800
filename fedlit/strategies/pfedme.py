"""pFedMe: personalized models as Moreau envelopes of the clients' losses around the local model.

T. Dinh, Tran, Nguyen. "Personalized Federated Learning with Moreau Envelopes." NeurIPS 2020.
https://arxiv.org/abs/2006.08848 (code read: the authors' ``userpFedMe.py`` and ``serverpFedMe.py``, PFLlib's
``clientpFedMe.py`` and ``serverpFedMe.py``)

Client i's personalized model is the proximal point of its loss at its local model ``w_i`` (Eq. 3 / 7):

    theta_i(w_i) = argmin_theta f_i(theta; D) + lam/2 ||theta - w_i||^2

Per local step (Algorithm 1), on one batch ``D``:

- the inner problem solved approximately by ``K`` gradient steps of the personal learning rate ``p``:
  ``theta <- theta - p (grad f_i(theta; D) + lam (theta - w_i))``, ``K`` times
- ``w_i <- w_i - eta lam (w_i - theta)`` (Eq. 8: a gradient step of the Moreau envelope, whose gradient is
  ``lam (w_i - theta_i(w_i))``): the loop's step of the module's optimizer at learning rate ``eta`` on the loss
  ``lam/2 ||w_i - theta||^2`` with ``theta`` held fixed (:meth:`pFedMe.training_loss`)

Server (Algorithm 1): ``w <- (1 - beta) w + beta * mean_i w_i`` over the clients of the round (Eq. 10; the mean is
FedAvg's, ``weighting`` and ``aggregator`` as FedAvg's). ``beta = 1`` is FedAvg's server; the paper also runs
``beta = 2``.

``theta`` starts each turn from the received ``w`` (as both codes, which reset the personal model at each round)
and is warm-started from one local step's solution to the next. Each client is evaluated with its ``theta`` after
its last turn (kept in its ``client_state``; before its first turn, the global model), and the global ``w`` is
evaluated beside it (:meth:`pFedMe.global_model_state`).

Symbols -> code: ``w`` -> ``global_state``; ``w_i`` -> the module's shared (and personal) trainable tensors;
``theta`` -> ``self._turn["theta"]``, kept as ``client_state["theta"]``; ``lam`` -> ``lam``; ``K`` -> ``K``; ``p``
-> ``personal_lr``; ``eta`` -> the local learning rate; ``beta`` -> ``beta``; the math -> :func:`pfedme_inner_step`,
:func:`pfedme_server_mix`.

Defaults: ``lam = 15``, ``K = 5`` (the paper's MNIST runs and the authors' defaults), ``personal_lr = 0.01`` (the
paper's Synthetic runs and PFLlib's default; its MNIST runs use 0.1 and 0.09), ``beta = 1`` (the paper's pFedMe;
PFLlib's command-line default ``beta = 0`` would freeze the global model, so it must be given there). The paper's
``eta`` is 0.005: the local learning rate of the recipe.

Deviation (both codes, not fedlit): the authors' and PFLlib's inner step adds ``0.001 theta`` (an L2 term the
paper does not have); fedlit follows the paper. Deviation (both codes, not fedlit), for users comparing numbers:
the authors' and PFLlib's "personalized" evaluation measures ``w_i``, not ``theta_i(w_i)`` (the list their
optimizer's step returns as ``theta`` is the model's own parameters, which the end of the turn overwrites with
``w_i``); fedlit evaluates the paper's personalized model ``theta_i(w_i)``. Deviation: with momentum, weight
decay or Adam in the local optimizer, the step of ``w_i`` is that optimizer's step of ``lam (w_i - theta)`` (the
paper's is plain SGD); the inner steps are always plain gradient steps. Deviation: the inner gradients are
computed without the 16-bit gradient scaler (16-bit mixed precision can underflow them; bf16 cannot). Memory per
client: ``theta``, a copy of the shared and personal tensors; the server holds FedAvg's state. A local step costs
``K + 1`` forward and backward passes (the loop's forward of ``w_i`` gives the logged training loss).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import torch
from torch import Tensor
from typing_extensions import override

from fedlit.core.contexts import Batch, ClientContext, StepOutput
from fedlit.core.errors import ConfigError
from fedlit.module import FederatedModule
from fedlit.strategies.base import ClientUpdate
from fedlit.strategies.common.aggregators import Aggregator
from fedlit.strategies.common.personal_copy import MethodCall, functional_loss, load_into, personal_copy
from fedlit.strategies.fedavg import FedAvg
from fedlit.strategies.fedprox import squared_distance


def pfedme_inner_step(
    theta: Mapping[str, Tensor], grad: Mapping[str, Tensor | None], w: Mapping[str, Tensor], lam: float, lr: float
) -> dict[str, Tensor]:
    """``theta - lr (grad f(theta) + lam (theta - w))`` per tensor of ``theta`` (one gradient step of pFedMe's
    inner problem); a missing gradient counts as zero."""
    out = {}
    for name, t in theta.items():
        step = lam * (t.detach() - w[name].detach().to(t))
        g = grad.get(name)
        if g is not None:
            step = step + g.detach().to(t)
        out[name] = t.detach() - lr * step
    return out


def pfedme_server_mix(previous: Mapping[str, Tensor], mean: Mapping[str, Tensor], beta: float) -> dict[str, Tensor]:
    """``(1 - beta) previous + beta mean`` per tensor of ``mean`` (Eq. 10), in ``mean``'s dtype, computed in
    float64."""
    return {
        n: ((1 - beta) * previous[n].to(m.device, torch.float64) + beta * m.to(torch.float64)).to(m.dtype)
        for n, m in mean.items()
    }


class pFedMe(FedAvg):
    """pFedMe: local models ``w_i`` that follow the Moreau envelope, personalized models ``theta_i`` their prox.

    Args:
        lam: The weight ``lam`` of ``lam/2 ||theta - w_i||^2`` (default 15, the paper's MNIST runs).
        K: Gradient steps of the inner problem per local step (default 5, the paper's).
        personal_lr: Their learning rate (default 0.01, the paper's Synthetic runs and PFLlib's).
        beta: The server's step ``w <- (1 - beta) w + beta * mean_i w_i`` (default 1: FedAvg's server; the paper
            also uses 2).
        weighting: FedAvg's client weights for the mean: ``num_examples`` (default, as both codes; the paper
            writes a plain mean) or ``uniform``.
        aggregator: FedAvg's rule for the mean (None: the weighted mean).
    """

    #: The server reads the uploads through FedAvg's weighted mean only (then mixes it with its own state).
    secure_aggregation = True

    def __init__(
        self,
        *,
        lam: float = 15.0,
        K: int = 5,
        personal_lr: float = 0.01,
        beta: float = 1.0,
        weighting: Literal["num_examples", "uniform"] = "num_examples",
        aggregator: Aggregator | None = None,
    ) -> None:
        problems = []
        key = "strategy.init_args."
        if isinstance(lam, bool) or not isinstance(lam, int | float) or not lam > 0:
            problems.append(f"{key}lam={lam!r} must be > 0 (15 in the paper)")
        if isinstance(K, bool) or not isinstance(K, int) or K < 1:
            problems.append(f"{key}K={K!r} must be an int >= 1 (5 in the paper)")
        if isinstance(personal_lr, bool) or not isinstance(personal_lr, int | float) or not personal_lr > 0:
            problems.append(f"{key}personal_lr={personal_lr!r} must be > 0 (0.01 in the paper's Synthetic runs)")
        if isinstance(beta, bool) or not isinstance(beta, int | float) or not beta > 0:
            problems.append(f"{key}beta={beta!r} must be > 0 (1: FedAvg's server; the paper also uses 2)")
        if problems:
            raise ConfigError("Invalid pFedMe settings: " + "; ".join(problems) + ".")
        super().__init__(weighting=weighting, aggregator=aggregator)
        self.lam, self.K, self.personal_lr, self.beta = float(lam), K, float(personal_lr), float(beta)
        self._turn: dict[str, Any] = {}

    @override
    def global_model_state(self, client_id: str) -> dict[str, Tensor]:
        """The server's ``w``, evaluated on every client beside its ``theta``."""
        return dict(self.global_state)

    @override
    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> dict[str, Tensor]:
        """``w <- (1 - beta) w + beta * mean_i w_i`` on the shared parameters (Eq. 10); buffers (normalization
        statistics) take the mean, as PFLlib's."""
        if not updates:
            return dict(self.global_state)
        mean = self.combine(updates)
        params = set(self.shared_parameter_names())
        mixed = pfedme_server_mix(self.global_state, {n: t for n, t in mean.items() if n in params}, self.beta)
        return {**self.global_state, **mean, **mixed}

    # ------------------------------------------------------------------------------------------ client
    def on_client_fit_start(self, pl_module: FederatedModule, client: ClientContext) -> None:
        """Start ``theta`` from the received ``w`` (and the client's personal tensors)."""
        theta, trainable = personal_copy(pl_module)
        self._turn = {
            "client": client,
            "theta": theta,
            "trainable": trainable,
            "training_step": MethodCall(pl_module, "training_step"),
        }

    def solve_inner(self, pl_module: FederatedModule, batch: Any) -> None:
        """``K`` gradient steps of ``f(theta; D) + lam/2 ||theta - w_i||^2`` from the current ``theta``."""
        turn = self._turn
        theta, names = turn["theta"], turn["trainable"]
        live = dict(pl_module.named_parameters())
        w = {n: live[n].detach() for n in names}
        for _ in range(self.K):
            loss = functional_loss(turn["training_step"], theta, batch, turn["client"])
            grads = torch.autograd.grad(loss, [theta[n] for n in names], allow_unused=True)
            stepped = pfedme_inner_step(
                {n: theta[n] for n in names}, dict(zip(names, grads, strict=True)), w, self.lam, self.personal_lr
            )
            for name in names:
                theta[name] = stepped[name].requires_grad_(True)

    @override
    def training_loss(
        self, pl_module: FederatedModule, loss: Tensor, batch: Batch, outputs: StepOutput = None
    ) -> Tensor:
        """Solve the inner problem on the batch, then return ``lam/2 ||w_i - theta||^2`` (``theta`` fixed), whose
        gradient ``lam (w_i - theta)`` the loop's step takes (Eq. 8)."""
        turn = self._turn
        if not turn or not turn["trainable"]:
            return loss
        self.solve_inner(pl_module, batch)
        live = dict(pl_module.named_parameters())
        params = {n: live[n] for n in turn["trainable"]}
        target = {n: turn["theta"][n].detach() for n in turn["trainable"]}
        return (self.lam / 2 * squared_distance(params, target)).to(loss.dtype)

    def on_client_fit_end(self, client_state: dict[str, Any], client: ClientContext) -> None:
        """Keep ``theta``, the model the client is evaluated with."""
        if self._turn:
            device = client.store.device
            client_state["theta"] = {n: t.detach().to(device, copy=True) for n, t in self._turn["theta"].items()}
        self._turn = {}

    @override
    def on_client_evaluate_start(self, pl_module: FederatedModule, client_state: dict[str, Any]) -> None:
        """Put the client's ``theta`` into the live module (before its first turn: ``w`` as sent)."""
        if "theta" in client_state:
            load_into(pl_module, client_state["theta"])
