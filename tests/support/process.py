"""`broker_process`: the real `amqpbroker run` on port 0, found through ports.json."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from support.waiting import wait_until

# Top-level sections of the test config; a test that defines one replaces it.
BASE_SECTIONS = {
    "name": "name: test-broker\n",
    "acceptors": "acceptors:\n  - name: amqp\n    url: amqp://127.0.0.1:0\n",
    "http": "http:\n  bind: 127.0.0.1:0\n",
    "persistence": "persistence:\n  enabled: false\n",
    "event-log": "event-log:\n  enabled: false\n",
    # The shipped 90% (as Artemis) would refuse every durable send of the suite on a
    # machine whose disk is fuller than that; test_disk_usage.py sets its own.
    "max-disk-usage": "max-disk-usage: -1\n",
}

# scrypt's log2 n for the users of tests that log in over and over and check something
# else than the hash's cost (the interop stacks ~150 logins a run, the SASL fuzzer one a
# case): the shipped cost (passwords.LOG2_N, 15) is ~60 ms of a check thread at nice 10
# each, seconds at load; 2**10 is ~2 ms. test_sasl.py keeps the shipped cost (its
# timing and throttle checks are about it). docs/decisions.md, "Suite time, fourth pass".
QUICK_LOG2_N = 10


def console_security() -> str:
    """Config text (issue 24): security on, `admin` may do anything, `viewer` (password
    viewer-pw) may only browse the management address; dead letters to DLA."""
    from amqpbroker.security import hash_password

    return (
        "security:\n  enabled: true\n  users:\n"
        f'    admin: {{password-hash: "{hash_password("admin-pw")}", roles: [admin]}}\n'
        f'    viewer: {{password-hash: "{hash_password("viewer-pw")}", roles: [viewer]}}\n'
        "  security-settings:\n"
        '    "#": {send: [admin], consume: [admin], browse: [admin], manage: [admin],\n'
        "          create-address: [admin], create-durable-queue: [admin],\n"
        "          create-non-durable-queue: [admin]}\n"
        "    activemq.management: {browse: [admin, viewer], manage: [admin]}\n"
        "address-settings:\n"
        '  "#": {dead-letter-address: DLA, auto-create-dead-letter-resources: true}\n'
    )


@dataclass
class BrokerProcess:
    """A running broker subprocess; stopped by PID with SIGTERM."""

    proc: subprocess.Popen[bytes]
    data_dir: Path
    ports: dict[str, int]
    log_path: Path

    @property
    def url(self) -> str:
        return f"amqp://127.0.0.1:{self.ports['amqp']}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, *, timeout: float = 10) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout)
        return self.proc.returncode

    def rss_bytes(self) -> int:
        """The broker's resident memory (VmRSS), for the issue 15 memory bounds."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def peak_rss_bytes(self) -> int:
        """The broker's highest resident memory so far (VmHWM): what its start-up, a
        journal replay included, took at most (issue 23: RSS bounded during recovery)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmHWM")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def write_config(directory: Path, extra: str = "") -> Path:
    path = directory / "broker.yaml"
    extra = textwrap.dedent(extra)
    own = {line.split(":", 1)[0] for line in extra.splitlines() if line and line[0].isalpha()}
    base = "".join(text for key, text in BASE_SECTIONS.items() if key not in own)
    path.write_text(base + extra)
    return path


def start_broker(
    directory: Path,
    extra_config: str = "",
    *,
    timeout: float = 20,
    args: tuple[str, ...] = (),
    log_level: str = "debug",
    python: tuple[str, ...] = ("-m", "amqpbroker"),
) -> BrokerProcess:
    """Start `amqpbroker run` with BASE_CONFIG + `extra_config`; wait for ports.json.

    Starting again in the same `directory` reuses its data dir (restart tests).
    `python` replaces `-m amqpbroker`, e.g. with `-c CODE` that injects a fault first.
    """
    config = write_config(directory, extra_config)
    data_dir = directory / "data"
    log_path = directory / "broker.log"
    (data_dir / "ports.json").unlink(missing_ok=True)  # a killed broker leaves its own
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                *python,
                "run",
                "--config",
                str(config),
                "--data-dir",
                str(data_dir),
                "--log-level",
                log_level,
                *args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    ports_file = data_dir / "ports.json"

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"broker exited with {proc.returncode}:\n{log_path.read_text()}")
        return ports_file.exists()

    try:
        wait_until(ready, timeout=timeout, message="ports.json")
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    ports = json.loads(ports_file.read_text())
    return BrokerProcess(proc, data_dir, ports, log_path)


def retry_ids(
    broker: BrokerProcess, queue: str, ids: Path, *more: str
) -> subprocess.CompletedProcess[str]:
    """`amqpbroker retry QUEUE --ids FILE [MORE...]` against `broker`, as an operator runs
    it."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "amqpbroker",
            "retry",
            queue,
            "--ids",
            str(ids),
            *more,
            "--url",
            f"http://127.0.0.1:{broker.ports['http']}",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )


def create_certs(out: Path, *extra: str) -> Path:
    """`amqpbroker certs create` for `localhost` into `out` (a CA, a server certificate,
    and whatever `extra` asks for, e.g. `--client NAME`)."""
    cli = [sys.executable, "-m", "amqpbroker", "certs", "create"]
    result = subprocess.run(
        [*cli, "--out", str(out), "--host", "localhost", *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return out


def sign_client_cert(ca_dir: Path, common_name: str, out: Path) -> Path:
    """client.pem/client.key with `common_name`, signed by the CA in `ca_dir` (made by
    `create_certs`), and its ca.pem, in `out`: a certificate the broker trusts for any CN."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_cert = x509.load_pem_x509_certificate((ca_dir / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((ca_dir / "ca.key").read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "ca.pem").write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    (out / "client.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (out / "client.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return out
