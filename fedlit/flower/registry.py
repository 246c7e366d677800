"""The operator's node registry: which client each SuperNode key may hold, and optionally its train size.

A SuperNode names its client itself (``--node-config client-id=...``), so without a registry any node the
SuperLink accepts may claim any client: a third node started as ``client-id='hungarian'`` while the real
Hungarian node is offline trains as "hungarian" on its own data. The registry binds each key to one client.
It is a TOML file on the server, beside the SuperNodes' public keys, named by the run config's
``node-registry``::

    [[node]]
    public-key = "node_0.pub"     # an OpenSSH or PEM public key file, relative to this file
    client-id = "site_0"
    train-size = 120              # optional: the train size the node must declare

What the server checks, and what it relies on: in flwr 1.41 the ServerApp's ``grid.get_nodes()`` gives each
connected node's ``public_key``, the key the SuperLink holds for that node id. With ``--enable-supernode-auth`` a
node id exists only for a key the operator registered (``flwr supernode register``), and the SuperLink accepts a
node's request only when it is signed with that key's private key and names that node id; every message of the
run goes to the node id the server checked at the ``query``, and a reply is taken as the answer to the message
whose id it names (an id only the addressed node receives). So the server knows that the node holds the private
key of the file the registry lists, and refuses, before round 1, a node whose key
the registry does not list, or lists for another client than the one it claims (:meth:`NodeRegistry.check`,
naming both). It cannot know more: whoever holds a site's private key is that site to the server (keep the
``node_*.key`` files on their sites only), and a registry read from a file the server's user may not trust is no
binding. Without a registry the server warns once that the clients' ids are self-declared.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli  # a dependency of flwr (tomllib is Python 3.11+)
from cryptography.hazmat.primitives import serialization

from fedlit.core.errors import ConfigError


@dataclass(frozen=True)
class Registered:
    """One node of the registry: the client its key may hold, the key's file, and the train size if given."""

    client_id: str
    key_file: str
    train_size: int | None = None


def normalize_key(data: bytes) -> bytes:
    """A public key (OpenSSH or PEM) as the DER of its SubjectPublicKeyInfo, the form keys are compared in."""
    text = data.strip()
    key: Any = (
        serialization.load_pem_public_key(text)
        if text.startswith(b"-----BEGIN")
        else serialization.load_ssh_public_key(text)
    )
    return bytes(key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo))


def fingerprint(der: bytes) -> str:
    """A short name of a key for messages: ``SHA256:`` and the first 16 hex digits of its DER's hash."""
    return "SHA256:" + hashlib.sha256(der).hexdigest()[:16]


class NodeRegistry:
    """The clients the nodes' keys may hold (see the module's documentation).

    Args:
        nodes: Each key (:func:`normalize_key`) and what it is registered for.
        source: Where the registry was read (for messages).
    """

    def __init__(self, nodes: Mapping[bytes, Registered], source: str = "the node registry") -> None:
        self.nodes, self.source = dict(nodes), source

    @classmethod
    def load(cls, path: str | Path) -> NodeRegistry:
        """Read the registry file ``path``; every problem (a missing key file, a key or client listed twice, a bad
        entry) in one :class:`~fedlit.core.errors.ConfigError` naming the file."""
        path = Path(path)
        where = f"node-registry {path}"
        try:
            entries = tomli.loads(path.read_text()).get("node", [])
        except (OSError, tomli.TOMLDecodeError) as err:
            raise ConfigError(f"{where}: cannot read it ({err}); see docs/deployment.md for its format.") from None
        problems: list[str] = []
        nodes: dict[bytes, Registered] = {}
        clients: dict[str, str] = {}
        for i, entry in enumerate(entries if isinstance(entries, list) else []):
            key_file, client = entry.get("public-key"), entry.get("client-id")
            size = entry.get("train-size")
            if not isinstance(key_file, str) or not isinstance(client, str) or not client:
                problems.append(f"node {i + 1} needs public-key and client-id strings, got {entry}")
                continue
            if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
                problems.append(f"node {i + 1} ({client}): train-size={size!r} must be an int >= 1")
                continue
            try:
                key = normalize_key((path.parent / key_file).read_bytes())
            except (OSError, ValueError) as err:
                problems.append(f"node {i + 1} ({client}): public-key {key_file} cannot be read as a key ({err})")
                continue
            if key in nodes:
                problems.append(f"the key {key_file} is listed for {nodes[key].client_id!r} and {client!r}")
            elif client in clients:
                problems.append(f"client {client!r} is listed for two keys, {clients[client]} and {key_file}")
            else:
                nodes[key], clients[client] = Registered(client, key_file, size), key_file
        if not nodes and not problems:
            problems.append("it lists no [[node]]")
        if problems:
            raise ConfigError(f"{where}: " + "; ".join(problems) + ".")
        return cls(nodes, where)

    def check(self, node: int, public_key: bytes | None, claimed: str, train_size: int) -> str | None:
        """Why the node ``node``, whose key the SuperLink holds as ``public_key`` (None: unknown), may not hold the
        client ``claimed`` with ``train_size`` training examples, or None."""
        if not public_key:
            return (
                f"node {node} claims client {claimed!r}, but Flower gives no public key for it, so {self.source} "
                "cannot verify the claim"
            )
        try:
            key = normalize_key(public_key)
        except ValueError as err:
            return f"node {node} claims client {claimed!r} with a public key the server cannot read ({err})"
        registered = self.nodes.get(key)
        if registered is None:
            return (
                f"node {node} claims client {claimed!r} with the key {fingerprint(key)}, which {self.source} does "
                "not list"
            )
        if registered.client_id != claimed:
            return (
                f"node {node} claims client {claimed!r}, but its key {registered.key_file} is registered for client "
                f"{registered.client_id!r} ({self.source})"
            )
        if registered.train_size is not None and train_size != registered.train_size:
            return (
                f"node {node} (client {claimed!r}) declares {train_size} training examples; {self.source} gives "
                f"{registered.train_size}"
            )
        return None
