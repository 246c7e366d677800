"""``fedlit certs``: a CA, the SuperLink's certificate for the given hosts, and SuperNode key pairs."""

from __future__ import annotations

import ipaddress

import pytest

pytest.importorskip("flwr.app", reason="flwr is not installed (pip install 'fedlit[flower]')")

from cryptography import x509  # noqa: E402
from cryptography.x509.verification import PolicyBuilder, Store  # noqa: E402

from fedlit.cli import main  # noqa: E402


def test_certificates_verify_for_the_hosts(tmp_path, capsys):
    main(["certs", "--out", str(tmp_path), "--host", "10.1.2.3", "--host", "superlink.example.org", "--nodes", "2"])
    names = {line.rsplit("/", 1)[1] for line in capsys.readouterr().out.split()}
    assert names == {
        "ca.crt",
        "ca.key",
        "server.pem",
        "server.key",
        "node_0.key",
        "node_0.pub",
        "node_1.key",
        "node_1.pub",
    }
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    server = x509.load_pem_x509_certificate((tmp_path / "server.pem").read_bytes())
    for host in (x509.IPAddress(ipaddress.ip_address("10.1.2.3")), x509.DNSName("superlink.example.org")):
        assert PolicyBuilder().store(Store([ca])).build_server_verifier(host).verify(server, [])[-1] == ca
    for other in (x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))):
        with pytest.raises(Exception, match="(?i)match|subject"):
            PolicyBuilder().store(Store([ca])).build_server_verifier(other).verify(server, [])
    assert (tmp_path / "node_1.key").read_bytes().startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----")
    assert (tmp_path / "node_1.pub").read_bytes().startswith(b"ecdsa-sha2-nistp384 ")
    assert (tmp_path / "node_0.pub").read_bytes() != (tmp_path / "node_1.pub").read_bytes()
    for key in ("ca.key", "server.key", "node_0.key", "node_1.key"):
        assert (tmp_path / key).stat().st_mode & 0o077 == 0


def test_default_hosts_and_no_overwrite(tmp_path, capsys):
    main(["certs", "--out", str(tmp_path)])
    server = x509.load_pem_x509_certificate((tmp_path / "server.pem").read_bytes())
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    before = (tmp_path / "ca.crt").read_bytes()
    with pytest.raises(SystemExit) as exited:  # a second CA would orphan the keys given out
        main(["certs", "--out", str(tmp_path), "--nodes", "1"])
    assert exited.value.code == 2
    assert "holds ca.crt, ca.key, server.key, server.pem already" in capsys.readouterr().err
    assert (tmp_path / "ca.crt").read_bytes() == before and not (tmp_path / "node_0.key").exists()
