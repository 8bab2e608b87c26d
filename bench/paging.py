"""Paging throughput and memory (issue 23): a backlog of N 1 KiB messages sent with no
consumer to a broker whose global-max-size is LIMIT, then drained by a late consumer.

    .venv/bin/python bench/paging.py                        # N=200000, LIMIT=16 MiB
    N=1000000 DURABLE=1 .venv/bin/python bench/paging.py
    PURGE=1 N=... .venv/bin/python bench/paging.py          # purge over HTTP, no drain

Prints produce and drain rates, the broker's RSS before, after producing and after
draining, and the page files' size at the peak. With PURGE=1 the backlog is purged over
the HTTP API instead of drained: the purge's wall time, and the RSS just after it and
SETTLE_S seconds later (issue 23: memory a purge frees goes back to the system). Runs
`amqpbroker run` (memory only unless DURABLE=1) on port 0 in a temporary directory; stops it by PID.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from support import bulk  # noqa: E402
from support.process import start_broker  # noqa: E402

N = int(os.environ.get("N", "200000"))
LIMIT = int(os.environ.get("LIMIT", str(16 * 1024 * 1024)))
DURABLE = os.environ.get("DURABLE", "0") == "1"
PURGE = os.environ.get("PURGE", "0") == "1"
SETTLE_S = float(os.environ.get("SETTLE_S", "3"))


def _mib(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MiB"


def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        broker = start_broker(
            Path(directory),
            f"""
            global-max-size: {LIMIT}
            persistence:
              enabled: {"true" if DURABLE else "false"}
            addresses:
              - name: q
                anycast: [{{name: q}}]
            """,
            log_level="warning",
        )
        try:
            rss0 = broker.rss_bytes()
            started = time.monotonic()
            sent = bulk.send(broker.url, "q", range(N), durable=lambda i: DURABLE)
            produce_s = time.monotonic() - started
            rss1 = broker.rss_bytes()
            paged = sum(p.stat().st_size for p in (broker.data_dir / "paging").rglob("*.page"))
            if PURGE:
                purged, purge_s, rss_now, rss2 = _purge(broker)
            else:
                started = time.monotonic()
                got = bulk.receive(broker.url, "q", sent)
                drain_s = time.monotonic() - started
                rss2 = broker.rss_bytes()
        finally:
            broker.stop()
    if PURGE:
        assert purged == sent, f"purged {purged} of {sent}"
        print(
            f"N={sent} 1 KiB {'durable' if DURABLE else 'non-durable'}, "
            f"global-max-size {_mib(LIMIT)}: produce {sent / produce_s:,.0f} msg/s; "
            f"RSS {_mib(rss0)} -> {_mib(rss1)} with the backlog; purge {purge_s:.1f} s; "
            f"RSS {_mib(rss_now)} just after, {_mib(rss2)} {SETTLE_S:g} s later; "
            f"page files {_mib(paged)}"
        )
        return
    assert got == list(range(sent)), "lost, duplicated or out of order"
    print(
        f"N={sent} 1 KiB {'durable' if DURABLE else 'non-durable'}, "
        f"global-max-size {_mib(LIMIT)}: produce {sent / produce_s:,.0f} msg/s "
        f"({produce_s:.1f} s), drain {sent / drain_s:,.0f} msg/s ({drain_s:.1f} s); "
        f"RSS {_mib(rss0)} -> {_mib(rss1)} with the backlog -> {_mib(rss2)} drained; "
        f"page files {_mib(paged)}"
    )


def _purge(broker: Any) -> tuple[int, float, int, int]:
    """POST /api/v1/queues/q/purge: how many, its wall time, RSS then and SETTLE_S later."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{broker.ports['http']}/api/v1/queues/q/purge",
        data=b"{}",
        headers={"Content-Type": "application/json", "X-Requested-By": "bench"},
        method="POST",
    )
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=600) as response:
        removed = int(json.loads(response.read())["removed"])
    purge_s = time.monotonic() - started
    rss_now = broker.rss_bytes()
    time.sleep(SETTLE_S)
    return removed, purge_s, rss_now, broker.rss_bytes()


if __name__ == "__main__":
    main()
