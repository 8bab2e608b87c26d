"""Password hashes for `security.users.NAME.password-hash` (scrypt, from `cryptography`).

Format: `scrypt$<log2 n>$<r>$<p>$<salt, base64>$<key, base64>`. Verification derives the
key again and compares in constant time; a malformed hash never matches.
"""

from __future__ import annotations

import base64
import hmac
import os

from cryptography.exceptions import InvalidKey
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

LOG2_N = 15  # n = 32768: ~30-60 ms per hash on this class of machine
R = 8
P = 1
KEY_BYTES = 32


def _kdf(salt: bytes, log2_n: int, r: int, p: int) -> Scrypt:
    return Scrypt(salt=salt, length=KEY_BYTES, n=2**log2_n, r=r, p=p)


def hash_password(password: str) -> str:
    """A new salted scrypt hash of `password`."""
    salt = os.urandom(16)
    key = _kdf(salt, LOG2_N, R, P).derive(password.encode("utf-8"))
    b64 = base64.b64encode
    return f"scrypt${LOG2_N}${R}${P}${b64(salt).decode()}${b64(key).decode()}"


def verify_password(password: str, stored: str) -> bool:
    """Whether `password` matches `stored` (constant-time comparison)."""
    try:
        scheme, log2_n, r, p, salt, key = stored.split("$")
        if scheme != "scrypt":
            return False
        expected = base64.b64decode(key, validate=True)
        kdf = _kdf(base64.b64decode(salt, validate=True), int(log2_n), int(r), int(p))
        derived = kdf.derive(password.encode("utf-8"))
    except (ValueError, InvalidKey, TypeError):
        return False
    return hmac.compare_digest(derived, expected)


# A hash of a random password, made once: checking an unknown user's password against it
# costs what checking a known user's does, so timing does not tell which users exist.
_DUMMY_HASH: str | None = None


def verify_password_or_dummy(password: str, stored: str | None) -> bool:
    """Whether `password` matches `stored`; with None (no such user), as slow, and False."""
    global _DUMMY_HASH
    if stored is None:
        if _DUMMY_HASH is None:
            _DUMMY_HASH = hash_password(base64.b64encode(os.urandom(18)).decode())
        verify_password(password, _DUMMY_HASH)
        return False
    return verify_password(password, stored)
