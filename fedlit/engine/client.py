"""One client's turn: load its state, train locally, check the result, build its upload.

::

    received = strategy.configure_client(...)       # every shared tensor, from the server
    load the client's personal tensors from the store, then ``received``, into the live module (in place)
    build the optimizer (fedlit.engine.optim: stored state, this round's learning rate)
    on_client_fit_start(..., client_state=<each callback's own slot>)
    for each step: convert the batch to the run's precision; training_step under strategy.client_forward(module)
        and fabric.autocast();
        strategy.training_loss; backward; on_before_optimizer_step; optimizer.step (a 16-bit step that the
        gradient scaler skipped is not counted); on_before_zero_grad(..., stepped=...); on_train_batch_end;
        a scheduler of interval "step" steps if the optimizer did
    update = the client's shared tensors + extras, checked finite
    on_client_fit_end; save the client's personal tensors to the store

A client whose loss or upload is not finite stops training at once and is *quarantined*: its turn carries the
``problem`` (the round leaves its update out of aggregation), ``on_client_fit_end`` is not called and nothing of
it is saved, so its stored state and the strategy's per-client state stay as they were before the turn. A turn
that takes longer than ``federation.client_timeout`` seconds (loading and training, measured after each step) is
*timed out* the same way: it stops at the step that passed the limit and is left out like a quarantined one.
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from fedlit.core.errors import DataError
from fedlit.core.tensors import first_non_finite
from fedlit.core.tensors import nbytes as state_nbytes
from fedlit.engine import optim
from fedlit.strategies.base import ClientUpdate

if TYPE_CHECKING:
    from fedlit.federation import Federation


@dataclass
class ClientTurn:
    """The outcome of one client's turn.

    Attributes:
        update: What it uploads; ``metrics`` holds ``loss`` (mean training loss) and ``steps`` (optimizer steps
            that happened).
        download_bytes: Bytes of what the server sent it (tensors and extras).
        problem: Why the turn is left out of aggregation (a non-finite loss or tensor, a timeout), or None.
        problem_kind: ``non-finite`` (quarantined) or ``timeout`` (past ``federation.client_timeout``).
    """

    update: ClientUpdate
    download_bytes: int
    problem: str | None = None
    problem_kind: str = "non-finite"


#: The clock of ``federation.client_timeout`` (a test replaces it with a fake one).
_clock = time.monotonic


def fit_client(fed: Federation, server_round: int, client_id: str) -> ClientTurn:
    """Train ``client_id`` for one round with what the strategy sends it (see the module docstring)."""
    return train_client(fed, server_round, client_id, fed.strategy.configure_client(server_round, client_id),
                        fed.strategy.configure_client_extras(server_round, client_id))


def train_client(fed: Federation, server_round: int, client_id: str, received: Mapping[str, Tensor],
                 received_extras: Mapping[str, Any]) -> ClientTurn:
    """Train ``client_id`` for one round from ``received`` (every shared tensor) and ``received_extras``, the
    client's side of a turn: what runs where the client's data and store entry are."""
    module, fabric, strategy = fed.module, fed.fabric, fed.strategy
    started, timeout = _clock(), fed.client_timeout
    load_client(fed, client_id, received)
    torch.manual_seed(fed.derive_seed("train", server_round, client_id))
    loader = fed.datamodule.train_dataloader(
        client_id, torch.Generator().manual_seed(fed.derive_seed("data", server_round, client_id)))
    optimizer, scheduler = optim.client_optimizer(fed, client_id)
    precision = fabric.strategy.precision
    scaler = getattr(precision, "scaler", None)
    scaler = scaler if scaler is not None and scaler.is_enabled() else None
    hook_args = {"trainer": fed, "pl_module": module}
    call_with_client_state(fed, "on_client_fit_start", **hook_args, server_round=server_round,
                           client_id=client_id, received=received, received_extras=received_extras)
    module.set_train_mode()
    steps, loss_sum, seen, epoch = 0, 0.0, 0, 0
    bad: str | None = None
    kind = "non-finite"
    max_steps = fed.local_steps if fed.local_steps is not None else math.inf
    show_progress = bool(getattr(fed, "progress_bar", False))  # the bar itself throttles its updates
    while (epoch < fed.local_epochs or fed.local_steps is not None) and steps < max_steps and bad is None:
        fed.call("on_train_epoch_start", **hook_args)
        batches = 0
        for batch_idx, batch in enumerate(loader):
            batch = precision.convert_input(fabric.to_device(batch))
            fed.call("on_train_batch_start", **hook_args, batch=batch, batch_idx=batch_idx)
            with strategy.client_forward(module), fabric.autocast():
                out = precision.convert_output(module.training_step(batch, batch_idx))
            loss = out["loss"] if isinstance(out, Mapping) else out
            value = float(loss.detach())
            batches += 1
            if not math.isfinite(value):
                bad = f"training loss {value} at step {steps + 1}"
                break
            loss_sum, seen = loss_sum + value, seen + 1
            total = strategy.training_loss(module, loss, batch, out)
            if total is not loss and not math.isfinite(float(total.detach())):
                bad = (f"training loss {float(total.detach())} at step {steps + 1} "
                       f"(after {type(strategy).__name__}.training_loss)")
                break
            loss = total
            fed.call("on_before_backward", **hook_args, loss=loss)
            fabric.backward(loss)
            fed.call("on_after_backward", **hook_args)
            if scaler is not None:
                # As Lightning's Trainer: unscale before the hook, so hooks that read or add to gradients
                # (SCAFFOLD) see true values; the scaler's step then skips its own unscaling.
                scaler.unscale_(getattr(optimizer, "optimizer", optimizer))
            fed.call("on_before_optimizer_step", **hook_args, optimizer=optimizer)
            scale = scaler.get_scale() if scaler is not None else 0.0
            optimizer.step()
            # A scaler that found inf/NaN gradients skips the step and lowers its scale.
            stepped = scaler is None or scaler.get_scale() >= scale
            steps += int(stepped)
            fed.call("on_before_zero_grad", **hook_args, optimizer=optimizer, stepped=stepped)
            optimizer.zero_grad(set_to_none=True)
            fed.call("on_train_batch_end", **hook_args, outputs=out, batch=batch, batch_idx=batch_idx)
            if scheduler is not None and stepped:  # interval "step": after the step, as Lightning's Trainer
                scheduler.step()
            if show_progress:
                fed.show_progress(steps, loss_sum / seen)
            if timeout is not None and _clock() - started > timeout:
                bad, kind = (f"timed out: {_clock() - started:.3g} s after {steps} steps, over "
                             f"federation.client_timeout={timeout:g} s"), "timeout"
                break
            if steps >= max_steps:
                break
        if batches == 0:
            raise DataError(f"Client {client_id!r} has no training batch: its train split is empty. Give it "
                            "training samples (change the partition) or leave it out of the federation.")
        fed.call("on_train_epoch_end", **hook_args)
        epoch += 1
    shared = module.named_tensors("shared")
    update = ClientUpdate(
        client_id=client_id,
        num_examples=fed.datamodule.num_examples(client_id, "train"),
        state={n: t.detach().to(fed.store.device, copy=True) for n, t in shared.items()},
        metrics={"loss": loss_sum / seen if seen else math.nan, "steps": float(steps)},
    )
    bad = bad or first_non_finite(module.named_tensors("shared", "personal"), "tensor")
    if bad is None:
        call_with_client_state(fed, "on_client_fit_end", **hook_args, server_round=server_round,
                               client_id=client_id, update=update)
        bad = first_non_finite(update.extras, "uploaded extra")
    download = state_nbytes(received) + state_nbytes(received_extras)
    if bad is not None:
        return ClientTurn(update, download, bad, kind)
    fed.store.save_from(client_id, module.named_tensors("personal"))
    optim.save_client(fed, client_id, optimizer, scheduler)
    return ClientTurn(update, download)


def load_client(fed: Federation, client_id: str, received: Mapping[str, Tensor]) -> None:
    """Put ``client_id``'s personal tensors from the store, then what the server sent, into the live module."""
    fed.store.load_into(client_id, fed.module.named_tensors("personal"))
    shared = fed.module.named_tensors("shared")
    unknown = sorted(set(received) - set(shared))
    if unknown:
        raise KeyError(f"{fed.strategy!r} sent tensors that are not shared: {unknown[:5]}")
    missing = sorted(set(shared) - set(received))
    if missing:
        # The store keeps personal tensors only: a shared tensor not sent would keep the previous client's value.
        raise KeyError(f"{fed.strategy!r} sent no value for the shared tensors {missing[:5]}: configure_client and "
                       "configure_evaluate must return every shared tensor (make the others personal).")
    with torch.no_grad():
        for name, tensor in received.items():
            shared[name].copy_(tensor)


def call_with_client_state(fed: Federation, hook: str, **kwargs: Any) -> None:
    """Call ``hook`` on every callback (the strategy first) with the keyword arguments it declares, giving each one
    its own ``client_state``: the dict persisted for ``kwargs["client_id"]`` under that callback's ``state_key``."""
    client_id = kwargs["client_id"]
    for callback in fed.callbacks:
        method = getattr(callback, hook, None)
        if not callable(method):
            continue
        params = inspect.signature(method).parameters
        takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        given = {k: v for k, v in kwargs.items() if takes_all or k in params}
        if takes_all or "client_state" in params:
            given["client_state"] = fed.store.extra(client_id, callback.state_key)
        method(**given)
