"""Per-FedAvg (first-order): FedAvg of a model meant to be adapted by one gradient step on each client.

Fallah, Mokhtari, Ozdaglar. "Personalized Federated Learning with Theoretical Guarantees: A Model-Agnostic
Meta-Learning Approach." NeurIPS 2020. https://arxiv.org/abs/2002.07948 (code read: PFLlib's ``clientperavg.py``
and ``serverperavg.py``, and the Per-FedAvg baseline of the pFedMe authors' code, from which PFLlib's descends)

The objective (Eq. 3): ``min_w (1/n) sum_i F_i(w - alpha grad f_i(w))``, each client's model being one gradient
step of its loss from the shared ``w``. Per local step (Algorithm 1, first-order version "Per-FedAvg (FO)"), on two
independent batches ``D`` and ``D'``:

- ``temp = w - alpha grad f_i(w; D)``
- ``w <- w - beta grad f_i(temp; D')``: the gradient at ``temp``, applied to ``w`` (FO drops the Hessian term of
  ``d temp / d w``)

The loop's step of the module's optimizer is the second line, at learning rate ``beta``: :meth:`PerFedAvg.
training_loss` returns ``f_i(w - alpha g.detach(); D')`` (``g = grad f_i(w; D)`` held fixed), whose gradient with
respect to ``w`` is ``grad f_i(temp; D')``. ``D`` is the loop's batch; ``D'`` the next batch of a second pass over
the client's train split, shuffled by the run's seed, the round and the client. The server is FedAvg.

Evaluation (the paper's personalized model, Eq. 3): each client adapts ``w`` by one plain gradient step on one
batch of its train split, ``w - alpha grad f_i(w; batch)`` (the batch drawn from the run's seed, the round and the
client), then evaluates it; nothing of the step is kept. It is the federation's fine-tuning before evaluation
(:attr:`~fedlit.strategies.base.Strategy.eval_finetune_steps` = 1) with the optimizer of
:meth:`PerFedAvg.configure_eval_finetune` (SGD at ``alpha``), so ``results.json``'s ``compute`` and ``fedlit
cost`` count it. ``w`` itself is evaluated beside it (:meth:`PerFedAvg.global_model_state`).

Symbols -> code: ``w`` -> the module's shared (and personal) trainable tensors, ``global_state`` after aggregation;
``alpha`` -> ``alpha``; ``beta`` -> the local learning rate (the module's ``lr``, its optimizer); the math ->
:func:`perfedavg_adapt`.

Defaults: ``alpha = 0.005`` and a local learning rate (``beta``) of 0.001 are the pFedMe authors' Per-FedAvg runs
(``--learning_rate 0.005 --beta 0.001``), which PFLlib's version copied; PFLlib now sets ``beta = alpha = lr``
(0.005 by default). Give ``alpha`` the value of the recipe's learning rate to follow PFLlib.

Deviation (the codes, not fedlit): both codes adapt before evaluation with a batch of the test split (the pFedMe
authors' ``train_one_step``; PFLlib's until 2023, now a training batch) and the pFedMe authors' with two steps
(``alpha``, then ``beta``); fedlit takes the paper's one step on a training batch. PFLlib splits one batch of twice
the size into ``D`` and ``D'`` and runs each client's local training twice per round; fedlit draws ``D'`` from a
second pass and trains once. The adaptation step is a plain gradient step whatever the local optimizer; the outer
step is the local optimizer's (momentum, weight decay or Adam if the recipe has them; the paper's is plain SGD).
Deviation: the inner gradient is computed without the 16-bit gradient scaler. A local step costs two forward and two
backward passes; memory: nothing per client, FedAvg's state on the server.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Literal

import torch
from torch import Tensor, nn
from typing_extensions import override

from fedlit.core.contexts import Batch, ClientContext, StepOutput
from fedlit.core.errors import ConfigError
from fedlit.module import FederatedModule
from fedlit.strategies.common.aggregators import Aggregator
from fedlit.strategies.common.personal_copy import MethodCall, functional_loss
from fedlit.strategies.fedavg import FedAvg


def perfedavg_adapt(w: Mapping[str, Tensor], grad: Mapping[str, Tensor | None], alpha: float) -> dict[str, Tensor]:
    """``w - alpha g`` per tensor of ``w`` with ``g`` detached, differentiable in ``w`` (the FO step's ``temp``, and
    the personalized model of evaluation); a missing gradient counts as zero."""
    return {n: t if (g := grad.get(n)) is None else t - alpha * g.detach().to(t) for n, t in w.items()}


def _single_sample_with_batch_norm(module: nn.Module, batch: Any) -> bool:
    """Whether ``batch`` has one sample and ``module`` BatchNorm layers that need the batch's statistics."""
    first = batch
    while isinstance(first, list | tuple | dict) and first:
        first = next(iter(first.values())) if isinstance(first, dict) else first[0]
    if not isinstance(first, Tensor) or first.dim() == 0 or first.shape[0] != 1:
        return False
    return any(
        isinstance(m, nn.modules.batchnorm._BatchNorm) and (m.training or m.running_mean is None)
        for m in module.modules()
    )


class PerFedAvg(FedAvg):
    """Per-FedAvg (FO): FedAvg of a meta-model, each client evaluated after one gradient step from it.

    Args:
        alpha: The adaptation step size ``alpha`` (default 0.005, the pFedMe authors' Per-FedAvg runs); the outer
            step size ``beta`` is the local learning rate.
        weighting: FedAvg's client weights: ``num_examples`` (default) or ``uniform``.
        aggregator: FedAvg's rule (None: the weighted mean).
    """

    #: The server is FedAvg's weighted mean (the adaptation is the clients' business), so SecAgg+ can replace the
    #: uploads (with the default aggregator and ``weighting="num_examples"``).
    secure_aggregation = True

    def __init__(
        self,
        *,
        alpha: float = 0.005,
        weighting: Literal["num_examples", "uniform"] = "num_examples",
        aggregator: Aggregator | None = None,
    ) -> None:
        if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not alpha > 0:
            raise ConfigError(
                f"strategy.init_args.alpha={alpha!r} must be > 0 (the adaptation step size; 0.005 in "
                "the pFedMe authors' Per-FedAvg runs)."
            )
        super().__init__(weighting=weighting, aggregator=aggregator)
        self.alpha = float(alpha)
        self.eval_finetune_steps = 1  # the one-step adaptation, with configure_eval_finetune's optimizer
        self._turn: dict[str, Any] = {}

    @override
    def global_model_state(self, client_id: str) -> dict[str, Tensor]:
        """``w``, the meta-model, evaluated on every client without adaptation beside the adapted one."""
        return dict(self.global_state)

    # ------------------------------------------------------------------------------------------ client
    def on_client_fit_start(
        self, pl_module: FederatedModule, server_round: int, client_id: str, client: ClientContext
    ) -> None:
        """Open the second pass over the train split, from which each step's ``D'`` comes."""
        live = pl_module.named_tensors("shared", "personal")
        self._turn = {
            "client": client,
            "training_step": MethodCall(pl_module, "training_step"),
            "names": [n for n, p in pl_module.named_parameters() if p.requires_grad and n in live],
            "batches": self._cycle(client, ("perfedavg-second-batch", server_round, client_id)),
        }

    @staticmethod
    def _cycle(client: ClientContext, stream: tuple[Any, ...]) -> Iterator[Any]:
        generator = torch.Generator().manual_seed(client.derive_seed(*stream))
        while True:
            empty = True
            for batch in client.train_dataloader(generator=generator):
                empty = False
                yield batch
            if empty:
                return

    def _next_batch(self, pl_module: FederatedModule, batches: Iterator[Any], client: ClientContext) -> Any:
        for _ in range(2):  # a lone sample under BatchNorm is skipped, as the loop does; then the next batch
            batch = next(batches)
            if not _single_sample_with_batch_norm(pl_module, batch):
                return client.prepare_batch(batch)
        return client.prepare_batch(next(batches))

    @override
    def training_loss(
        self, pl_module: FederatedModule, loss: Tensor, batch: Batch, outputs: StepOutput = None
    ) -> Tensor:
        """``f_i(w - alpha grad f_i(w; D); D')`` with the inner gradient held fixed: its gradient with respect to
        ``w`` is the FO step's ``grad f_i(temp; D')``."""
        turn = self._turn
        if not turn or not turn["names"]:
            return loss
        live = dict(pl_module.named_parameters())
        w = {n: live[n] for n in turn["names"]}
        grads = torch.autograd.grad(loss, list(w.values()), allow_unused=True)
        temp = perfedavg_adapt(w, dict(zip(w, grads, strict=True)), self.alpha)
        second = self._next_batch(pl_module, turn["batches"], turn["client"])
        return functional_loss(turn["training_step"], temp, second, turn["client"]).to(loss.dtype)

    def on_client_fit_end(self) -> None:
        self._turn = {}

    @override
    def configure_eval_finetune(self, pl_module: FederatedModule) -> torch.optim.Optimizer:
        """The adaptation before evaluation: one plain gradient step ``w - alpha grad f_i(w; batch)`` (SGD at
        ``alpha``, no momentum or weight decay) over the trainable shared and personal tensors."""
        live = pl_module.named_tensors("shared", "personal")
        params = [p for n, p in pl_module.named_parameters() if p.requires_grad and n in live]
        return torch.optim.SGD(params, lr=self.alpha)
