"""What the Python drivers share (issue 21): the job on stdin, the case loop, the one
output line, the large payload, and how a stack that decodes AMQP string and binary alike
to `bytes` reports values in the JSON the tests compare."""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from typing import Any


def read_job() -> dict[str, Any]:
    job: dict[str, Any] = json.load(sys.stdin)
    return job


def run_cases(cases: dict[str, Callable[[], Any]]) -> dict[str, Any]:
    """Each case on its own: a failure is reported under its name and the rest still run."""
    result: dict[str, Any] = {}
    for name, case in cases.items():
        try:
            result[name] = case()
        except Exception as exc:
            result[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return result


def emit(result: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


def payload(size: int) -> bytes:
    """The large case's body: every byte value, repeated."""
    return bytes(range(256)) * (size // 256)


def same_payload(got: bytes, sent: bytes) -> dict[str, Any]:
    return {"size": len(got), "same": hashlib.sha256(got).digest() == hashlib.sha256(sent).digest()}


def text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def decoded(value: Any) -> Any:
    """bytes as text where they are UTF-8 (what an application expecting text does), else
    as hex; maps and lists item by item."""
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return {"hex": value.hex()}
    if isinstance(value, dict):
        return {str(decoded(k)): decoded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [decoded(v) for v in value]
    return value
