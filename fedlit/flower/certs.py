"""``fedlit certs``: make the TLS certificates and SuperNode keys of a Flower deployment (for tests and a first trial).

::

    fedlit certs --out certs [--host 127.0.0.1 --host localhost --host superlink.example.org] [--nodes 2] [--days 365]

writes into ``--out``:

- ``ca.crt``, ``ca.key``: a certificate authority (self-signed, EC P-256). Every SuperNode and the ``flwr`` CLI
  trust it: ``flower-supernode --root-certificates ca.crt``, and ``root-certificates = "ca.crt"`` in the SuperLink
  connection of ``$FLWR_HOME/config.toml``.
- ``server.pem``, ``server.key``: the SuperLink's certificate, signed by the CA, valid for every ``--host`` (IP
  addresses and DNS names: the addresses the nodes and the CLI dial): ``flower-superlink --ssl-ca-certfile ca.crt
  --ssl-certfile server.pem --ssl-keyfile server.key``.
- with ``--nodes N``: ``node_<i>.key`` and ``node_<i>.pub`` for i < N, the SuperNodes' authentication key pairs
  (EC P-384, OpenSSH format, as Flower reads them): ``flower-supernode --auth-supernode-private-key node_0.key``;
  the SuperLink (started with ``--enable-supernode-auth``) accepts a node whose public key was registered with
  ``flwr supernode register node_0.pub <connection>``.

Keep ``ca.key`` and the ``node_*.key`` files private. A production deployment gets its server certificate from the
institution's CA instead.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import re
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from fedlit.core.errors import ConfigError


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fedlit"), x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    )


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def make_certificates(out: Path, hosts: list[str], nodes: int = 0, days: int = 365) -> dict[str, Path]:
    """Write the CA, the SuperLink's certificate for ``hosts`` and ``nodes`` SuperNode key pairs into ``out``;
    return the paths by name (``ca.crt``, ``server.pem``, ``server.key``, ``node_0.key``...)."""
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("fedlit CA"))
        .issuer_name(_name("fedlit CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca_cert.subject)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(server_key.public_key()), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    files = {
        "ca.crt": ca_cert.public_bytes(serialization.Encoding.PEM),
        "ca.key": _pem_key(ca_key),
        "server.pem": server_cert.public_bytes(serialization.Encoding.PEM),
        "server.key": _pem_key(server_key),
    }
    for i in range(nodes):
        key = ec.generate_private_key(ec.SECP384R1())
        files[f"node_{i}.key"] = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
        files[f"node_{i}.pub"] = key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
    paths = {}
    for name, content in files.items():
        path = out / name
        path.write_bytes(content)
        if name.endswith(".key"):
            path.chmod(0o600)
        paths[name] = path
    return paths


def main(argv: list[str] | None = None) -> dict[str, Path]:
    """``fedlit certs``: parse ``argv``, write the files, print their paths and return them by name."""
    parser = argparse.ArgumentParser(prog="fedlit certs", description=__doc__.splitlines()[0].split(": ", 1)[1])
    parser.add_argument("--out", required=True, help="The folder to write into.")
    parser.add_argument(
        "--host",
        action="append",
        default=None,
        help="An address the SuperLink is reached at (repeat; default: 127.0.0.1 and localhost).",
    )
    parser.add_argument("--nodes", type=int, default=0, help="SuperNode authentication key pairs to make.")
    parser.add_argument("--days", type=int, default=365, help="Validity of the certificates, in days.")
    args = parser.parse_args(argv)
    if args.nodes < 0 or args.days < 1:
        raise ConfigError(
            f"fedlit certs: --nodes {args.nodes} --days {args.days}: --nodes must be >= 0 and --days >= 1."
        )
    out = Path(args.out)
    existing = sorted(
        p.name
        for p in out.glob("*")
        if p.name in ("ca.crt", "ca.key", "server.pem", "server.key") or re.fullmatch(r"node_\d+\.(key|pub)", p.name)
    )
    if existing:
        raise ConfigError(
            f"fedlit certs --out {out}: it holds {', '.join(existing)} already; a new CA would not "
            "sign the certificates and keys given out before. Choose an empty folder (or delete them)."
        )
    paths = make_certificates(out, args.host or ["127.0.0.1", "localhost"], args.nodes, args.days)
    print("\n".join(str(p) for p in paths.values()), flush=True)
    return paths
