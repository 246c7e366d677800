"""Where the clients' work runs: the seam between the server's round and the clients' turns.

A round (:mod:`fedlit.engine.rounds`) and an evaluation (:mod:`fedlit.engine.evaluate`) never train or evaluate a
client themselves: they hand the round's clients to ``fed.executor`` and get, in the order they gave, each client's
:class:`~fedlit.engine.client.ClientTurn` (or what it raised) and each client's metrics. What the server sends a client
(:meth:`~fedlit.strategies.base.Strategy.configure_client`, ``configure_client_extras``, ``configure_evaluate``,
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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from fedlit.engine import client as local

if TYPE_CHECKING:
    from fedlit.federation import Federation


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
    """

    client_id: str
    received: dict[str, Tensor]
    global_state: dict[str, Tensor] | None = None
    splits: tuple[str, ...] = ("val", "test")
    images: bool = False


@dataclass
class EvaluateResult:
    """What one client's evaluation gives back.

    Attributes:
        metrics: Per split (``val``, ``test``, and ``global/val``, ``global/test`` for the global model), the
            metrics by name; a split the client lacks is absent.
        download_bytes: Bytes of what it received for the evaluation (0 when it has none of the splits).
        image: The validation picture, when asked for and the module draws one.
    """

    metrics: dict[str, dict[str, float]]
    download_bytes: int = 0
    image: Tensor | None = None


class LocalExecutor:
    """Every client in this process, in turn, on the one live module (the default executor)."""

    def setup(self, fed: Federation) -> None:
        """Called once the federation is set up (its module, store and strategy ready)."""

    def fit(self, fed: Federation, server_round: int, tasks: list[FitTask]) -> list[local.ClientTurn | str]:
        """Each task's turn, in the order given: a :class:`~fedlit.engine.client.ClientTurn`, or, with
        ``federation.on_client_error=skip``, a description of what the turn raised."""
        results: list[local.ClientTurn | str] = []
        for i, task in enumerate(tasks, 1):
            fed._bar_client = f"client {task.client_id} ({i}/{len(tasks)})"
            if fed._bar is not None:
                fed._bar.set_postfix_str(fed._bar_client, refresh=False)
            results.append(run_fit_task(fed, server_round, task))
        return results

    def evaluate(self, fed: Federation, server_round: int, tasks: list[EvaluateTask]) -> list[EvaluateResult]:
        """Each task's metrics, in the order given."""
        return [run_evaluate_task(fed, server_round, task) for task in tasks]

    def teardown(self, fed: Federation) -> None:
        """Called once at the end of the fit (or when it stops on an error)."""


def run_fit_task(fed: Federation, server_round: int, task: FitTask) -> local.ClientTurn | str:
    """``task``'s turn in this process; with ``on_client_error="skip"``, a description of what it raised instead."""
    if fed.on_client_error == "raise":
        return local.train_client(fed, server_round, task.client_id, task.received, task.received_extras)
    try:
        return local.train_client(fed, server_round, task.client_id, task.received, task.received_extras)
    except Exception as err:  # noqa: BLE001  (skip means: any failure of one client's turn)
        detail = f"{type(err).__name__}: {err}"
        warnings.warn(f"Round {server_round}: client {task.client_id!r} raised {detail}; it is left out of this "
                      "round (federation.on_client_error=skip).", stacklevel=2)
        return detail


def run_evaluate_task(fed: Federation, server_round: int, task: EvaluateTask) -> EvaluateResult:
    """``task``'s evaluation in this process (the personalized model, then the global one if given)."""
    from fedlit.engine.evaluate import GLOBAL, evaluate_client

    images: dict[str, torch.Tensor] | None = {} if task.images else None
    metrics, download = evaluate_client(fed, server_round, task.client_id, task.splits, images=images,
                                        received=task.received, personalized=True)
    if task.global_state is not None:
        global_metrics, received = evaluate_client(fed, server_round, task.client_id, task.splits,
                                                   received=task.global_state)
        download += received
        metrics.update({f"{GLOBAL}/{s}": v for s, v in global_metrics.items()})
    return EvaluateResult(metrics, download, (images or {}).get(task.client_id))


def fit_tasks(fed: Federation, server_round: int, client_ids: list[str]) -> list[FitTask]:
    """What the strategy sends each of ``client_ids`` for its turn."""
    return [FitTask(c, fed.strategy.configure_client(server_round, c),
                    fed.strategy.configure_client_extras(server_round, c)) for c in client_ids]


def evaluate_tasks(fed: Federation, server_round: int, client_ids: list[str], splits: tuple[str, ...],
                   images: bool = False, with_global: bool = True) -> list[EvaluateTask]:
    """What the strategy sends each of ``client_ids`` to evaluate (and its global model, when it has one)."""
    return [EvaluateTask(c, fed.strategy.configure_evaluate(server_round, c),
                         fed.strategy.global_model_state(c) if with_global else None, splits, images)
            for c in client_ids]

