"""Fused multi-client training (``federation.fused_clients: K``): K clients of a round train in one forward and one
backward pass through the shared frozen backbone; their evaluations run K at a time too
(:mod:`fedlit.engine.speedups.fused_eval`). What it does for a user, when it is refused and what it costs is told
once, in ``docs/runs.md`` ("Fused multi-client training").

How: each client of a group gets its own trainable tensors (:class:`~fedlit.engine.speedups.fused_model.
ClientParameters`), optimizer, data stream and ``on_client_fit_start``, loaded as in its sequential turn; each step
concatenates the group's batches, runs the frozen layers once, routes each sample through its own client's LoRA and
head, back-propagates the sum of the clients' ``strategy.training_loss`` (their tensors are disjoint, so each gets
the gradient of its own loss) and steps each client's optimizer. Uploads, store entries and optimizer states are
then made as :func:`~fedlit.engine.loop.client.train_client` makes them. :func:`fused_problems` names every reason
the result could differ from sequential turns, and the executor refuses the run at set-up for any of them.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch import Callback
from typing_extensions import override

from fedlit.core.errors import ConfigError, DataError, broken
from fedlit.core.tensors import first_non_finite
from fedlit.core.tensors import nbytes as state_nbytes
from fedlit.engine.loop import client as client_turn
from fedlit.engine.loop.client import ClientTurn, load_client
from fedlit.engine.loop.client_context import ClientContext
from fedlit.engine.loop.executor import LocalExecutor, run_evaluate_task, run_fit_task
from fedlit.engine.loop.tasks import EvaluateResult, EvaluateTask, FitTask
from fedlit.engine.speedups.fused_eval import evaluate_group, fuses_evaluation, fuses_task
from fedlit.engine.speedups.fused_model import ClientParameters, module_problems
from fedlit.strategies.base import ClientUpdate, Strategy
from fedlit.tasks.classification import ClassificationModule

if TYPE_CHECKING:
    from fedlit.engine.loop.run import Run

#: Hooks called at every local step or epoch: their calls assume one client's turn at a time.
STEP_HOOKS = (
    "on_train_epoch_start",
    "on_train_epoch_end",
    "on_train_batch_start",
    "on_train_batch_end",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
)


def fused_problems(run: Run) -> list[str]:
    """Why ``run`` cannot train its clients fused, each naming the cause and the fix; [] if it can."""
    strategy, module = run.strategy, run.module
    problems = []
    if not vars(type(strategy)).get("fusable", False):
        problems.append(
            f"{type(strategy).__name__} has not declared that its client side can train several "
            "clients at once (Strategy.fusable)"
        )
    for hook in STEP_HOOKS:
        if run.hooks.implemented(hook):
            owners = [
                type(c).__name__
                for c in run.hooks.callbacks
                if getattr(type(c), hook, None) is not getattr(Callback, hook)
            ]
            problems.append(f"{', '.join(owners)} implements {hook}, which is called at each step of one client")
            break
    if type(strategy).client_forward is not Strategy.client_forward:
        problems.append(f"{type(strategy).__name__}.client_forward swaps the module's tensors per client")
    if not isinstance(module, ClassificationModule) or any(
        getattr(type(module), m) is not getattr(ClassificationModule, m) for m in ("training_step", "forward")
    ):
        problems.append(
            f"{type(module).__name__} is not a ClassificationModule with its training_step and forward "
            "(each client's loss is computed from one forward pass of the fused batch)"
        )
    else:
        problems += module_problems(module)
    if getattr(run.fabric.strategy.precision, "scaler", None) is not None:
        problems.append(
            f"federation.precision={run.settings.precision!r} scales the loss with one gradient scaler for every client"
        )
    if run.settings.client_timeout is not None:
        problems.append("federation.client_timeout times each client's turn, but a fused group trains together")
    if run.fabric.world_size > 1:
        problems.append("several processes train their own clients (federation.devices, num_nodes)")
    return problems


class FusedExecutor(LocalExecutor):
    """The round's clients in this process, ``group`` at a time in one fused pass (see the module docstring).

    Args:
        group: The clients trained together (``federation.fused_clients``).
    """

    def __init__(self, group: int) -> None:
        self.group = group

    @override
    def setup(self, run: Run) -> None:
        """Refuse a run whose clients cannot be trained fused exactly."""
        problems = fused_problems(run)
        if problems:
            raise ConfigError(
                f"federation.fused_clients={self.group} cannot give the result of sequential turns: "
                + "; ".join(problems)
                + ". Set federation.fused_clients: 1 (the default)."
            )

    @override
    def fit(self, run: Run, server_round: int, tasks: list[FitTask]) -> list[ClientTurn | str]:
        """Each task's turn, in the order given, computed ``group`` clients at a time."""
        results: list[ClientTurn | str] = []
        for start in range(0, len(tasks), self.group):
            group = tasks[start : start + self.group]
            run.progress.client(f"clients {start + 1}-{start + len(group)} of {len(tasks)} (fused)")
            if len(group) == 1:
                results.append(
                    run_fit_task(
                        run.client_context(group[0].client_id), server_round, group[0], run.settings.on_client_error
                    )
                )
            else:
                results += train_group(
                    [run.client_context(t.client_id) for t in group], server_round, group, run.settings.on_client_error
                )
        return results

    @override
    def evaluate(self, run: Run, server_round: int, tasks: list[EvaluateTask]) -> list[EvaluateResult]:
        """Each task's metrics, in the order given, ``group`` clients' forward passes at a time
        (:mod:`fedlit.engine.speedups.fused_eval`); a task that cannot be fused is evaluated alone, in its place."""
        if not fuses_evaluation(run.module):
            return super().evaluate(run, server_round, tasks)
        results: list[EvaluateResult] = []
        pending: list[EvaluateTask] = []

        def flush() -> None:
            if len(pending) == 1:
                results.append(run_evaluate_task(run.client_context(pending[0].client_id), server_round, pending[0]))
            elif pending:
                results.extend(
                    evaluate_group([run.client_context(t.client_id) for t in pending], server_round, pending)
                )
            pending.clear()

        for task in tasks:
            if fuses_task(run.module, task):
                pending.append(task)
                if len(pending) == self.group:
                    flush()
            else:
                flush()
                results.append(run_evaluate_task(run.client_context(task.client_id), server_round, task))
        flush()
        return results


@dataclass
class _Turn:
    """One client's part of a fused group."""

    ctx: ClientContext
    task: FitTask
    index: int
    rng: torch.Tensor | None = None
    stream: Iterator[Any] | None = None
    batch: Any = None
    optimizer: Any = None
    scheduler: Any = None
    callback_state: dict[str, Any] = field(default_factory=dict)
    steps: int = 0
    loss_sum: float = 0.0
    seen: int = 0
    bad: str | None = None
    failed: str | None = None  # what the turn raised, under on_client_error=skip
    done: bool = False


def train_group(
    ctxs: list[ClientContext], server_round: int, tasks: list[FitTask], on_client_error: str = "raise"
) -> list[ClientTurn | str]:
    """The turns of ``tasks`` (one context each, same live module) trained in one fused pass per step; with
    ``on_client_error="skip"``, a description of what a client's turn raised instead of its turn."""
    module, strategy = ctxs[0].module, ctxs[0].strategy
    params = ClientParameters(module, len(tasks))
    turns = [_Turn(ctx, task, k) for k, (ctx, task) in enumerate(zip(ctxs, tasks, strict=True))]

    def guard(turn: _Turn, step: Any) -> Any:
        if on_client_error == "raise":
            return step()
        try:
            return step()
        except Exception as err:  # noqa: BLE001  (skip means: any failure of one client's turn)
            turn.failed, turn.done = f"{type(err).__name__}: {err}", True
            warnings.warn(
                f"Round {server_round}: client {turn.ctx.client_id!r} raised {turn.failed}; it is left out "
                "of this round (federation.on_client_error=skip).",
                stacklevel=4,
            )
            return None

    try:
        for turn in turns:
            params.bind(turn.index)
            guard(turn, lambda turn=turn: _start(turn, server_round))
        module.set_train_mode()
        while True:
            active = [t for t in turns if not t.done and t.bad is None]
            for turn in active:
                guard(turn, lambda turn=turn: _next_batch(turn))
            active = [t for t in active if not t.done]
            if not active:
                break
            _fused_step(module, strategy, params, active)
        results: list[ClientTurn | str] = []
        for turn in turns:
            params.bind(turn.index)
            vars(strategy).update(turn.callback_state)
            end = None if turn.failed else guard(turn, lambda turn=turn: _finish(turn, server_round))
            if end is None:
                if not (turn.failed is not None):  # guard gives None only for a failed turn
                    raise broken("guard gives None only for a failed turn")
                results.append(turn.failed)
            else:
                results.append(end)
        if turns[-1].rng is not None:
            torch.set_rng_state(turns[-1].rng)
    finally:
        params.restore(len(turns) - 1)
    return results


def _start(turn: _Turn, server_round: int) -> None:
    """What :func:`~fedlit.engine.loop.client.train_client` does before its first step, for client ``turn`` (bound)."""
    ctx, client_id = turn.ctx, turn.ctx.client_id
    load_client(ctx, turn.task.received)
    torch.manual_seed(ctx.derive_seed("train", server_round, client_id))
    loader = ctx.train_dataloader("data", server_round, client_id)
    turn.optimizer, turn.scheduler = client_turn.client_optimizer(ctx)
    ctx.hooks.call(
        "on_client_fit_start",
        client_states=ctx.store,
        **ctx.hook_args(),
        server_round=server_round,
        client_id=client_id,
        received=turn.task.received,
        received_extras=turn.task.received_extras,
    )
    turn.callback_state = dict(vars(ctx.strategy))  # its per-turn attributes (FedProx's anchor), restored per step
    turn.rng = torch.get_rng_state()
    turn.stream = _batches(ctx, loader)


def _batches(ctx: ClientContext, loader: Any) -> Iterator[Any]:
    """The batches of the client's turn, epoch after epoch or up to ``local_steps``, as the sequential loop draws
    them (one batch per step: no optimizer step is skipped here)."""
    local = ctx.local
    max_steps = local.local_steps if local.local_steps is not None else math.inf
    steps, epoch = 0, 0
    while (epoch < local.local_epochs or local.local_steps is not None) and steps < max_steps:
        batches = 0
        for batch in loader:
            batches += 1
            yield batch
            steps += 1
            if steps >= max_steps:
                return
        if batches == 0:
            raise DataError(
                f"Client {ctx.client_id!r} has no training batch: its train split is empty. Give it "
                "training samples (change the partition) or leave it out of the federation."
            )
        epoch += 1


def _next_batch(turn: _Turn) -> None:
    """Draw the client's next batch under its own global random stream (a data transform may read it)."""
    if not (turn.rng is not None and turn.stream is not None):
        raise broken("_start sets the turn's random state and stream")
    torch.set_rng_state(turn.rng)
    try:
        batch = next(turn.stream, None)
    finally:
        turn.rng = torch.get_rng_state()
    if batch is None:
        turn.done = True
        return
    inputs, targets = turn.ctx.prepare_batch(batch)
    if not isinstance(inputs, torch.Tensor):
        raise ConfigError(
            f"federation.fused_clients: client {turn.ctx.client_id!r}'s inputs are a "
            f"{type(inputs).__name__}, not one tensor to concatenate: keep federation.fused_clients: 1."
        )
    turn.batch = (inputs, targets)


def _fused_step(module: Any, strategy: Any, params: ClientParameters, active: list[_Turn]) -> None:
    """One local step of every client of ``active``: one forward and one backward pass, one optimizer step each."""
    ctx = active[0].ctx
    sizes = [len(t.batch[1]) for t in active]
    inputs = torch.cat([t.batch[0] for t in active])
    with params.fused([t.index for t in active], sizes), ctx.autocast():
        logits = module(inputs)
        parts = logits.split(sizes)
        losses = [module.loss(part, t.batch[1]) for part, t in zip(parts, active, strict=True)]
    total, stepping = None, []
    for turn, part, loss in zip(active, parts, losses, strict=True):
        targets = turn.batch[1]
        part, loss = ctx.convert_output(part), ctx.convert_output(loss)
        value = float(loss.detach())
        if not math.isfinite(value):
            turn.bad = f"training loss {value} at step {turn.steps + 1}"
            continue
        turn.loss_sum, turn.seen = turn.loss_sum + value, turn.seen + 1
        params.bind(turn.index)
        vars(strategy).update(turn.callback_state)
        out = {"loss": loss, "logits": part, "targets": targets}
        loss_k = strategy.training_loss(module, loss, turn.batch, out)
        if loss_k is not loss and not math.isfinite(float(loss_k.detach())):
            turn.bad = (
                f"training loss {float(loss_k.detach())} at step {turn.steps + 1} "
                f"(after {type(strategy).__name__}.training_loss)"
            )
            continue
        total = loss_k if total is None else total + loss_k
        stepping.append(turn)
    if total is None:
        return
    ctx.fabric.backward(total)
    for turn in stepping:
        turn.optimizer.step()
        turn.steps += 1
        turn.optimizer.zero_grad(set_to_none=True)
        if turn.scheduler is not None:
            turn.scheduler.step()
        if turn.ctx.progress is not None:
            turn.ctx.progress(turn.steps, turn.loss_sum / turn.seen)


def _finish(turn: _Turn, server_round: int) -> ClientTurn:
    """What :func:`~fedlit.engine.loop.client.train_client` does after its last step, for client ``turn`` (bound)."""
    ctx, client_id, module = turn.ctx, turn.ctx.client_id, turn.ctx.module
    shared = module.named_tensors("shared")
    update = ClientUpdate(
        client_id=client_id,
        num_examples=ctx.num_examples("train"),
        state={n: t.detach().to(ctx.store.device, copy=True) for n, t in shared.items()},
        metrics={"loss": turn.loss_sum / turn.seen if turn.seen else math.nan, "steps": float(turn.steps)},
    )
    bad = turn.bad or first_non_finite(module.named_tensors("shared", "personal"), "tensor")
    if bad is None:
        ctx.hooks.call(
            "on_client_fit_end",
            client_states=ctx.store,
            **ctx.hook_args(),
            server_round=server_round,
            client_id=client_id,
            update=update,
        )
        bad = first_non_finite(update.extras, "uploaded extra")
    download = state_nbytes(turn.task.received) + state_nbytes(turn.task.received_extras)
    if bad is not None:
        return ClientTurn(update, download, bad)
    ctx.store.save_from(client_id, module.named_tensors("personal"))
    client_turn.save_optimizer(ctx, turn.optimizer, turn.scheduler)
    return ClientTurn(update, download)
