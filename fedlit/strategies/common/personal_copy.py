"""A second copy of a client's tensors over the one frozen backbone, run through the live module's own code.

Methods that keep a personal model beside the shared one (APFL's ``v``, Ditto's ``v``, pFedMe's ``theta``) keep it
as one more set of the trainable and normalization tensors in the client's ``client_state``, never as a copy of the
module: :func:`personal_copy` makes the set (leaves with gradients where the module's are trainable),
:func:`functional_loss` runs the module's ``training_step`` with it in place of the module's tensors
(``torch.func.functional_call``: frozen tensors, a backbone's bulk, are the module's own),
:func:`mirror_optimizer` builds an optimizer for it like the local one and :func:`load_into` puts it into the live
module for evaluation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.func import functional_call
from typing_extensions import override

from fedlit.core.contexts import ClientContext
from fedlit.core.errors import ConfigError
from fedlit.module import FederatedModule


class MethodCall(nn.Module):
    """Calls ``module.<method>`` as its ``forward``, so ``functional_call`` can run a training step with other
    tensors in place of the module's (names prefixed ``module.``)."""

    def __init__(self, module: nn.Module, method: str) -> None:
        super().__init__()
        self.module, self.method = module, method

    @override
    def forward(self, *args: Any) -> Any:
        return getattr(self.module, self.method)(*args)


def to_device(obj: Any, device: torch.device | str) -> Any:
    """A copy of ``obj`` (nested dicts, lists and tuples of tensors, an optimizer's state) with tensors detached
    and on ``device``."""
    if isinstance(obj, Tensor):
        return obj.detach().to(device, copy=True)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(to_device(v, device) for v in obj)
    return obj


def personal_copy(
    pl_module: FederatedModule, stored: Mapping[str, Tensor] | None = None
) -> tuple[dict[str, Tensor], list[str]]:
    """A copy of the module's shared and personal tensors (``stored``'s values where given, else the live ones), on
    the live tensors' devices and dtypes, and the names of the trainable ones (in model order), which are leaves
    that require gradients."""
    live = pl_module.named_tensors("shared", "personal")
    trainable = {n for n, p in pl_module.named_parameters() if p.requires_grad and n in live}
    source = live if stored is None else stored
    copy = {}
    for name, tensor in live.items():
        value = source[name].detach().to(tensor.device, tensor.dtype, copy=True)
        copy[name] = value.requires_grad_(True) if name in trainable else value
    return copy, [n for n in live if n in trainable]


def functional_loss(step: MethodCall, tensors: Mapping[str, Tensor], batch: Any, client: ClientContext) -> Tensor:
    """The loss of ``step`` (a :class:`MethodCall` of ``training_step``) on ``batch`` with ``tensors`` in place of
    the module's, under the run's precision (``client``: the turn's ``ClientContext``)."""
    with client.autocast():
        out = functional_call(step, {f"module.{n}": t for n, t in tensors.items()}, (batch, 0))
    out = client.convert_output(out)
    return cast(Tensor, out["loss"] if isinstance(out, Mapping) else out)  # training_step gives a loss


def mirror_optimizer(
    pl_module: FederatedModule,
    inner: torch.optim.Optimizer,
    tensors: Mapping[str, Tensor],
    state: dict[str, Any] | None,
    owner: str,
) -> torch.optim.Optimizer:
    """An optimizer of ``tensors`` like ``inner`` (the loop's, over the module's parameters): same class, the same
    parameter groups and hyperparameters, each module parameter replaced by the tensor of its name; ``state``
    (a ``state_dict`` kept from an earlier turn) loaded when given. ``owner`` names the strategy in the error
    raised when the class cannot be built that way."""
    names = {id(p): n for n, p in pl_module.named_parameters()}
    groups = [
        {
            **{k: val for k, val in g.items() if k != "params"},
            "params": [tensors[names[id(p)]] for p in g["params"] if names.get(id(p)) in tensors],
        }
        for g in inner.param_groups
    ]
    try:
        mirror = type(inner)(groups, **inner.defaults)
    except (TypeError, ValueError) as err:
        raise ConfigError(
            f"{owner} builds the personal model's optimizer as the local one, but "
            f"{type(inner).__name__}(params, **defaults) failed ({err}): use a torch.optim "
            "optimizer in model.init_args.optimizer."
        ) from err
    if state is not None:
        mirror.load_state_dict(state)
    return mirror


def sync_hyperparameters(mirror: torch.optim.Optimizer, inner: torch.optim.Optimizer) -> None:
    """Give each group of ``mirror`` the hyperparameters of ``inner``'s group at the same place (this step's
    learning rate under a schedule)."""
    for group, ref in zip(mirror.param_groups, inner.param_groups, strict=True):
        group.update({k: val for k, val in ref.items() if k != "params"})


def unscale_gradients(tensors: Mapping[str, Tensor], names: list[str], scaler: Any) -> None:
    """Divide the gradients of ``tensors[names]`` by the gradient scaler's scale (16-bit mixed precision: the loop
    unscales the module's gradients only); nothing when ``scaler`` is None."""
    if scaler is None:
        return
    for name in names:
        grad = tensors[name].grad
        if grad is not None:
            grad.div_(scaler.get_scale())


def load_into(pl_module: FederatedModule, tensors: Mapping[str, Tensor]) -> None:
    """Copy ``tensors`` (shared and personal tensors by name) into the live module, in place."""
    live = pl_module.named_tensors("shared", "personal")
    with torch.no_grad():
        for name, tensor in tensors.items():
            live[name].copy_(tensor)


def step_copy(
    turn: dict[str, Any], key: str, pl_module: FederatedModule, optimizer: Any, stepped: bool, owner: str
) -> None:
    """After the loop's step, step the copy ``turn[key]`` with its mirror optimizer (built on first use from
    ``turn["optimizer_state"]``, kept in ``turn["optimizer"]``; not on a step the gradient scaler skipped), then drop
    its gradients. ``owner`` names the strategy in errors."""
    tensors = turn[key]
    if stepped:
        inner = getattr(optimizer, "optimizer", optimizer)
        if turn["optimizer"] is None:
            turn["optimizer"] = mirror_optimizer(pl_module, inner, tensors, turn["optimizer_state"], owner)
        sync_hyperparameters(turn["optimizer"], inner)
        turn["optimizer"].step()
    for name in turn["trainable"]:
        tensors[name].grad = None


def keep_copy(turn: dict[str, Any], key: str, client_state: dict[str, Any], client: ClientContext) -> None:
    """Store the copy ``turn[key]`` in ``client_state[key]`` (on the store's device) and, under
    ``optimizer_state: persist``, its mirror optimizer's state."""
    device = client.store.device
    client_state[key] = {n: t.detach().to(device, copy=True) for n, t in turn[key].items()}
    if client.local.optimizer_state == "persist" and turn["optimizer"] is not None:
        client_state["optimizer"] = to_device(turn["optimizer"].state_dict(), device)
