"""A node's view of its own client's data: the recipe's data module seen through the node's one client.

On a SuperNode, :class:`~fedlit.flower.client.ClientRuntime` (:mod:`fedlit.flower.client`) constructs the recipe's
data module (with the node's ``overrides``: its own folder or file) and wraps it in :class:`OwnClientData`, which
restricts it to the node's ``client-id`` before it is set up
(:meth:`~fedlit.data.FederatedDataModule.only_site`): a site data set reads that site's files alone, built exactly
as among all the sites; one that generates every client from a seed builds them all (nothing private). The loop
sees one client; loaders, sizes and class counts of any other client are never read. The server's counterpart, which
holds no data at all, is :class:`~fedlit.flower.remote.RemoteData` (:mod:`fedlit.flower.remote`).
"""

from __future__ import annotations

from typing import Any

import torch

from fedlit.core.errors import DataError


class OwnClientData:
    """The data module of one site: the recipe's data module seen through one client.

    Args:
        datamodule: The recipe's data module (set up).
        client_id: The node's client.
    """

    def __init__(self, datamodule: Any, client_id: str) -> None:
        self.inner, self.client_id = datamodule, client_id

    def setup(self) -> None:
        """Set up the node's site only (:meth:`~fedlit.data.FederatedDataModule.only_site`) and check that the data
        holds it."""
        if getattr(self.inner, "_data", None) is None and hasattr(self.inner, "only_site"):
            self.inner.only_site(self.client_id)
        self.inner.setup()
        if self.client_id not in self.inner.client_ids:
            ids = self.inner.client_ids
            raise DataError(
                f"node config client-id={self.client_id!r} is not a client of "
                f"{type(self.inner).__name__} (its clients: {ids[:10]}{' ...' if len(ids) > 10 else ''}). "
                "Start the SuperNode with --node-config \"client-id='<one of them>'\", or give the node a "
                "data section that holds its site."
            )

    @property
    def task(self) -> str:
        """The data set's task."""
        return self.inner.task

    @property
    def num_classes(self) -> int:
        """The data set's number of classes."""
        return self.inner.num_classes

    @property
    def batch_size(self) -> int:
        """The training batch size (the inner data module's)."""
        return int(self.inner.batch_size)

    @property
    def data(self) -> Any:
        """The inner data module's built data (its other clients are never read)."""
        return self.inner.data

    @property
    def client_ids(self) -> list[str]:
        """The node's client only."""
        return [self.client_id]

    @property
    def evaluation_only(self) -> frozenset[str]:
        """The node's client if the data set marks it evaluation-only."""
        return frozenset({self.client_id}) & frozenset(getattr(self.inner, "evaluation_only", frozenset()))

    @property
    def train_client_ids(self) -> list[str]:
        """The node's client, unless it is evaluation-only."""
        return [] if self.evaluation_only else [self.client_id]

    def expected_num_clients(self) -> int:
        """One."""
        return 1

    def position(self) -> int:
        """The client's place in the data set's client order (the server orders the clients by it)."""
        if hasattr(self.inner, "client_position"):
            return int(self.inner.client_position(self.client_id))
        return list(self.inner.client_ids).index(self.client_id)

    def _own(self, client_id: str) -> str:
        if client_id != self.client_id:
            raise KeyError(f"This node holds client {self.client_id!r}, not {client_id!r}.")
        return client_id

    def num_examples(self, client_id: str, split: str) -> int:
        """Samples of the node's client in ``split``."""
        return self.inner.num_examples(self._own(client_id), split)

    def class_counts(self) -> dict[str, dict[str, list[int]]] | None:
        """The node's client's samples per class and split (None for a task without classes)."""
        counts = self.inner.class_counts()
        return None if counts is None else {self.client_id: counts[self.client_id]}

    def manifest(self) -> dict[str, Any]:
        """The data set's manifest with the node's client's entry only."""
        manifest = dict(self.inner.manifest())
        manifest["clients"] = {self.client_id: manifest["clients"][self.client_id]}
        return manifest

    def train_dataloader(self, client_id: str, generator: torch.Generator) -> Any:
        """The node's client's train loader."""
        return self.inner.train_dataloader(self._own(client_id), generator)

    def val_dataloader(self, client_id: str) -> Any:
        """The node's client's validation loader (None without a validation split)."""
        return self.inner.val_dataloader(self._own(client_id))

    def test_dataloader(self, client_id: str) -> Any:
        """The node's client's test loader."""
        return self.inner.test_dataloader(self._own(client_id))
