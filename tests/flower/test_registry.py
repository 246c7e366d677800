"""The operator's node registry binds each SuperNode key to one client id (and optionally its train size): the server
refuses, before round 1, a node whose key is not registered for the client it claims, naming both; without a
registry it warns once that the ids are self-declared. Driven in-process: the transport presents each node's key as
flwr 1.41's ``grid.get_nodes()`` gives it (PEM)."""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("flwr.app", reason="flwr is not installed (pip install 'fedlit[flower]'): no Flower deployment")

from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402

from fedlit.core.errors import ConfigError, DataError  # noqa: E402
from fedlit.flower.certs import make_certificates  # noqa: E402
from fedlit.flower.client import node_run  # noqa: E402
from fedlit.flower.inprocess import InProcessTransport  # noqa: E402
from fedlit.flower.registry import NodeRegistry, fingerprint, normalize_key  # noqa: E402
from fedlit.flower.remote import RemoteData  # noqa: E402
from fedlit.flower.server import run_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TINY = (
    "--data.init_args.num_clients 2 --data.init_args.samples_per_client 20 --data.init_args.image_size 8 "
    "--model.init_args.backbone.init_args.width 4 --federation.rounds 1"
)


def _pem(pub: Path) -> bytes:
    """The key of an OpenSSH ``.pub`` file as the SuperLink holds it (flwr's ``public_key_to_bytes``: PEM)."""
    key = serialization.load_ssh_public_key(pub.read_bytes())
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("certs")
    make_certificates(folder, ["127.0.0.1"], nodes=3)
    return folder


def _registry(certs: Path, text: str) -> Path:
    path = certs / "registry.toml"
    path.write_text(text)
    return path


REGISTRY = """
[[node]]
public-key = "node_0.pub"
client-id = "site_0"

[[node]]
public-key = "node_1.pub"
client-id = "site_1"

[[node]]
public-key = "node_2.pub"
client-id = "site_2"
"""


def test_check_by_hand(certs):
    registry = NodeRegistry.load(_registry(certs, REGISTRY))
    key = {i: _pem(certs / f"node_{i}.pub") for i in range(3)}
    assert registry.check(7, key[1], "site_1", 14) is None
    assert registry.check(7, key[2], "site_1", 14) == (
        "node 7 claims client 'site_1', but its key node_2.pub is registered for client 'site_2' "
        f"(node-registry {certs / 'registry.toml'})"
    )
    stranger = ec.generate_private_key(ec.SECP384R1()).public_key()
    pem = stranger.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert registry.check(7, pem, "site_0", 14) == (
        f"node 7 claims client 'site_0' with the key {fingerprint(normalize_key(pem))}, which node-registry "
        f"{certs / 'registry.toml'} does not list"
    )
    assert "Flower gives no public key for it" in registry.check(7, b"", "site_0", 14)
    sized = NodeRegistry.load(_registry(certs, REGISTRY.replace('"site_1"', '"site_1"\ntrain-size = 120')))
    assert sized.check(7, key[1], "site_1", 120) is None
    assert sized.check(7, key[1], "site_1", 10**9).startswith("node 7 (client 'site_1') declares 1000000000 training")


def test_a_registry_that_binds_a_key_or_a_client_twice_is_refused(certs):
    twice = REGISTRY.replace('public-key = "node_1.pub"', 'public-key = "node_0.pub"')
    with pytest.raises(ConfigError, match=r"the key node_0.pub is listed for 'site_0' and 'site_1'"):
        NodeRegistry.load(_registry(certs, twice))
    with pytest.raises(ConfigError, match=r"client 'site_0' is listed for two keys, node_0.pub and node_1.pub"):
        NodeRegistry.load(_registry(certs, REGISTRY.replace('"site_1"', '"site_0"')))
    with pytest.raises(ConfigError, match=r"public-key nowhere.pub cannot be read as a key"):
        NodeRegistry.load(_registry(certs, REGISTRY.replace("node_2.pub", "nowhere.pub")))
    with pytest.raises(ConfigError, match=r"train-size=0 must be an int >= 1"):
        NodeRegistry.load(_registry(certs, REGISTRY.replace('"site_1"', '"site_1"\ntrain-size = 0')))


def _run(tmp_path, certs, keys, registry_text=REGISTRY):
    recipe = (ROOT / "recipes" / "quickstart.yaml").read_text()
    run_config = {
        "recipe": recipe,
        "overrides": TINY,
        "out-dir": str(tmp_path / "server"),
        "connect-timeout": 2,
        "client-ids": "site_0,site_1",
        "node-registry": str(_registry(certs, registry_text)),
    }
    builders = {
        c: (lambda c=c: node_run(run_config, {"client-id": c}, tmp_path / "node")) for c in ("site_0", "site_1")
    }
    transport = InProcessTransport(builders, keys={c: _pem(certs / f"node_{i}.pub") for c, i in keys.items()})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        return run_server(transport, run_config), [str(w.message) for w in caught]


def test_a_node_claiming_a_client_its_key_is_not_registered_for_is_refused(tmp_path, certs):
    # site_1's node presents node_2's key (registered for site_2): refused before round 1, naming both
    with pytest.raises(DataError) as err:
        _run(tmp_path, certs, {"site_0": 0, "site_1": 2})
    assert "missing: ['site_1']" in str(err.value)
    assert "node 102 claims client 'site_1', but its key node_2.pub is registered for client 'site_2'" in str(err.value)
    assert not (tmp_path / "server" / "results.json").exists()


def test_registered_nodes_run_and_no_warning_says_the_ids_are_self_declared(tmp_path, certs):
    results, said = _run(tmp_path, certs, {"site_0": 0, "site_1": 1})
    assert set(results["last"]["clients"]) == {"site_0", "site_1"}
    assert not [s for s in said if "self-declared" in s or "Refused" in s]


def test_without_a_registry_the_server_warns_once(tmp_path):
    transport = InProcessTransport(
        {c: (lambda c=c: node_run({"recipe": "x"}, {"client-id": c}, tmp_path)) for c in ("a", "b")}
    )
    transport.exchange = lambda messages, group, timeout: [  # the nodes' answers to the query, no client built
        _answer(node) for node, _, _ in messages
    ]
    data = RemoteData(SimpleNamespace(expected_num_clients=lambda: 2), transport, connect_timeout=1)
    with pytest.warns(UserWarning) as caught:
        data.setup()
        data.setup()
    said = [str(w.message) for w in caught if "self-declared" in str(w.message)]
    assert len(said) == 1 and said[0].startswith("No node registry (run config node-registry)")


def _answer(node):
    from flwr.app import ConfigRecord, RecordDict

    client = {101: "a", 102: "b"}[node]
    return RecordDict({"query": ConfigRecord({"client-id": client, "position": node, "num-examples": '{"train": 5}'})})


def test_the_registry_of_the_page_is_read(certs):
    import re

    page = (ROOT / "docs" / "deployment.md").read_text()
    blocks = [b for b in re.findall(r"```toml\n(.*?)```", page, flags=re.S) if "[[node]]" in b]
    assert len(blocks) == 1
    registry = NodeRegistry.load(_registry(certs, blocks[0]))
    assert {r.client_id: (r.key_file, r.train_size) for r in registry.nodes.values()} == {
        "site_0": ("node_0.pub", 120),
        "site_1": ("node_1.pub", None),
    }
