"""Ditto: a personal model per client, pulled toward the global model that FedAvg trains.

Li, Hu, Beirami, Smith. "Ditto: Fair and Robust Federated Learning Through Personalization." ICML 2021.
https://proceedings.mlr.press/v139/li21h.html (code read: the authors' ``flearn/trainers_MTL/ditto.py`` and
PFLlib's ``clientditto.py``)

The objective of client k (Eq. 1 / Eq. 2 of the paper): ``min_v h_k(v; w*) = F_k(v) + lam/2 ||v - w*||^2``, with
``w*`` the global model, trained by any federated solver: here FedAvg. Algorithm 1, per local step of round t:

- ``w <- w - eta grad F_k(w)``: the loop's ordinary step of the module's optimizer (FedAvg's local solver)
- ``v <- v - eta (grad F_k(v) + lam (v - w^t))``: ``v``'s own step, ``w^t`` being the global model the client
  received this round (fixed during the turn), on the same batch, with a mirror of the loop's optimizer (same class
  and hyperparameters per parameter group, this step's learning rate)

Both gradients come from the model's values before the step (one backward pass over ``F_k(w) + F_k(v) +
lam/2 ||v - w^t||^2``: ``v`` and ``w`` share no leaf). ``v`` starts as a copy of the first ``w^t`` a client
receives and is kept in its ``client_state`` between turns; each client is evaluated with ``v``, and ``w`` (the
global model) is evaluated beside it (:meth:`Ditto.global_model_state`).

Symbols -> code: ``w`` -> the module's shared tensors (the server's ``global_state`` after aggregation); ``v`` ->
``client_state["v"]``; ``w^t`` -> ``self._turn["anchor"]`` (what the server sent); ``lam`` -> ``lam``; ``eta`` ->
the local learning rate (the same for both models, as the code); ``F_k`` -> the module's loss.

Defaults: ``lam = 1.0``, the value of the authors' released run scripts (``--lam=1``; the paper tunes lam per data
set over a small grid, and the code's and PFLlib's command-line defaults are 0, which makes ``v`` plain local
training). Memory per client: one copy of the shared and personal tensors (``v``) and, under
``federation.optimizer_state: persist``, ``v``'s optimizer state. The server holds FedAvg's state only.

Deviation (PFLlib, not fedlit): PFLlib trains ``v`` for its own ``plocal_epochs`` passes over the data before
``w``'s turn and with plain SGD; the authors' code, and fedlit, step ``v`` once per local step of ``w``, on the same
batch. Deviation: with momentum, weight decay or Adam in the local optimizer, ``v``'s step is that optimizer's step
of the gradient above (the paper's is plain SGD). Deviation: the proximal term covers the shared trainable tensors
(those ``w^t`` has); personal tensors of ``v`` (a FedBN-style personal normalization layer) train on ``F_k`` alone,
and ``v``'s normalization statistics are its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

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
    keep_copy,
    load_into,
    personal_copy,
    step_copy,
    unscale_gradients,
)
from fedlit.strategies.fedavg import FedAvg
from fedlit.strategies.fedprox import squared_distance


class Ditto(FedAvg):
    """Ditto: FedAvg's global model ``w``, and per client a personal ``v`` regularized toward it.

    Args:
        lam: The weight ``lam`` of ``lam/2 ||v - w^t||^2`` (default 1.0, the authors' scripts; 0: ``v`` is local
            training from the first global model it receives).
        weighting: FedAvg's client weights for ``w``: ``num_examples`` (default) or ``uniform``.
        aggregator: FedAvg's rule for ``w`` (None: the weighted mean).
    """

    #: The server is FedAvg's weighted mean of the shared tensors (``v`` never leaves the client), so SecAgg+ can
    #: replace the uploads (with the default aggregator and ``weighting="num_examples"``).
    secure_aggregation = True

    def __init__(
        self,
        *,
        lam: float = 1.0,
        weighting: Literal["num_examples", "uniform"] = "num_examples",
        aggregator: Aggregator | None = None,
    ) -> None:
        if isinstance(lam, bool) or not isinstance(lam, int | float) or not lam >= 0:
            raise ConfigError(
                f"strategy.init_args.lam={lam!r} must be a number >= 0 (1.0 in the authors' scripts; "
                "0 trains each personal model on its own loss only)."
            )
        super().__init__(weighting=weighting, aggregator=aggregator)
        self.lam = float(lam)
        self._turn: dict[str, Any] = {}

    @override
    def global_model_state(self, client_id: str) -> dict[str, Tensor]:
        """``w``, the FedAvg model, evaluated on every client beside its ``v``."""
        return dict(self.global_state)

    # ------------------------------------------------------------------------------------------ client
    def on_client_fit_start(
        self,
        pl_module: FederatedModule,
        received: Mapping[str, Tensor],
        client_state: dict[str, Any],
        client: ClientContext,
    ) -> None:
        """Take ``v`` (a copy of the received ``w^t`` at the client's first turn) and keep ``w^t``."""
        v, trainable = personal_copy(pl_module, client_state.get("v"))
        self._turn = {
            "client": client,
            "v": v,
            "trainable": trainable,
            "optimizer": None,
            "anchor": {
                n: received[n].detach().to(v[n].device, v[n].dtype, copy=True) for n in trainable if n in received
            },
            "training_step": MethodCall(pl_module, "training_step"),
            "optimizer_state": client_state.get("optimizer") if client.local.optimizer_state == "persist" else None,
        }

    @override
    def training_loss(
        self, pl_module: FederatedModule, loss: Tensor, batch: Batch, outputs: StepOutput = None
    ) -> Tensor:
        """``F_k(w) + F_k(v) + lam/2 ||v - w^t||^2``: the loop's backward gives ``w`` its gradient ``grad F_k(w)``
        and ``v`` its own, ``grad F_k(v) + lam (v - w^t)`` (they share no leaf)."""
        turn = self._turn
        if not turn:
            return loss
        personal = functional_loss(turn["training_step"], turn["v"], batch, turn["client"])
        if self.lam and turn["anchor"]:
            anchored = {n: turn["v"][n] for n in turn["anchor"]}
            personal = personal + self.lam / 2 * squared_distance(anchored, turn["anchor"]).to(personal.dtype)
        return loss + personal.to(loss.dtype)

    @override
    def on_before_optimizer_step(self, client: ClientContext) -> None:
        """Unscale ``v``'s gradients under 16-bit mixed precision (the loop unscales the module's only)."""
        if self._turn:
            unscale_gradients(self._turn["v"], self._turn["trainable"], client.scaler)

    @override
    def on_before_zero_grad(self, pl_module: FederatedModule, optimizer: Optimizer, stepped: bool) -> None:
        """After ``w``'s step, step ``v`` with the mirror optimizer (not on a step the gradient scaler skipped)."""
        if self._turn:
            step_copy(self._turn, "v", pl_module, optimizer, stepped, "Ditto")

    def on_client_fit_end(self, client_state: dict[str, Any], client: ClientContext) -> None:
        """Keep ``v`` and, under ``persist``, its optimizer state."""
        if self._turn:
            keep_copy(self._turn, "v", client_state, client)
        self._turn = {}

    @override
    def on_client_evaluate_start(self, pl_module: FederatedModule, client_state: dict[str, Any]) -> None:
        """Put the client's ``v`` into the live module (before its first turn: ``w`` as sent)."""
        if "v" in client_state:
            load_into(pl_module, client_state["v"])
