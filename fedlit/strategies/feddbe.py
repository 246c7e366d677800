"""FedDBE: domain bias elimination in representation space.

Zhang, Hua, Wang, Song, Xue, Ma, Guan. "Eliminating Domain Bias for Federated Learning in Representation Space."
NeurIPS 2023. https://arxiv.org/abs/2311.14975 (PFLlib's ``FedDBE``, TsingZ0/PFLlib ``clientdbe.py``,
``serverdbe.py``, read)

The model is a feature extractor ``rep = f(x)`` (the body) and a head ``h``. Client i keeps a personal learnable
bias ``c_i`` in representation space (the paper's personalized representation bias memory, PRBM) and trains

    L_i = CE(h(rep + c_i), y) + kappa * mean_d 0.5 (rbar_i - rbar_g)_d^2          (mean regularization, MR)

where ``rbar_i`` is the running mean of the batch means of ``rep`` over the turn (reset to 0 at each turn, then
``rbar_i <- (1 - m) rbar_i + m mean_batch(rep)``, m = 0.1; the gradient flows through the current batch's mean
only) and ``rbar_g`` the global mean: the sample-weighted mean ``sum_i (n_i / n) rbar_i`` of the running means the
clients end a warm-up turn with (plain CE, no ``c_i``), fixed afterwards. Body and head are FedAvg'd; ``c_i`` never
leaves the client. Client i is evaluated with ``h(f(x) + c_i)``; the global model (the FedAvg'd body and head,
without any ``c_i``) is evaluated beside it.

Defaults: ``momentum = 0.1`` and ``kappa = 0`` (PFLlib's ``--momentum`` and ``--kl_weight`` defaults; the paper
tunes kappa per data set); ``c_i`` starts at 0 and steps by plain SGD (no momentum, as PFLlib's
``opt_client_mean``) at the local optimizer's current learning rate (PFLlib's stays at the initial one; the two
agree without a learning-rate schedule).

How fedlit runs it on one model: :meth:`FedDBE.client_forward` hooks the head so that it receives ``rep + c_i`` and
records ``rep``; :meth:`FedDBE.training_loss` adds the MR term. ``c_i`` is a vector in the client's strategy state
(``client_state["bias"]``), not a module tensor. The head must be one ``nn.Linear`` with a bias (checked), so that
``h(rep + c) = W rep + (b + W c)``: :meth:`FedDBE.on_client_evaluate_start` adds ``W c_i`` to the head's bias, and the
module evaluates (and ``fedlit export`` writes) the personalized model as it is.

Symbols -> code: ``rep`` -> the head's input; ``c_i`` -> ``client_state["bias"]``; ``rbar_i`` -> the turn's
running mean (uploaded as ``update.extras["running_mean"]`` in the warm-up); ``rbar_g`` -> ``self.global_mean``;
``m``, ``kappa`` -> ``momentum``, ``kappa``; the math -> :func:`running_mean`, :func:`mean_regularizer`.

Deviation (warm-up): PFLlib runs one extra training pass of every client before round 0, whose model updates are
then overwritten by the global model, only to get the running means. Here round 1 (the first round with an upload)
is the warm-up: its clients train with plain CE and upload their running means (counted as upload), and their
training counts like any round's; ``c_i`` and MR start in the next round, and the server sends ``rbar_g`` with
every later download (counted). Under partial participation the global mean comes from the warm-up round's clients
only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.optim import Optimizer
from typing_extensions import override

from fedlit.core.contexts import Batch, ClientContext, StepOutput
from fedlit.core.errors import ConfigError
from fedlit.module import FederatedModule
from fedlit.strategies.base import ClientUpdate
from fedlit.strategies.common.aggregate import weighted_average
from fedlit.strategies.common.aggregators import Aggregator
from fedlit.strategies.fedavg import FedAvg
from fedlit.strategies.fedper import head_rule
from fedlit.strategies.fedrod import linear_head


def running_mean(previous: Tensor, rep: Tensor, momentum: float) -> Tensor:
    """``(1 - m) previous + m mean_batch(rep)`` (the mean over every dimension but the last), differentiable in
    ``rep``."""
    return (1 - momentum) * previous + momentum * rep.reshape(-1, rep.shape[-1]).float().mean(0)


def mean_regularizer(client_mean: Tensor, global_mean: Tensor) -> Tensor:
    """``mean_d 0.5 (client_mean - global_mean)_d^2`` (FedDBE's MR term, before ``kappa``)."""
    return (0.5 * (client_mean - global_mean.to(client_mean)) ** 2).mean()


@contextlib.contextmanager
def biased_input(head: nn.Module, turn: dict[str, Any]) -> Iterator[None]:
    """While open, the head records its input in ``turn["rep"]`` and receives ``rep + turn["bias"]`` (when set)."""

    def hook(_: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        turn["rep"] = args[0]
        bias = turn.get("bias")
        return None if bias is None else (args[0] + bias.to(args[0].dtype), *args[1:])

    handle = head.register_forward_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()


class FedDBE(FedAvg):
    """FedAvg with a personal representation bias per client and mean regularization toward the global mean.

    Args:
        kappa: Weight of the mean regularizer (default 0, PFLlib's).
        momentum: ``m`` of the running mean (default 0.1).
        head: Glob (or ``re:<regex>``) of the head's weight and bias, one ``nn.Linear`` (default ``head.*``).
        weighting: As in :class:`~fedlit.strategies.fedavg.FedAvg`.
        aggregator: As in :class:`~fedlit.strategies.fedavg.FedAvg` (default: the weighted mean).
    """

    secure_aggregation = False  # the warm-up uploads running means as extras; later rounds send the global mean
    cost_notes = (
        "FedDBE's warm-up (round 1) clients also upload their running mean of the features, one float32 "
        "per input of the head, once: not counted above.",
    )

    def __init__(
        self,
        *,
        kappa: float = 0.0,
        momentum: float = 0.1,
        head: str = "head.*",
        weighting: Literal["num_examples", "uniform"] = "num_examples",
        aggregator: Aggregator | None = None,
    ) -> None:
        problems = []
        if isinstance(kappa, bool) or not kappa >= 0:
            problems.append(f"strategy.init_args.kappa={kappa!r} must be >= 0 (0 by default)")
        if isinstance(momentum, bool) or not 0 < momentum <= 1:
            problems.append(f"strategy.init_args.momentum={momentum!r} must be in (0, 1] (0.1 by default)")
        if problems:
            raise ConfigError("Invalid FedDBE settings: " + "; ".join(problems) + ".")
        super().__init__(weighting=weighting, aggregator=aggregator)
        self.kappa, self.momentum, self.head = float(kappa), float(momentum), head
        self.head_rule = head_rule(head)
        self.global_mean: Tensor | None = None
        self._turn: dict[str, Any] = {}

    @override
    def setup_server_state(self) -> None:
        """No global mean before the warm-up."""
        super().setup_server_state()
        self.global_mean = None

    @override
    def configure_client_extras(self, server_round: int, client_id: str) -> dict[str, Any]:
        """The global mean once the warm-up gave it (its presence tells the client to use ``c_i`` and MR)."""
        return {} if self.global_mean is None else {"global_mean": self.global_mean.clone()}

    @override
    def expected_download_extras(self, server_round: int, client_id: str) -> dict[str, Any]:
        """Nothing in round 1 (the warm-up); from round 2, the global mean: one float32 per input feature of the
        head (its shared weight's second dimension)."""
        weights = [t for n, t in self.global_state.items() if self.head_rule.matches(n) and t.ndim == 2]
        if server_round <= 1 or not weights:
            return {}
        return {"global_mean": torch.zeros(weights[0].shape[1], dtype=torch.float32, device=weights[0].device)}

    @override
    def global_model_state(self, client_id: str) -> dict[str, Tensor]:
        """The FedAvg'd body and head, evaluated without ``c_i`` beside the personalized model."""
        return dict(self.global_state)

    @override
    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> dict[str, Tensor]:
        """FedAvg; after the warm-up round, the global mean ``sum_i (n_i / n) rbar_i`` of its uploads."""
        state = super().aggregate(server_round, updates)
        means = [(u.extras["running_mean"], u.num_examples) for u in updates if "running_mean" in u.extras]
        if self.global_mean is None and means:
            averaged = weighted_average([{"m": m} for m, _ in means], [float(n) for _, n in means])
            self.global_mean = averaged["m"].float()
        return state

    @override
    def state_dict(self) -> dict[str, Any]:
        """The server state plus the global mean."""
        return {**super().state_dict(), "global_mean": self.global_mean}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        super().load_state_dict(state_dict)
        self.global_mean = state_dict["global_mean"]

    # ------------------------------------------------------------------------------------------ client
    def on_client_fit_start(
        self, pl_module: FederatedModule, received_extras: dict[str, Any], client_state: dict[str, Any]
    ) -> None:
        """Warm-up (no global mean received): plain CE; else take ``c_i`` (0 at first) to train."""
        _, head = linear_head(pl_module, self.head_rule, "FedDBE")
        device = head.weight.device
        features = head.in_features
        turn: dict[str, Any] = {"head": head, "mean": torch.zeros(features, device=device)}
        if "global_mean" in received_extras:
            stored = client_state.get("bias", torch.zeros(features))
            turn["bias"] = stored.detach().to(device, torch.float32, copy=True).requires_grad_(True)
            turn["global_mean"] = received_extras["global_mean"].to(device, torch.float32)
        self._turn = turn

    @override
    def client_forward(self, pl_module: FederatedModule) -> contextlib.AbstractContextManager[Any]:
        """The head receives ``rep + c_i`` and records ``rep``."""
        return biased_input(self._turn["head"], self._turn) if self._turn else contextlib.nullcontext()

    @override
    def training_loss(
        self, pl_module: FederatedModule, loss: Tensor, batch: Batch, outputs: StepOutput = None
    ) -> Tensor:
        """Update the running mean; ``loss + kappa MR`` after the warm-up."""
        turn = self._turn
        if not turn:
            return loss
        turn["mean"] = running_mean(turn["mean"], turn["rep"], self.momentum)
        if "global_mean" in turn and self.kappa > 0:
            loss = loss + (self.kappa * mean_regularizer(turn["mean"], turn["global_mean"])).to(loss.dtype)
        return loss

    @override
    def on_before_optimizer_step(self, client: ClientContext) -> None:
        """Unscale ``c_i``'s gradient under 16-bit mixed precision (the loop unscales the module's only)."""
        bias = self._turn.get("bias")
        if bias is not None and bias.grad is not None and client.scaler is not None:
            bias.grad.div_(client.scaler.get_scale())

    @override
    def on_before_zero_grad(self, optimizer: Optimizer, stepped: bool) -> None:
        """SGD step of ``c_i`` at the local learning rate when the module's optimizer stepped; the running mean is
        detached from the step's graph."""
        turn = self._turn
        if not turn:
            return
        turn["mean"] = turn["mean"].detach()
        bias = turn.get("bias")
        if bias is None:
            return
        lr = float(getattr(optimizer, "optimizer", optimizer).param_groups[0]["lr"])
        with torch.no_grad():
            if stepped and bias.grad is not None:
                bias.sub_(lr * bias.grad)
        bias.grad = None

    def on_client_fit_end(self, update: ClientUpdate, client_state: dict[str, Any], client: ClientContext) -> None:
        """Keep ``c_i``; in the warm-up, upload the running mean."""
        turn = self._turn
        if not turn:
            return
        store = client.store.device
        if "bias" in turn:
            client_state["bias"] = turn["bias"].detach().to(store, copy=True)
        else:
            update.extras["running_mean"] = turn["mean"].detach().to(store, copy=True)
        self._turn = {}

    @override
    def on_client_evaluate_start(self, pl_module: FederatedModule, client_state: dict[str, Any]) -> None:
        """Evaluate ``h(rep + c_i)``: add ``W c_i`` to the (linear) head's bias."""
        bias = client_state.get("bias")
        if bias is None:
            return
        _, head = linear_head(pl_module, self.head_rule, "FedDBE")
        with torch.no_grad():
            head.bias.add_((head.weight.float() @ bias.to(head.weight.device).float()).to(head.bias.dtype))
