"""Unknown users cost a password check too (issue 15: timing must not tell who exists)."""

from __future__ import annotations

import pytest

from amqpbroker.security import hash_password, passwords, verify_password_or_dummy


def test_an_unknown_user_runs_scrypt_and_never_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    verify_password_or_dummy("warm-up", None)  # the dummy hash is made once
    derived: list[int] = []
    real_derive = passwords._derive

    def counting_derive(password: str, salt: bytes, log2_n: int, r: int, p: int) -> bytes:
        derived.append(log2_n)
        return real_derive(password, salt, log2_n, r, p)

    monkeypatch.setattr(passwords, "_derive", counting_derive)
    assert not verify_password_or_dummy("anything", None)
    assert derived == [passwords.LOG2_N]  # the same work factor as a real user's hash
    stored = hash_password("pw")
    derived.clear()
    assert verify_password_or_dummy("pw", stored)
    assert not verify_password_or_dummy("other", stored)
    assert derived == [passwords.LOG2_N] * 2
