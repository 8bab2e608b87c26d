"""Memory after many short connections (issue 23): the broker's RSS and its count of
live connection objects around N connections that each attach a producer and a
consumer, send M 1 KiB messages, take deliveries they never settle, and go (half with
an AMQP close, half by closing the socket).

    N=5000 M=3 .venv/bin/python bench/connection_churn.py
    N=5000 M=3 HOLD=1 .venv/bin/python bench/connection_churn.py

HOLD=1 opens all N first and ends them together (long-lived connections: their
objects have aged into the cyclic collector's oldest generation when they close).

Runs `amqpbroker run` (memory only, as a user runs it: `tune_gc`'s frozen heap and
thresholds) on port 0 in a temporary directory and stops it by PID. The clients are raw
sockets writing pre-built frames (tests/support/frames.py), `PARALLEL` at a time, so
the broker, not a client library, is what is measured. Prints RSS before (after a
500-connection warm-up and a purge), right after the churn, and WATCH_S seconds after
a purge of what the connections left on the queue (every message: the unsettled ones
came back), so that what remains is what the connections themselves left behind.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from support import frames as F  # noqa: E402
from support.process import start_broker  # noqa: E402

MIB = 1024 * 1024
CONFIG = """
addresses:
  - name: q
    anycast: [{name: q}]
"""


def session_bytes(messages: int) -> tuple[bytes, bytes]:
    """One connection's frames in two parts: open, begin, a producer and a consumer
    granting credit 2; then (once the broker has answered: its session window)
    `messages` unsettled transfers."""
    head = [
        F.frame(F.open_("churn")),
        F.frame(F.begin()),
        F.frame(F.attach("p", handle=0, role_receiver=False, target=F.target("q"))),
        F.frame(F.attach("c", handle=1, role_receiver=True, source=F.source("q"))),
        F.frame(F.flow(handle=1, credit=2)),
    ]
    tail = [
        F.frame(F.transfer(handle=0, delivery_id=n, tag=b"%d" % n), payload=F.message("x" * 1024))
        for n in range(messages)
    ]
    return F.AMQP_HEADER + b"".join(head), b"".join(tail)


def _read_until(sock: socket.socket, got: bytes, code: int, count: int) -> bytes:
    """Read until `got` (the answer so far) holds `count` performatives `code`, or the
    socket ends."""
    while sum(F.performative_code(p) == code for _, _, p in F.read_frames(got[8:])) < count:
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


ATTACH, TRANSFER, CLOSE = 0x12, 0x14, 0x18
RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a reset


def start(port: int, parts: tuple[bytes, bytes]) -> tuple[socket.socket, bytes]:
    """A connection that has sent its messages and holds two deliveries unsettled."""
    head, tail = parts
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(head)
    got = _read_until(sock, b"", ATTACH, 2)
    sock.sendall(tail)
    return sock, _read_until(sock, got, TRANSFER, 2)


def end(sock: socket.socket, got: bytes, orderly: bool) -> None:
    """An AMQP close (answered), or a reset without one."""
    with sock:
        if orderly:
            sock.sendall(F.frame(F.close()))
            _read_until(sock, got, CLOSE, 1)
        else:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET)


def churn(port: int, count: int, messages: int, parallel: int, *, hold: bool = False) -> None:
    """`count` connections, `parallel` at a time; with `hold`, all open at once first
    (their objects age into the collector's old generation), then all ended."""
    parts = session_bytes(messages)
    with ThreadPoolExecutor(parallel) as pool:
        if hold:
            started = list(pool.map(lambda i: start(port, parts), range(count)))
            for _ in pool.map(lambda i: end(*started[i], bool(i % 2)), range(count)):
                pass
            return
        for _ in pool.map(lambda i: end(*start(port, parts), bool(i % 2)), range(count)):
            pass


def purge(http_port: int) -> int:
    """Purge q over HTTP (its memory goes back at once, `MemoryReturner`); how many."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{http_port}/api/v1/queues/q/purge",
        data=b"{}",
        method="POST",
        headers={"X-Requested-By": "bench", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        removed: int = json.loads(response.read())["removed"]
        return removed


def main() -> None:
    n = int(os.environ.get("N", "5000"))
    m = int(os.environ.get("M", "3"))
    parallel = int(os.environ.get("PARALLEL", "8"))
    watch_s = float(os.environ.get("WATCH_S", "5"))
    hold = os.environ.get("HOLD", "0") == "1"
    with tempfile.TemporaryDirectory(prefix="churn-") as tmp:
        broker = start_broker(Path(tmp), CONFIG, log_level="warning")
        try:
            port = broker.ports["amqp"]
            http = broker.ports["http"]
            churn(port, 500, m, parallel)
            purge(http)
            time.sleep(1)
            before = broker.rss_bytes()
            started = time.monotonic()
            churn(port, n, m, parallel, hold=hold)
            took = time.monotonic() - started
            after = broker.rss_bytes()
            left = purge(http)  # what the connections sent, all back on the queue
            series = []
            for _ in range(int(watch_s)):
                time.sleep(1)
                series.append(f"{broker.rss_bytes() / MIB:.0f}")
            later = broker.rss_bytes()
            print(
                f"N={n} M={m} HOLD={int(hold)}: {took:.1f} s; RSS before {before / MIB:.1f} MiB, "
                f"after the churn {after / MIB:.1f} (+{(after - before) / MIB:.1f}), "
                f"purged {left} messages, {watch_s:.0f} s later {later / MIB:.1f} "
                f"(+{(later - before) / MIB:.1f}, {(later - before) / n:.0f} B a connection); "
                f"each second after the purge: {' '.join(series)} MiB"
            )
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
