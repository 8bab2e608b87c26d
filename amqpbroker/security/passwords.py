"""Password hashes for `security.users.NAME.password-hash` (scrypt, RFC 7914).

Format: `scrypt$<log2 n>$<r>$<p>$<salt, base64>$<key, base64>`. Verification derives the
key again and compares in constant time; a malformed hash never matches.

`hashlib.scrypt` (OpenSSL) releases the GIL while it derives, so verifications run in a
thread pool without stalling the event loop (security/logins.py). An unknown user is
checked against a dummy hash with the same cost, so a refusal takes as long whether or
not the user exists (issue 15 item 3: no user enumeration by timing).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import os

LOG2_N = 15  # n = 32768: ~30-70 ms per hash on this class of machine, 32 MiB of memory
R = 8
P = 1
KEY_BYTES = 32
# A hash's own parameters are read from the config (the operator's), but a typo such as
# log2 n = 40 must not ask for a terabyte: scrypt needs 128 * r * n * p bytes.
MAX_SCRYPT_MEMORY_BYTES = 256 * 1024 * 1024


def _derive(password: str, salt: bytes, log2_n: int, r: int, p: int) -> bytes:
    n = 2**log2_n
    needed = 128 * r * n * p
    if needed > MAX_SCRYPT_MEMORY_BYTES:
        raise ValueError(f"scrypt parameters need {needed} bytes")
    return hashlib.scrypt(
        password.encode("utf-8"),
        salt=salt,
        n=n,
        r=r,
        p=p,
        dklen=KEY_BYTES,
        maxmem=needed + 1024 * 1024,
    )


def hash_password(password: str, *, log2_n: int = LOG2_N) -> str:
    """A new salted scrypt hash of `password`. A lower `log2_n` is for the tests whose
    clients log in hundreds of times and check something else than the hash's cost (the
    interop stacks, the fuzzer: docs/decisions.md, "Suite time, fourth pass"); a hash
    carries its own parameters, so the broker verifies it as it is."""
    salt = os.urandom(16)
    key = _derive(password, salt, log2_n, R, P)
    b64 = base64.b64encode
    return f"scrypt${log2_n}${R}${P}${b64(salt).decode()}${b64(key).decode()}"


def verify_password(password: str, stored: str) -> bool:
    """Whether `password` matches `stored` (constant-time comparison)."""
    try:
        scheme, log2_n, r, p, salt, key = stored.split("$")
        if scheme != "scrypt":
            return False
        expected = base64.b64decode(key, validate=True)
        derived = _derive(
            password, base64.b64decode(salt, validate=True), int(log2_n), int(r), int(p)
        )
    except (ValueError, TypeError, MemoryError):
        return False
    return hmac.compare_digest(derived, expected)


@functools.cache
def _dummy_hash() -> str:
    """A hash of a random password with the default cost, made once per process."""
    return hash_password(base64.b64encode(os.urandom(18)).decode())


def verify_password_or_dummy(password: str, stored: str | None) -> bool:
    """Whether `password` matches `stored`, the user's hash; None (no such user) costs a
    full verification too, against a dummy hash, and is always refused."""
    if stored is None:
        verify_password(password, _dummy_hash())
        return False
    return verify_password(password, stored)
