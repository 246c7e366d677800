"""The context of one client's turn (:class:`ClientContext`): what the turn needs, and nothing of the server.

:func:`~fedlit.engine.loop.client.train_client` and the evaluation of :mod:`~fedlit.engine.loop.evaluate` take one;
the simulation builds one per turn from its run (:meth:`~fedlit.engine.loop.run.Run.client_context`), a Flower node
builds its own from the recipe. It implements the public :class:`fedlit.core.contexts.ClientContext`, which hooks
of a turn receive as ``client`` and as ``trainer``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from lightning.fabric import Fabric
from typing_extensions import override

from fedlit.core import contexts
from fedlit.core.seeding import derive_seed
from fedlit.core.store import ClientStore
from fedlit.engine.loop import optim
from fedlit.engine.loop.hooks import Hooks
from fedlit.engine.loop.protocols import DataSource
from fedlit.engine.loop.settings import LocalSettings
from fedlit.module import FederatedModule
from fedlit.strategies.base import Strategy


@dataclass
class ClientContext(contexts.ClientContext):
    """What one client's turn needs: the engine's :class:`fedlit.core.contexts.ClientContext`, which hooks of the
    turn receive as ``client`` and as ``trainer``.

    Attributes:
        client_id: The client.
        module: The live module (shared by every client of this process).
        fabric: The run's Fabric (device, precision, backward).
        data: The data; the turn reads ``client_id``'s splits only.
        store: The client store; the turn reads and writes ``client_id``'s entry only.
        strategy: The strategy (its client-side methods: ``client_forward``, ``training_loss``).
        hooks: The callbacks' hooks.
        seed: The run's seed, from which every random stream of the turn is derived.
        local: Local epochs or steps, the optimizer state's fate, the time limit.
        rounds: The run's number of rounds (a client-side schedule may read it).
        lr_schedule: The learning rate of this round (a schedule of interval ``round``), or None.
        progress: Called as ``progress(steps, mean loss)`` after each step (a progress bar), or None.
        warned: What the run has already warned about (each such warning once per run).
    """

    client_id: str
    module: FederatedModule
    fabric: Fabric
    data: DataSource
    store: ClientStore
    strategy: Strategy
    hooks: Hooks
    seed: int
    local: LocalSettings
    rounds: int
    lr_schedule: optim.RoundSchedule | None = None
    progress: Callable[[int, float], None] | None = field(default=None, repr=False)
    warned: set[str] = field(default_factory=set, repr=False)

    @override
    def derive_seed(self, *parts: object) -> int:
        """The seed of one random stream of the run (``"train"``, round, client...)."""
        return derive_seed(self.seed, *parts)

    @override
    def train_dataloader(self, *stream: object, generator: torch.Generator | None = None) -> Any:
        """The client's training batches, shuffled by the run's random stream ``stream`` (or by ``generator``)."""
        if generator is None:
            generator = torch.Generator().manual_seed(self.derive_seed(*stream))
        return self.data.train_dataloader(self.client_id, generator)

    @override
    def eval_dataloader(self, split: str) -> Any:
        """The client's ``val`` or ``test`` batches, or None when it lacks the split."""
        if split == "val":
            return self.data.val_dataloader(self.client_id)
        return self.data.test_dataloader(self.client_id)

    @override
    def num_examples(self, split: str) -> int:
        """The client's samples in ``split``."""
        return self.data.num_examples(self.client_id, split)

    @override
    def class_counts(self) -> dict[str, list[int]] | None:
        """The client's samples per class in each split; None for a task without classes."""
        counts = self.data.class_counts()
        return None if counts is None else counts[self.client_id]

    @override
    @property
    def batch_size(self) -> int:
        """The batch size of the client's training loader (the data's ``batch_size``)."""
        return int(self.data.batch_size)  # type: ignore[attr-defined]  # every data module has one, not DataSource

    @override
    @property
    def scaler(self) -> Any:
        """The gradient scaler of 16-bit mixed precision when it is enabled, else None."""
        scaler = getattr(self.fabric.strategy.precision, "scaler", None)
        return scaler if scaler is not None and scaler.is_enabled() else None

    @override
    def prepare_batch(self, batch: Any) -> Any:
        """``batch`` on the run's device, in its precision (what ``training_step`` receives)."""
        return self.fabric.strategy.precision.convert_input(self.fabric.to_device(batch))

    @override
    def autocast(self) -> Any:
        """The context of the run's precision for a forward pass."""
        return self.fabric.autocast()

    @override
    def convert_output(self, output: Any) -> Any:
        """A step's output converted back from the run's precision."""
        return self.fabric.strategy.precision.convert_output(output)

    def hook_args(self) -> dict[str, Any]:
        """The arguments every hook of the turn gets."""
        return {"trainer": self, "pl_module": self.module, "client": self}
