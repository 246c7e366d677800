"""FedRoD: a generic head trained with the balanced softmax, a personal head on top of it.

Chen, Chao. "On Bridging Generic and Personalized Federated Learning for Image Classification." ICLR 2022.
https://arxiv.org/abs/2107.00778 (PFLlib's ``FedROD``, TsingZ0/PFLlib ``clientrod.py``, read)

The model is a body ``f(x; theta)`` giving features ``z``, a generic head ``h_G(z; psi)`` and, on client m, a
personal head ``h_P(z; phi_m)``. Client m's local step (Algorithm 1, the linear-head variant):

- body and generic head, on the balanced softmax loss of Ren et al. ("Balanced Meta-Softmax for Long-Tailed Visual
  Recognition", NeurIPS 2020), which adds the log of client m's class prior to the generic logits inside the
  cross-entropy:

      L_BSM = -log softmax(h_G(z) + log pi_m)_y,     pi_m(c) = n_{m,c} / n_m     (class counts of m's train split)

- the personal head, on plain cross-entropy of the personalized logits, with the body and the generic head held
  fixed (both detached): ``L_P = CE(h_G(z).detach() + h_P(z.detach()), y)``.

The server averages the body and the generic head (FedAvg, ``n_m / n``); ``phi_m`` never leaves the client. Client
m is evaluated with ``h_G(z) + h_P(z)``; the global model (body + generic head, :meth:`FedRoD.global_model_state`)
is evaluated beside it, with the generic head alone.

How fedlit runs the two heads on one model: the module keeps its one head (``head``, the generic head, shared);
``phi_m`` is an extra set of tensors of the same shapes kept in the client's strategy state
(``client_state["head_p"]``), never a second module. During training, :meth:`FedRoD.client_forward` hooks the head to
capture its input ``z``; :meth:`FedRoD.training_loss` returns ``L_BSM + L_P`` (``L_P`` computes ``h_P`` by
``torch.func.functional_call`` of the head with ``phi_m``). The two losses touch disjoint tensors, so one backward
gives the body and ``psi`` the gradient of ``L_BSM`` and ``phi_m`` that of ``L_P``: the same steps as PFLlib's two
backward passes. For evaluation the head must be linear (``nn.Linear``, checked): then
``h_G(z) + h_P(z) = h(z; psi + phi_m)``, so :meth:`FedRoD.on_client_evaluate_start` adds ``phi_m`` to the head's
weight and bias and the module evaluates (and ``fedlit export`` writes) the personalized model as it is.

Defaults (the paper's experiments and PFLlib): ``phi_m`` starts as a copy of the generic head (PFLlib's
``copy.deepcopy(model.head)``; here the head the client receives at its first turn) and steps by plain SGD (no
momentum, as PFLlib's ``opt_head``) at the local optimizer's current learning rate (PFLlib decays both learning rates
alike). A client that has not trained yet is evaluated with the generic head alone.

Symbols -> code: ``theta`` -> the shared body tensors; ``psi`` -> the tensors matched by ``head`` (shared); ``phi_m``
-> ``client_state["head_p"]`` (by the head's parameter names); ``n_{m,c}`` -> the client's train class counts
(``client.class_counts()``); L_BSM -> :func:`balanced_softmax_loss`; L_P -> :func:`personal_loss`.

Deviation: a binary task (one logit ``s``, BCE) is the two-class softmax over ``[0, s]``, so its balanced softmax
is BCE of ``s + log(n_pos / n_neg)`` and ``L_P`` is BCE. Multilabel tasks are refused. Deviation: a class absent
from the client's train split has ``log pi = -inf``, as in PFLlib (the class gets no probability in ``L_BSM``).
The paper's hypernetwork variant (FedRoD with a hypernetwork predicting ``phi_m``) is not implemented.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.func import functional_call
from torch.nn import functional as F  # noqa: N812
from torch.optim import Optimizer
from typing_extensions import override

from fedlit.core.contexts import Batch, ClientContext, StepOutput
from fedlit.core.errors import ConfigError
from fedlit.core.roles import RoleRule
from fedlit.module import FederatedModule
from fedlit.strategies.common.aggregators import Aggregator
from fedlit.strategies.fedavg import FedAvg
from fedlit.strategies.fedper import head_rule, parameter_names


def binary_as_two_classes(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """Multi-class logits ``(B, C)`` and class indices ``(B,)`` as they are; one binary logit ``s`` as the two-class
    logits ``[0, s]`` (whose softmax is BCE's) with 0/1 targets."""
    if targets.is_floating_point() or logits.dim() == 1 or logits.shape[-1] == 1:
        s = logits.reshape(len(targets))
        return torch.stack([torch.zeros_like(s), s], dim=-1), targets.round().long().reshape(-1)
    return logits, targets.long().reshape(-1)


def balanced_softmax_loss(logits: Tensor, targets: Tensor, counts: Tensor) -> Tensor:
    """``mean_k -log softmax(logits_k + log pi)_{y_k}`` with ``pi = counts / sum(counts)`` (balanced softmax, Ren et
    al. NeurIPS 2020; FedRoD's generic loss). Binary logits as :func:`binary_as_two_classes` (``counts`` =
    ``[negatives, positives]``). In float32; a class with count 0 gets ``-inf``."""
    logits, targets = binary_as_two_classes(logits, targets)
    counts = counts.to(logits.device, torch.float32)
    if counts.shape != logits.shape[-1:]:
        raise ConfigError(
            f"FedRoD: the model gives {logits.shape[-1]} class scores but the client's class counts "
            f"have {len(counts)} entries; model.init_args.num_classes must match the data."
        )
    return F.cross_entropy(logits.float() + torch.log(counts / counts.sum()), targets)


def personal_loss(generic: Tensor, personal: Tensor, targets: Tensor) -> Tensor:
    """``CE(generic.detach() + personal, y)`` (FedRoD's personal loss; binary logits as
    :func:`binary_as_two_classes`). In float32."""
    logits, targets = binary_as_two_classes(generic.detach().float() + personal.float(), targets)
    return F.cross_entropy(logits, targets)


def linear_head(pl_module: FederatedModule, rule: RoleRule, strategy: str) -> tuple[str, nn.Linear]:
    """The name and module of the one ``nn.Linear`` whose parameters ``rule`` matches (its weight and bias); a
    ConfigError naming ``strategy.init_args.head`` otherwise."""
    names = parameter_names(pl_module, rule)
    prefixes = {n.rpartition(".")[0] for n in names}
    module = pl_module.get_submodule(next(iter(prefixes))) if len(prefixes) == 1 else None
    if not isinstance(module, nn.Linear) or module.bias is None or len(names) != 2:
        raise ConfigError(
            f"strategy.init_args.head={rule.pattern!r} must match the weight and bias of one nn.Linear (the "
            f"classifier: 'head.*' in fedlit.tasks.ClassificationModule), since {strategy} runs that head on the "
            f"features with tensors of its own; it matches {sorted(names)[:4]}."
        )
    return next(iter(prefixes)), module


@contextlib.contextmanager
def captured_input(module: nn.Module, into: dict[str, Tensor]) -> Iterator[None]:
    """While open, each forward of ``module`` puts its first input in ``into["z"]``."""

    def hook(_: nn.Module, args: tuple[Any, ...]) -> None:
        into["z"] = args[0]

    handle = module.register_forward_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()


class FedRoD(FedAvg):
    """FedAvg of the body and a generic head trained with the balanced softmax; a personal head per client.

    Args:
        head: Glob (or ``re:<regex>``) of the generic head's weight and bias, one ``nn.Linear`` (default
            ``head.*``).
        weighting: As in :class:`~fedlit.strategies.fedavg.FedAvg`.
        aggregator: As in :class:`~fedlit.strategies.fedavg.FedAvg` (default: the weighted mean).
    """

    accepted_tasks = frozenset({"multiclass", "binary"})
    #: The server is FedAvg's weighted mean; the prior and ``phi_m`` never leave the client.
    secure_aggregation = True

    def __init__(
        self,
        *,
        head: str = "head.*",
        weighting: Literal["num_examples", "uniform"] = "num_examples",
        aggregator: Aggregator | None = None,
    ) -> None:
        super().__init__(weighting=weighting, aggregator=aggregator)
        self.head = head
        self.head_rule = head_rule(head)
        self._turn: dict[str, Any] = {}

    @override
    def global_model_state(self, client_id: str) -> dict[str, Tensor]:
        """The body and the generic head (every client evaluated with ``h_G`` alone, beside ``h_G + h_P``)."""
        return dict(self.global_state)

    # ------------------------------------------------------------------------------------------ client
    def on_client_fit_start(
        self, pl_module: FederatedModule, client_state: dict[str, Any], client: ClientContext
    ) -> None:
        """Take ``phi_m`` (a copy of the received head at the first turn) and the client's train class counts."""
        name, head = linear_head(pl_module, self.head_rule, "FedRoD")
        counts = client.class_counts()
        if counts is None:
            raise ConfigError(
                "FedRoD needs the clients' class counts (a multiclass or binary task); the data has none."
            )
        stored = client_state.get("head_p")
        phi = {}
        for key, param in head.named_parameters():
            source = stored[f"{name}.{key}"] if stored is not None else param
            phi[key] = source.detach().to(param.device, param.dtype, copy=True).requires_grad_(True)
        self._turn = {
            "name": name,
            "head": head,
            "phi": phi,
            "captured": {},
            "client": client,
            "counts": torch.as_tensor(counts["train"], dtype=torch.float32),
        }

    @override
    def client_forward(self, pl_module: FederatedModule) -> contextlib.AbstractContextManager[Any]:
        """Capture the head's input ``z`` during the step."""
        if not self._turn:
            return contextlib.nullcontext()
        return captured_input(self._turn["head"], self._turn["captured"])

    @override
    def training_loss(
        self, pl_module: FederatedModule, loss: Tensor, batch: Batch, outputs: StepOutput = None
    ) -> Tensor:
        """``L_BSM(h_G(z)) + CE(h_G(z).detach() + h_P(z.detach()))``; replaces the module's loss."""
        turn = self._turn
        if not turn:
            return loss
        if not isinstance(outputs, Mapping) or "logits" not in outputs or "targets" not in outputs:
            raise TypeError(
                f"FedRoD needs {type(pl_module).__name__}.training_step to return a dict with 'logits' "
                "and 'targets' (fedlit.tasks.ClassificationModule does)."
            )
        logits, targets = outputs["logits"], outputs["targets"]
        if targets.dim() > 1 and targets.shape[-1] > 1:
            raise ConfigError(
                "FedRoD needs one class per sample (multiclass or binary); multilabel targets of "
                f"shape {tuple(targets.shape)} have none."
            )
        z = turn["captured"]["z"].detach()
        with turn["client"].autocast():
            personal = functional_call(turn["head"], turn["phi"], (z,))
        total = balanced_softmax_loss(logits, targets, turn["counts"]) + personal_loss(logits, personal, targets)
        return total.to(loss.dtype)

    @override
    def on_before_optimizer_step(self, client: ClientContext) -> None:
        """Unscale ``phi_m``'s gradients under 16-bit mixed precision (the loop unscales the module's only)."""
        if self._turn and client.scaler is not None:
            for tensor in self._turn["phi"].values():
                if tensor.grad is not None:
                    tensor.grad.div_(client.scaler.get_scale())

    @override
    def on_before_zero_grad(self, optimizer: Optimizer, stepped: bool) -> None:
        """SGD step of ``phi_m`` at the local learning rate when the module's optimizer stepped."""
        if not self._turn:
            return
        lr = float(getattr(optimizer, "optimizer", optimizer).param_groups[0]["lr"])
        with torch.no_grad():
            for tensor in self._turn["phi"].values():
                if stepped and tensor.grad is not None:
                    tensor.sub_(lr * tensor.grad)
                tensor.grad = None

    def on_client_fit_end(self, client_state: dict[str, Any], client: ClientContext) -> None:
        """Keep ``phi_m`` in the client's state."""
        turn = self._turn
        if not turn:
            return
        client_state["head_p"] = {
            f"{turn['name']}.{k}": t.detach().to(client.store.device, copy=True) for k, t in turn["phi"].items()
        }
        self._turn = {}

    @override
    def on_client_evaluate_start(self, pl_module: FederatedModule, client_state: dict[str, Any]) -> None:
        """Evaluate ``h_G + h_P``: add ``phi_m`` to the (linear) head's weight and bias."""
        phi = client_state.get("head_p")
        if phi is None:
            return
        name, head = linear_head(pl_module, self.head_rule, "FedRoD")
        with torch.no_grad():
            for key, param in head.named_parameters():
                param.add_(phi[f"{name}.{key}"].to(param.device, param.dtype))
