"""The interop cases' expectations, shared by every client stack (issue 21).

Each stack's driver reports what it saw per case; `CHECKS[case](seen, prefix)` asserts it.
A stack that cannot express a case leaves it out (interop/README.md says why).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amqpbroker.security import hash_password
from support.process import QUICK_LOG2_N, BrokerProcess

ROOT = Path(__file__).resolve().parents[2]
INTEROP = ROOT / "interop"
USER, PASSWORD = "app", "app-pw"
LARGE = 5 * 1024 * 1024


def ensure_apt(*packages: str, probes: tuple[str, ...]) -> None:
    """Install Debian packages when a `probes` path is missing; fail with the reason."""
    if all(Path(p).exists() for p in probes):
        return
    assert os.geteuid() == 0, f"{probes} missing; `apt-get install {' '.join(packages)}` as root"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    if done.returncode != 0:  # a fresh machine has no package lists yet
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=240)
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"apt-get install failed:\n{done.stderr}"
    missing = [p for p in probes if not Path(p).exists()]
    assert not missing, f"{missing} still missing after apt-get install {' '.join(packages)}"


def cache_dir(name: str) -> Path:
    """Built clients live outside the tree, keyed by what they were built from."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    path = root / "amqpbroker-interop" / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def npm_ci(directory: Path, module: str) -> Path:
    """`npm ci` once from the lockfile (node_modules is git-ignored); node and npm come
    from Debian when root and missing."""
    if shutil.which("npm") is None or shutil.which("node") is None:
        ensure_apt("nodejs", "npm", probes=("/usr/bin/node", "/usr/bin/npm"))
    npm = shutil.which("npm")
    assert npm is not None, "interop tests need node and npm on PATH (apt-get install npm)"
    if not (directory / "node_modules" / module).exists():
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            cwd=directory,
            capture_output=True,
            text=True,
            timeout=100,
        )
        assert done.returncode == 0, f"npm ci failed in {directory}:\n{done.stderr}"
    return directory


def broker_config(cert_dir: Path) -> str:
    everything = (
        "{send: [app], consume: [app], browse: [app], create-address: [app],"
        " delete-address: [app], create-durable-queue: [app], delete-durable-queue: [app],"
        " create-non-durable-queue: [app], delete-non-durable-queue: [app], manage: [app]}"
    )
    password_hash = hash_password(PASSWORD, log2_n=QUICK_LOG2_N)  # (QUICK_LOG2_N: why)
    return f"""
        acceptors:
          - name: amqp
            url: amqp://127.0.0.1:0
          - name: amqps
            url: amqps://localhost:0
            tls: {{cert-file: {cert_dir}/server.pem, key-file: {cert_dir}/server.key,
                   ca-file: {cert_dir}/ca.pem, client-auth: none}}
        security:
          enabled: true
          sasl-mechanisms: [PLAIN]
          users: {{{USER}: {{password-hash: "{password_hash}", roles: [app]}}}}
          security-settings:
            "#": {everything}
        address-settings:
          "#":
            dead-letter-address: DLA
            auto-create-dead-letter-resources: true
          "q.#":
            default-address-routing-type: ANYCAST
            default-queue-routing-type: ANYCAST
            dead-letter-address: DLA
            auto-create-dead-letter-resources: true
          "matrix.#":
            default-address-routing-type: ANYCAST
            default-queue-routing-type: ANYCAST
        """


def spec(broker: BrokerProcess, cert_dir: Path, prefix: str, **extra: Any) -> dict[str, Any]:
    """What every driver is told: where the broker is, who to be, which names to use."""
    return {
        "host": "127.0.0.1",
        "port": broker.ports["amqp"],
        "tls_host": "localhost",
        "tls_port": broker.ports["amqps"],
        "ca": str(cert_dir / "ca.pem"),
        "user": USER,
        "password": PASSWORD,
        "prefix": prefix,
        "large": LARGE,
        **extra,
    }


def run_driver(
    cmd: list[str], job: dict[str, Any], *, cwd: Path, timeout: float = 150
) -> dict[str, Any]:
    """Run one driver process with the job as JSON on stdin; its last stdout line is JSON."""
    done = subprocess.run(
        cmd,
        cwd=cwd,
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0, f"{cmd} failed ({done.returncode}):\n{done.stderr}"
    assert lines, f"{cmd} printed nothing:\n{done.stderr}"
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _queue(seen: Any, prefix: str) -> None:
    """B-020: one queue, one consumer: in order."""
    assert seen == [f"m{i}" for i in range(5)]


def _topic(seen: Any, prefix: str) -> None:
    """B-026: two private subscriptions each get every message, in order."""
    assert seen == [["n0", "n1", "n2"], ["n0", "n1", "n2"]]


def _reject(seen: Any, prefix: str) -> None:
    """B-046/B-090: rejected -> DLA::DLQ.<address>, ORIG-ADDRESS visible to the client."""
    assert seen["body"] == "poison"
    assert seen["annotations"]["x-opt-ORIG-ADDRESS"] == f"q.{prefix}.rej"


def _modified(seen: Any, prefix: str) -> None:
    """B-044: modified(delivery-failed) comes back with delivery-count 1."""
    assert seen == [0, 1]


def _released(seen: Any, prefix: str) -> None:
    """B-044: released comes back with the delivery-count unchanged."""
    assert seen == [0, 0]


def _tls(seen: Any, prefix: str) -> None:
    """Issue 8: amqps + SASL PLAIN works; a wrong password is refused."""
    assert seen == {"body": "over-tls", "wrong_password_refused": True}


def _large(seen: Any, prefix: str) -> None:
    """Issue 16: a 5 MiB message goes through whole."""
    assert seen == {"size": 5 * 1024 * 1024, "same": True}


def _durable(seen: Any, prefix: str) -> None:
    """B-026/B-027/B-028: a durable subscription keeps messages while its client is away."""
    assert seen == ["d0", "d1"]


def _shared(seen: Any, prefix: str) -> None:
    """B-026: a shared subscription hands each message to one of its consumers."""
    assert seen["bodies"] == ["s0", "s1", "s2", "s3"]
    assert len(seen["per_receiver"]) == 2


def _transactions(seen: Any, prefix: str) -> None:
    """B-140/B-141: committed sends arrive, aborted ones do not."""
    assert seen == {"committed": ["t0", "t1"], "after": None}


CHECKS: dict[str, Callable[[Any, str], None]] = {
    "queue": _queue,
    "topic": _topic,
    "reject": _reject,
    "modified": _modified,
    "released": _released,
    "tls": _tls,
    "large": _large,
    "durable": _durable,
    "shared": _shared,
    "transactions": _transactions,
}


def check(results: dict[str, Any], case: str, prefix: str) -> None:
    seen = results[case]
    assert not (isinstance(seen, dict) and "error" in seen), seen
    CHECKS[case](seen, prefix)


# --- the stacks -------------------------------------------------------------------------


def _t(kind: str, value: Any) -> dict[str, Any]:
    return {"t": kind, "v": value}


def matrix_messages(sender: str) -> list[dict[str, Any]]:
    """What every stack sends in the cross matrix: typed, so each driver builds the same
    AMQP values with its own API (issue 21: bodies, message-id, content-type, properties)."""
    props = {
        "s": _t("string", "text ü"),
        "i": _t("int", -7),
        "l": _t("long", -5_000_000_000),
        "b": _t("boolean", True),
        "d": _t("double", 1.5),
        "x": _t("binary", "00ff"),
    }
    return [
        {
            "id": f"{sender}-str",
            "content_type": "text/plain",
            "body": {"kind": "value", "value": _t("string", "héllo wörld")},
            "props": props,
        },
        {
            "id": f"{sender}-bin",
            "content_type": "application/octet-stream",
            "body": {"kind": "data", "value": _t("binary", "000102fffe")},
            "props": {"s": _t("string", "bin")},
        },
        {
            "id": f"{sender}-map",
            "content_type": "application/x-amqp-map",
            "body": {
                "kind": "value",
                "value": _t("map", {"k": _t("string", "v"), "n": _t("long", 42)}),
            },
            "props": {},
        },
        {
            "id": f"{sender}-list",
            "content_type": "application/x-amqp-list",
            "body": {
                "kind": "value",
                "value": _t("list", [_t("string", "a"), _t("long", 2), _t("double", 2.5)]),
            },
            "props": {},
        },
    ]


def plain(typed: dict[str, Any]) -> Any:
    """A typed value as every receiving driver reports it after decoding."""
    kind, value = typed["t"], typed["v"]
    if kind == "binary":
        return {"hex": value}
    if kind == "map":
        return {k: plain(v) for k, v in value.items()}
    if kind == "list":
        return [plain(v) for v in value]
    return value


def expected(message: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": message["id"],
        "content_type": message["content_type"],
        "props": {k: plain(v) for k, v in message["props"].items()},
        "body": {"kind": message["body"]["kind"], "value": plain(message["body"]["value"])},
    }


def bare_message(raw: bytes) -> bytes:
    """The bare message of an encoded one: its sections from properties up to the body,
    without header, annotations and footer (what a broker may add or change)."""
    from proton import Data

    offset, start, end = 0, None, len(raw)
    while offset < len(raw):
        data = Data()
        used = data.decode(raw[offset:])
        data.next()
        data.enter()
        data.next()
        code = data.get_object()
        if start is None and code >= 0x73:  # properties, application-properties, body
            start = offset
        if code == 0x78:  # footer
            end = offset
        offset += used
    return raw[start:end]


@dataclass(frozen=True)
class Stack:
    """One client stack: how to install it, how to run its driver, what it cannot do."""

    name: str
    prefix: str  # address prefix of its cases, q.<prefix>.*, t.<prefix>.*
    directory: str  # under interop/
    install: Callable[[], list[str]]  # -> the driver's command line
    not_applicable: dict[str, str] = field(default_factory=dict)  # case -> why

    def run(self, broker: BrokerProcess, cert_dir: Path, **job: Any) -> dict[str, Any]:
        return run_driver(
            self.install(),
            spec(broker, cert_dir, self.prefix, **job),
            cwd=INTEROP / self.directory,
        )

    def cases(self) -> list[str]:
        return sorted(set(CHECKS) - set(self.not_applicable))


def _python_module(module: str, why: str) -> Callable[[], list[str]]:
    def install() -> list[str]:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise AssertionError(
                f"{module} missing ({exc}): pip install -e '.[test]' {why}"
            ) from exc
        return [sys.executable, "driver.py"]

    return install


def _npm(directory: str, module: str) -> Callable[[], list[str]]:
    def install() -> list[str]:
        npm_ci(INTEROP / directory, module)
        node = shutil.which("node")
        assert node is not None, "interop tests need node on PATH"
        return [node, "driver.js"]

    return install


def _proton_cpp() -> list[str]:
    """apt-get the Proton C++ headers (and nlohmann-json for the job file), compile once."""
    ensure_apt(
        "libqpid-proton-cpp12-dev",
        "nlohmann-json3-dev",
        "g++",
        probes=(
            "/usr/include/proton/container.hpp",
            "/usr/include/nlohmann/json.hpp",
            "/usr/bin/g++",
        ),
    )
    source = INTEROP / "proton-cpp" / "driver.cpp"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    binary = cache_dir("proton-cpp") / f"driver-{digest}"
    if not binary.exists():
        built = binary.with_suffix(".tmp")
        cmd = [
            "g++",
            "-std=c++17",
            "-O1",
            str(source),
            "-o",
            str(built),
            "-lqpid-proton-cpp",
            "-pthread",
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, f"compiling the Proton C++ driver failed:\n{done.stderr}"
        built.rename(binary)
    return [str(binary)]


NO_TX = "the client has no transaction API"
PYAMQP_WHY = "(azure-servicebus 7.x carries the pure-Python AMQP stack)"
STACKS: dict[str, Stack] = {
    s.name: s
    for s in [
        Stack("proton-python", "pp", "proton-python", _python_module("proton", "")),
        Stack("rhea", "rh", "rhea", _npm("rhea", "rhea"), {"transactions": NO_TX}),
        Stack("amqp10", "a10", "amqp10", _npm("amqp10", "amqp10"), {"transactions": NO_TX}),
        Stack(
            "pyamqp",
            "pya",
            "pyamqp",
            _python_module("azure.servicebus._pyamqp", PYAMQP_WHY),
            {"transactions": NO_TX},
        ),
        Stack(
            "uamqp",
            "ua",
            "uamqp",
            _python_module("uamqp", "(uamqp 1.6.11 wheels)"),
            {
                "transactions": NO_TX,
                "shared": "uamqp's Source has no capabilities field, so no `shared`",
            },
        ),
        Stack(
            "proton-cpp",
            "cpp",
            "proton-cpp",
            _proton_cpp,
            {
                "transactions": "Proton C++ 0.37 has no transaction API",
                "modified": "Proton C++ 0.37's delivery::modify() cannot set delivery-failed",
            },
        ),
    ]
}
