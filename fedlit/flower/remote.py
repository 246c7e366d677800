"""The server's view of the nodes in a Flower deployment: how it reaches them, and what it knows of their data.

- :class:`Transport`: how the server sends messages to the nodes and gets their replies; :class:`GridTransport`
  over Flower's :class:`~flwr.serverapp.Grid` (an in-process stand-in for tests:
  :class:`~fedlit.flower.inprocess.InProcessTransport`).
- :class:`RemoteData`: the server's data module, which holds no data: before round 1 it sends a ``query`` message
  to every node and keeps what each answers about its client (id, split sizes, class counts, manifest entry,
  task), waiting for the expected nodes up to ``connect-timeout`` seconds. With the operator's node registry
  (:mod:`fedlit.flower.registry`) it refuses a node whose key is not registered for the client it claims, or whose
  train size is not the registry's; without one it warns once that the clients' ids are self-declared.

The ServerApp and the executor that sends the clients' turns through a transport are in :mod:`fedlit.flower.server`
(which re-exports these names); the node's side of the ``query`` is
:class:`~fedlit.flower.node_data.OwnClientData`.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any, Protocol

from flwr.app import Error, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid

from fedlit.core.errors import ConfigError, DataError
from fedlit.core.names import check_client_ids
from fedlit.flower.registry import NodeRegistry


class Transport(Protocol):
    """How the server reaches the nodes (Flower's Grid, or an in-process stand-in for tests)."""

    def node_ids(self) -> list[int]:
        """The nodes connected now."""

    def node_keys(self) -> dict[int, bytes]:
        """The public key the SuperLink holds for each node connected now (read only with a node registry)."""

    def exchange(
        self, messages: list[tuple[int, str, RecordDict]], group: str, timeout: float | None
    ) -> list[RecordDict | str]:
        """Send each ``(node, message type, content)`` and return each reply's content in the same order, or a
        description of why there is none (the node failed, or did not answer within ``timeout`` seconds)."""


class GridTransport:
    """:class:`Transport` over a Flower :class:`~flwr.serverapp.Grid`.

    Args:
        grid: The ServerApp's grid.
    """

    def __init__(self, grid: Grid) -> None:
        self.grid = grid

    def node_ids(self) -> list[int]:
        """The nodes connected to the SuperLink."""
        return list(self.grid.get_node_ids())

    def node_keys(self) -> dict[int, bytes]:
        """Each connected node's public key as the SuperLink holds it (flwr 1.41's ``NodeInfo.public_key``: with
        ``--enable-supernode-auth``, the key registered for that node id, which signs its every request)."""
        return {int(n.node_id): bytes(getattr(n, "public_key", b"")) for n in self.grid.get_nodes()}

    def exchange(
        self, messages: list[tuple[int, str, RecordDict]], group: str, timeout: float | None
    ) -> list[RecordDict | str]:
        """One message per node; each reply matched to the message it answers (:func:`replies_by_node`), a failure
        described with Flower's error code and reason and the seconds the exchange took."""
        sent = [Message(content, node, message_type, group_id=group) for node, message_type, content in messages]
        start = time.monotonic()
        replies = replies_by_node(sent, self.grid.send_and_receive(sent, timeout=timeout))
        elapsed = time.monotonic() - start
        out: list[RecordDict | str] = []
        for node, _, _ in messages:
            reply = replies.get(node)
            if reply is None:
                out.append(
                    f"no reply from node {node} after {elapsed:.0f} s (client timeout {timeout} s: timed out, "
                    "or the node is gone)"
                )
            elif reply.has_error():
                out.append(f"node {node} failed after {elapsed:.0f} s: {describe_error(reply.error)}")
            else:
                out.append(reply.content)
        return out


def replies_by_node(sent: list[Message], replies: Iterable[Message]) -> dict[int, Message]:
    """Each reply under the node its message was sent to, matched by the id of the message it answers (the grid
    sets ``message_id`` when it pushes a message): an error reply the SuperLink writes for a node that is gone
    carries the SuperLink as its sender, not the node."""
    nodes = {m.metadata.message_id: m.metadata.dst_node_id for m in sent if m.metadata.message_id}
    out: dict[int, Message] = {}
    for reply in replies:
        node = nodes.get(reply.metadata.reply_to_message_id)
        if node is not None:
            out.setdefault(node, reply)
    return out


def describe_error(error: Error) -> str:
    """Flower's error as one line: its code's name and number, and its reason."""
    names = {v: k for k, v in vars(ErrorCode).items() if not k.startswith("_") and isinstance(v, int)}
    reason = (error.reason or "no reason given").strip()
    return f"Flower error {names.get(error.code, 'UNKNOWN')} (code {error.code}): {reason}"


class RemoteData:
    """What the server knows of the clients' data: the nodes' answers to the ``query`` message.

    Args:
        recipe_data: The recipe's data section (:class:`~fedlit.config.build.DataSection`: its options, never
            built), or a data module that is never set up; only ``expected_num_clients()`` is read.
        transport: How to reach the nodes.
        client_ids: The expected clients, in the run's order; empty: any ``num_clients`` clients, ordered as the
            data set orders them.
        num_clients: The expected number of clients when ``client_ids`` is empty (0: the recipe's data section).
        connect_timeout: Seconds to wait for the nodes.
        registry: The operator's node registry (:mod:`fedlit.flower.registry`); None: the nodes' client ids are
            taken as they declare them (warned once).
    """

    def __init__(
        self,
        recipe_data: Any,
        transport: Transport,
        *,
        client_ids: list[str] | None = None,
        num_clients: int = 0,
        connect_timeout: float = 600.0,
        registry: NodeRegistry | None = None,
    ) -> None:
        self.recipe_data, self.transport = recipe_data, transport
        self.expected_ids = list(client_ids or [])
        self.expected = len(self.expected_ids) or num_clients or recipe_data.expected_num_clients()
        if not self.expected:
            name = getattr(recipe_data, "name", type(recipe_data).__name__)
            raise ConfigError(
                f"{name} cannot tell its number of clients from its options (the server builds no "
                "data): give the run config client-ids (comma-separated) or num-clients."
            )
        self.connect_timeout, self.registry = connect_timeout, registry
        self.nodes: dict[str, int] = {}
        self.info: dict[str, dict[str, Any]] = {}

    def setup(self) -> None:
        """Wait for the nodes, ask each one about its client (only the first call does work)."""
        if self.info:
            return
        deadline = time.monotonic() + self.connect_timeout
        answers: dict[int, dict[str, Any]] = {}
        problems: dict[int, str] = {}
        refused: set[int] = set()  # by the registry: not asked again
        if self.registry is None:
            warnings.warn(
                "No node registry (run config node-registry): the SuperNodes' client ids are self-declared, so a "
                "node the SuperLink accepts may claim any client. See docs/deployment.md, 'Identities'.",
                stacklevel=2,
            )
        while True:
            new = [n for n in self.transport.node_ids() if n not in answers and n not in refused]
            if new:
                replies = self.transport.exchange(
                    [(n, "query", RecordDict()) for n in new], "query", max(1.0, deadline - time.monotonic())
                )
                for node, reply in zip(new, replies, strict=True):
                    if isinstance(reply, str) or "error" in reply.config_records:
                        problems[node] = reply if isinstance(reply, str) else str(reply["error"]["detail"])
                    else:
                        answer = dict(reply.config_records["query"])
                        why = self._refused(node, answer)
                        if why is None:
                            answers[node] = answer
                            problems.pop(node, None)
                        else:
                            problems[node] = why
                            refused.add(node)
                            warnings.warn(f"Refused: {why}.", stacklevel=2)
            found = {str(a["client-id"]) for a in answers.values()}
            done = set(self.expected_ids) <= found if self.expected_ids else len(found) >= self.expected
            if done or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        self._keep(answers, problems, done)

    def _refused(self, node: int, answer: dict[str, Any]) -> str | None:
        """Why the registry refuses the node's answer to the ``query`` (None: no registry, or a registered node)."""
        if self.registry is None:
            return None
        try:
            claimed, size = str(answer["client-id"]), int(json.loads(str(answer["num-examples"]))["train"])
        except (KeyError, TypeError, ValueError) as err:
            return f"node {node} answered the query without a readable client id and train size ({err!r})"
        return self.registry.check(node, self.transport.node_keys().get(node), claimed, size)

    def _keep(self, answers: dict[int, dict[str, Any]], problems: dict[int, str], done: bool) -> None:
        by_client: dict[str, list[int]] = {}
        for node, answer in answers.items():
            by_client.setdefault(str(answer["client-id"]), []).append(node)
        check_client_ids(by_client, "--node-config client-id of the SuperNodes")
        twice = {c: n for c, n in by_client.items() if len(n) > 1}
        if twice:
            raise ConfigError(
                f"Several SuperNodes hold the same client: {twice}. Give each node its own --node-config client-id."
            )
        if not done:
            missing = (
                [c for c in self.expected_ids if c not in by_client]
                if self.expected_ids
                else f"{self.expected - len(by_client)} more"
            )
            failed = "".join(f"; node {n}: {p}" for n, p in problems.items())
            raise DataError(
                f"After {self.connect_timeout:g} s (run config connect-timeout) {len(by_client)} of "
                f"{self.expected} clients answered: {sorted(by_client)}; missing: {missing}{failed}. "
                "Start a SuperNode for each missing client (--node-config \"client-id='...'\")."
            )
        order = self.expected_ids or sorted(by_client, key=lambda c: (int(answers[by_client[c][0]]["position"]), c))
        if not self.expected_ids and len(order) > self.expected:
            warnings.warn(
                f"{len(order)} nodes answered, {self.expected} expected: the federation has them all ({order}).",
                stacklevel=2,
            )
        self.nodes = {c: by_client[c][0] for c in order}
        self.info = {c: answers[self.nodes[c]] for c in order}

    # ------------------------------------------------------------------------------- the data module's answers
    def _first(self) -> dict[str, Any]:
        if not self.info:
            self.setup()
        return next(iter(self.info.values()))

    @property
    def task(self) -> str:
        """The data set's task (as the nodes report it)."""
        return str(self._first()["task"])

    @property
    def num_classes(self) -> int:
        """The data set's number of classes."""
        return int(self._first()["num-classes"])

    @property
    def client_ids(self) -> list[str]:
        """Every client, in the run's order."""
        self._first()
        return list(self.info)

    @property
    def evaluation_only(self) -> frozenset[str]:
        """Clients whose node says they never train."""
        return frozenset(c for c, i in self.info.items() if not i["trains"])

    @property
    def train_client_ids(self) -> list[str]:
        """The clients that train."""
        return [c for c in self.client_ids if c not in self.evaluation_only]

    def expected_num_clients(self) -> int:
        """The number of clients the server waits for."""
        return self.expected

    def num_examples(self, client_id: str, split: str) -> int:
        """Samples of ``client_id`` in ``split``, as its node reported."""
        self._first()
        return int(json.loads(str(self.info[client_id]["num-examples"]))[split])

    def class_counts(self) -> dict[str, dict[str, list[int]]] | None:
        """Each client's samples per class and split, as its node reported (None for a task without classes)."""
        counts = {c: json.loads(str(i["class-counts"])) for c, i in self.info.items()}
        return None if any(v is None for v in counts.values()) else counts

    def manifest(self) -> dict[str, Any]:
        """The data set's manifest: the first node's description, each client's entry from its own node."""
        manifest = dict(json.loads(str(self._first()["manifest"])))
        manifest["clients"] = {c: json.loads(str(i["manifest"]))["clients"][c] for c, i in self.info.items()}
        return manifest

    @property
    def data(self) -> Any:
        """The manifest's description (``name``, ``partitioner``...), as the run's hyperparameters read it."""
        manifest = self.manifest()
        return SimpleNamespace(
            name=manifest.get("dataset"),
            partitioner=manifest.get("partitioner"),
            task=self.task,
            num_classes=self.num_classes,
        )

    def _no_data(self, *args: Any) -> Any:
        raise DataError(
            "The server of a Flower deployment holds no client data: this needs a client's samples on "
            "the server (federation.unseen_clients, or a callback or strategy hook that reads data on "
            "the server)."
        )

    train_dataloader = val_dataloader = test_dataloader = _no_data
