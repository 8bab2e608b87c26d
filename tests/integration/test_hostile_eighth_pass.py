"""Hostile input, eighth attack pass (issue 15): the newest surfaces (size units in
configuration text, the management address's config loader, ...).

Real broker on port 0, real AMQP clients and raw bytes over loopback.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from proton import Message
from proton.utils import BlockingConnection
from support.client import QUEUE, connect, selector
from support.frame_conn import round_trip
from support.process import BrokerProcess, write_config

from amqpbroker.core.records import RecordType
from amqpbroker.store.segments import FRAME_BYTES, HEADER_BYTES

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

BROKER_LOG_LEVEL = "info"

MANAGEMENT = "activemq.management"


def _call(conn: BlockingConnection, operation: str, *args: Any) -> tuple[bool, Any]:
    """A broker operation on the management address: (succeeded, the reply's value)."""
    replies = conn.create_receiver(None, dynamic=True)
    sender = conn.create_sender(MANAGEMENT)
    try:
        request = Message(
            body=json.dumps(args),
            properties={"_AMQ_ResourceName": "broker", "_AMQ_OperationName": operation},
            reply_to=replies.remote_source.address,
            id="eighth",
        )
        sender.send(request)
        reply = replies.receive(timeout=10)
        replies.accept()
    finally:
        sender.close()
        replies.close()
    (result,) = json.loads(reply.body)
    return reply.properties["_AMQ_OperationSucceeded"], result


@pytest.mark.parametrize(
    "size",
    [
        "1" * 5000,  # past Python's 4,300 digits for int(): ValueError escaped
        "1" * 5000 + "MiB",
        "\uff11\uff10MB",  # fullwidth digits: `\d` and int() took them as 10 MiB
        "\u0661\u0660",  # Arabic-Indic digits
    ],
)
def test_a_size_text_that_is_no_ascii_number_is_refused_by_the_management_address(
    broker: BrokerProcess, size: str
) -> None:
    """Eighth attack pass (B-153, B-162): `addAddressSettings` hands its JSON to the
    config loader, whose size text (`10MiB`, user pass) went through `int()`: 5,000
    digits raised ValueError out of the request (no reply; the connection closed with
    an internal error) and non-ASCII digits were read as numbers. Now both are a failure
    reply naming the key, and the connection serves the next request."""
    conn = connect(broker.url)
    try:
        succeeded, text = _call(
            conn, "addAddressSettings", "eighth.#", json.dumps({"max-size-bytes": size})
        )
        assert not succeeded
        assert "max-size-bytes: not a size" in text, text
        assert _call(conn, "getAddressSettingsAsJSON", "eighth.x")[0]
    finally:
        conn.close()


@pytest.mark.timing  # the loop's stall, against a wall-clock bound
def test_a_like_pattern_with_underscores_does_not_stall_the_loop(broker: BrokerProcess) -> None:
    """Eighth attack pass (B-130, issue 15): LIKE's runs with `_` were searched a
    position at a time, each position compared over the whole run: a consumer's
    `p LIKE '%aaaa...(2,000)_b%'` on a message whose `p` is 300,000 `a`s took ~40 CPU-s of
    the event loop per message offered (every connection stalled). The search is now
    bounded (LIKE_STEPS characters compared an evaluation, then a runtime failure: no
    match); another client's round trip is answered at once."""
    conn = connect(broker.url)
    try:
        pattern = "%" + "a" * 2000 + "_b%"
        receiver = conn.create_receiver(
            "like.slow", options=[QUEUE, selector(f"p LIKE '{pattern}'")], credit=1
        )
        sender = conn.create_sender("like.slow", options=QUEUE)
        sender.send(Message(body="x", properties={"p": "a" * 300_000}))
        started = time.monotonic()
        assert round_trip(broker, "like.other") == ["still here"]
        assert time.monotonic() - started < 10
        assert receiver.queued == 0  # it does not match
    finally:
        conn.close()


def _retype_first(segment: Path, type_id: int, at: int, tag: int) -> None:
    """Set the value tag at payload offset `at` of the first `type_id` frame to `tag`,
    and give the frame the crc of what it now holds (the damage a crc cannot see)."""
    data = bytearray(segment.read_bytes())
    pos = HEADER_BYTES
    while True:
        length, _, frame_type, _ = struct.unpack_from("<IIHH", data, pos)
        if frame_type == type_id:
            break
        pos += FRAME_BYTES + length
    data[pos + FRAME_BYTES + at] = tag
    end = pos + FRAME_BYTES + length
    crc = zlib.crc32(bytes(data[pos + 8 : end]), zlib.crc32(bytes(data[pos : pos + 4])))
    struct.pack_into("<I", data, pos + 4, crc)
    segment.write_bytes(bytes(data))


def test_a_journal_record_of_the_wrong_value_type_is_a_corrupt_journal(
    spawn: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    """Eighth attack pass (B-095, B-153): an AddAddress whose name's tag says bytes (a
    flipped bit the crc did not see; found by mutating a real journal and refitting the
    crc) was handed to recovery as it decoded: the start failed with a TypeError
    traceback out of the wildcard matcher. It is now a corrupt journal, named with file
    and offset: `cannot start`, exit 1, no traceback."""
    config = "persistence:\n  enabled: true\n"
    first = spawn(tmp_path, config, log_level="info")
    conn = connect(first.url)
    conn.create_sender("typed.addr", options=QUEUE).send(Message(body="x", durable=True))
    conn.close()
    assert first.stop() == 0
    (segment,) = (tmp_path / "data" / "journal").glob("journal-*.seg")
    _retype_first(segment, RecordType.ADD_ADDRESS, 1, 5)  # name: str (4) -> bytes (5)
    (tmp_path / "data" / "ports.json").unlink(missing_ok=True)
    command = [sys.executable, "-m", "amqpbroker", "run", "--log-level", "info"]
    command += ["--config", str(write_config(tmp_path, config))]
    again = subprocess.run(
        [*command, "--data-dir", str(tmp_path / "data")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = again.stdout + again.stderr
    assert again.returncode == 1, output
    assert "Traceback" not in output
    assert "cannot start: journal corrupt:" in output
    assert "bad AddAddress payload: name is a bytes" in output
