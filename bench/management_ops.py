"""Event-loop time of management operations on a big queue (issue: management on big
queues): one message by id, one browse page, and the bulk ones, on N 1 KiB messages.

    PYTHONPATH=$PWD .venv/bin/python bench/management_ops.py            # core, N=200000
    N=1000000 PYTHONPATH=$PWD .venv/bin/python bench/management_ops.py
    MODE=http N=200000 PYTHONPATH=$PWD .venv/bin/python bench/management_ops.py

`core` calls `core/operations.py` on a broker in this process (no sockets): each figure is
the time of the call, all of it loop time in a server. It also prints the RSS per queued
message (run it before and after a change to see what it adds). `http` starts `amqpbroker run`
on port 0 (memory only), fills the queue over AMQP and times the HTTP requests (each is
one call onto the loop plus the HTTP round trip); it stops the broker by PID.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

N = int(os.environ.get("N", "200000"))
MODE = os.environ.get("MODE", "core")
BODY = b"x" * 1024


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _timed(name: str, call: Callable[[], Any]) -> Any:
    started = time.perf_counter()
    result = call()
    print(f"{name:<34} {1000 * (time.perf_counter() - started):9.2f} ms")
    return result


def core() -> None:
    from support.core_harness import Harness

    from amqpbroker.core import operations as ops

    h = Harness()
    target = h.producer("q", "queue")
    h.producer("other", "queue")
    gc.collect()
    rss0 = _rss()
    for i in range(N):
        h.send(target, BODY[8:] + i.to_bytes(8), props={"n": i}, priority=4 + i % 2)
    gc.collect()
    rss1 = _rss()
    print(f"N={N}: RSS per queued 1 KiB message {(rss1 - rss0) / N:.0f} B")
    middle = ops.browse(h.broker, "q", offset=N // 2, limit=3)
    ids = [r.message.msg_id for r in middle]
    _timed("browse first page (100)", lambda: ops.browse(h.broker, "q", limit=100))
    _timed("remove one by id", lambda: ops.purge(h.broker, "q", ids=[ids[0]]))
    _timed(
        "change priority of one by id",
        lambda: ops.change_priority(h.broker, "q", priority=9, ids=[ids[1]]),
    )
    _timed("move one by id", lambda: ops.move(h.broker, "q", to_queue="other", ids=[ids[2]]))
    chunk = [r.message.msg_id for r in ops.browse(h.broker, "q", offset=N // 4, limit=100)]
    _timed(
        "move 100 by id (a task step)", lambda: ops.move(h.broker, "q", to_queue="other", ids=chunk)
    )
    _timed("browse page at offset N/2", lambda: ops.browse(h.broker, "q", offset=N // 2, limit=100))
    _timed("count with a filter", lambda: ops.count(h.broker, "q", selector="n < 10"))
    _timed("purge with a filter (10)", lambda: ops.purge(h.broker, "q", selector="n < 10"))


def _http(port: int, path: str, body: dict[str, Any] | None = None) -> Any:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=None if body is None else json.dumps(body).encode(),
        method="GET" if body is None else "POST",
        headers={"X-Requested-By": "bench"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def http() -> None:
    from support import bulk
    from support.process import start_broker

    with tempfile.TemporaryDirectory() as directory:
        broker = start_broker(
            Path(directory),
            """
            persistence:
              enabled: false
            addresses:
              - name: q
                anycast: [{name: q}]
              - name: other
                anycast: [{name: other}]
            """,
            log_level="warning",
        )
        try:
            port = broker.ports["http"]
            rss0 = broker.rss_bytes()
            bulk.send(broker.url, "q", range(N), durable=lambda i: False)
            rss1 = broker.rss_bytes()
            base = "/api/v1/queues/q"
            page = _http(port, f"{base}/messages?limit=3&offset={N // 2}")
            ids = [m["msg_id"] for m in page]
            print(f"N={N} over HTTP: broker RSS per queued 1 KiB message {(rss1 - rss0) / N:.0f} B")
            _timed("GET messages limit=100", lambda: _http(port, f"{base}/messages?limit=100"))
            _timed("purge one by id", lambda: _http(port, f"{base}/purge", {"ids": [ids[0]]}))
            _timed(
                "purge one by id (again)", lambda: _http(port, f"{base}/purge", {"ids": [ids[1]]})
            )
            _timed(
                "move one by id",
                lambda: _http(port, f"{base}/move", {"ids": [ids[2]], "to-queue": "other"}),
            )
        finally:
            broker.stop()


if __name__ == "__main__":
    core() if MODE == "core" else http()
