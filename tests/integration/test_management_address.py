"""The AMQP management address `activemq.management` through a plain proton client, sent
exactly as an Artemis tool sends it (issue 19, B-160…B-162, B-154).

A request is a message to `activemq.management` with `reply-to` (here a dynamic receiver's
temporary queue), `_AMQ_ResourceName`, and `_AMQ_OperationName` with a JSON-array body or
`_AMQ_Attribute`; the reply carries `correlation-id`, `_AMQ_OperationSucceeded` and a
JSON array of one element. One round trip per B-161 operation, the B-162 broker
operations, the `manage` permission, and hostile requests that must get a failure reply
or be dropped while the broker carries on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from proton import Delivery, Message, Timeout, symbol
from proton.utils import (
    BlockingConnection,
    BlockingReceiver,
    BlockingSender,
    LinkDetached,
    SendException,
)
from support.client import QUEUE, connect
from support.process import BrokerProcess, start_broker

from amqpbroker.security import hash_password

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

MANAGEMENT = "activemq.management"


BROKER_CONFIG = """
address-settings:
  "#":
    dead-letter-address: DLA
    auto-create-dead-letter-resources: true
    expiry-address: ExpiryQueue
    auto-create-expiry-resources: true
  "paged.#": {management-browse-page-size: 2}
"""


class Manager:
    """An Artemis-style management client: a sender to the management address and a
    dynamic receiver for the replies."""

    def __init__(self, conn: BlockingConnection, *, target: str | None = MANAGEMENT) -> None:
        self.conn = conn
        self.replies: BlockingReceiver = conn.create_receiver(None, dynamic=True)
        self.reply_to: str = self.replies.remote_source.address
        self.sender: BlockingSender = conn.create_sender(target)
        self.target = target
        self.sent = 0

    def request(self, properties: dict[str, Any], body: Any = "[]", **fields: Any) -> Message:
        self.sent += 1
        fields.setdefault("id", f"req-{self.sent}")
        fields.setdefault("reply_to", self.reply_to)
        if self.target is None:
            fields["address"] = MANAGEMENT
        message = Message(body=body, properties=properties, **fields)
        self.sender.send(message)
        reply = self.replies.receive(timeout=10)
        self.replies.accept()
        assert reply.correlation_id == (fields.get("correlation_id") or fields["id"])
        return reply

    def call(self, resource: str, operation: str, *args: Any) -> tuple[bool, Any]:
        reply = self.request(
            {"_AMQ_ResourceName": resource, "_AMQ_OperationName": operation}, json.dumps(args)
        )
        return outcome(reply)

    def ok(self, resource: str, operation: str, *args: Any) -> Any:
        succeeded, result = self.call(resource, operation, *args)
        assert succeeded, result
        return result

    def attribute(self, resource: str, name: str) -> Any:
        reply = self.request({"_AMQ_ResourceName": resource, "_AMQ_Attribute": name})
        succeeded, result = outcome(reply)
        assert succeeded, result
        return result


def outcome(reply: Message) -> tuple[bool, Any]:
    """(`_AMQ_OperationSucceeded`, the one element of the JSON-array body)."""
    assert isinstance(reply.body, str)
    (result,) = json.loads(reply.body)
    return reply.properties["_AMQ_OperationSucceeded"], result


@pytest.fixture
def manager(conn: BlockingConnection) -> Manager:
    return Manager(conn)


def fill(conn: BlockingConnection, queue: str, *colors: str) -> None:
    sender = conn.create_sender(queue, options=QUEUE)
    for color in colors:
        sender.send(Message(body=f"{color}-body", properties={"color": color}))
    sender.close()


def ids(manager: Manager, queue: str, selector: str | None = None) -> list[int]:
    return [m["messageID"] for m in manager.ok(f"queue.{queue}", "listMessages", selector)]


def bodies(conn: BlockingConnection, queue: str, count: int) -> list[str]:
    receiver = conn.create_receiver(queue, options=QUEUE)
    got = []
    for _ in range(count):
        got.append(receiver.receive(timeout=5).body)
        receiver.accept()
    receiver.close()
    return got


def count(manager: Manager, queue: str) -> int:
    return int(manager.ok(f"queue.{queue}", "countMessages"))


def test_reply_correlates_on_message_id_else_correlation_id(manager: Manager) -> None:
    """B-160: correlation-id = the request's correlation-id if present, else its
    message-id (typed: here a ulong and a string); `_AMQ_OperationSucceeded` is true."""
    fill(manager.conn, "corr", "a")
    resource = {"_AMQ_ResourceName": "queue.corr", "_AMQ_Attribute": "messageCount"}
    reply = manager.request(resource, id=7)
    assert reply.correlation_id == 7
    assert outcome(reply) == (True, 1)
    reply = manager.request(resource, id="m-1", correlation_id="c-1")
    assert reply.correlation_id == "c-1"


def test_requests_through_the_anonymous_relay(conn: BlockingConnection) -> None:
    """B-160: on the anonymous relay, `to` = activemq.management is a request too."""
    relay = Manager(conn, target=None)
    fill(conn, "relayed", "a", "b")
    assert relay.ok("queue.relayed", "countMessages") == 2


def test_retry_messages_and_retry_message(manager: Manager) -> None:
    """B-161 retryMessages()/retryMessages(filter)/retryMessage(id): dead letters go
    back to their original queue."""
    conn = manager.conn
    fill(conn, "retried", "red", "blue", "green")
    assert manager.ok("queue.retried", "sendMessagesToDeadLetterAddress", None) == 3
    assert count(manager, "DLQ.retried") == 3
    assert manager.ok("queue.DLQ.retried", "retryMessages", "color = 'red'") == 1
    (blue, _) = ids(manager, "DLQ.retried", "color <> 'red'")[:2]
    assert manager.ok("queue.DLQ.retried", "retryMessage", blue) is True
    assert manager.ok("queue.DLQ.retried", "retryMessage", blue) is False  # gone
    assert manager.ok("queue.DLQ.retried", "retryMessages") == 1
    assert sorted(bodies(conn, "retried", 3)) == ["blue-body", "green-body", "red-body"]
    assert count(manager, "DLQ.retried") == 0


def test_move_messages_and_move_message(manager: Manager) -> None:
    """B-161 moveMessages(filter, queue[, rejectDuplicates]) and moveMessage(id, queue)."""
    conn = manager.conn
    fill(conn, "move.from", "red", "blue", "green")
    fill(conn, "move.to")
    assert manager.ok("queue.move.from", "moveMessages", "color = 'red'", "move.to") == 1
    blue = ids(manager, "move.from", "color = 'blue'")[0]
    assert manager.ok("queue.move.from", "moveMessage", blue, "move.to") is True
    assert manager.ok("queue.move.from", "moveMessages", None, "move.to", False) == 1
    assert count(manager, "move.from") == 0
    assert sorted(bodies(conn, "move.to", 3)) == ["blue-body", "green-body", "red-body"]


def test_move_messages_rejecting_duplicates(manager: Manager) -> None:
    """B-161 moveMessages(filter, queue, rejectDuplicates=true): a message whose
    _AMQ_DUPL_ID the target address has seen (B-012) is removed, not copied there."""
    conn = manager.conn
    conn.create_sender("dedup.to", options=QUEUE).send(
        Message(body="first", properties={"_AMQ_DUPL_ID": "d1"})
    )
    sender = conn.create_sender("dedup.from", options=QUEUE)
    for dup in ("d1", "d2"):
        sender.send(Message(body=f"{dup}-moved", properties={"_AMQ_DUPL_ID": dup}))
    assert manager.ok("queue.dedup.from", "moveMessages", None, "dedup.to", True) == 2
    assert count(manager, "dedup.from") == 0
    assert count(manager, "dedup.to") == 2
    assert bodies(conn, "dedup.to", 2) == ["first", "d2-moved"]


def test_send_messages_to_dead_letter_address(manager: Manager) -> None:
    """B-161 sendMessagesToDeadLetterAddress(filter) and sendMessageToDeadLetterAddress(id):
    dead-lettered now, counted as killed."""
    fill(manager.conn, "dl", "red", "blue", "green")
    assert manager.ok("queue.dl", "sendMessagesToDeadLetterAddress", "color = 'red'") == 1
    blue = ids(manager, "dl", "color = 'blue'")[0]
    assert manager.ok("queue.dl", "sendMessageToDeadLetterAddress", blue) is True
    assert count(manager, "DLQ.dl") == 2
    assert manager.attribute("queue.dl", "messagesKilled") == 2
    assert bodies(manager.conn, "DLA::DLQ.dl", 2) == ["red-body", "blue-body"]


def test_expire_messages_and_expire_message(manager: Manager) -> None:
    """B-161 expireMessages(filter) and expireMessage(id): to the expiry address now."""
    fill(manager.conn, "exp", "red", "blue", "green")
    assert manager.ok("queue.exp", "expireMessages", "color = 'red'") == 1
    blue = ids(manager, "exp", "color = 'blue'")[0]
    assert manager.ok("queue.exp", "expireMessage", blue) is True
    assert manager.attribute("queue.exp", "messagesExpired") == 2
    assert bodies(manager.conn, "ExpiryQueue::EXP.exp", 2) == ["red-body", "blue-body"]


def test_remove_messages_remove_all_and_remove_message(manager: Manager) -> None:
    """B-161 removeMessages(filter), removeMessage(id), removeAllMessages(): killed."""
    fill(manager.conn, "rm", "red", "blue", "green", "grey")
    assert manager.ok("queue.rm", "removeMessages", "color = 'red'") == 1
    blue = ids(manager, "rm", "color = 'blue'")[0]
    assert manager.ok("queue.rm", "removeMessage", blue) is True
    assert manager.ok("queue.rm", "removeAllMessages") == 2
    assert count(manager, "rm") == 0
    assert manager.attribute("queue.rm", "messagesKilled") == 4


def test_list_messages_and_the_browse_page_size(manager: Manager) -> None:
    """B-161 listMessages(filter): maps with the Artemis keys and the properties; at most
    management-browse-page-size (B-160) entries."""
    conn = manager.conn
    sender = conn.create_sender("listed", options=QUEUE)
    sender.send(Message(id="amqp-1", body="x", durable=True, priority=7, properties={"k": 1}))
    (entry,) = manager.ok("queue.listed", "listMessages", "")
    assert entry["userID"] == "ID:amqp-1"
    assert (entry["address"], entry["durable"], entry["priority"], entry["k"]) == (
        "listed",
        True,
        7,
        1,
    )
    assert {"messageID", "timestamp", "expiration"} <= entry.keys()
    fill(conn, "paged.q", "a", "b", "c")
    assert len(manager.ok("queue.paged.q", "listMessages", None)) == 2
    assert count(manager, "paged.q") == 3


def test_count_messages_and_count_delivering(manager: Manager) -> None:
    """B-161 countMessages([filter]) and countDeliveringMessages(filter)."""
    conn = manager.conn
    fill(conn, "counted", "red", "blue", "red")
    assert manager.ok("queue.counted", "countMessages", "color = 'red'") == 2
    receiver = conn.create_receiver("counted", options=QUEUE, credit=0)
    receiver.receive(timeout=5)  # one credit, one delivery
    assert manager.ok("queue.counted", "countDeliveringMessages", None) == 1
    assert manager.ok("queue.counted", "countDeliveringMessages", "color = 'blue'") == 0
    assert manager.ok("queue.counted", "countMessages") == 3  # delivering included
    receiver.accept()


def test_change_messages_priority_and_change_message_priority(manager: Manager) -> None:
    """B-161 changeMessagesPriority(filter, p) / changeMessagePriority(id, p): the
    messages take the priority, in the header the consumer receives too."""
    fill(manager.conn, "prio", "red", "blue", "green")
    assert manager.ok("queue.prio", "changeMessagesPriority", "color = 'green'", 9) == 1
    red = ids(manager, "prio", "color = 'red'")[0]
    assert manager.ok("queue.prio", "changeMessagePriority", red, 0) is True
    assert manager.call("queue.prio", "changeMessagesPriority", None, 10)[0] is False
    receiver = manager.conn.create_receiver("prio", options=QUEUE)
    got = []
    for _ in range(3):
        message = receiver.receive(timeout=5)
        receiver.accept()
        got.append((message.body, message.priority))
    assert got == [("green-body", 9), ("blue-body", 4), ("red-body", 0)]


def test_pause_and_resume(manager: Manager) -> None:
    """B-161 pause()/resume(): no dispatch while paused; the attribute says so."""
    conn = manager.conn
    fill(conn, "paused")
    receiver = conn.create_receiver("paused", options=QUEUE, credit=10)
    assert manager.ok("queue.paused", "pause") is None
    fill(conn, "paused", "a")
    assert manager.attribute("queue.paused", "paused") is True
    assert manager.attribute("queue.paused", "deliveringCount") == 0
    assert manager.attribute("queue.paused", "messageCount") == 1
    assert manager.ok("queue.paused", "resume") is None
    assert receiver.receive(timeout=5).body == "a-body"
    receiver.accept()
    assert manager.attribute("queue.paused", "paused") is False


def test_queue_attributes(manager: Manager) -> None:
    """B-161 attributes by their Artemis names."""
    fill(manager.conn, "attrs", "a", "b")
    expected = {
        "messageCount": 2,
        "deliveringCount": 0,
        "scheduledCount": 0,
        "consumerCount": 0,
        "messagesAdded": 2,
        "messagesAcknowledged": 0,
        "messagesExpired": 0,
        "messagesKilled": 0,
        "deadLetterAddress": "DLA",
        "expiryAddress": "ExpiryQueue",
        "maxConsumers": -1,
        "routingType": "ANYCAST",
        "filter": None,
        "durable": True,
        "temporary": False,
        "autoDelete": True,
        "exclusive": False,
        "purgeOnNoConsumers": False,  # issue 19: B-126, B-127, B-128
        "groupRebalance": False,
        "groupRebalancePauseDispatch": False,
        "groupBuckets": -1,
        "groupFirstKey": None,
        "groupCount": 0,
        "consumersBeforeDispatch": 0,
        "delayBeforeDispatch": -1,
        "lastValue": False,
        "lastValueKey": None,
        "nonDestructive": False,
        "ringSize": -1,
        "paused": False,
    }
    assert {name: manager.attribute("queue.attrs", name) for name in expected} == expected


def test_broker_queue_and_address_operations(manager: Manager) -> None:
    """B-162: createAddress, createQueue, getQueueNames, getAddressNames, listQueues,
    destroyQueue, deleteAddress; address attributes."""
    assert manager.ok("broker", "createAddress", "made", "ANYCAST,MULTICAST") is None
    assert manager.call("broker", "createAddress", "made", "ANYCAST")[0] is False
    spec = {"name": "made.q", "address": "made", "routing-type": "ANYCAST", "durable": False}
    created = json.loads(manager.ok("broker", "createQueue", json.dumps(spec)))
    assert (created["name"], created["routingType"], created["durable"]) == (
        "made.q",
        "ANYCAST",
        False,
    )
    assert manager.call("broker", "createQueue", json.dumps(spec))[0] is False
    assert json.loads(manager.ok("broker", "createQueue", json.dumps(spec), True))
    assert "made.q" in manager.ok("broker", "getQueueNames", "ANYCAST")
    assert "made.q" not in manager.ok("broker", "getQueueNames", "MULTICAST")
    assert "made" in manager.ok("broker", "getAddressNames")
    assert manager.attribute("address.made", "queueNames") == ["made.q"]
    assert manager.attribute("address.made", "routingTypes") == ["ANYCAST", "MULTICAST"]
    options = json.dumps({"field": "name", "operation": "CONTAINS", "value": "made"})
    listed = json.loads(manager.ok("broker", "listQueues", options, 1, 10))
    assert (listed["count"], listed["data"][0]["name"]) == (1, "made.q")
    assert manager.call("broker", "deleteAddress", "made")[0] is False  # has a queue
    assert manager.ok("broker", "destroyQueue", "made.q") is None
    assert manager.ok("broker", "deleteAddress", "made") is None
    assert "made" not in manager.ok("broker", "getAddressNames")


def test_create_queue_is_checked_like_a_configured_queue(manager: Manager) -> None:
    """B-162 createQueue goes through the config loader: a badly typed option is refused
    (issue 19), so is an unknown key or a bad filter."""
    for spec, error in (
        ({"name": "c.1", "ring-size": "x"}, "ring-size: not an integer"),
        ({"name": "c.2", "colour": "red"}, "colour: unknown key"),
        ({"name": "c.3", "filter-string": "a = "}, "filter: invalid filter"),
        ({"name": "c.4", "max-consumers": "x"}, "max-consumers: not an integer"),
    ):
        succeeded, text = manager.call("broker", "createQueue", json.dumps(spec))
        assert not succeeded
        assert error in text
    assert manager.call("broker", "createQueue", json.dumps({"name": "c.5"}))[0] is False
    auto = {"name": "c.5", "auto-create-address": True, "ring-size": -1}
    assert manager.call("broker", "createQueue", json.dumps(auto))[0] is True


def test_create_queue_makes_ring_and_last_value_queues(manager: Manager) -> None:
    """B-162 createQueue with B-120/B-121 options: the queue has them (issue 19)."""
    spec = {"name": "c.6", "auto-create-address": True, "ring-size": 2, "last-value": True}
    assert manager.call("broker", "createQueue", json.dumps(spec))[0] is True
    assert manager.attribute("queue.c.6", "ringSize") == 2
    assert manager.attribute("queue.c.6", "lastValue") is True
    assert manager.attribute("queue.c.6", "lastValueKey") == "_AMQ_LVQ_NAME"
    assert manager.attribute("queue.c.6", "nonDestructive") is False


def test_destroy_queue_with_consumers(broker: BrokerProcess, manager: Manager) -> None:
    """B-162 destroyQueue(name[, removeConsumers]): refused while consumed unless asked."""
    consumer = connect(broker.url)
    try:
        receiver = consumer.create_receiver("consumed", options=QUEUE)
        assert manager.call("broker", "destroyQueue", "consumed")[0] is False
        assert manager.ok("broker", "destroyQueue", "consumed", True) is None
        assert "consumed" not in manager.ok("broker", "getQueueNames")
        with pytest.raises(LinkDetached, match="amqp:resource-deleted"):
            receiver.receive(timeout=5)
    finally:
        consumer.close()


def test_address_settings_at_runtime(manager: Manager) -> None:
    """B-102/B-162 addAddressSettings (checked by the config loader, camelCase or kebab
    keys), getAddressSettingsAsJSON, removeAddressSettings."""
    settings = json.dumps({"maxDeliveryAttempts": 3, "redelivery-delay": 5})
    assert manager.ok("broker", "addAddressSettings", "tuned.#", settings) is None
    effective = json.loads(manager.ok("broker", "getAddressSettingsAsJSON", "tuned.x"))
    assert (effective["max-delivery-attempts"], effective["redelivery-delay"]) == (3, 5)
    assert "config-delete-queues" not in effective  # not implemented: never shown
    assert effective["slow-consumer-threshold"] == -1  # implemented (issue 19): shown
    assert effective["default-ring-size"] == -1  # implemented (B-121): shown
    bad = json.dumps({"config-delete-queues": "FORCE"})
    succeeded, text = manager.call("broker", "addAddressSettings", "tuned.#", bad)
    assert not succeeded
    assert "config-delete-queues: not supported by amqpbroker" in text
    assert manager.ok("broker", "removeAddressSettings", "tuned.#") is None
    effective = json.loads(manager.ok("broker", "getAddressSettingsAsJSON", "tuned.x"))
    assert effective["max-delivery-attempts"] == 10


# -- hostile requests: a failure reply, or dropped; never a crash ---------------------


def raw_request(manager: Manager, properties: dict[Any, Any], body: Any) -> tuple[bool, Any]:
    return outcome(manager.request(properties, body))


@pytest.mark.parametrize(
    ("properties", "body", "error"),
    [
        ({}, "[]", "_AMQ_ResourceName is missing"),
        ({"_AMQ_ResourceName": "broker"}, "[]", "either _AMQ_OperationName or"),
        ({"_AMQ_ResourceName": 5, "_AMQ_OperationName": "x"}, "[]", "must be a string"),
        ({"_AMQ_ResourceName": "broker", "_AMQ_OperationName": 5}, "[]", "must be a string"),
        ({"_AMQ_ResourceName": "nothing", "_AMQ_Attribute": "x"}, "[]", "unknown resource"),
        ({"_AMQ_ResourceName": "broker", "_AMQ_OperationName": "halt"}, "[]", "unknown broker"),
        ({"_AMQ_ResourceName": "queue.host", "_AMQ_OperationName": "pause"}, "[1]", "takes 0"),
        ({"_AMQ_ResourceName": "queue.host", "_AMQ_Attribute": "size"}, "[]", "unknown queue"),
        (
            {"_AMQ_ResourceName": "queue.host", "_AMQ_OperationName": "removeMessage"},
            '[{"a": 1}]',
            "message id must be",
        ),
        (
            {"_AMQ_ResourceName": "queue.host", "_AMQ_OperationName": "removeMessages"},
            "[[1, 2]]",
            "filter must be",
        ),
        (
            {"_AMQ_ResourceName": "queue.host", "_AMQ_OperationName": "removeMessages"},
            '["color ="]',
            "",
        ),
        ({"_AMQ_ResourceName": "queue.host", "_AMQ_OperationName": "pause"}, "{", "JSON"),
        ({"_AMQ_ResourceName": "queue.host", "_AMQ_OperationName": "pause"}, '{"a": 1}', "array"),
        ({"_AMQ_ResourceName": "queue.host", "_AMQ_OperationName": "pause"}, 42, "amqp-value"),
        ({"_AMQ_ResourceName": "queue.host", "_AMQ_OperationName": "pause"}, "[" * 100_000, ""),
        (
            {"_AMQ_ResourceName": "queue.host", "_AMQ_OperationName": "pause"},
            "[" + " " * (2 * 1024 * 1024) + "]",
            "over",
        ),
        (
            {"_AMQ_ResourceName": "broker", "_AMQ_OperationName": "createQueue"},
            json.dumps(["{" * 5000]),
            "JSON",
        ),
        (
            {"_AMQ_ResourceName": "broker", "_AMQ_OperationName": "listQueues"},
            json.dumps(["{}", 0, 10**30]),
            "",
        ),
        (
            {"_AMQ_ResourceName": "queue." + "x" * 100_000, "_AMQ_OperationName": "pause"},
            "[]",
            "does not exist",
        ),
    ],
)
def test_hostile_request_gets_a_failure_reply(
    manager: Manager, properties: dict[Any, Any], body: Any, error: str
) -> None:
    """B-153/B-160: a request that is not understood is answered with
    `_AMQ_OperationSucceeded` = false and the reason; the broker carries on."""
    fill(manager.conn, "host", "a")
    before = count(manager, "host")
    succeeded, text = raw_request(manager, properties, body)
    assert not succeeded
    assert isinstance(text, str)
    assert error in text
    assert count(manager, "host") == before  # nothing was done; the broker still answers


def test_request_without_reply_to_is_dropped_not_run(manager: Manager) -> None:
    """A request nobody can read the answer of is dropped: its operation is not run
    (docs/decisions.md); the next request is answered. Also a reply-to that names the
    management address as a queue or is a wildcard (B-011)."""
    fill(manager.conn, "noreply", "a")
    props = {"_AMQ_ResourceName": "queue.noreply", "_AMQ_OperationName": "removeAllMessages"}
    manager.sender.send(Message(id="lost", body="[]", properties=props))
    for reply_to in (MANAGEMENT, "", f"{MANAGEMENT}::q", "replies.#"):
        manager.sender.send(Message(id="loop", reply_to=reply_to, body="[]", properties=props))
    assert count(manager, "noreply") == 1


def test_reply_to_a_named_address(manager: Manager) -> None:
    """B-160: reply-to may name an address (here an existing queue) instead of a
    temporary one."""
    fill(manager.conn, "replies")
    props = {"_AMQ_ResourceName": "broker", "_AMQ_Attribute": "version"}
    manager.sender.send(Message(id="named", reply_to="replies", body="[]", properties=props))
    receiver = manager.conn.create_receiver("replies", options=QUEUE)
    reply = receiver.receive(timeout=5)
    receiver.accept()
    assert reply.correlation_id == "named"
    assert outcome(reply)[0] is True


def test_consumers_cannot_attach_to_the_management_address(conn: BlockingConnection) -> None:
    """B-110: the management address is never auto-created, so nothing consumes from it."""
    with pytest.raises(LinkDetached, match="amqp:not-found"):
        conn.create_receiver(MANAGEMENT)


# -- the manage permission (B-154) ------------------------------------------------------


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    running = start_broker(
        tmp_path_factory.mktemp("amqp-mgmt-sec"),
        f"""
        security:
          enabled: true
          sasl-mechanisms: [PLAIN]
          users:
            admin: {{password-hash: "{hash_password("admin-pw")}", roles: [admin]}}
            app: {{password-hash: "{hash_password("app-pw")}", roles: [app]}}
            ops: {{password-hash: "{hash_password("ops-pw")}", roles: [ops]}}
          security-settings:
            "#": {{send: [admin, app], consume: [admin, app, ops], browse: [admin, app],
                  create-address: [admin, app], create-durable-queue: [admin, app],
                  create-non-durable-queue: [admin, app, ops], manage: [admin, ops]}}
        """,
    )
    yield running
    assert running.stop() == 0, running.log()


def login(broker: BrokerProcess, user: str) -> BlockingConnection:
    return BlockingConnection(
        broker.url,
        timeout=10,
        user=user,
        password=f"{user}-pw",
        allowed_mechs="PLAIN",
        allow_insecure_mechs=True,
    )


def test_manage_permission_is_required(secured: BrokerProcess) -> None:
    """B-154: without `manage` the attach to the management address is refused with
    unauthorized-access, and a request through the relay is rejected; with it, answered."""
    app = login(secured, "app")
    try:
        with pytest.raises(LinkDetached, match="amqp:unauthorized-access"):
            app.create_sender(MANAGEMENT)
    finally:
        app.close()
    app = login(secured, "app")
    try:
        replies = app.create_receiver(None, dynamic=True)
        relay = app.create_sender(None)
        props = {"_AMQ_ResourceName": "broker", "_AMQ_OperationName": "getAddressNames"}
        request = Message(
            address=MANAGEMENT,
            reply_to=replies.remote_source.address,
            body="[]",
            properties=props,
        )
        with pytest.raises(SendException) as info:
            relay.send(request)
        assert info.value.state == Delivery.REJECTED
    finally:
        app.close()
    admin = login(secured, "admin")
    try:
        names = Manager(admin).ok("broker", "getQueueNames", "ANYCAST")
        assert len(names) == 1  # the admin's own reply queue
    finally:
        admin.close()


def test_a_symbol_resource_name_reads_as_a_string(manager: Manager) -> None:
    """An application property sent as a symbol is a string to the broker: answered."""
    props = {"_AMQ_ResourceName": symbol("broker"), "_AMQ_Attribute": "name"}
    assert raw_request(manager, props, "[]") == (True, "test-broker")


def test_created_queues_survive_a_restart_with_their_auto_delete(
    tmp_path: Path, spawn: Callable[..., BrokerProcess]
) -> None:
    """B-162 createQueue makes a durable queue like any other (journaled with its
    messages), and its auto-delete (B-113, from auto-delete-created-queues unless given)
    is still its own after a restart."""
    config = (
        "persistence: {enabled: true}\n"
        'address-settings:\n  "auto.#": {auto-delete-created-queues: true}\n'
    )
    broker = spawn(tmp_path, config)
    conn = connect(broker.url)
    manager = Manager(conn)
    for name in ("kept", "auto.q"):
        spec = {"name": name, "routing-type": "ANYCAST", "auto-create-address": True}
        assert manager.ok("broker", "createQueue", json.dumps(spec))
    conn.create_sender("kept").send(Message(body="durable", durable=True))
    conn.close()
    assert broker.stop() == 0
    broker = spawn(tmp_path, config)
    conn = connect(broker.url)
    manager = Manager(conn)
    assert manager.attribute("queue.kept", "autoDelete") is False
    assert manager.attribute("queue.auto.q", "autoDelete") is True
    assert manager.attribute("queue.kept", "autoCreated") is False
    assert bodies(conn, "kept", 1) == ["durable"]
    conn.close()
    assert broker.stop() == 0


def test_by_id_and_list_match_the_whole_queue(manager: Manager) -> None:
    """B-160/B-161 removeMessage(id), changeMessagePriority(id, p), listMessages through
    `activemq.management` on a queue answered by its id index and a lazy browse (issue:
    management on big queues): the answers of a walk of the whole queue."""
    fill(manager.conn, "amqp.big", *(f"c{i}" for i in range(25)))
    listed = [m["messageID"] for m in manager.ok("queue.amqp.big", "listMessages", None)]
    assert manager.ok("queue.amqp.big", "removeMessage", listed[4]) is True
    assert manager.ok("queue.amqp.big", "removeMessage", listed[4]) is False
    assert manager.ok("queue.amqp.big", "changeMessagePriority", listed[6], 9) is True
    rows = manager.ok("queue.amqp.big", "listMessages", None)
    # B-161: a re-prioritized message goes to the tail (listed in arrival order).
    kept = [i for i in listed if i not in (listed[4], listed[6])]
    assert [m["messageID"] for m in rows] == [*kept, listed[6]]
    assert next(m["priority"] for m in rows if m["messageID"] == listed[6]) == 9
    assert int(manager.ok("queue.amqp.big", "countMessages")) == 24


def test_a_reply_goes_where_its_requester_may_send(secured: BrokerProcess) -> None:
    """B-154, third attack pass: `ops` may manage but not send. Its request with
    `reply-to` = `victim` put the reply (its correlation-id and the echoed resource
    name its own) on `victim`: the reply was sent as nobody. Now it is sent as the
    requester, so it is dropped there; a dynamic node's reply still arrives."""
    app = login(secured, "app")
    try:
        app.create_sender("victim", options=QUEUE).close()  # creates the queue
        ops = login(secured, "ops")
        try:
            manager = Manager(ops)
            props = {"_AMQ_ResourceName": "queue.victim", "_AMQ_OperationName": "x"}
            manager.sender.send(Message(body="[]", properties=props, reply_to="victim"))
            assert manager.ok("broker", "getQueueNames", "ANYCAST")  # the dynamic reply
        finally:
            ops.close()
        receiver = app.create_receiver("victim", options=QUEUE, credit=10)
        with pytest.raises(Timeout):
            receiver.receive(timeout=1)
    finally:
        app.close()
