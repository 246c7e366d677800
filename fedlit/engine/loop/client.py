"""One client's turn over a :class:`ClientContext`: load its state, train locally, check the result, build its upload.

A :class:`ClientContext` holds what a turn needs and nothing of the server: the live module, Fabric, the data (read
for this client only), the store (this client's entry only), the hooks, the run's seed and the local-training
settings. The simulation builds one per turn from its run; a Flower node builds its own from the recipe, without a
run. Hooks of a turn receive it as ``client`` and as ``trainer`` (its data loaders, its gradient scaler, its seeds:
the public :class:`fedlit.core.contexts.ClientContext`, which it implements), so strategies never reach into Fabric,
the data module or the run. It is defined in :mod:`fedlit.engine.loop.client_context`.

::

    received = strategy.configure_client(...)       # every shared tensor, from the server
    load the client's personal tensors from the store, then ``received``, into the live module (in place)
    the optimizer (fedlit.engine.loop.optim: the module's own one reused with a fresh state, or configure_optimizers;
    stored
        state, this round's learning rate)
    on_client_fit_start(..., client_state=<each callback's own slot>)
    for each step: convert the batch to the run's precision; training_step under strategy.client_forward(module)
        and fabric.autocast();
        strategy.training_loss; backward; on_before_optimizer_step; optimizer.step (a 16-bit step that the
        gradient scaler skipped is not counted); on_before_zero_grad(..., stepped=...); on_train_batch_end;
        a scheduler of interval "step" steps if the optimizer did
    update = the client's shared tensors + extras, checked finite
    on_client_fit_end; save the client's personal tensors to the store

With BatchNorm layers that normalize with the statistics of the batch (in train mode), a training batch of one
sample is left out: it has no such statistics (PyTorch raises on it). It happens once per pass over a train split
of 1 more than a multiple of the batch size; the skipped batch is not a step and does not enter the mean loss, and a
warning names the client once per run (:func:`skip_single_sample`).

A client whose loss or upload is not finite stops training at once and is *quarantined*: its turn carries the
``problem`` (the round leaves its update out of aggregation), ``on_client_fit_end`` is not called and nothing of
it is saved, so its stored state and the strategy's per-client state stay as they were before the turn. A turn
that takes longer than ``federation.client_timeout`` seconds (loading and training, measured after each step) is
*timed out* the same way: it stops at the step that passed the limit and is left out like a quarantined one.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim.lr_scheduler import LRScheduler

from fedlit.core.errors import DataError
from fedlit.core.seeding import manual_seed
from fedlit.core.tensors import first_non_finite
from fedlit.core.tensors import nbytes as state_nbytes
from fedlit.engine.loop import optim
from fedlit.engine.loop.client_context import ClientContext
from fedlit.module import FederatedModule
from fedlit.strategies.base import ClientUpdate


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


def train_client(
    ctx: ClientContext, server_round: int, received: Mapping[str, Tensor], received_extras: Mapping[str, Any]
) -> ClientTurn:
    """Train ``ctx.client_id`` for one round from ``received`` (every shared tensor) and ``received_extras``: the
    client's side of a turn, run where the client's data and store entry are (see the module docstring)."""
    module, fabric, strategy, hooks, local = ctx.module, ctx.fabric, ctx.strategy, ctx.hooks, ctx.local
    client_id = ctx.client_id
    started, timeout = _clock(), local.client_timeout
    load_client(ctx, received)
    manual_seed(ctx.derive_seed("train", server_round, client_id))
    loader = ctx.train_dataloader("data", server_round, client_id)
    optimizer, scheduler = client_optimizer(ctx)
    precision = fabric.strategy.precision
    scaler = ctx.scaler
    hook_args = ctx.hook_args()
    hooks.call(
        "on_client_fit_start",
        client_states=ctx.store,
        **hook_args,
        server_round=server_round,
        client_id=client_id,
        received=received,
        received_extras=received_extras,
    )
    module.set_train_mode()
    norms = batch_statistics_layers(module)
    steps, loss_sum, seen, epoch = 0, 0.0, 0, 0
    bad: str | None = None
    kind = "non-finite"
    max_steps = local.local_steps if local.local_steps is not None else math.inf
    while (epoch < local.local_epochs or local.local_steps is not None) and steps < max_steps and bad is None:
        hooks.call("on_train_epoch_start", **hook_args)
        batches = 0
        for batch_idx, batch in enumerate(loader):
            if skip_single_sample(ctx, batch, norms):
                continue
            batch = precision.convert_input(fabric.to_device(batch))
            hooks.call("on_train_batch_start", **hook_args, batch=batch, batch_idx=batch_idx)
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
                bad = (
                    f"training loss {float(total.detach())} at step {steps + 1} "
                    f"(after {type(strategy).__name__}.training_loss)"
                )
                break
            loss = total
            hooks.call("on_before_backward", **hook_args, loss=loss)
            fabric.backward(loss)
            hooks.call("on_after_backward", **hook_args)
            if scaler is not None:
                # As Lightning's Trainer: unscale before the hook, so hooks that read or add to gradients
                # (SCAFFOLD) see true values; the scaler's step then skips its own unscaling.
                scaler.unscale_(getattr(optimizer, "optimizer", optimizer))
            hooks.call("on_before_optimizer_step", **hook_args, optimizer=optimizer)
            scale = scaler.get_scale() if scaler is not None else 0.0
            optimizer.step()
            # A scaler that found inf/NaN gradients skips the step and lowers its scale.
            stepped = scaler is None or scaler.get_scale() >= scale
            steps += int(stepped)
            hooks.call("on_before_zero_grad", **hook_args, optimizer=optimizer, stepped=stepped)
            optimizer.zero_grad(set_to_none=True)
            hooks.call("on_train_batch_end", **hook_args, outputs=out, batch=batch, batch_idx=batch_idx)
            if scheduler is not None and stepped:  # interval "step": after the step, as Lightning's Trainer
                scheduler.step()
            if ctx.progress is not None:
                ctx.progress(steps, loss_sum / seen)
            if timeout is not None and _clock() - started > timeout:
                bad, kind = (
                    (
                        f"timed out: {_clock() - started:.3g} s after {steps} steps, over "
                        f"federation.client_timeout={timeout:g} s"
                    ),
                    "timeout",
                )
                break
            if steps >= max_steps:
                break
        if batches == 0:
            raise DataError(
                f"Client {client_id!r} has no training batch: its train split is "
                f"{_empty_or_single(ctx, norms)}. Give it training samples (change the partition) or "
                "leave it out of the federation."
            )
        hooks.call("on_train_epoch_end", **hook_args)
        epoch += 1
    shared = module.named_tensors("shared")
    update = ClientUpdate(
        client_id=client_id,
        num_examples=ctx.num_examples("train"),
        state={n: t.detach().to(ctx.store.device, copy=True) for n, t in shared.items()},
        metrics={"loss": loss_sum / seen if seen else math.nan, "steps": float(steps)},
    )
    bad = bad or first_non_finite(module.named_tensors("shared", "personal"), "tensor")
    if bad is None:
        hooks.call(
            "on_client_fit_end",
            client_states=ctx.store,
            **hook_args,
            server_round=server_round,
            client_id=client_id,
            update=update,
        )
        bad = first_non_finite(update.extras, "uploaded extra")
    download = state_nbytes(received) + state_nbytes(received_extras)
    if bad is not None:
        return ClientTurn(update, download, bad, kind)
    ctx.store.save_from(client_id, module.named_tensors("personal"))
    save_optimizer(ctx, optimizer, scheduler)
    return ClientTurn(update, download)


def batch_statistics_layers(module: nn.Module) -> list[str]:
    """The BatchNorm layers of ``module`` that normalize with the statistics of the batch: in train mode, or
    without running statistics. A batch of one sample has none."""

    def norms() -> list[tuple[str, nn.Module]]:
        return [(n, m) for n, m in module.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]

    layers = module.derived("batchnorm_layers", norms) if isinstance(module, FederatedModule) else norms()
    return [name for name, m in layers if m.training or m.running_mean is None]


def skip_single_sample(ctx: ClientContext, batch: Any, norms: list[str]) -> bool:
    """Whether to leave out ``batch``: one sample, with BatchNorm layers ``norms`` that need batch statistics. Warns
    the first time in the run for the client."""
    if not norms or _num_samples(batch) != 1:
        return False
    key = f"single-sample-batch:{ctx.client_id}"
    if key not in ctx.warned and ctx.num_examples("train") > 1:  # a lone sample: the turn raises, saying why
        ctx.warned.add(key)
        warnings.warn(
            f"Client {ctx.client_id!r}: a training batch of one sample is left out, one sample per pass over its "
            f"{ctx.num_examples('train')} training samples (1 more than a multiple of the batch size), because the "
            f"BatchNorm layers {norms[:3]}{' ...' if len(norms) > 3 else ''} normalize with the statistics of the "
            "batch, which one sample cannot give. Choose a data.init_args.batch_size that leaves no sample alone to "
            "train on every one.",
            stacklevel=3,
        )
    return True


def _num_samples(batch: Any) -> int | None:
    """The leading dimension of the first tensor in ``batch`` (a tensor, or a tuple, list or mapping of them)."""
    if isinstance(batch, Tensor):
        return batch.shape[0] if batch.dim() else None
    items = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, list | tuple) else ()
    for item in items:
        found = _num_samples(item)
        if found is not None:
            return found
    return None


def _empty_or_single(ctx: ClientContext, norms: list[str]) -> str:
    if ctx.num_examples("train") == 1 and norms:
        return (
            f"one sample, which the BatchNorm layers {norms[:3]} cannot train on (they normalize with the "
            "statistics of the batch)"
        )
    return "empty"


def client_optimizer(ctx: ClientContext) -> tuple[Any, LRScheduler | None]:
    """The optimizer of the client's turn (set up by Fabric) and the scheduler to step after each local step
    (None unless the interval is ``step``): stored states loaded under ``optimizer_state: persist``, this round's
    hyperparameters applied under ``interval: round``."""
    persist = ctx.local.optimizer_state == "persist"
    stored = ctx.store.optimizer_state(ctx.client_id) if persist else None
    reused = optim.reused_optimizer(ctx.module)
    if reused is not None:  # a built-in optimizer, as configure_optimizers would build it (see optim.reused_optimizer)
        optimizer, wrapped = reused
        if stored is None:
            if ctx.lr_schedule is not None:
                ctx.lr_schedule.apply(optimizer)
            return wrapped if wrapped is not None else optim.keep_wrapped(
                ctx.module, ctx.fabric.setup_optimizers(optimizer)
            ), None
        optimizer.load_state_dict(stored)  # replaces its state and groups: Fabric's wrapper must be built anew
        optim.keep_wrapped(ctx.module, None)
        if ctx.lr_schedule is not None:
            ctx.lr_schedule.apply(optimizer)
        return ctx.fabric.setup_optimizers(optimizer), None
    local = optim.unpack(ctx.module, ctx.module.configure_optimizers())
    optimizer = local.optimizer
    if stored is not None:
        optimizer.load_state_dict(stored)
    scheduler = local.scheduler if local.interval == "step" else None
    if scheduler is not None and persist:
        saved = ctx.store.extra(ctx.client_id, optim.STORE_KEY).get("state")
        if saved is not None:
            scheduler.load_state_dict(saved)
    if ctx.lr_schedule is not None:
        ctx.lr_schedule.apply(optimizer)
    return ctx.fabric.setup_optimizers(optimizer), scheduler


def save_optimizer(ctx: ClientContext, optimizer: Any, scheduler: LRScheduler | None) -> None:
    """Keep the client's optimizer state and that of its ``step`` scheduler under ``optimizer_state: persist``."""
    if ctx.local.optimizer_state != "persist":
        return
    ctx.store.set_optimizer_state(ctx.client_id, optimizer.state_dict())
    if scheduler is not None:
        ctx.store.extra(ctx.client_id, optim.STORE_KEY)["state"] = scheduler.state_dict()


def load_client(ctx: ClientContext, received: Mapping[str, Tensor]) -> None:
    """Put the client's personal tensors from the store, then what the server sent, into the live module."""
    ctx.store.load_into(ctx.client_id, ctx.module.named_tensors("personal"))
    shared = ctx.module.named_tensors("shared")
    unknown = sorted(set(received) - set(shared))
    if unknown:
        raise KeyError(f"{ctx.strategy!r} sent tensors that are not shared: {unknown[:5]}")
    missing = sorted(set(shared) - set(received))
    if missing:
        # The store keeps personal tensors only: a shared tensor not sent would keep the previous client's value.
        raise KeyError(
            f"{ctx.strategy!r} sent no value for the shared tensors {missing[:5]}: configure_client and "
            "configure_evaluate must return every shared tensor (make the others personal)."
        )
    with torch.no_grad():
        for name, tensor in received.items():
            shared[name].copy_(tensor)
