"""Hostile input, eighth attack pass (issue 15): the newest surfaces (size units in
configuration text, the management address's config loader, ...).

Real broker on port 0, real AMQP clients and raw bytes over loopback.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from proton import Message
from proton.utils import BlockingConnection
from support.client import QUEUE, connect, selector
from support.frame_conn import round_trip
from support.process import BrokerProcess

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
