"""The real `amqpbroker run` on port 0 with python-qpid-proton clients over loopback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from proton import Message, Timeout
from proton.utils import BlockingConnection, LinkDetached, SendException
from support.client import (
    QUEUE,
    TOPIC,
    Browse,
    Durable,
    connect,
    receive_bodies,
    selector,
    send,
    settle_modified,
)
from support.process import BrokerProcess, start_broker
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


BROKER_CONFIG = """
address-settings:
  "#":
    dead-letter-address: DLA
    auto-create-dead-letter-resources: true
    max-delivery-attempts: 3
addresses:
  - name: DLA
    anycast:
      - name: DLA
  - name: configured
    anycast:
      - name: configured
"""


def test_ports_json_names_the_bound_port(broker: BrokerProcess) -> None:
    """CONTRACT: port 0 binds a free port and ports.json names it."""
    ports = json.loads((broker.data_dir / "ports.json").read_text())
    assert ports["amqp"] > 0
    with socket.create_connection(("127.0.0.1", ports["amqp"]), timeout=5):
        pass


def test_point_to_point(conn: BlockingConnection) -> None:
    """B-005: send to a queue, receive it, accept it; the queue is then empty."""
    receiver = conn.create_receiver("p2p", options=QUEUE)
    send(conn, "p2p", "hello", "world", caps=("queue",))
    assert receive_bodies(receiver, 2) == ["hello", "world"]
    receiver.close()
    again = conn.create_receiver("p2p", options=QUEUE)
    with pytest.raises(Timeout):
        again.receive(timeout=0.3)


def test_message_bytes_are_forwarded_unchanged(conn: BlockingConnection) -> None:
    """B-018: the consumer sees every section as sent (header, properties, app props)."""
    receiver = conn.create_receiver("exact", options=QUEUE)
    sender = conn.create_sender("exact", options=QUEUE)
    sent = Message(
        body={"k": [1, 2.5, "x"]},
        id="m-1",
        subject="s",
        durable=True,
        priority=7,
        properties={"color": "red", "n": 3},
        annotations={"x-opt-custom": "v"},
        correlation_id="c-1",
    )
    sender.send(sent)
    got = receiver.receive(timeout=5)
    receiver.accept()
    assert (got.body, got.id, got.subject, got.durable, got.priority) == (
        sent.body,
        "m-1",
        "s",
        True,
        7,
    )
    assert got.properties == {"color": "red", "n": 3}
    assert got.annotations["x-opt-custom"] == "v"
    assert got.correlation_id == "c-1"
    assert got.delivery_count == 0


def test_competing_consumers_share_the_queue(broker: BrokerProcess) -> None:
    """Competing consumers each get a share, none gets a duplicate."""
    c1, c2 = connect(broker.url), connect(broker.url)
    r1 = c1.create_receiver("work", credit=10, options=QUEUE)
    r2 = c2.create_receiver("work", credit=10, options=QUEUE)
    producer = connect(broker.url)
    send(producer, "work", *range(20), caps=("queue",))
    got: list[int] = []
    for receiver in (r1, r2):
        while True:
            try:
                got.append(receiver.receive(timeout=0.5).body)
                receiver.accept()
            except Exception:
                break
    assert sorted(got) == list(range(20))
    for c in (c1, c2, producer):
        c.close()


def test_multicast_fan_out(broker: BrokerProcess) -> None:
    """B-002/B-026: each subscriber of a topic gets every message."""
    subscribers = [connect(broker.url) for _ in range(3)]
    receivers = [c.create_receiver("prices", options=TOPIC) for c in subscribers]
    producer = connect(broker.url)
    send(producer, "prices", "p1", "p2", caps=("topic",))
    for receiver in receivers:
        assert receive_bodies(receiver, 2) == ["p1", "p2"]
    for c in [*subscribers, producer]:
        c.close()


def test_fqqn_consumer_reads_one_subscription_queue(conn: BlockingConnection) -> None:
    """B-006: `address::queue` consumes from exactly that queue."""
    sub = conn.create_receiver("fqqn-topic::mine", options=TOPIC)
    send(conn, "fqqn-topic", "only-mine", caps=("topic",))
    assert sub.receive(timeout=5).body == "only-mine"
    sub.accept()


def test_configured_queue_and_auto_created_queue(conn: BlockingConnection) -> None:
    """B-110: configured queues exist at start; a `queue` producer auto-creates one."""
    send(conn, "configured", "c", caps=("queue",))
    send(conn, "auto-made", "a", caps=("queue",))
    for name, body in (("configured", "c"), ("auto-made", "a")):
        receiver = conn.create_receiver(name, options=QUEUE)
        assert receiver.receive(timeout=5).body == body
        receiver.accept()
        receiver.close()


def test_topic_capability_on_a_queue_address_is_refused(conn: BlockingConnection) -> None:
    """B-024: address exists without the requested routing type -> amqp:illegal-state."""
    send(conn, "only-queue", "x", caps=("queue",))
    with pytest.raises(LinkDetached, match="illegal-state"):
        conn.create_receiver("only-queue", options=TOPIC)


def test_fqqn_on_the_wrong_address_is_not_found(conn: BlockingConnection) -> None:
    """B-006: a queue that exists on another address -> amqp:not-found."""
    send(conn, "home", "x", caps=("queue",))
    with pytest.raises(LinkDetached, match="not-found"):
        conn.create_receiver("elsewhere::home")


def test_durable_subscription_survives_reattach(broker: BrokerProcess) -> None:
    """B-026/B-027/B-028: detach keeps the subscription and its messages."""
    sub_conn = connect(broker.url, container="sub-app")
    sub = sub_conn.create_receiver("events", name="audit", options=[TOPIC, Durable()])
    sub.detach()
    sub_conn.close()
    producer = connect(broker.url)
    send(producer, "events", "e1", "e2", caps=("topic",))
    producer.close()
    sub_conn = connect(broker.url, container="sub-app")
    sub = sub_conn.create_receiver("events", name="audit", options=[TOPIC, Durable()])
    assert receive_bodies(sub, 2) == ["e1", "e2"]
    sub.close()
    sub_conn.close()


def test_browse_does_not_consume(conn: BlockingConnection) -> None:
    """B-031: a browser sees the messages and a consumer still gets them."""
    send(conn, "browsed", "b1", "b2", caps=("queue",))
    browser = conn.create_receiver("browsed", options=[QUEUE, Browse()])
    assert [browser.receive(timeout=5).body for _ in range(2)] == ["b1", "b2"]
    browser.close()
    receiver = conn.create_receiver("browsed", options=QUEUE)
    assert receive_bodies(receiver, 2) == ["b1", "b2"]


def test_consumer_selector_filters(conn: BlockingConnection) -> None:
    """B-032: the selector filters what this consumer receives."""
    sender = conn.create_sender("sel", options=QUEUE)
    for color in ("red", "blue", "red"):
        sender.send(Message(body=color, properties={"color": color}))
    blue = conn.create_receiver("sel", options=[QUEUE, selector("color = 'blue'")])
    assert blue.receive(timeout=5).body == "blue"
    blue.accept()
    with pytest.raises(Timeout):
        blue.receive(timeout=0.3)


def test_invalid_selector_refuses_attach(conn: BlockingConnection) -> None:
    """B-032: an invalid selector -> amqp:invalid-field."""
    with pytest.raises(LinkDetached, match="invalid-field"):
        conn.create_receiver("sel2", options=[QUEUE, selector("color = ")])


def test_modified_failed_comes_back_counted_then_dead_letters(
    conn: BlockingConnection,
) -> None:
    """B-044/B-060/B-074: counts 0,1,2; the 3rd failure moves it to DLA::DLQ.<address>."""
    send(conn, "flaky", "poison", caps=("queue",))
    receiver = conn.create_receiver("flaky", options=QUEUE)
    counts = []
    for _ in range(3):
        message = receiver.receive(timeout=5)
        counts.append(message.delivery_count)
        settle_modified(receiver)
    assert counts == [0, 1, 2]
    dlq = conn.create_receiver("DLA::DLQ.flaky")
    dead = dlq.receive(timeout=5)
    dlq.accept()
    assert dead.body == "poison"
    assert dead.delivery_count == 0
    assert dead.annotations["x-opt-ORIG-ADDRESS"] == "flaky"
    assert dead.annotations["x-opt-ORIG-QUEUE"] == "flaky"
    assert dead.annotations["x-opt-DLQ-REASON"] == "max-attempts"


def test_rejected_moves_to_dla_at_once(conn: BlockingConnection) -> None:
    """B-046: rejected dead-letters immediately, into both DLA and DLQ.<address>."""
    send(conn, "strict", "bad", caps=("queue",))
    receiver = conn.create_receiver("strict", options=QUEUE)
    receiver.receive(timeout=5)
    receiver.reject()
    dlq = conn.create_receiver("DLA::DLQ.strict")
    assert dlq.receive(timeout=5).body == "bad"
    dlq.accept()


def test_released_keeps_delivery_count(conn: BlockingConnection) -> None:
    """B-042: released -> same wire delivery-count next time."""
    send(conn, "rel", "r", caps=("queue",))
    receiver = conn.create_receiver("rel", options=QUEUE)
    first = receiver.receive(timeout=5)
    receiver.release(delivered=False)
    second = receiver.receive(timeout=5)
    receiver.accept()
    assert (first.delivery_count, second.delivery_count) == (0, 0)


def test_orderly_close_returns_uncounted(broker: BrokerProcess) -> None:
    """B-053: closing the connection with a close frame does not count the attempt."""
    producer = connect(broker.url)
    send(producer, "polite", "x", caps=("queue",))
    leaver = connect(broker.url)
    receiver = leaver.create_receiver("polite", options=QUEUE)
    assert receiver.receive(timeout=5).delivery_count == 0
    leaver.close()
    survivor = producer.create_receiver("polite", options=QUEUE)
    assert survivor.receive(timeout=5).delivery_count == 0
    survivor.accept()
    producer.close()


def test_anonymous_relay_without_to_is_rejected(conn: BlockingConnection) -> None:
    """B-009: the anonymous relay rejects a message without `to`."""
    relay = conn.create_sender(None)
    relay.send(Message(address="relay-q", body="ok"))
    with pytest.raises(SendException):
        relay.send(Message(body="nowhere"))


def test_garbage_bytes_close_only_that_connection(broker: BrokerProcess) -> None:
    """B-153: a framing error closes that connection; the broker keeps serving."""
    with socket.create_connection(("127.0.0.1", broker.ports["amqp"]), timeout=5) as sock:
        sock.sendall(b"AMQP\x00\x01\x00\x00" + b"\xff" * 64)
        sock.settimeout(5)
        data = b""
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    assert data.startswith(b"AMQP")
    healthy = connect(broker.url)
    send(healthy, "still-up", "y", caps=("queue",))
    healthy.close()
    assert broker.proc.poll() is None


def test_bad_config_names_key_and_line_and_does_not_start(tmp_path: Path) -> None:
    """CONTRACT: a bad config names the key and line; the broker does not start."""
    config = tmp_path / "bad.yaml"
    config.write_text(
        "acceptors:\n  - name: amqp\n    url: amqp://127.0.0.1:0\n"
        "address-settings:\n  '#':\n    max-delivery-attempts: ten\n"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "amqpbroker",
            "run",
            "--config",
            str(config),
            "--data-dir",
            str(tmp_path / "data"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert f'{config}:6: address-settings."#".max-delivery-attempts' in result.stderr
    assert not (tmp_path / "data" / "ports.json").exists()


def test_sigterm_stops_cleanly(tmp_path: Path) -> None:
    """CONTRACT: SIGTERM shuts down cleanly with exit code 0 and removes ports.json."""
    running = start_broker(tmp_path)
    connection = connect(running.url)
    assert running.stop() == 0
    wait_until(lambda: not (running.data_dir / "ports.json").exists(), timeout=5)
    connection.close()


SLOW_AFTER_START = """
import runpy, sys, time
import amqpbroker.server as server
real = server.tune_gc
def slow():  # the start-up work after ports.json, slowed down (a loaded machine)
    time.sleep(1.5)
    real()
server.tune_gc = slow
sys.argv[0] = "amqpbroker"
runpy.run_module("amqpbroker", run_name="__main__")
"""


def test_sigterm_right_after_ports_json_still_stops_cleanly(tmp_path: Path) -> None:
    """CONTRACT: SIGTERM stops with exit code 0 even when it comes as soon as ports.json
    names the port, while the process still finishes starting (the handlers were set
    only after start-up, so such a signal killed the broker with -15)."""
    running = start_broker(tmp_path, python=("-c", SLOW_AFTER_START))
    assert running.stop() == 0
    assert not (running.data_dir / "ports.json").exists()
