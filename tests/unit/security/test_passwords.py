"""scrypt password hashes (`amqpbroker user hash`, CONTRACT)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from amqpbroker.security import hash_password, verify_password


def test_hash_verifies_only_the_right_password() -> None:
    stored = hash_password("s3cret")
    assert stored.startswith("scrypt$")
    assert verify_password("s3cret", stored)
    assert not verify_password("s3cret!", stored)
    assert hash_password("s3cret") != stored  # salted


@pytest.mark.parametrize(
    "stored",
    ["", "plain", "scrypt$x$8$1$AA==$AA==", "md5$1$2$3$4$5", "scrypt$15$8$1$not-base64$AA=="],
)
def test_malformed_hashes_never_match(stored: str) -> None:
    assert not verify_password("anything", stored)


def test_cli_reads_the_password_from_stdin_not_argv() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "amqpbroker", "user", "hash", "--password-stdin"],
        input="pw-123\n",
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0
    assert verify_password("pw-123", result.stdout.strip())
    empty = subprocess.run(
        [sys.executable, "-m", "amqpbroker", "user", "hash", "--password-stdin"],
        input="\n",
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert empty.returncode == 1
    assert empty.stderr.strip() == "amqpbroker: an empty password is not allowed"
