"""FML: Federated Mutual Learning, a personal ("local") model and the shared "meme" model teach each other.

Shen, Zhang, Wang, Feng, Wang, Xie, Wang, Zhang, Wu. "Federated Mutual Learning." arXiv 2020.
https://arxiv.org/abs/2006.16765 (code read: PFLlib's ``clientfml.py``)

Each client k holds the meme model (the module's shared tensors: received, trained, uploaded, FedAvg'd by the
server, the federation's global model) and a local model (a second copy of every shared and personal tensor over
the one frozen backbone, kept in ``client_state``, never sent). Each local batch goes through both, and both step
on their deep-mutual-learning losses (Zhang et al., "Deep Mutual Learning", CVPR 2018), the paper's

    L_local = alpha CE(p_local, y) + (1 - alpha) KL(p_meme || p_local)
    L_meme  = beta  CE(p_meme, y)  + (1 - beta)  KL(p_local || p_meme)

``p = softmax(logits)``; ``KL(p_t || p_s) = (1 / B) sum_b sum_c p_t (log p_t - log p_s)`` (batch mean, no
temperature), the teacher detached in each, so ``L_local`` moves only the local model and ``L_meme`` only the meme
(:func:`fml_losses`). The server is FedAvg of the memes. Each client is evaluated with its local model; the meme is
evaluated beside it as the global model (:meth:`FML.global_model_state`).

Symbols -> code: meme -> the module's shared tensors (``global_state`` after aggregation); local model ->
``client_state["local"]``; ``alpha``, ``beta`` -> ``alpha``, ``beta``; ``CE`` -> the module's own loss (the loop's
``loss`` for the meme, the same ``training_step`` run with the local tensors by ``torch.func.functional_call``).

Defaults: ``alpha = beta = 0.5``, the paper's. The local model steps with a mirror of the loop's optimizer (same
class and hyperparameters per parameter group, this step's learning rate), once per local step of the meme, on the
same batch; its optimizer state is kept under ``federation.optimizer_state: persist``. The local model starts as a
copy of the meme a client receives at its first turn.

Memory per client: one copy of the shared and personal tensors (the local model) and, under ``persist``, its
optimizer state. The server holds FedAvg's state only; communication is FedAvg's.

Departures of PFLlib (fedlit follows the paper): its ``nn.KLDivLoss()`` averages over batch *and* classes (the KL
terms are ``1 / C`` of the paper's); its teachers are not detached (``loss.backward`` also sends
``(1 - alpha) KL`` gradients into the meme, and ``loss_g.backward`` into the local model); it clips both models'
gradient norms at 10; its command-line defaults are ``alpha = 1``, ``beta = 0`` (no mutual learning for the local
model, none of CE for the meme); it builds a new plain-SGD optimizer for the meme. Deviation: binary tasks with one
logit ``z`` use the two-class logits ``(0, z)`` in the KL terms (the CE terms are the module's, BCE); multilabel
tasks are refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import torch
from torch import Tensor
from torch.func import functional_call
from torch.optim import Optimizer
from typing_extensions import override

from fedlit.core.contexts import Batch, ClientContext, StepOutput
from fedlit.core.errors import ConfigError
from fedlit.module import FederatedModule
from fedlit.strategies.common.personal_copy import (
    MethodCall,
    keep_copy,
    load_into,
    personal_copy,
    step_copy,
    unscale_gradients,
)
from fedlit.strategies.fedavg import FedAvg
from fedlit.strategies.fedmetamed.equations import distillation_kl


def two_class(logits: Tensor) -> Tensor:
    """A binary task's single logit ``z`` as the two-class logits ``(0, z)``; other logits unchanged."""
    if logits.ndim == 1 or logits.shape[-1] == 1:
        z = logits.reshape(-1, 1)
        return torch.cat([torch.zeros_like(z), z], dim=-1)
    return logits


def fml_losses(
    ce_local: Tensor, ce_meme: Tensor, logits_local: Tensor, logits_meme: Tensor, alpha: float, beta: float
) -> tuple[Tensor, Tensor]:
    """FML's ``(L_local, L_meme)``: ``alpha CE_local + (1 - alpha) KL(p_meme || p_local)`` and ``beta CE_meme +
    (1 - beta) KL(p_local || p_meme)``, each KL batch-mean with its teacher detached (Shen et al., 2020)."""
    local = alpha * ce_local + (1 - alpha) * distillation_kl(logits_local, logits_meme).to(ce_local.dtype)
    meme = beta * ce_meme + (1 - beta) * distillation_kl(logits_meme, logits_local).to(ce_meme.dtype)
    return local, meme


class FML(FedAvg):
    """Federated Mutual Learning: a FedAvg'd meme model and a personal local model per client, trained mutually.

    Args:
        alpha: Weight of the local model's CE against ``KL(p_meme || p_local)`` (default 0.5, the paper's).
        beta: Weight of the meme's CE against ``KL(p_local || p_meme)`` (default 0.5, the paper's).
        weighting: FedAvg's client weights for the meme: ``num_examples`` (default) or ``uniform``.
    """

    accepted_tasks = frozenset({"multiclass", "binary"})
    #: The server is FedAvg's weighted mean of the memes (the local models never leave the clients).
    secure_aggregation = True

    def __init__(
        self, *, alpha: float = 0.5, beta: float = 0.5, weighting: Literal["num_examples", "uniform"] = "num_examples"
    ) -> None:
        problems = [
            f"strategy.init_args.{key}={value!r} must be in [0, 1] (0.5 in the paper)"
            for key, value in (("alpha", alpha), ("beta", beta))
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1
        ]
        if problems:
            raise ConfigError("Invalid FML settings: " + "; ".join(problems) + ".")
        super().__init__(weighting=weighting)
        self.alpha, self.beta = float(alpha), float(beta)
        self._turn: dict[str, Any] = {}

    @override
    def global_model_state(self, client_id: str) -> dict[str, Tensor]:
        """The meme (FedAvg's model), evaluated on every client beside its local model."""
        return dict(self.global_state)

    # ------------------------------------------------------------------------------------------ client
    def on_client_fit_start(
        self, pl_module: FederatedModule, client_state: dict[str, Any], client: ClientContext
    ) -> None:
        """Take the local model (a copy of the received meme at the client's first turn)."""
        local, trainable = personal_copy(pl_module, client_state.get("local"))
        self._turn = {
            "client": client,
            "local": local,
            "trainable": trainable,
            "optimizer": None,
            "training_step": MethodCall(pl_module, "training_step"),
            "optimizer_state": client_state.get("optimizer") if client.local.optimizer_state == "persist" else None,
        }

    @override
    def training_loss(
        self, pl_module: FederatedModule, loss: Tensor, batch: Batch, outputs: StepOutput = None
    ) -> Tensor:
        """``L_meme + L_local``: one backward gives each model its own gradient (the teachers are detached)."""
        turn = self._turn
        if not turn:
            return loss
        if not isinstance(outputs, Mapping) or "logits" not in outputs:
            raise ConfigError(
                f"FML distils between logits, but {type(pl_module).__name__}.training_step returns "
                "no 'logits': use fedlit.tasks.ClassificationModule."
            )
        client = turn["client"]
        with client.autocast():
            out = functional_call(
                turn["training_step"], {f"module.{n}": t for n, t in turn["local"].items()}, (batch, 0)
            )
        out = client.convert_output(out)
        local, meme = fml_losses(
            out["loss"], loss, two_class(out["logits"]), two_class(outputs["logits"]), self.alpha, self.beta
        )
        return meme + local.to(meme.dtype)

    @override
    def on_before_optimizer_step(self, client: ClientContext) -> None:
        """Unscale the local model's gradients under 16-bit mixed precision (the loop unscales the meme's only)."""
        if self._turn:
            unscale_gradients(self._turn["local"], self._turn["trainable"], client.scaler)

    @override
    def on_before_zero_grad(self, pl_module: FederatedModule, optimizer: Optimizer, stepped: bool) -> None:
        """After the meme's step, step the local model with the mirror optimizer (not on a skipped step)."""
        if self._turn:
            step_copy(self._turn, "local", pl_module, optimizer, stepped, "FML")

    def on_client_fit_end(self, client_state: dict[str, Any], client: ClientContext) -> None:
        """Keep the local model and, under ``persist``, its optimizer state."""
        if self._turn:
            keep_copy(self._turn, "local", client_state, client)
        self._turn = {}

    @override
    def on_client_evaluate_start(self, pl_module: FederatedModule, client_state: dict[str, Any]) -> None:
        """Put the client's local model into the live module (before its first turn: the meme as sent)."""
        if "local" in client_state:
            load_into(pl_module, client_state["local"])
