"""B-151 BLOCK with a real client on the anonymous relay (issue 23 item 1): a producer
with a null target cannot get past an address's limit by more than its credit window."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from proton import Message
from proton.utils import BlockingSender, SendException
from support.client import Capabilities, connect, receive_bodies
from support.process import BrokerProcess, start_broker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

LIMIT = 100 * 1024  # max-size-bytes of the address
BODY = b"x" * 1024
CREDIT_WINDOW = 1000  # protocol/handler.py PRODUCER_CREDIT: what a link may overshoot by


def _api(broker: BrokerProcess, path: str) -> Any:
    url = f"http://127.0.0.1:{broker.ports['http']}{path}"
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def _send_until_blocked(sender: BlockingSender, total: int) -> int:
    """Send `total` messages to `q` on an anonymous relay; how many went before the
    broker stopped granting credit (a blocked send times out)."""
    sent = 0
    try:
        for _ in range(total):
            sender.send(Message(address="q", body=BODY, durable=False))
            sent += 1
    except (SendException, Exception) as e:  # proton's Timeout: no credit came
        if type(e).__name__ != "Timeout":
            raise
    return sent


# The two limits that pace a relay under BLOCK (B-151): its address's own, and, with no
# address limit, the broker-wide one (issue 23: "the anonymous relay is paced by the
# broker-wide limit under BLOCK", so no producer gets past a limit with a null target).
RELAY_LIMITS = {
    "address-limit": f"""
        address-settings:
          "#": {{max-size-bytes: {LIMIT}, address-full-policy: BLOCK}}
        """,
    "broker-wide-limit": f"""
        global-max-size: {LIMIT}
        address-settings:
          "#": {{address-full-policy: BLOCK}}
        """,
}


@pytest.mark.parametrize("limit", sorted(RELAY_LIMITS))
def test_anonymous_relay_is_blocked_at_the_limit(tmp_path: Path, limit: str) -> None:
    """B-151 BLOCK: the relay gets no more credit once the limit is reached; the address
    holds at most the limit + one credit window, not more; after a drain the same relay
    link gets credit and sends again (the send that timed out goes first)."""
    broker = start_broker(
        tmp_path,
        RELAY_LIMITS[limit]
        + """
        addresses:
          - name: q
            anycast: [{name: q, durable: false}]
        """,
    )
    try:
        producer = connect(broker.url, timeout=3)
        relay = producer.create_sender(None)
        sent = _send_until_blocked(relay, 5 * CREDIT_WINDOW)
        assert sent < 5 * CREDIT_WINDOW, "the relay was never blocked"
        held = _api(broker, "/api/v1/queues/q")["messages"]
        assert held == sent
        assert held * len(BODY) <= LIMIT + CREDIT_WINDOW * (len(BODY) + 100)
        consumer = connect(broker.url)
        receiver = consumer.create_receiver("q", credit=200, options=Capabilities("queue"))
        assert len(receive_bodies(receiver, held)) == held
        consumer.close()
        relay.send(Message(address="q", body=b"after", durable=False))
        assert _api(broker, "/api/v1/queues/q")["messages"] == 2
        producer.close()
    finally:
        broker.stop()


def test_a_producer_past_its_credit_or_attaching_again_is_held_at_the_limit(
    tmp_path: Path,
) -> None:
    """B-151 BLOCK, third attack pass: a raw producer that ignored credit put 3,000 1 KiB
    messages on an address of max-size-bytes 10,000 (Proton counts the credit below zero
    and hands the transfers on); one that attached again got 1,000 credit each time. Now
    a transfer without credit detaches its link with transfer-limit-exceeded and is
    dropped, and a new link to a full address gets no credit until it has room."""
    import socket

    from support import frames as F
    from support.raw import read_until_closed

    broker = start_broker(
        tmp_path,
        """
        address-settings:
          "blk.#": {address-full-policy: BLOCK, max-size-bytes: 10000}
        """,
    )
    try:
        with socket.create_connection(("127.0.0.1", broker.ports["amqp"]), timeout=5) as sock:
            attach = F.attach("p", role_receiver=False, target=F.target("blk.a", "queue"))
            sock.sendall(
                F.AMQP_HEADER
                + F.frame(F.open_())
                + F.frame(F.begin(incoming_window=65535))
                + F.frame(attach)
            )
            received = b""
            while not any(F.performative_code(p) == F.FLOW for _, _, p in F.read_frames(received)):
                chunk = sock.recv(65536)
                assert chunk, received
                received += chunk
            sock.sendall(
                b"".join(
                    F.frame(
                        F.transfer(delivery_id=i, tag=str(i).encode(), settled=True),
                        payload=F.message("x" * 1000),
                    )
                    for i in range(3000)
                )
            )
            received, _ = read_until_closed(sock, 3.0)
        errors = [F.error_of(p) for _, _, p in F.read_frames(received)]
        assert any(e is not None and e[0] == "amqp:link:transfer-limit-exceeded" for e in errors)
        held = _api(broker, "/api/v1/queues/blk.a")["messages"]
        assert held == CREDIT_WINDOW  # what the first link's credit allowed, no more
        producer = connect(broker.url, timeout=2)
        sender = producer.create_sender("blk.a", options=Capabilities("queue"))
        assert sender.link.credit == 0  # full: a new link gets none
        producer.close()
        assert _api(broker, "/api/v1/queues/blk.a")["messages"] == held
    finally:
        broker.stop()
