"""Paging throughput and memory (issue 23): a backlog of N 1 KiB messages sent with no
consumer to a broker whose global-max-size is LIMIT, then drained by a late consumer.

    .venv/bin/python bench/paging.py                        # N=200000, LIMIT=16 MiB
    N=1000000 DURABLE=1 .venv/bin/python bench/paging.py

Prints produce and drain rates, the broker's RSS before, after producing and after
draining, and the page files' size at the peak. Runs `amqpbroker run` (memory only unless
DURABLE=1) on port 0 in a temporary directory; stops it by PID.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from support import bulk  # noqa: E402
from support.process import start_broker  # noqa: E402

N = int(os.environ.get("N", "200000"))
LIMIT = int(os.environ.get("LIMIT", str(16 * 1024 * 1024)))
DURABLE = os.environ.get("DURABLE", "0") == "1"


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
            started = time.monotonic()
            got = bulk.receive(broker.url, "q", sent)
            drain_s = time.monotonic() - started
            rss2 = broker.rss_bytes()
        finally:
            broker.stop()
    assert got == list(range(sent)), "lost, duplicated or out of order"
    print(
        f"N={sent} 1 KiB {'durable' if DURABLE else 'non-durable'}, "
        f"global-max-size {_mib(LIMIT)}: produce {sent / produce_s:,.0f} msg/s "
        f"({produce_s:.1f} s), drain {sent / drain_s:,.0f} msg/s ({drain_s:.1f} s); "
        f"RSS {_mib(rss0)} -> {_mib(rss1)} with the backlog -> {_mib(rss2)} drained; "
        f"page files {_mib(paged)}"
    )


if __name__ == "__main__":
    main()
