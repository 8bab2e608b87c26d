"""Memory back to the system after a purge or a drain (issue 23): the broker's RSS over
time around a backlog of N non-durable 1 KiB messages held in memory (global-max-size
4 GiB, no consumer), purged over HTTP (MODE=purge) or drained by a consumer (MODE=drain).

    N=1048576 MODE=purge .venv/bin/python bench/memory_return.py
    N=300000 MODE=drain WATCH_S=8 .venv/bin/python bench/memory_return.py

Prints RSS (VmRSS) before the backlog (after a 1,000-message warm-up), at its peak, with
the growth per message (RSS per queued 1 KiB message), then every 0.25 s for WATCH_S
seconds from the moment the purge answered or the consumer had taken the last message.
Sends and receives with amqp-cgen (`../shared/bench/setup.sh` builds it; CGEN overrides
/tmp/bench-cgen/amqp-cgen): the Python client would take ~10 min for 1M. Runs `amqpbroker
run` (memory only) on port 0 in a temporary directory; stops it by PID.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from support import bulk  # noqa: E402
from support.process import BrokerProcess, start_broker  # noqa: E402

MIB = 1024 * 1024
CONFIG = """
global-max-size: 4294967296
addresses:
  - name: q
    anycast: [{name: q}]
"""


def cpu_s(broker: BrokerProcess) -> float:
    fields = Path(f"/proc/{broker.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    n = int(os.environ.get("N", "300000"))
    mode = os.environ.get("MODE", "purge")
    watch_s = float(os.environ.get("WATCH_S", "5"))
    cgen = os.environ.get("CGEN", "/tmp/bench-cgen/amqp-cgen")
    with tempfile.TemporaryDirectory(prefix="memory-return-") as tmp:
        broker = start_broker(Path(tmp), CONFIG, log_level="warning")
        try:
            host = f"127.0.0.1:{broker.ports['amqp']}"
            assert bulk.send(broker.url, "q", range(1000), size=1024, durable=lambda i: False)
            assert len(bulk.receive(broker.url, "q", 1000)) == 1000
            time.sleep(2)
            before = broker.rss_bytes()
            print(f"N={n} MODE={mode}: RSS before {before / MIB:.1f} MiB")
            started = time.monotonic()
            amqp = [cgen, "-u", host, "-a", "q", "-n", str(n), "-C", "queue"]
            quiet = {"check": True, "stdout": subprocess.DEVNULL}
            subprocess.run([*amqp[:1], "send", *amqp[1:], "-s", "1024"], **quiet)
            peak = broker.rss_bytes()
            print(
                f"  sent in {time.monotonic() - started:.1f} s: RSS {peak / MIB:.1f} MiB, "
                f"{(peak - before) / n:.0f} B per queued message, broker CPU {cpu_s(broker):.1f} s"
            )
            started = time.monotonic()
            if mode == "purge":
                port = broker.ports["http"]
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}/api/v1/queues/q/purge",
                    data=b"{}",
                    method="POST",
                    headers={"X-Requested-By": "bench", "Content-Type": "application/json"},
                )
                with urllib.request.urlopen(request, timeout=600) as response:
                    removed = json.loads(response.read())["removed"]
                print(f"  purged {removed} in {time.monotonic() - started:.1f} s")
            else:
                subprocess.run([*amqp[:1], "recv", *amqp[1:]], **quiet)
                print(f"  drained in {time.monotonic() - started:.1f} s")
            started = time.monotonic()
            while (elapsed := time.monotonic() - started) <= watch_s:
                rss = broker.rss_bytes()
                grown = (rss - before) / MIB
                print(f"  +{elapsed:4.1f} s RSS {rss / MIB:7.1f} MiB (before +{grown:.1f})")
                time.sleep(0.25)
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
