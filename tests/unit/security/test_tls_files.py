"""TLS files that cannot be used: one message naming the acceptor and the file, from
`amqpbroker run` and `amqpbroker check-config` alike (issue 15 item 3)."""

from __future__ import annotations

import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from amqpbroker.cli import main
from amqpbroker.config import TlsConfig
from amqpbroker.security import TlsFileError, acceptor_context
from amqpbroker.security.certs import create_certificates


def test_a_missing_certificate_is_named_with_its_path(tmp_path: Path) -> None:
    """Issue 15 item 3: not OpenSSL's nameless `[Errno 2] No such file or directory`."""
    cert = tmp_path / "nope.pem"
    with pytest.raises(TlsFileError) as info:
        acceptor_context("amqps", TlsConfig(cert_file=str(cert), key_file=str(cert)))
    assert str(info.value) == (
        f"acceptor amqps: cannot load TLS certificate/key: {cert}: No such file or directory"
    )


def test_a_missing_ca_file_is_named_with_its_path(tmp_path: Path) -> None:
    files = create_certificates(tmp_path, ["localhost"])
    ca = tmp_path / "missing-ca.pem"
    tls = TlsConfig(
        cert_file=str(files.server_cert), key_file=str(files.server_key), ca_file=str(ca)
    )
    with pytest.raises(TlsFileError, match=f"{ca}: No such file or directory$"):
        acceptor_context("amqps", tls)


def test_a_file_that_is_not_pem_names_the_files(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(TlsFileError) as info:
        acceptor_context("amqps", TlsConfig(cert_file=str(junk), key_file=str(junk)))
    assert str(info.value).startswith(
        f"acceptor amqps: cannot load TLS certificate/key: {junk}, {junk}: "
        "not a PEM certificate and its key"
    )


def test_check_config_refuses_a_missing_certificate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 15 item 3: check-config catches what `run` would stop on."""
    cert = tmp_path / "nope.pem"
    config = tmp_path / "tls.yaml"
    config.write_text(
        "acceptors:\n  - name: amqps\n    url: amqps://localhost:0\n"
        f"    tls: {{cert-file: {cert}, key-file: {cert}}}\n"
    )
    assert main(["check-config", str(config)]) == 1
    assert capsys.readouterr().err == (
        f"{config}: acceptor amqps: cannot load TLS certificate/key: {cert}: "
        "No such file or directory\n"
    )


def test_check_config_passes_with_readable_certificates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = create_certificates(tmp_path, ["localhost"])
    config = tmp_path / "tls.yaml"
    config.write_text(
        "acceptors:\n  - name: amqps\n    url: amqps://localhost:0\n"
        f"    tls: {{cert-file: {files.server_cert}, key-file: {files.server_key}}}\n"
    )
    assert main(["check-config", str(config)]) == 0
    assert capsys.readouterr().err == ""


def test_a_broker_start_does_not_load_cryptography() -> None:
    """Suite time and `make run` (docs/decisions.md, "Suite time, third pass"): only
    `certs create` needs cryptography, ~0.15 CPU-s of a broker start's ~0.55 when the
    modules the start imports loaded it. A fresh interpreter: this process has it."""
    code = (
        "import sys, amqpbroker.cli, amqpbroker.config, amqpbroker.server; "
        "amqpbroker.cli.build_parser(); "
        "sys.exit('cryptography' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=30).returncode == 0


def test_the_server_refuses_renegotiation_whatever_openssl_defaults_to(tmp_path: Path) -> None:
    """Seventh attack pass (issue 15): client-initiated renegotiation is a handshake's
    CPU on the loop per request; OpenSSL 3 refuses it by default ("no renegotiation" to
    `openssl s_client -tls1_2` and `R`), 1.1.1 allows it. The context says so itself."""
    files = create_certificates(tmp_path, ["localhost"])
    tls = TlsConfig(cert_file=str(files.server_cert), key_file=str(files.server_key))
    assert acceptor_context("amqps", tls).options & ssl.OP_NO_RENEGOTIATION
