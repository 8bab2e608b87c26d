"""HTTP basic authentication for the management API and the console.

Issue 24: reading (GET, HEAD) needs the `browse` permission and everything else the
`manage` permission, both as granted on `activemq.management` by security-settings.

Issue 15: the API ran scrypt (~50 ms of CPU) on every request, so a dashboard polling
every second burned a core's worth of hashing, and an unknown user answered faster than
a wrong password. Here:
- the server's `verify` hashes against a dummy for unknown users (same cost);
- a success is remembered for `CACHE_TTL_S` as (user, SHA-256 of the password): a poll
  costs a dictionary lookup, and the password itself is never kept;
- `MAX_FAILURES` failed attempts from one client address within `FAILURE_WINDOW_S` make
  that address wait: 429 with Retry-After, without hashing, until its failures age out.
  An IPv6 /64 counts as one address (`core.security.source_key`, as SASL's throttle):
  keyed by the whole address, a client rotating through its /64 was never slowed; and
  its /48 as 16 addresses (`source_keys`): rotating through /64s was the same bypass.
  Requests without credentials (a browser's first try) are not failures.

Thread-safe: called from the HTTP threads.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus

from amqpbroker.core.security import source_keys

CACHE_TTL_S = 60.0
CACHE_ENTRIES = 256
MAX_FAILURES = 10
FAILURE_WINDOW_S = 60.0
TRACKED_CLIENTS = 4096


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request may not go on: the status, and when to retry (429 only)."""

    status: HTTPStatus
    message: str
    retry_after_s: int | None = None


UNAUTHENTICATED = Refusal(HTTPStatus.UNAUTHORIZED, "authentication required")


def forbidden(permission: str) -> Refusal:
    return Refusal(HTTPStatus.FORBIDDEN, f"the {permission!r} permission is required")


def basic_credentials(header: str | None) -> tuple[str, str] | None:
    """(user, password) from an `Authorization: Basic ...` header, or None."""
    if not header:
        return None
    scheme, _, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    user, colon, password = decoded.partition(":")
    return (user, password) if colon else None


class BasicAuth:
    """Decides whether a request's credentials may use the management API."""

    def __init__(
        self,
        *,
        verify: Callable[[str, str], bool],
        permitted: Callable[[str, str], bool],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._verify = verify  # (user, password) -> valid; as slow for unknown users
        # (user, "browse" or "manage") -> granted on the management address
        self.permitted = permitted
        self._clock = clock
        self._lock = threading.Lock()
        self._verified: OrderedDict[tuple[str, bytes], float] = OrderedDict()  # -> expiry
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()  # client -> times

    def check(
        self, authorization: str | None, client: str, permission: str = "manage"
    ) -> Refusal | None:
        """None when the request may go on with `permission`; otherwise the refusal."""
        credentials = basic_credentials(authorization)
        if credentials is None:
            return UNAUTHENTICATED
        user, password = credentials
        clients = source_keys(client)  # an IPv6 /64 is one client, its /48 16 (issue 15)
        now = self._clock()
        key = (user, hashlib.sha256(password.encode("utf-8", "surrogatepass")).digest())
        with self._lock:
            wait = self._throttled(clients, now)
            if wait is not None:
                return Refusal(HTTPStatus.TOO_MANY_REQUESTS, "too many failed logins", wait)
            cached = self._verified.get(key, 0.0) > now
        if not cached:
            valid = self._verify(user, password)  # slow: outside the lock
            with self._lock:
                if not valid:
                    self._fail(clients, now)
                    return UNAUTHENTICATED
                self._verified[key] = now + CACHE_TTL_S
                self._verified.move_to_end(key)
                while len(self._verified) > CACHE_ENTRIES:
                    self._verified.popitem(last=False)
        return None if self.permitted(user, permission) else forbidden(permission)

    def _throttled(self, clients: tuple[tuple[str, int], ...], now: float) -> int | None:
        """Seconds to wait when any of the client's keys has had its failures."""
        waits = []
        for client, sources in clients:
            times = self._failures.get(client)
            if times is None:
                continue
            while times and times[0] <= now - FAILURE_WINDOW_S:
                times.popleft()
            if not times:
                del self._failures[client]
            elif len(times) >= MAX_FAILURES * sources:
                waits.append(max(1, int(times[0] + FAILURE_WINDOW_S - now + 0.999)))
        return max(waits) if waits else None

    def _fail(self, clients: tuple[tuple[str, int], ...], now: float) -> None:
        for client, sources in clients:
            times = self._failures.setdefault(client, deque(maxlen=MAX_FAILURES * sources))
            times.append(now)
            self._failures.move_to_end(client)
        while len(self._failures) > TRACKED_CLIENTS:
            self._failures.popitem(last=False)
