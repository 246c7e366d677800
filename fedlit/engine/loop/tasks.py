"""What the server sends for a client's turn and evaluation, and what an evaluation gives back.

The strategy decides on the server what each client receives (:meth:`~fedlit.strategies.base.Strategy.
configure_client`, ``configure_client_extras``, ``configure_evaluate``, ``global_model_state``) before an executor
runs the tasks, so every executor gives the strategy the same inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from fedlit.strategies.base import Strategy


@dataclass
class FitTask:
    """One client's turn as the server configures it.

    Attributes:
        client_id: The client.
        received: The shared tensors the strategy sends it (``configure_client``).
        received_extras: What else the strategy sends it (``configure_client_extras``).
    """

    client_id: str
    received: dict[str, Tensor]
    received_extras: dict[str, Any] = field(default_factory=dict)


@dataclass
class EvaluateTask:
    """One client's evaluation as the server configures it.

    Attributes:
        client_id: The client.
        received: What it evaluates with on top of its personal tensors (``configure_evaluate``).
        global_state: The strategy's global model for it (``global_model_state``), evaluated beside, or None.
        splits: The splits to evaluate (those it lacks are skipped).
        images: Return the module's ``validation_images()`` after the validation split.
        finetune_steps: Local steps it takes from ``received`` before evaluating it (the strategy's
            ``eval_finetune_steps``: FedAvg-FT); the global model is evaluated without.
        pooled: The splits whose predictions come back for the metrics pooled over clients (the module's
            ``pooled_predictions()``; ``federation.pooled_metrics``). A Flower node is never asked for them.
    """

    client_id: str
    received: dict[str, Tensor]
    global_state: dict[str, Tensor] | None = None
    splits: tuple[str, ...] = ("val", "test")
    images: bool = False
    finetune_steps: int = 0
    pooled: tuple[str, ...] = ()


@dataclass
class EvaluateResult:
    """What one client's evaluation gives back.

    Attributes:
        metrics: Per split (``val``, ``test``, and ``global/val``, ``global/test`` for the global model), the
            metrics by name; a split the client lacks is absent.
        download_bytes: Bytes of what it received for the evaluation (0 when it has none of the splits).
        image: The validation picture, when asked for and the module draws one.
        finetune_steps: Local steps taken before the evaluation (``EvaluateTask.finetune_steps``; 0 when the
            client had none of the splits).
        pooled: Per split of ``EvaluateTask.pooled`` it has (``global/<split>`` for the global model), the module's
            ``pooled_predictions()``; absent where the module has none.
    """

    metrics: dict[str, dict[str, float]]
    download_bytes: int = 0
    image: Tensor | None = None
    finetune_steps: int = 0
    pooled: dict[str, Any] = field(default_factory=dict)


def fit_tasks(strategy: Strategy, server_round: int, client_ids: list[str]) -> list[FitTask]:
    """What the strategy sends each of ``client_ids`` for its turn."""
    return [
        FitTask(c, strategy.configure_client(server_round, c), strategy.configure_client_extras(server_round, c))
        for c in client_ids
    ]


def evaluate_tasks(
    strategy: Strategy,
    server_round: int,
    client_ids: list[str],
    splits: tuple[str, ...],
    images: bool = False,
    with_global: bool = True,
    pooled: tuple[str, ...] = (),
) -> list[EvaluateTask]:
    """What the strategy sends each of ``client_ids`` to evaluate (and its global model, when it has one);
    ``pooled``: the splits whose predictions come back for the pooled metrics."""
    return [
        EvaluateTask(
            c,
            strategy.configure_evaluate(server_round, c),
            strategy.global_model_state(c) if with_global else None,
            splits,
            images,
            strategy.eval_finetune_steps,
            pooled,
        )
        for c in client_ids
    ]
