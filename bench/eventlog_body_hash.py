"""Micro-benchmark: what `event-log.body-hash: keyed` (the default, issue 22) costs.

    /work/main/.venv/bin/python bench/eventlog_body_hash.py

Broker loop: a frame of 1,000 events (250 messages x sent/enqueued/dispatched/acked, one
shared message part each, as core.lifecycle builds them) marshalled for the writer pipe,
with the message's head (~100 bytes: `body-hash: false`, no properties) or its whole bytes
(`keyed` or `true`). Writer process: the hash of one body, once per message (cached by
msg_id), SHA-256 (`true`) against HMAC-SHA-256 (`keyed`). Best of 7 repeats.
"""

from __future__ import annotations

import hashlib
import hmac
import marshal
import os
import timeit


def best(run: object, number: int) -> float:
    return min(timeit.repeat(run, number=number, repeat=7)) / number  # type: ignore[arg-type]


def frame(size: int, length: int) -> tuple[int, int, list[tuple[object, ...]]]:
    events: list[tuple[object, ...]] = []
    for msg_id in range(250):
        part = (msg_id, True, size, 0, os.urandom(length))
        for kind in range(4):
            events.append((("q", kind), 0, part, 1, None))
    return (1, 0, events)


def main() -> None:
    key = os.urandom(32)
    for size in (1024, 16 * 1024):
        head, whole = frame(size, 100), frame(size, size)
        per_head = best(lambda f=head: marshal.dumps(f), 50) / 250 * 1e9
        per_whole = best(lambda f=whole: marshal.dumps(f), 50) / 250 * 1e9
        body = os.urandom(size)
        sha = best(lambda b=body: hashlib.sha256(b).hexdigest()[:16], 2000) * 1e9
        mac = best(lambda b=body: hmac.digest(key, b, "sha256").hex()[:16], 2000) * 1e9
        print(
            f"{size:>6} B messages: loop hand-off per message {per_head:,.0f} ns (head) -> "
            f"{per_whole:,.0f} ns (whole); writer hash per message sha256 {sha:,.0f} ns, "
            f"hmac-sha256 {mac:,.0f} ns"
        )


if __name__ == "__main__":
    main()
