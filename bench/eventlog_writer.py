"""CPU of the event-log writer process per 10,000 queue messages (issue 20, B-170).

Feeds frames through the writer process alone (`python -m amqpbroker.eventlog.child`) and
prints its user+system CPU-seconds (os.wait4: not wall time, which the machine's load makes
meaningless), per 10,000 messages, median of REPS runs. The frames are what the broker
sends for the queue scenario (`make bench`'s): per message `sent`, `enqueued`,
`dispatched` (each carrying the message's bytes, once per frame) and `acked` (`KNOWN`),
~3,800 events a frame, 1 KiB bodies with the C generator's two application properties;
shipped settings (level lifecycle, `body-hash: keyed`, compress). FRAMES=path replays a
capture of the broker's pipe instead (raw stdin bytes of the writer process).

    PYTHON=.venv/bin/python N=30000 REPS=3 python3 bench/eventlog_writer.py
    VERBOSE=1 ...           # user and system CPU-seconds apart
    COMPRESS=0 ...          # rotated files not gzipped
    WRAP="valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p" N=3000 REPS=1 ...
        # instructions instead of CPU-s (noise-free under load): the difference between
        # N=3000 and N=6000 runs, over 3000, is the writer's instructions a message

It prints one line per run and the median; the written files are checked to hold N*4
lines (a writer that dropped events would look cheap). The per-10k figure includes the
process's fixed cost (start-up, imports, exit: ~0.08-0.09 CPU-s, what `N=10` measures),
~0.03 of it at N=30000; a larger N, less an `N=10` run, gives the cost a message.

The compiled build's writer uses `eventlog/_lines.c` (setup.py C_MODULES); a tree other
than the installed one goes first on PYTHONPATH, which the writer process inherits:

    PYTHONPATH=/tmp/T MODULE=amqpbroker.eventlog.child_base PYTHON=.venv/bin/python ...

SCENARIO=redelivery gives the frames of the redelivery scenario instead (issue 20): per
message also a `returned` (reason modified-failed, the shared delay-0 extra the broker's
`Queue._note_returned` sends) and a second `dispatched` (count 1), both `KNOWN`: six
lines a message.
"""

from __future__ import annotations

import gzip
import json
import marshal
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

N = int(os.environ.get("N", "30000"))
REPS = int(os.environ.get("REPS", "3"))
PYTHON = os.environ.get("PYTHON", sys.executable)
if os.sep in PYTHON:
    PYTHON = os.path.abspath(PYTHON)  # the writer runs in a temp dir
FRAMES = os.environ.get("FRAMES")
REDELIVERY = os.environ.get("SCENARIO", "queue") == "redelivery"
LINES = 6 if REDELIVERY else 4  # a message's events
COMPRESS = os.environ.get("COMPRESS", "1") != "0"
MODULE = os.environ.get("MODULE", "amqpbroker.eventlog.child")
WRAP = os.environ.get("WRAP", "").split()  # e.g. WRAP="valgrind --tool=callgrind"
PER_FRAME = 950  # messages a frame (~3,800 events: a loaded broker's loop turn)
KNOWN = 0


def _message(seq: int, ts: int) -> bytes:
    """A queue message as the C generator sends it: empty header and properties,
    application-properties {bench-sq: long, bench-ts: long}, a 1 KiB data section."""
    app = (
        b"\xa1\x08bench-sq\x81"
        + seq.to_bytes(8, "big")
        + b"\xa1\x08bench-ts\x81"
        + ts.to_bytes(8, "big")
    )
    return (
        b"\x00SpE\x00SsE\x00St\xd1"
        + (len(app) + 4).to_bytes(4, "big")
        + (4).to_bytes(4, "big")
        + app
        + b"\x00Sw\xb0"
        + (1024).to_bytes(4, "big")
        + b"x" * 1024
    )


def synthetic(n: int) -> bytes:
    """The broker's frames for `n` queue messages, framed as `eventlog.frames` does."""
    address = "bench.queue.1795943097001"
    sent = ("sent", (address, None, None), ("amqp-cgen-send-1-2", None), None)
    enq = ("enqueued", (address, address, "ANYCAST"), None, "route")
    disp = ("dispatched", (address, address, "ANYCAST"), ("amqp-cgen-recv-1-3", "recv"), None)
    acked = ("acked", (address, address, "ANYCAST"), ("amqp-cgen-recv-1-3", "recv"), None)
    where, by = (address, address, "ANYCAST"), ("amqp-cgen-recv-1-3", "recv")
    back = ("returned", where, by, "modified-failed")
    at_once = (None, None, None, None, 0, None, None, None)
    targets = (None, None, (address,), None, None, None, None, None)
    out = bytearray()
    seq = 1
    ts = 1795943097836
    for start in range(0, n, PER_FRAME):
        events: list[tuple[Any, ...]] = []
        for msg_id in range(start + 1, min(start + PER_FRAME, n) + 1):
            data = _message(msg_id, ts * 1000)
            part = (msg_id, False, len(data), ts, data)
            events.append((sent, ts, part, None, targets))
            events.append((enq, ts, part, None, None))
            events.append((disp, ts, part, 0, None))
            known = (msg_id, False, len(data), ts, KNOWN)
            if REDELIVERY:
                events.append((back, ts + 1, known, 1, at_once))
                events.append((disp, ts + 1, known, 1, None))
            events.append((acked, ts + 1, known, None, None))
        payload = marshal.dumps((seq, ts, events))
        out += len(payload).to_bytes(4, "little") + payload
        seq += len(events)
        ts += 3
    return bytes(out)


def run_once(frames: bytes, directory: Path) -> tuple[float, int]:
    """One writer process over `frames`: (its CPU-seconds, lines written)."""
    events = directory / "events"
    config = {
        "directory": str(events),
        "broker": "amqpbroker",
        "properties": [],
        "body_hash": "keyed",
        "body_key_file": str(directory / "event-log.key"),
        "max_file_bytes": 64 << 20,
        "max_file_age": 300000,
        "compress": COMPRESS,
        "max_total_bytes": None,
        "max_age": 604800000,
        "keep_until_analyzed": False,
        "min_free_bytes": None,
    }
    source = directory / "frames.bin"
    source.write_bytes(frames)
    with source.open("rb") as stdin:
        proc = subprocess.Popen(
            [*WRAP, PYTHON, "-m", MODULE, json.dumps(config)],
            stdin=stdin,
            stdout=subprocess.DEVNULL,
            cwd=directory,
        )
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"writer exited with {proc.returncode}")
    lines = 0
    for path in events.iterdir():
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rb") as f:
            lines += sum(1 for _ in f)
    if os.environ.get("VERBOSE"):
        print(f"  user {usage.ru_utime:.3f} system {usage.ru_stime:.3f}")
    return usage.ru_utime + usage.ru_stime, lines


def main() -> None:
    frames = Path(FRAMES).read_bytes() if FRAMES else synthetic(N)
    messages = N if not FRAMES else None
    results = []
    for rep in range(REPS):
        with tempfile.TemporaryDirectory(prefix="eventlog-writer-") as tmp:
            cpu, lines = run_once(frames, Path(tmp))
        if messages is None:
            messages = lines // LINES
        elif lines != messages * LINES:
            raise SystemExit(f"wrote {lines} lines, expected {messages * LINES}")
        per = cpu / messages * 10000
        results.append(per)
        print(f"rep {rep + 1}: {cpu:.3f} CPU-s, {lines} lines, {per:.3f} CPU-s per 10k messages")
    print(f"median {statistics.median(results):.3f} CPU-s per 10k messages ({PYTHON}, {MODULE})")


if __name__ == "__main__":
    main()
