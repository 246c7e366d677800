"""The data a federation sees, as a Protocol (the other seam, where the clients' turns run, is
:class:`fedlit.engine.loop.run.Executor`).

:class:`DataSource` is what the loop reads of the data: implemented by every
:class:`~fedlit.data.FederatedDataModule` (the simulation), by the Flower server's view of its nodes
(:class:`fedlit.flower.remote.RemoteData`: sizes and counts only, no loader) and by a node's own client
(:class:`fedlit.flower.node_data.OwnClientData`).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class DataSource(Protocol):
    """The data of a federation, as the loop reads it."""

    @property
    def client_ids(self) -> list[str]:
        """Every client (evaluation-only ones included)."""

    @property
    def train_client_ids(self) -> list[str]:
        """The clients that may train (all but the evaluation-only ones)."""

    def setup(self) -> None:
        """Read, partition and split the data (idempotent)."""

    def num_examples(self, client_id: str, split: str) -> int:
        """Samples of ``client_id``'s ``split`` (0 when it has none)."""

    def class_counts(self) -> dict[str, dict[str, list[int]]] | None:
        """Per client and split, the samples per class (None for a task without classes)."""

    def manifest(self) -> dict[str, Any]:
        """Which client holds which sample, and how the data was split."""

    def train_dataloader(self, client_id: str, generator: torch.Generator) -> Any:
        """``client_id``'s training batches, shuffled by ``generator``."""

    def val_dataloader(self, client_id: str) -> Any:
        """``client_id``'s validation batches, or None without a validation split."""

    def test_dataloader(self, client_id: str) -> Any:
        """``client_id``'s test batches, or None without a test split."""
