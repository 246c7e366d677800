"""A deployment without Flower's processes: the same server, executor, codec and client runtime, in one process.

:class:`InProcessTransport` stands for the SuperLink and the SuperNodes: every message is encoded by the server's
:class:`~fedlit.flower.server.FlowerExecutor` exactly as for Flower, handed to a :class:`~fedlit.flower.client.
ClientRuntime` built afresh for that message (as a SuperNode starts one process per message: a fresh strategy
instance, its own store holding only the client's entry, restored from the bytes the node kept), and its reply
decoded by the executor. It checks in seconds what a deployment depends on: that every tensor and extra survives
the codec, and that a strategy's client-side hooks use only what the client receives and keeps (a strategy that
reads server state on the client side gives other results than in simulation).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from flwr.app import RecordDict

from fedlit.flower.client import ClientRuntime
from fedlit.flower.remote import RemoteData
from fedlit.flower.server import FlowerExecutor
from fedlit.flower.snapshots import Snapshots

if TYPE_CHECKING:
    from fedlit.federation import Federation


class InProcessTransport:
    """Nodes in this process, one per client.

    Args:
        builders: Per client id, what builds its node's federation (the recipe's objects, not set up).
        fail: Called as ``fail(client_id, message_type, server_round)`` before a node answers; what it raises
            reaches the server as the node's failure (a crashed process), as if the node had died.
        keys: Per client id, the public key its node presents (PEM, as the SuperLink holds it); a client left out
            has none.
    """

    def __init__(
        self,
        builders: Mapping[str, Callable[[], Federation]],
        fail: Callable[[str, str, int], None] | None = None,
        keys: Mapping[str, bytes] | None = None,
    ) -> None:
        self.builders = dict(builders)
        self.clients = {node: client for node, client in enumerate(self.builders, start=101)}
        #: Each node's snapshots of its client's store entry (:class:`~fedlit.flower.snapshots.Snapshots`).
        self.tables: dict[str, dict[str, bytes]] = {c: {} for c in self.builders}
        self.fail, self.keys = fail, dict(keys or {})
        self.sent: list[tuple[str, str]] = []

    def node_ids(self) -> list[int]:
        """Every node."""
        return list(self.clients)

    def node_keys(self) -> dict[int, bytes]:
        """Each node's public key (``keys``; empty bytes for a node without one)."""
        return {node: self.keys.get(client, b"") for node, client in self.clients.items()}

    def exchange(
        self, messages: list[tuple[int, str, RecordDict]], group: str, timeout: float | None
    ) -> list[RecordDict | str]:
        """Each message answered by a fresh runtime of its node's client."""
        replies: list[RecordDict | str] = []
        for node, message_type, content in messages:
            client_id = self.clients[node]
            self.sent.append((client_id, message_type))
            if self.fail is not None:
                try:
                    self.fail(client_id, message_type, int(group.split("-")[0]) if group[0].isdigit() else 0)
                except Exception as err:  # noqa: BLE001  (a node process that died)
                    replies.append(f"node {node} failed: {type(err).__name__}: {err}")
                    continue
            runtime = ClientRuntime(self.builders[client_id], client_id, Snapshots(self.tables[client_id]))
            replies.append(runtime.handle(message_type, content))
        return replies


def deploy(
    server: Federation, transport: InProcessTransport, *, timeout: float | None = None, ckpt_path: Any = None
) -> dict[str, Any]:
    """Fit ``server`` (a federation built from the recipe, its data never set up) through ``transport``."""
    data = RemoteData(server.datamodule, transport, num_clients=len(transport.clients), connect_timeout=1.0)
    server.datamodule = data
    server.executor = FlowerExecutor(transport, data, timeout=timeout)
    return server.fit(ckpt_path=ckpt_path)
