"""A synthetic lifecycle event log (B-170/B-171) with planted poison and an outage window.

Used by the analytics tests (small) and `bench/analytics.sh` (1M/10M events). The lines
have the exact field order and shape of `amqpbroker.eventlog`, so the job reads them as it
reads a real broker's log. What is planted is returned, so a test can check that the job
finds exactly that:

* every message: sent, enqueued, dispatched (+ returned modified-failed, dispatched ... ),
  then acked or dead-lettered (the copy enqueued on `DLQ.<queue>`);
* background noise: 1 in 100 deliveries fails once and then succeeds; 1 in 500 messages
  is rejected with `app:validation` (dead-lettered, not transient, not poison);
* an outage on `orders-1` for `outage_windows` whole windows in the middle of the span:
  every delivery fails until max-delivery-attempts (3), so the message is dead-lettered;
  some of those copies are consumed from the DLQ (acked there: no longer redrivable);
* planted poison: payloads (one body hash each) sent as 3 messages at random times,
  each failing on every attempt on several consumers; one of them inside the outage.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

from amqpbroker.eventlog.child import EVENT_FIELDS

MAX_ATTEMPTS = 3
OUTAGE_QUEUE = "orders-1"
_INT = {"ts", "seq", "msg_id", "size", "delivery_count", "copy_msg_id", "delay_ms", "first_ts"}
_TEMPLATE = "{" + ",".join(f'"{n}":%({n})s' for n in EVENT_FIELDS) + "}\n"


@dataclass
class Planted:
    """What the generator planted, to compare with what the job finds."""

    events: int = 0
    malformed_lines: int = 0
    poison_body_hashes: set[str] = field(default_factory=set)
    # (DLQ copy msg_id, DLQ name) of outage victims still in the DLQ: the redrive list.
    redrive: set[tuple[int, str]] = field(default_factory=set)
    window_ms: int = 60_000


def _j(value: object) -> str:
    return json.dumps(value)


class _Writer:
    """Writes events in order into files of about `file_events` lines."""

    def __init__(
        self, directory: Path, *, file_events: int, first_seq: int = 1, prefix: str = "events-synth"
    ) -> None:
        self.directory = directory
        self.file_events = file_events
        self.seq = first_seq - 1
        self.prefix = prefix
        self.lines: list[str] = []
        self.files = 0
        directory.mkdir(parents=True, exist_ok=True)

    def event(self, values: dict[str, object]) -> None:
        self.seq += 1
        row = {name: "null" for name in EVENT_FIELDS}
        row["seq"] = str(self.seq)
        row["broker"] = '"synth"'
        for name, value in values.items():
            if value is None:
                continue
            if name in _INT:
                row[name] = str(value)
            elif name == "durable":
                row[name] = "true" if value else "false"
            else:
                row[name] = _j(value)
        self.lines.append(_TEMPLATE % row)
        if len(self.lines) >= self.file_events:
            self.flush()

    def raw(self, line: str) -> None:
        self.lines.append(line)

    def flush(self) -> None:
        if not self.lines:
            return
        path = self.directory / f"{self.prefix}-{self.files:05d}.jsonl"
        path.write_text("".join(self.lines))
        self.files += 1
        self.lines = []


def generate(
    directory: Path,
    *,
    events: int,
    queues: int = 8,
    poison_payloads: int = 20,
    outage_windows: int = 5,
    malformed_lines: int = 7,
    start_ms: int = 1_767_225_600_000,  # 2026-01-01T00:00:00Z
    window_ms: int = 60_000,
    seed: int = 7,
    file_events: int = 250_000,
    first_id: int = 1,
    first_seq: int = 1,
    prefix: str = "events-synth",
) -> Planted:
    """Write about `events` events into `directory`; return what was planted. `first_id`,
    `first_seq` and `prefix` continue an earlier log (the next rotated files of the same
    broker run: bench/analytics.sh's second run)."""
    rng = random.Random(seed)
    out = _Writer(directory, file_events=file_events, first_seq=first_seq, prefix=prefix)
    planted = Planted(window_ms=window_ms)
    messages = max(events // 4, 200)
    windows = max(messages * 4 // 10_000, 3 * outage_windows + 3)  # ~10k events per window
    span_ms = windows * window_ms
    outage_start = start_ms + (windows // 2) * window_ms
    outage_end = outage_start + outage_windows * window_ms
    next_id = first_id

    def new_id() -> int:
        nonlocal next_id
        next_id += 1
        return next_id

    sends: list[tuple[int, str, str | None]] = []  # (ts, queue, poison body hash)
    for _ in range(messages):
        sends.append((start_ms + rng.randrange(span_ms), f"orders-{rng.randrange(queues)}", None))
    for p in range(poison_payloads):
        body_hash = f"{0xBAD0000000000000 + p:016x}"
        planted.poison_body_hashes.add(body_hash)
        for _ in range(3):
            ts = start_ms + rng.randrange(span_ms)
            while outage_start - 1_000 <= ts < outage_end + 1_000:
                ts = start_ms + rng.randrange(span_ms)
            sends.append((ts, f"orders-{rng.randrange(queues)}", body_hash))
    if poison_payloads:  # one poison message inside the outage: never a redrive candidate
        sends.append((outage_start + window_ms, OUTAGE_QUEUE, f"{0xBAD0000000000000:016x}"))
    sends.sort(key=lambda send: send[0])
    for ts, queue, poison in sends:
        msg_id = new_id()
        body_hash = poison or f"{rng.getrandbits(64):016x}"
        in_outage = (
            queue == OUTAGE_QUEUE and outage_start <= ts < outage_end - 1_000 and poison is None
        )
        base: dict[str, object] = {
            "msg_id": msg_id,
            "amqp_message_id": f"m-{msg_id}",
            "address": queue,
            "durable": True,
            "size": 200 + msg_id % 300,
            "first_ts": ts,
            "body_hash": body_hash,
        }
        out.event({**base, "ts": ts, "event": "sent", "connection": "producer"})
        queued = {**base, "queue": queue, "routing_type": "ANYCAST"}
        out.event({**queued, "ts": ts, "event": "enqueued", "reason": "route", "delivery_count": 0})
        now = ts
        attempts = 0
        while True:
            attempts += 1
            now += 1 + rng.randrange(5)
            consumer = f"worker-{rng.randrange(4)}"
            link = {"connection": consumer, "link": "in"}
            out.event(
                {**queued, **link, "ts": now, "event": "dispatched", "delivery_count": attempts}
            )
            now += 1 + rng.randrange(20)
            # Poison and outage deliveries always fail; others fail once, 1 in 100.
            failed = bool(poison or in_outage) or (attempts == 1 and rng.random() < 0.01)
            if not failed:
                if poison is None and attempts == 1 and rng.random() < 0.002:
                    _dead_letter(
                        out,
                        queued,
                        now=now,
                        attempts=attempts,
                        reason="rejected",
                        condition="app:validation",
                        copy_id=new_id(),
                    )
                    break
                out.event(
                    {
                        **queued,
                        **link,
                        "ts": now,
                        "event": "acked",
                        "reason": "accepted",
                        "delivery_count": attempts,
                    }
                )
                break
            if attempts >= MAX_ATTEMPTS:
                copy_id = new_id()
                dlq = f"DLQ.{queue}"
                _dead_letter(
                    out,
                    queued,
                    now=now,
                    attempts=attempts,
                    reason="max-attempts",
                    condition=None,
                    copy_id=copy_id,
                )
                if in_outage:
                    if rng.random() < 0.1:  # someone already handled this one by hand
                        out.event(
                            {
                                **queued,
                                "msg_id": copy_id,
                                "queue": dlq,
                                "address": "DLA",
                                "routing_type": "MULTICAST",
                                "ts": now + 50,
                                "event": "acked",
                                "reason": "accepted",
                                "connection": "triage",
                                "link": "dlq",
                                "delivery_count": 1,
                            }
                        )
                    else:
                        planted.redrive.add((copy_id, dlq))
                break
            out.event(
                {
                    **queued,
                    **link,
                    "ts": now,
                    "event": "returned",
                    "reason": "modified-failed",
                    "delivery_count": attempts,
                    "delay_ms": 0,
                }
            )
    for n in range(malformed_lines):
        out.raw(['{"ts": 1, "event": ', "not json at all", '{"ts":"x","event":"sent"}'][n % 3])
        out.raw("\n")
    planted.malformed_lines = malformed_lines
    out.flush()
    planted.events = out.seq - first_seq + 1
    return planted


def _dead_letter(
    out: _Writer,
    queued: dict[str, object],
    *,
    now: int,
    attempts: int,
    reason: str,
    condition: str | None,
    copy_id: int,
) -> None:
    dlq = f"DLQ.{queued['queue']}"
    out.event(
        {
            **queued,
            "ts": now,
            "event": "dead-lettered",
            "reason": reason,
            "delivery_count": attempts,
            "target_address": "DLA",
            "target_queues": [dlq],
            "copy_msg_id": copy_id,
            "error_condition": condition,
            "error_description": "invalid payload" if condition else None,
        }
    )
    out.event(
        {
            **queued,
            "msg_id": copy_id,
            "queue": dlq,
            "address": "DLA",
            "routing_type": "MULTICAST",
            "ts": now,
            "event": "enqueued",
            "reason": "move",
            "delivery_count": 0,
        }
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--start-ms", type=int, default=1_767_225_600_000)
    parser.add_argument("--first-id", type=int, default=1)
    parser.add_argument("--first-seq", type=int, default=1)
    parser.add_argument("--prefix", default="events-synth")
    parser.add_argument("--outage-windows", type=int, default=5)
    args = parser.parse_args(argv)
    planted = generate(
        args.directory,
        events=args.events,
        seed=args.seed,
        start_ms=args.start_ms,
        first_id=args.first_id,
        first_seq=args.first_seq,
        prefix=args.prefix,
        outage_windows=args.outage_windows,
    )
    sys.stdout.write(
        f"{planted.events} events, {planted.malformed_lines} malformed lines, "
        f"{len(planted.poison_body_hashes)} poison payloads, "
        f"{len(planted.redrive)} redrive candidates in {args.directory}\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
