"""Issue 15 figures: what lying SASL sizes cost, and where password checks should run.

    .venv/bin/python bench/hostile_sasl.py [--checks 64]

1. Peak RSS (VmHWM from /proc) of an `amqpbroker run` process before and after three
   sasl-inits that claim 40 MB or 4 GB (a ulong where the binary response belongs, a
   vbin32 size, a frame size), with security on (the broker's SaslServer) and off
   (Proton's built-in SASL).
2. Event-loop lag (how late a 1 ms timer fires, p50/p99/max) while 16 scrypt checks at a
   time run inline on the loop, in a thread pool (hashlib.scrypt releases the GIL) or in
   a process pool.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

from amqpbroker.security import hash_password, verify_password

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
_ULONG_40MB = b"\x00\x53\x41\xc0\x11\x02\xa3\x05PLAIN\x80" + struct.pack(">Q", 40_000_000)
_VBIN_4GB = b"\x00\x53\x41\xc0\x0c\x02\xa3\x05PLAIN\xb0" + struct.pack(">I", 0xFFFFFFF0)
LYING = [
    struct.pack(">IBBH", 8 + len(_ULONG_40MB), 2, 1, 0) + _ULONG_40MB,
    struct.pack(">IBBH", 8 + len(_VBIN_4GB), 2, 1, 0) + _VBIN_4GB,
    struct.pack(">IBBH", 0xFFFFFFF0, 2, 1, 0) + b"\x00\x53\x41",
]


def peak_rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(x for x in status.splitlines() if x.startswith("VmHWM")).split()[1])


def rss_under_lying_inits(security: bool) -> tuple[int, int]:
    directory = Path(tempfile.mkdtemp())
    config = directory / "broker.yaml"
    text = "acceptors: [{name: amqp, url: 'amqp://127.0.0.1:0'}]\nhttp: {enabled: false}\n"
    text += "persistence: {enabled: false}\nevent-log: {enabled: false}\n"
    if security:
        user = f"{{password-hash: '{hash_password('p')}'}}"
        text += f"security: {{enabled: true, users: {{u: {user}}}}}\n"
    config.write_text(text)
    data = directory / "data"
    command = [sys.executable, "-m", "amqpbroker", "run", "--config", str(config)]
    proc = subprocess.Popen([*command, "--data-dir", str(data), "--log-level", "error"])
    try:
        deadline = time.monotonic() + 20
        while not (data / "ports.json").exists():
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("the broker did not start")
            time.sleep(0.05)
        port = json.loads((data / "ports.json").read_text())["amqp"]
        before = peak_rss_kib(proc.pid)
        for frame in LYING:
            with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
                sock.sendall(SASL_HEADER + frame)
                while sock.recv(65536):
                    pass
        return before, peak_rss_kib(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)


async def loop_lag(run: Callable[[], object] | None, pool: Executor | None, checks: int) -> str:
    """Lag of a 1 ms timer while `checks` verifications run, 16 at a time."""
    loop = asyncio.get_running_loop()
    stored = hash_password("right")
    lags: list[float] = []
    done = asyncio.Event()

    async def probe() -> None:
        while not done.is_set():
            started = loop.time()
            await asyncio.sleep(0.001)
            lags.append((loop.time() - started - 0.001) * 1000)

    async def guess(n: int) -> None:
        for _ in range(n):
            if pool is None:
                verify_password("wrong", stored)
                await asyncio.sleep(0)
            else:
                await loop.run_in_executor(pool, verify_password, "wrong", stored)

    prober = asyncio.create_task(probe())
    started = time.perf_counter()
    await asyncio.gather(*(guess(checks // 16) for _ in range(16)))
    took = time.perf_counter() - started
    done.set()
    await prober
    lags.sort()
    p = lags[len(lags) // 2], lags[int(len(lags) * 0.99)], lags[-1]
    return (
        f"lag p50 {p[0]:.2f} ms, p99 {p[1]:.2f} ms, max {p[2]:.1f} ms; {checks / took:.0f} checks/s"
    )


async def pools(checks: int) -> None:
    workers = max(1, min(4, (os.cpu_count() or 2) - 1))
    print(f"loop lag, {checks} scrypt checks, 16 at a time ({os.cpu_count()} CPUs):")
    print(f"  inline on the loop:        {await loop_lag(None, None, checks)}")
    with ThreadPoolExecutor(workers) as threads:
        print(f"  thread pool ({workers} workers):  {await loop_lag(None, threads, checks)}")
    with ProcessPoolExecutor(workers) as processes:
        await loop_lag(None, processes, 16)  # start the workers first
        print(f"  process pool ({workers} workers): {await loop_lag(None, processes, checks)}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checks", type=int, default=64)
    args = parser.parse_args()
    for security in (True, False):
        before, after = rss_under_lying_inits(security)
        print(
            f"security {'on ' if security else 'off'}: peak RSS {before / 1024:.1f} MiB -> "
            f"{after / 1024:.1f} MiB after {len(LYING)} lying sasl-inits"
        )
    asyncio.run(pools(args.checks))


if __name__ == "__main__":
    main()
