"""Where the clients' work runs: the seam between the server's round and the clients' turns.

A round (:mod:`fedlit.engine.loop.rounds`) and an evaluation (:mod:`fedlit.engine.loop.evaluate`) never train or
evaluate a client themselves: they hand the round's clients to ``run.executor`` and get, in the order they gave, each
client's
:class:`~fedlit.engine.loop.client.ClientTurn` (or what it raised) and each client's metrics. What the server sends a
client (:meth:`~fedlit.strategies.base.Strategy.configure_client`, ``configure_client_extras``, ``configure_evaluate``,
``global_model_state``) is decided by the strategy on the server side before the executor is called, so every
executor gives the strategy the same inputs:

- :class:`LocalExecutor` (the default): every client in this process, one after the other, on the one live module.
- Ranks of a Fabric run (``federation.devices > 1``): each rank runs its own clients, the results meet on every rank.
- A Flower deployment: each client's turn is a message to the process that holds that client.

An executor returns results in the order of ``client_ids`` whatever order it ran them in, so aggregation sums the
uploads in one order and the result does not depend on where the clients ran.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import torch

from fedlit.engine.loop.client import ClientTurn, train_client
from fedlit.engine.loop.client_context import ClientContext
from fedlit.engine.loop.evaluate import GLOBAL, evaluate_client
from fedlit.engine.loop.tasks import EvaluateResult, EvaluateTask, FitTask

if TYPE_CHECKING:
    from fedlit.engine.loop.run import Run


class LocalExecutor:
    """Every client in this process, in turn, on the one live module (the default executor)."""

    def setup(self, run: Run) -> None:
        """Called once the run is set up (its module, store and strategy ready)."""

    def fit(self, run: Run, server_round: int, tasks: list[FitTask]) -> list[ClientTurn | str]:
        """Each task's turn, in the order given: a :class:`~fedlit.engine.loop.client.ClientTurn`, or, with
        ``federation.on_client_error=skip``, a description of what the turn raised."""
        results: list[ClientTurn | str] = []
        for i, task in enumerate(tasks, 1):
            run.progress.client(f"client {task.client_id} ({i}/{len(tasks)})")
            results.append(
                run_fit_task(run.client_context(task.client_id), server_round, task, run.settings.on_client_error)
            )
        return results

    def evaluate(self, run: Run, server_round: int, tasks: list[EvaluateTask]) -> list[EvaluateResult]:
        """Each task's metrics, in the order given."""
        return [run_evaluate_task(run.client_context(task.client_id), server_round, task) for task in tasks]

    def teardown(self, run: Run) -> None:
        """Called once at the end of the fit (or when it stops on an error)."""


def run_fit_task(
    ctx: ClientContext, server_round: int, task: FitTask, on_client_error: str = "raise"
) -> ClientTurn | str:
    """``task``'s turn in this process; with ``on_client_error="skip"``, a description of what it raised instead."""
    if on_client_error == "raise":
        return train_client(ctx, server_round, task.received, task.received_extras)
    try:
        return train_client(ctx, server_round, task.received, task.received_extras)
    except Exception as err:  # noqa: BLE001  (skip means: any failure of one client's turn)
        detail = f"{type(err).__name__}: {err}"
        warnings.warn(
            f"Round {server_round}: client {task.client_id!r} raised {detail}; it is left out of this "
            "round (federation.on_client_error=skip).",
            stacklevel=2,
        )
        return detail


def run_evaluate_task(ctx: ClientContext, server_round: int, task: EvaluateTask) -> EvaluateResult:
    """``task``'s evaluation in this process (the personalized model, fine-tuned first when the task says so, then
    the global one if given)."""
    images: dict[str, torch.Tensor] | None = {} if task.images else None
    predictions: dict[str, Any] = {}
    metrics, download = evaluate_client(
        ctx,
        server_round,
        task.splits,
        task.received,
        personalized=True,
        images=images,
        finetune_steps=task.finetune_steps,
        pooled=task.pooled,
        predictions=predictions,
    )
    steps = task.finetune_steps if metrics else 0
    if task.global_state is not None:
        global_predictions: dict[str, Any] = {}
        global_metrics, received = evaluate_client(
            ctx, server_round, task.splits, task.global_state, pooled=task.pooled, predictions=global_predictions
        )
        download += received
        metrics.update({f"{GLOBAL}/{s}": v for s, v in global_metrics.items()})
        predictions.update({f"{GLOBAL}/{s}": v for s, v in global_predictions.items()})
    return EvaluateResult(metrics, download, (images or {}).get(task.client_id), steps, predictions)
