"""APFL: each client mixes a personal model with the global one, the mixing weight learned.

Deng, Kamani, Mahdavi. "Adaptive Personalized Federated Learning." arXiv 2020.
https://arxiv.org/abs/2003.13461 (code read: PFLlib's ``clientapfl.py``, whose alpha update follows FedTorch, the
authors' framework)

Client i holds the global model ``w`` (the module's shared tensors: received, trained, uploaded, FedAvg'd by the
server) and a personal model ``v`` (a second copy of every shared and personal tensor over the one frozen
backbone, kept in ``client_state``, never sent). Its personalized model is the paper's mixed model

    vbar = (1 - a) w + a v

Per local step, on the same batch:

- ``w <- w - lr grad f(w)``: the loop's ordinary step (the module's optimizer)
- ``v <- v - lr grad f(v)``: ``v``'s own loss and gradient, stepped with a mirror of the loop's optimizer (same
  class and hyperparameters per parameter group, this step's learning rate)
- ``a <- clip(a - lr_a (sum <v - w, a grad f(v) + (1 - a) grad f(w)> + 0.02 a), 0, 1)`` with ``v`` and ``w``
  after their steps, the gradients those of the step (the paper's gradient step on ``a``, ``<v - w, grad
  f(vbar)>``, with ``grad f(vbar)`` linearized as the code does, plus the code's 0.02 a)

(Algorithm 1 of the paper, local descent APFL, for ``w`` and ``v``; equation numbers differ between the arXiv
versions, so the updates are written out here.)

After the turn ``v`` is replaced by ``vbar`` (its trainable tensors; its buffers stay its own), which is the
model the client is evaluated with; ``a`` is kept per client (``alpha`` the first time, 0.5 by default).

Symbols -> code: ``w`` -> the module's shared tensors (the server's ``global_state`` after aggregation); ``v`` ->
``client_state["v"]`` (``vbar`` after a turn); ``a`` -> ``client_state["alpha"]`` (a float); ``lr_a`` ->
``lr_alpha`` (the loop's current learning rate when None); 0.02 -> ``alpha_penalty``; the math ->
:func:`apfl_alpha_step`, :func:`apfl_mix`.

Memory per client: one copy of the shared and personal tensors (``v``), a float, and ``v``'s optimizer state under
``federation.optimizer_state: persist``. The server holds FedAvg's state only.

Deviation (from the paper, as the code): the paper steps ``v`` with ``grad_v f(vbar) = a grad f(vbar)`` and ``a``
with the exact ``<v - w, grad f(vbar)>``; the code, and fedlit, step ``v`` on its own loss ``f(v)``, replace
``grad f(vbar)`` by ``a grad f(v) + (1 - a) grad f(w)`` in the ``a`` step, add ``0.02 a`` to it and overwrite
``v`` with ``vbar`` at the end of each turn. Deviation: ``v`` starts as a copy of the ``w`` a client receives at its
first turn (the code copies the initial model: the same for a client that trains in round 1). Deviation: the code
steps ``a`` with the constant initial learning rate; fedlit with the loop's current one (``lr_alpha`` fixes it).
The paper starts ``a`` at 0.5 in most experiments (its argument here; some benchmarks use 1.0). Each client
is evaluated with ``vbar``; ``w``, the global model, is evaluated beside it (:meth:`APFL.global_model_state`).
Evaluation downloads are counted as for FedAvg.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, cast

import torch
from torch import Tensor
from torch.optim import Optimizer
from typing_extensions import override

from fedlit.core.contexts import Batch, ClientContext, StepOutput
from fedlit.core.errors import ConfigError
from fedlit.module import FederatedModule
from fedlit.strategies.common.aggregators import Aggregator
from fedlit.strategies.common.personal_copy import (
    MethodCall,
    functional_loss,
    load_into,
    mirror_optimizer,
    personal_copy,
    sync_hyperparameters,
    to_device,
    unscale_gradients,
)
from fedlit.strategies.fedavg import FedAvg


def apfl_alpha_step(
    alpha: float,
    v: Mapping[str, Tensor],
    w: Mapping[str, Tensor],
    grad_v: Mapping[str, Tensor],
    grad_w: Mapping[str, Tensor],
    lr: float,
    penalty: float = 0.02,
) -> float:
    """``clip(a - lr (sum_k <v_k - w_k, a grad_v_k + (1 - a) grad_w_k> + penalty a), 0, 1)`` over the keys of
    ``v`` (APFL's mixing-weight step as the code computes it); a key missing from a gradient counts as a zero
    gradient. Float64."""
    total = torch.zeros((), dtype=torch.float64)
    for name, tensor in v.items():
        ref = tensor.detach().to(torch.float64)
        diff = ref - w[name].detach().to(ref.device, torch.float64)
        grad = torch.zeros_like(ref)
        if grad_v.get(name) is not None:
            grad = grad + alpha * grad_v[name].detach().to(ref.device, torch.float64)
        if grad_w.get(name) is not None:
            grad = grad + (1 - alpha) * grad_w[name].detach().to(ref.device, torch.float64)
        total = total + (diff * grad).sum().cpu()
    step = float(total) + penalty * alpha
    return min(1.0, max(0.0, alpha - lr * step))


def apfl_mix(w: Mapping[str, Tensor], v: Mapping[str, Tensor], alpha: float) -> dict[str, Tensor]:
    """``vbar = (1 - a) w + a v`` per tensor of ``v`` (APFL's mixed model), in ``v``'s dtype and device."""
    return {
        n: ((1 - alpha) * w[n].detach().to(t.device, torch.float64) + alpha * t.detach().to(torch.float64)).to(t.dtype)
        for n, t in v.items()
    }


class APFL(FedAvg):
    """Adaptive personalized FL: a personal ``v`` per client, mixed with the global ``w`` by a learned ``a``.

    Args:
        alpha: The mixing weight ``a`` each client starts from (default 0.5, as the paper; 1.0: start from ``v``).
        lr_alpha: Learning rate of ``a``; None (default): the loop's learning rate at each step (the code's).
        alpha_penalty: The ``0.02`` of ``+ 0.02 a`` in the ``a`` step (the code's; 0 leaves the paper's step).
        weighting: FedAvg's client weights for ``w``: ``num_examples`` (default) or ``uniform``.
        aggregator: FedAvg's rule for ``w`` (None: the weighted mean).
    """

    #: The server is FedAvg's weighted mean of the shared tensors (``v`` and ``a`` never leave the client), so
    #: SecAgg+ can replace the uploads (with the default aggregator and ``weighting="num_examples"``).
    secure_aggregation = True

    def __init__(
        self,
        *,
        alpha: float = 0.5,
        lr_alpha: float | None = None,
        alpha_penalty: float = 0.02,
        weighting: Literal["num_examples", "uniform"] = "num_examples",
        aggregator: Aggregator | None = None,
    ) -> None:
        problems = []
        key = "strategy.init_args."
        if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 <= alpha <= 1:
            problems.append(f"{key}alpha={alpha!r} must be in [0, 1] (0.5 in the paper)")
        if lr_alpha is not None and (isinstance(lr_alpha, bool) or not lr_alpha >= 0):
            problems.append(f"{key}lr_alpha={lr_alpha!r} must be >= 0, or null for the local learning rate")
        if isinstance(alpha_penalty, bool) or not alpha_penalty >= 0:
            problems.append(f"{key}alpha_penalty={alpha_penalty!r} must be >= 0 (0.02 in the code)")
        if problems:
            raise ConfigError("Invalid APFL settings: " + "; ".join(problems) + ".")
        super().__init__(weighting=weighting, aggregator=aggregator)
        self.alpha = float(alpha)
        self.lr_alpha = None if lr_alpha is None else float(lr_alpha)
        self.alpha_penalty = float(alpha_penalty)
        self._turn: dict[str, Any] = {}

    @override
    def global_model_state(self, client_id: str) -> dict[str, Tensor]:
        """``w``, the FedAvg model, evaluated on every client beside its ``vbar``."""
        return dict(self.global_state)

    # ------------------------------------------------------------------------------------------ client
    def on_client_fit_start(
        self, pl_module: FederatedModule, client_state: dict[str, Any], client: ClientContext
    ) -> None:
        """Take ``v`` (a copy of the received ``w`` at the client's first turn) and ``a``."""
        v, trainable = personal_copy(pl_module, client_state.get("v"))
        self._turn = {
            "client": client,
            "v": v,
            "trainable": trainable,
            "optimizer": None,
            "alpha": float(client_state.get("alpha", self.alpha)),
            "training_step": MethodCall(pl_module, "training_step"),
            "optimizer_state": client_state.get("optimizer") if client.local.optimizer_state == "persist" else None,
        }

    @override
    def training_loss(
        self, pl_module: FederatedModule, loss: Tensor, batch: Batch, outputs: StepOutput = None
    ) -> Tensor:
        """``f(w) + f(v)``: the loop's backward gives ``w`` and ``v`` their own gradients (they share no leaf)."""
        turn = self._turn
        if not turn:
            return loss
        loss_v = functional_loss(turn["training_step"], turn["v"], batch, turn["client"])
        return loss + loss_v.to(loss.dtype)

    @override
    def on_before_optimizer_step(self, client: ClientContext) -> None:
        """Unscale ``v``'s gradients under 16-bit mixed precision (the loop unscales the module's only)."""
        if self._turn:
            unscale_gradients(self._turn["v"], self._turn["trainable"], client.scaler)

    @override
    def on_before_zero_grad(self, pl_module: FederatedModule, optimizer: Optimizer, stepped: bool) -> None:
        """After ``w``'s step: step ``v`` (same hyperparameters), then ``a`` from both models after their steps and
        the gradients of the step; nothing moves on a step the gradient scaler skipped."""
        turn = self._turn
        if not turn:
            return
        v = turn["v"]
        if stepped:
            inner = getattr(optimizer, "optimizer", optimizer)
            if turn["optimizer"] is None:
                turn["optimizer"] = mirror_optimizer(pl_module, inner, v, turn["optimizer_state"], "APFL")
            sync_hyperparameters(turn["optimizer"], inner)
            turn["optimizer"].step()
            live = dict(pl_module.named_parameters())
            names = turn["trainable"]
            lr = self.lr_alpha if self.lr_alpha is not None else float(inner.param_groups[0]["lr"])
            turn["alpha"] = apfl_alpha_step(
                turn["alpha"],
                {n: v[n] for n in names},
                {n: live[n] for n in names},
                {n: cast(Tensor, v[n].grad) for n in names},
                {n: cast(Tensor, live[n].grad) for n in names},
                lr,
                self.alpha_penalty,
            )
        for name in turn["trainable"]:
            v[name].grad = None

    def on_client_fit_end(
        self, pl_module: FederatedModule, client_state: dict[str, Any], client: ClientContext
    ) -> None:
        """Keep ``v <- vbar`` (its trainable tensors mixed with the trained ``w``), ``a`` and, under ``persist``,
        ``v``'s optimizer state."""
        turn = self._turn
        if not turn:
            return
        device = client.store.device
        v = {n: t.detach() for n, t in turn["v"].items()}
        live = pl_module.named_tensors("shared", "personal")
        v.update(apfl_mix(live, {n: v[n] for n in turn["trainable"]}, turn["alpha"]))
        client_state["v"] = {n: t.to(device, copy=True) for n, t in v.items()}
        client_state["alpha"] = turn["alpha"]
        if client.local.optimizer_state == "persist" and turn["optimizer"] is not None:
            client_state["optimizer"] = to_device(turn["optimizer"].state_dict(), device)
        self._turn = {}

    @override
    def on_client_evaluate_start(self, pl_module: FederatedModule, client_state: dict[str, Any]) -> None:
        """Put the client's ``vbar`` into the live module (before its first turn: ``w`` as sent)."""
        if "v" in client_state:
            load_into(pl_module, client_state["v"])
