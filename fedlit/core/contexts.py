"""What hooks receive besides the module: a client's turn (:class:`ClientContext`) and a read-only view of the run
(:class:`ServerContext`).

Hooks are called with Lightning's keyword names. A hook of a client's turn or evaluation (``on_client_fit_start``,
``on_before_optimizer_step``, ``on_client_fit_end``, ``on_client_evaluate_start``...) gets the turn's
:class:`ClientContext` as ``client`` and as ``trainer``: the same object in a simulation, on the ranks of a
multi-device run and on a Flower node. A server-side hook (``on_fit_start``, ``on_round_start``,
``on_before_aggregate``, ``on_after_aggregate``, ``on_round_end``, ``on_fit_end``) and a callback's
``results_json`` get a :class:`ServerContext` as ``trainer``: the round, the clients, the settings, the evaluation
history and the round's log, all read-only, and :meth:`ServerContext.request_stop` to end the run after the round.
Neither exposes the engine's run: a hook that needs more asks for a hook argument.

The engine implements both (:class:`fedlit.engine.loop.client_context.ClientContext` subclasses :class:`ClientContext`;
:meth:`fedlit.engine.loop.run.Run.server_context` builds a :class:`ServerContext` over the run).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from types import MappingProxyType
from typing import Any, Protocol, TypeAlias, runtime_checkable

import torch
from lightning.pytorch import Callback
from torch import Tensor
from typing_extensions import override

from fedlit.core.store import ClientStore

__all__ = [
    "Batch",
    "ClientContext",
    "EvaluationView",
    "LocalView",
    "RunView",
    "ServerContext",
    "SettingsView",
    "StepOutput",
]

#: A batch as a client's data loader yields it (a tensor, or a tuple, list or mapping of tensors, per task). Hooks
#: pass it on (to ``training_step``, :meth:`ClientContext.prepare_batch`) without reading inside it, so its type
#: says nothing more than ``object``.
Batch: TypeAlias = object

#: What ``training_step`` returns: the loss, or a mapping with ``loss`` (and, for fedlit's tasks, ``logits`` and
#: ``targets``), as Lightning's ``STEP_OUTPUT``; None where a caller has no output to give.
StepOutput: TypeAlias = "Tensor | Mapping[str, Any] | None"


class LocalView(Protocol):
    """The local-training settings a client's turn runs with (``federation.local_epochs`` ...), read-only."""

    @property
    def local_epochs(self) -> int:
        """Local epochs per turn (when ``local_steps`` is None)."""

    @property
    def local_steps(self) -> int | None:
        """Local optimizer steps per turn, or None to count epochs."""

    @property
    def optimizer_state(self) -> str:
        """``reset`` (a fresh optimizer state every turn) or ``persist`` (kept in the client's store entry)."""

    @property
    def client_timeout(self) -> float | None:
        """Seconds a turn may take, or None."""


@runtime_checkable
class ClientContext(Protocol):
    """What one client's turn or evaluation sees, in the process where the client's data and store entry are.

    Attributes:
        client_id: The client.
        store: The client store; a hook reads and writes ``client_id``'s entry only (``store.device`` is where
            per-client state is kept).
        seed: The run's seed, from which every random stream of the turn is derived (:meth:`derive_seed`).
        local: The local-training settings.
        rounds: The run's number of rounds (a client-side schedule may read it).
    """

    client_id: str
    store: ClientStore
    seed: int
    local: LocalView
    rounds: int

    def derive_seed(self, *parts: object) -> int:
        """The seed of one random stream of the run (``"train"``, round, client...)."""
        ...

    def train_dataloader(self, *stream: object, generator: torch.Generator | None = None) -> Iterable[Batch]:
        """The client's training batches, shuffled by the run's random stream ``stream`` (or by ``generator``)."""
        ...

    def eval_dataloader(self, split: str) -> Iterable[Batch] | None:
        """The client's ``val`` or ``test`` batches, or None when it lacks the split."""
        ...

    def num_examples(self, split: str) -> int:
        """The client's samples in ``split``."""
        ...

    def class_counts(self) -> dict[str, list[int]] | None:
        """The client's samples per class in each split (``train``, ``val``, ``test``); None for a task without
        classes."""
        ...

    @property
    def batch_size(self) -> int:
        """The batch size of the client's training loader."""
        ...

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        """The gradient scaler of 16-bit mixed precision when it is enabled, else None."""
        ...

    def prepare_batch(self, batch: Batch) -> Batch:
        """``batch`` on the run's device, in its precision (what ``training_step`` receives)."""
        ...

    def autocast(self) -> AbstractContextManager[object]:
        """The context of the run's precision for a forward pass."""
        ...

    def convert_output(self, output: StepOutput) -> StepOutput:
        """A step's output converted back from the run's precision."""
        ...


class EvaluationView(Protocol):
    """The evaluation history of a run, as hooks read it."""

    @property
    def selection_metric(self) -> str:
        """The metric whose mean validation value picks the best round."""

    @property
    def higher_is_better(self) -> Mapping[str, bool]:
        """Direction per metric."""

    @property
    def rounds(self) -> Mapping[int, Mapping[str, Mapping[str, Mapping[str, float]]]]:
        """Per evaluated round, per split (``val``, ``test``, ``global/val``...), per client, the metrics."""

    @property
    def last_round(self) -> int | None:
        """The last evaluated round."""

    def best_round(self) -> int | None:
        """The round with the best mean validation ``selection_metric``; None without validation values."""


class RunView(Protocol):
    """What a :class:`ServerContext` reads of a run (the engine's :class:`~fedlit.engine.loop.run.Run`)."""

    should_stop: bool
    stop_reason: str | None

    @property
    def server_round(self) -> int:
        """The current round."""

    @property
    def settings(self) -> object:
        """The run's settings (a dataclass)."""

    @property
    def strategy(self) -> Callback:
        """The strategy."""

    @property
    def history(self) -> EvaluationView:
        """The evaluation history."""

    @property
    def client_ids(self) -> list[str]:
        """Every client."""

    @property
    def train_client_ids(self) -> list[str]:
        """The clients that train."""

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        """The gradient scaler of 16-bit mixed precision, or None."""

    def num_selected(self) -> int:
        """How many clients a round selects."""

    def num_examples(self, client_id: str, split: str) -> int:
        """Samples of ``client_id``'s ``split``."""

    def derive_seed(self, *parts: Any) -> int:
        """The seed of one random stream of the run."""


class SettingsView:
    """The run's settings (``federation.*``: a :class:`~fedlit.engine.loop.settings.Settings`), read by attribute
    and never set: ``trainer.settings.rounds``.

    Args:
        settings: The settings it shows.
    """

    __slots__ = ("_settings",)
    _settings: object

    def __init__(self, settings: object) -> None:
        object.__setattr__(self, "_settings", settings)

    def __getattr__(self, name: str) -> Any:
        # Any: each setting has its own type (int, float, a Literal, a list...), declared on Settings.
        return getattr(object.__getattribute__(self, "_settings"), name)

    @override
    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(
            f"The run's settings are read-only in a hook: cannot set {name!r} (set "
            f"federation.{name} in the recipe instead)"
        )

    @override
    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"The run's settings are read-only in a hook: cannot delete {name!r}")

    @override
    def __repr__(self) -> str:
        return f"SettingsView({object.__getattribute__(self, '_settings')!r})"


class ServerContext:
    """A read-only view of a run for server-side hooks (see the module docstring): nothing of it can be set; a hook
    changes the run only through :meth:`request_stop` and the hook arguments made to be changed (``updates``,
    ``log``).

    Args:
        run: The run it shows.
        log: The scalars logged for the current round so far (empty outside a round).
    """

    __slots__ = ("_log", "_run")
    _run: RunView
    _log: Mapping[str, float]

    def __init__(self, run: RunView, log: dict[str, float] | None = None) -> None:
        object.__setattr__(self, "_run", run)
        object.__setattr__(self, "_log", MappingProxyType({} if log is None else log))

    @override
    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(
            f"ServerContext is read-only: cannot set {name!r} (a hook ends the run with "
            "trainer.request_stop(reason); it changes nothing else of the run)"
        )

    @override
    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"ServerContext is read-only: cannot delete {name!r}")

    @override
    def __repr__(self) -> str:
        return f"ServerContext(server_round={self.server_round})"

    @property
    def server_round(self) -> int:
        """The current round (from 1; 0 before the first, and in ``on_fit_start`` of a fresh run; a resumed run's
        last round there)."""
        return self._run.server_round

    @property
    def settings(self) -> SettingsView:
        """The run's settings (``trainer.settings.rounds``, ``.seed``, ``.clients_per_round``...), read-only."""
        return SettingsView(self._run.settings)

    @property
    def strategy(self) -> Callback:
        """The run's strategy (the first callback)."""
        return self._run.strategy

    @property
    def history(self) -> EvaluationView:
        """The evaluation history: each evaluated round's per-client metrics, and the selection metric."""
        return self._run.history

    @property
    def log(self) -> Mapping[str, float]:
        """The scalars logged for the current round so far, read-only (``on_after_aggregate`` gets the round's log
        to add to as its ``log`` argument)."""
        return self._log

    @property
    def client_ids(self) -> list[str]:
        """Every client of the federation (the unseen ones included)."""
        return list(self._run.client_ids)

    @property
    def train_client_ids(self) -> list[str]:
        """The clients that train (rounds select among them)."""
        return list(self._run.train_client_ids)

    def num_selected(self) -> int:
        """How many clients a round selects (``federation.clients_per_round`` of the clients that train)."""
        return self._run.num_selected()

    def num_examples(self, client_id: str, split: str) -> int:
        """Samples of ``client_id``'s ``split``."""
        return self._run.num_examples(client_id, split)

    def derive_seed(self, *parts: object) -> int:
        """The seed of one random stream of the run (``"dp-noise"``, round...)."""
        return self._run.derive_seed(*parts)

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        """The gradient scaler of 16-bit mixed precision when the run uses one, else None."""
        return self._run.scaler

    @property
    def should_stop(self) -> bool:
        """Whether a hook asked to end the run after the current round."""
        return self._run.should_stop

    @property
    def stop_reason(self) -> str | None:
        """Why, as the hook that asked said (None until then)."""
        return self._run.stop_reason

    def request_stop(self, reason: str) -> None:
        """End the run after the current round (evaluated, checkpointed and reported as ``stopped_early`` with
        ``reason``); the first request's reason is kept."""
        if not self._run.should_stop:
            self._run.stop_reason = reason
        self._run.should_stop = True
