"""FedALA: each client merges the global model into its own by learned element-wise weights.

Zhang, Hua, Wang, Xu, Cao, Guan. "FedALA: Adaptive Local Aggregation for Personalized Federated Learning."
AAAI 2023. https://arxiv.org/abs/2212.01197 (code read: PFLlib's ``utils/ALA.py``, the authors' module)

The server is FedAvg. Client i keeps its model ``theta_i`` from the end of its last turn. At the start of a turn it
receives the global ``theta`` and, over the ordered list of its shared trainable tensors (model order; the
lower ones first), builds its starting model by Adaptive Local Aggregation (the paper's ALA module,
written out here):

- the lower tensors (all but the last ``p = layer_idx``) take the global value
- the higher ones: ``theta_hat = theta_i + (theta - theta_i) * W_i``, element-wise, ``W_i`` starting at all ones
- ``W_i`` is learned on a random ``s = rand_percent``% of the client's training data, batch by batch, with the
  lower tensors at the global value: ``W_i <- clip(W_i - eta grad_theta_hat L(theta_hat) * (theta - theta_i),
  0, 1)``, ``theta_hat`` recomputed after each batch
- the first time, passes over that data repeat until the standard deviation of the last ``num_pre_loss`` (10)
  pass losses (each the loss of its last batch, as the code) is below ``threshold``; later, one pass
- ``W_i`` persists per client; then the client trains as FedAvg's from ``theta_hat`` and uploads its model

A client's first turn starts from the global model (no local model yet: ALA is skipped, as the code's first
round). Each client is evaluated with its own model at the end of its last turn (the global one before it has
trained); the global model is evaluated beside it (:meth:`FedALA.global_model_state`).

Symbols -> code: ``theta`` -> the received shared tensors (``global_state``); ``theta_i`` ->
``client_state["model"]`` (every shared tensor after the last turn); ``W_i`` -> ``client_state["weights"]`` (the
higher tensors, by name); ``eta``, ``s``, ``p`` -> ``eta``, ``rand_percent``, ``layer_idx``; the math ->
:func:`ala_weight_step`, :func:`ala_merge`, :func:`ala_converged`.

Memory per client: one copy of the shared tensors (``theta_i``) and one of the higher tensors (``W_i``). Weight
learning costs forward and backward passes over ``s``% of the data (many of them the first time).

Departures of the code from the paper, and what fedlit does: the code samples a *contiguous* slice of the
training data at a random offset, unshuffled; fedlit takes the first batches (up to ``s``% of the samples, the
batch that would pass it left out, at least one batch) of one shuffle of the training split, drawn from the run's
seed, the round and the client (the same batches in every pass of a turn, as the code's). The code skips ALA when
the first tensor of the received model equals the local one; fedlit when the client has no model of its own yet.
``layer_idx = 0`` means every tensor, as the code's slicing. The code's first-time loop has no bound;
``max_init_passes`` can bound it (None: no bound, as the code). Buffers (BatchNorm statistics) are not learned by
ALA: they take the global value, and the passes of weight learning leave them unchanged (the code learns on a
copy). Personal tensors stay the client's. Weight-learning gradients are taken without the gradient scaler of
16-bit mixed precision. Some copies of the code never write ``W_i`` back; here it is stored and reused.
Evaluation downloads are counted as for FedAvg.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, cast

import torch
from torch import Tensor, nn
from typing_extensions import override

from fedlit.core.contexts import ClientContext
from fedlit.core.errors import ConfigError
from fedlit.module import FederatedModule
from fedlit.strategies.common.aggregators import Aggregator
from fedlit.strategies.fedavg import FedAvg


def ala_merge(local: Tensor, global_: Tensor, weight: Tensor) -> Tensor:
    """``theta_i + (theta - theta_i) * W`` element-wise (FedALA's merge)."""
    return local + (global_ - local) * weight


def ala_weight_step(weight: Tensor, grad: Tensor, local: Tensor, global_: Tensor, eta: float) -> Tensor:
    """``clip(W - eta grad * (theta - theta_i), 0, 1)`` element-wise (FedALA's weight learning), ``grad`` the loss
    gradient at the merged tensor."""
    return torch.clamp(weight - eta * (grad * (global_ - local)), 0, 1)


def ala_converged(losses: Sequence[float], num_pre_loss: int, threshold: float) -> bool:
    """Whether more than ``num_pre_loss`` losses were recorded and the population standard deviation of the last
    ``num_pre_loss`` is below ``threshold`` (the code's ``np.std`` stopping rule)."""
    return len(losses) > num_pre_loss and statistics.pstdev(losses[-num_pre_loss:]) < threshold


def _num_samples(batch: Any) -> int | None:
    """The leading dimension of the first tensor in ``batch`` (a tensor, or a tuple, list or mapping of them)."""
    if isinstance(batch, Tensor):
        return batch.shape[0] if batch.dim() else None
    items = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, list | tuple) else ()
    for item in items:
        if (found := _num_samples(item)) is not None:
            return found
    return None


def subset_batches(batches: Iterable[Any], num_samples: int, single_ok: bool = True) -> list[Any]:
    """The first batches of ``batches`` holding at most ``num_samples`` samples together (the batch that would
    pass it left out), at least one; batches of one sample left out when ``single_ok`` is False (BatchNorm)."""
    chosen: list[Any] = []
    taken = 0
    for batch in batches:
        size = _num_samples(batch) or 1
        if size == 1 and not single_ok:
            continue
        if chosen and taken + size > num_samples:
            break
        chosen.append(batch)
        taken += size
        if taken >= num_samples:
            break
    return chosen


class FedALA(FedAvg):
    """FedAvg whose clients start each turn from an adaptive, element-wise merge of the global and their own model.

    Args:
        eta: Learning rate ``eta`` of the weights ``W`` (default 1.0).
        rand_percent: ``s``, the percentage of the client's training samples weight learning uses (default 80).
        layer_idx: ``p``, how many of the last shared trainable tensors ALA merges (default 2: a linear head's
            weight and bias); 0: every one.
        threshold: The first time, learn until the standard deviation of the last ``num_pre_loss`` pass losses is
            below it (default 0.1).
        num_pre_loss: How many pass losses the stopping rule looks at (default 10).
        max_init_passes: A bound on the first-time passes; None (default): none, as the code.
        weighting: FedAvg's client weights: ``num_examples`` (default) or ``uniform``.
        aggregator: FedAvg's rule (None: the weighted mean).
    """

    #: The server is FedAvg's weighted mean of the shared tensors (``W`` and the local model never leave the client), so
    #: SecAgg+ can replace the uploads (with the default aggregator and ``weighting="num_examples"``).
    secure_aggregation = True

    def __init__(
        self,
        *,
        eta: float = 1.0,
        rand_percent: float = 80,
        layer_idx: int = 2,
        threshold: float = 0.1,
        num_pre_loss: int = 10,
        max_init_passes: int | None = None,
        weighting: Literal["num_examples", "uniform"] = "num_examples",
        aggregator: Aggregator | None = None,
    ) -> None:
        problems = []
        key = "strategy.init_args."
        if isinstance(eta, bool) or not isinstance(eta, int | float) or not eta > 0:
            problems.append(f"{key}eta={eta!r} must be > 0 (1.0 in the paper)")
        if isinstance(rand_percent, bool) or not isinstance(rand_percent, int | float) or not 0 < rand_percent <= 100:
            problems.append(f"{key}rand_percent={rand_percent!r} must be in (0, 100] (80 in the paper)")
        for name, value, least in (("layer_idx", layer_idx, 0), ("num_pre_loss", num_pre_loss, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                problems.append(f"{key}{name}={value!r} must be an integer >= {least}")
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not threshold >= 0:
            problems.append(f"{key}threshold={threshold!r} must be >= 0 (0.1 in the code)")
        if max_init_passes is not None and (
            isinstance(max_init_passes, bool) or not isinstance(max_init_passes, int) or max_init_passes < 1
        ):
            problems.append(f"{key}max_init_passes={max_init_passes!r} must be an integer >= 1, or null for no bound")
        if problems:
            raise ConfigError("Invalid FedALA settings: " + "; ".join(problems) + ".")
        super().__init__(weighting=weighting, aggregator=aggregator)
        self.eta, self.rand_percent, self.layer_idx = float(eta), float(rand_percent), layer_idx
        self.threshold, self.num_pre_loss, self.max_init_passes = float(threshold), num_pre_loss, max_init_passes

    @override
    def global_model_state(self, client_id: str) -> dict[str, Tensor]:
        """The FedAvg model, evaluated on every client beside its own."""
        return dict(self.global_state)

    # ------------------------------------------------------------------------------------------ client
    def higher_names(self, pl_module: FederatedModule) -> list[str]:
        """The last ``layer_idx`` shared trainable tensors (every one for 0), in model order."""
        names = [n for n, p in pl_module.shared_parameters() if p.requires_grad]
        return names[-self.layer_idx :] if self.layer_idx else names

    def on_client_fit_start(
        self,
        pl_module: FederatedModule,
        server_round: int,
        client_id: str,
        client_state: dict[str, Any],
        client: ClientContext,
    ) -> None:
        """Adaptive Local Aggregation into the live module (which holds the received global model); nothing at
        the client's first turn."""
        if "model" not in client_state:
            return
        params = dict(pl_module.named_parameters())
        names = self.higher_names(pl_module)
        local = {n: client_state["model"][n].to(params[n].device, params[n].dtype) for n in names}
        received = {n: params[n].detach().clone() for n in names}
        first = "weights" not in client_state
        weights = {
            n: torch.ones_like(received[n])
            if first
            else client_state["weights"][n].to(received[n].device, received[n].dtype)
            for n in names
        }
        batches = self._batches(pl_module, server_round, client_id, client)
        buffers = {n: b.detach().clone() for n, b in pl_module.named_buffers()}
        pl_module.set_train_mode()
        losses: list[float] = []
        try:
            self._set(params, {n: ala_merge(local[n], received[n], weights[n]) for n in names})
            while True:
                loss = math.nan
                for batch_idx, batch in enumerate(batches):
                    with client.autocast():
                        out = client.convert_output(pl_module.training_step(client.prepare_batch(batch), batch_idx))
                    value = cast(Tensor, out["loss"] if isinstance(out, Mapping) else out)
                    grads = torch.autograd.grad(value, [params[n] for n in names], allow_unused=True)
                    for name, grad in zip(names, grads, strict=True):
                        if grad is not None:
                            weights[name] = ala_weight_step(
                                weights[name], grad.to(weights[name].dtype), local[name], received[name], self.eta
                            )
                    self._set(params, {n: ala_merge(local[n], received[n], weights[n]) for n in names})
                    loss = float(value.detach())
                losses.append(loss)
                if not first or ala_converged(losses, self.num_pre_loss, self.threshold):
                    break
                if self.max_init_passes is not None and len(losses) >= self.max_init_passes:
                    break
        finally:
            with torch.no_grad():
                for name, buffer in pl_module.named_buffers():
                    buffer.copy_(buffers[name])
        device = client.store.device
        client_state["weights"] = {n: w.detach().to(device, copy=True) for n, w in weights.items()}
        client_state["ala_passes"] = len(losses)

    def _batches(
        self, pl_module: FederatedModule, server_round: int, client_id: str, client: ClientContext
    ) -> list[Any]:
        """The batches of weight learning: the first ``rand_percent``% of the samples of one seeded shuffle."""
        wanted = max(1, int(self.rand_percent / 100 * client.num_examples("train")))
        norms = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in pl_module.modules())
        generator = torch.Generator().manual_seed(client.derive_seed("fedala", server_round, client_id))
        return subset_batches(client.train_dataloader(generator=generator), wanted, single_ok=not norms)

    @staticmethod
    def _set(params: Mapping[str, Tensor], values: Mapping[str, Tensor]) -> None:
        with torch.no_grad():
            for name, value in values.items():
                params[name].copy_(value)

    def on_client_fit_end(
        self, pl_module: FederatedModule, client_state: dict[str, Any], client: ClientContext
    ) -> None:
        """Keep the trained model (every shared tensor) for the next turn's merge and for evaluation."""
        device = client.store.device
        client_state["model"] = {
            n: t.detach().to(device, copy=True) for n, t in pl_module.named_tensors("shared").items()
        }

    @override
    def on_client_evaluate_start(self, pl_module: FederatedModule, client_state: dict[str, Any]) -> None:
        """Put the client's own model into the live module (before its first turn: the global one, as sent)."""
        if "model" not in client_state:
            return
        live = pl_module.named_tensors("shared")
        with torch.no_grad():
            for name, tensor in client_state["model"].items():
                live[name].copy_(tensor)
