"""Durability end to end (issue 5): the real broker with its file journal, restarted and
killed with SIGKILL, and python-qpid-proton clients over loopback.

B-095 (counts persisted on return), B-096 (the cap), B-097 (persisted before delivery).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from proton import Message
from support.client import QUEUE, connect, drain, reject_with, settle_modified
from support.process import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

PERSISTENT = """
persistence:
  enabled: true
  sync: true
  persist-delivery-count-before-delivery: {before}
address-settings:
  "#":
    dead-letter-address: DLA
    auto-create-dead-letter-resources: true
    max-delivery-attempts: {attempts}
"""


def _config(*, before: bool = False, attempts: int = 10, extra: str = "") -> str:
    return PERSISTENT.format(before=str(before).lower(), attempts=attempts) + extra


def _send(broker: BrokerProcess, address: str, *bodies: str, durable: bool = True) -> None:
    conn = connect(broker.url)
    try:
        sender = conn.create_sender(address, options=QUEUE)
        for body in bodies:
            sender.send(Message(body=body, durable=durable))  # waits for `accepted`
    finally:
        conn.close()


def _drain(broker: BrokerProcess, address: str, *, timeout: float = 2) -> list[tuple[str, int]]:
    return drain(broker.url, address, first_timeout=timeout)


def test_durable_messages_survive_a_restart_non_durable_do_not(
    tmp_path: Path, spawn: Callable[..., BrokerProcess]
) -> None:
    broker = spawn(tmp_path, _config())
    _send(broker, "orders", "a", "b", "c")
    _send(broker, "orders", "volatile", durable=False)
    assert broker.stop() == 0, broker.log()
    broker = spawn(tmp_path, _config())
    try:
        assert _drain(broker, "orders") == [("a", 0), ("b", 0), ("c", 0)]
        assert "recovered 3 messages" in broker.log()
    finally:
        assert broker.stop() == 0, broker.log()


def test_sigkill_keeps_every_accepted_message_and_its_failed_attempts(
    tmp_path: Path, spawn: Callable[..., BrokerProcess]
) -> None:
    """B-095: modified{delivery-failed} is persisted on return; SIGKILL loses nothing."""
    broker = spawn(tmp_path, _config())
    _send(broker, "jobs", "first")
    conn = connect(broker.url)
    receiver = conn.create_receiver("jobs", credit=1, options=QUEUE)
    assert receiver.receive(timeout=5).body == "first"
    settle_modified(receiver)  # count 1
    assert receiver.receive(timeout=5).delivery_count == 1
    settle_modified(receiver)  # count 2
    conn.close()
    _send(broker, "jobs", "second")
    broker.kill()
    broker = spawn(tmp_path, _config())
    try:
        assert _drain(broker, "jobs") == [("first", 2), ("second", 0)]
    finally:
        assert broker.stop() == 0, broker.log()


@pytest.mark.parametrize(("before", "expected"), [(False, 0), (True, 1)])
def test_in_flight_count_after_a_crash(
    tmp_path: Path, spawn: Callable[..., BrokerProcess], before: bool, expected: int
) -> None:
    """B-097: with persist-delivery-count-before-delivery the unsettled delivery at the
    crash counts as an attempt; without it, it comes back looking like a first delivery."""
    broker = spawn(tmp_path, _config(before=before))
    _send(broker, "inflight", "m")
    conn = connect(broker.url, timeout=1)
    receiver = conn.create_receiver("inflight", credit=1, options=QUEUE)
    assert receiver.receive(timeout=5).delivery_count == 0  # held, never settled
    broker.kill()
    with contextlib.suppress(Exception):  # the broker is gone: no close frame comes back
        conn.close()
    broker = spawn(tmp_path, _config(before=before))
    try:
        assert _drain(broker, "inflight") == [("m", expected)]
    finally:
        assert broker.stop() == 0, broker.log()


def test_max_redelivery_records_caps_the_persisted_count(
    tmp_path: Path, spawn: Callable[..., BrokerProcess]
) -> None:
    """B-096: with max-redelivery-records 1, five failures come back as 1 after a crash."""
    config = _config(extra="max-redelivery-records: 1\n")
    broker = spawn(tmp_path, config)
    _send(broker, "capped", "m")
    conn = connect(broker.url)
    receiver = conn.create_receiver("capped", credit=1, options=QUEUE)
    for attempt in range(5):
        assert receiver.receive(timeout=5).delivery_count == attempt
        settle_modified(receiver)
    conn.close()
    _send(broker, "marker", "m")  # accepted once synced: every earlier append is written
    broker.kill()
    broker = spawn(tmp_path, config)
    try:
        assert _drain(broker, "capped") == [("m", 1)]
    finally:
        assert broker.stop() == 0, broker.log()


def test_dead_letter_move_survives_a_crash_exactly_once(
    tmp_path: Path, spawn: Callable[..., BrokerProcess]
) -> None:
    """The original's ack and the DLQ copy are one journal append: after SIGKILL the
    message is in DLQ.<address>, annotated, and no longer in its queue."""
    broker = spawn(tmp_path, _config(attempts=1))
    _send(broker, "payments", "poison")
    conn = connect(broker.url)
    receiver = conn.create_receiver("payments", credit=1, options=QUEUE)
    receiver.receive(timeout=5)
    reject_with(receiver, "app:bad-input", "cannot parse")
    conn.close()
    # The move needs no fsync (a crash before it is written redelivers the original,
    # at-least-once). A durable send is accepted after its append is synced, and appends
    # are written in order: once it is accepted, the move is on disk too.
    _send(broker, "marker", "m")
    broker.kill()
    broker = spawn(tmp_path, _config(attempts=1))
    try:
        assert _drain(broker, "payments", timeout=1) == []
        conn = connect(broker.url)
        receiver = conn.create_receiver("DLA::DLQ.payments", credit=1)
        copy = receiver.receive(timeout=5)
        receiver.accept()
        conn.close()
        assert copy.body == "poison"
        assert copy.annotations["x-opt-ORIG-ADDRESS"] == "payments"
        assert copy.annotations["x-opt-DLQ-REASON"] == "rejected"
    finally:
        assert broker.stop() == 0, broker.log()


def test_journal_export_lists_queues_messages_and_counts(
    tmp_path: Path, spawn: Callable[..., BrokerProcess]
) -> None:
    broker = spawn(tmp_path, _config())
    _send(broker, "exported", "x")
    conn = connect(broker.url)
    receiver = conn.create_receiver("exported", credit=1, options=QUEUE)
    receiver.receive(timeout=5)
    settle_modified(receiver)
    conn.close()
    assert broker.stop() == 0, broker.log()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "amqpbroker",
            "journal",
            "export",
            "--data-dir",
            str(broker.data_dir),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    queues = {line["name"]: line for line in lines if line["kind"] == "queue"}
    assert queues["exported"]["routing_type"] == "ANYCAST"
    [message] = [line for line in lines if line["kind"] == "message"]
    assert message["address"] == "exported"
    assert message["queues"] == [{"queue": "exported", "delivery_count": 1, "scheduled_at_ms": 0}]


def test_a_corrupt_record_in_the_middle_stops_the_start_until_told_to_skip(
    tmp_path: Path,
    spawn: Callable[..., BrokerProcess],
) -> None:
    broker = spawn(tmp_path, _config())
    _send(broker, "fragile", "one")
    _send(broker, "fragile", "two")
    assert broker.stop() == 0, broker.log()
    [segment] = sorted((broker.data_dir / "journal").glob("journal-*.seg"))
    data = bytearray(segment.read_bytes())
    middle = data.find(b"one")
    data[middle] ^= 0xFF  # flip a byte of the first message: its crc no longer matches
    segment.write_bytes(bytes(data))
    with pytest.raises(AssertionError, match="corrupt"):
        spawn(tmp_path, _config())
    broker = spawn(tmp_path, _config(), args=("--skip-corrupt-journal",))
    try:
        assert _drain(broker, "fragile") == [("two", 0)]
    finally:
        assert broker.stop() == 0, broker.log()


def test_journal_metrics_show_syncs_and_size(
    tmp_path: Path, spawn: Callable[..., BrokerProcess]
) -> None:
    import urllib.request

    broker = spawn(tmp_path, _config())
    try:
        _send(broker, "metered", "x", "y")
        url = f"http://127.0.0.1:{broker.ports['http']}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        values = {
            line.split(" ")[0]: float(line.split(" ")[1])
            for line in text.splitlines()
            if line.startswith("amqpbroker_journal_")
        }
        assert values["amqpbroker_journal_size_bytes"] > 0
        assert values["amqpbroker_journal_sync_seconds_count"] >= 1  # group commits
        assert (
            values['amqpbroker_journal_sync_seconds_bucket{le="+Inf"}']
            == values["amqpbroker_journal_sync_seconds_count"]
        )
    finally:
        assert broker.stop() == 0, broker.log()


@pytest.mark.parametrize(
    "annotation",
    [
        {"x-opt-delivery-time": 2**64 - 1},  # a ulong past the journal's i64
        {"x-opt-delivery-delay": 2**63 - 1},  # receipt time + a long: past it too
    ],
)
def test_a_delivery_time_past_a_long_is_stored_and_later_durable_sends_too(
    tmp_path: Path, spawn: Callable[..., BrokerProcess], annotation: dict[str, int]
) -> None:
    """Issue 15 attack, B-015/B-095: one durable message scheduled past what the journal
    stores (i64 ms) failed the journal's encoding, and from then on every durable send on
    every connection was refused (resource-limit-exceeded) until a restart. Now it is
    scheduled at the latest time a long holds; other sends are stored; both survive."""
    from proton import symbol, ulong

    broker = spawn(tmp_path, _config())
    key, value = next(iter(annotation.items()))
    conn = connect(broker.url)
    try:
        sender = conn.create_sender("far", options=QUEUE)
        sender.send(Message(body="far", durable=True, annotations={symbol(key): ulong(value)}))
    finally:
        conn.close()
    _send(broker, "orders", "after")  # SendException (rejected) before the fix
    assert broker.stop() == 0, broker.log()
    broker = spawn(tmp_path, _config())
    try:
        assert _drain(broker, "orders") == [("after", 0)]
        assert _drain(broker, "far", timeout=0.5) == []  # still scheduled
        assert "recovered 2 messages" in broker.log()
    finally:
        assert broker.stop() == 0, broker.log()
