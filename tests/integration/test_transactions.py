"""AMQP transactions with proton's client-side support (B-140…B-143, issue 5).

Each scenario runs proton's event-driven Container: declare a transaction, send and/or
accept under it, then commit, abort, or drop the connection without a discharge.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from proton import Delivery, Message, byte, symbol
from proton.handlers import MessagingHandler, TransactionHandler
from proton.reactor import Container
from proton.utils import BlockingConnection, SendException
from support.client import QUEUE, connect, receive_bodies, send
from support.event_files import read_events
from support.process import BrokerProcess, start_broker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


BROKER_CONFIG = """
persistence:
  enabled: true
address-settings:
  "#":
    max-delivery-attempts: 3
    dead-letter-address: DLA
    auto-create-dead-letter-resources: true
  "tx.closed.#":
    auto-create-addresses: false
  "tx.full.#":
    address-full-policy: FAIL
    max-size-bytes: 4000
"""


class Scenario(MessagingHandler, TransactionHandler):  # type: ignore[misc]
    """Declare, send `bodies` and accept `receive` messages under it, then `end` it."""

    def __init__(
        self,
        url: str,
        address: str,
        *,
        bodies: tuple[str, ...] = (),
        receive: int = 0,
        end: str = "commit",
        settle_before_discharge: bool = False,
    ) -> None:
        super().__init__(prefetch=receive, auto_accept=False)
        self.url, self.address, self.bodies = url, address, bodies
        self.receive, self.end = receive, end
        self.settle_before_discharge = settle_before_discharge
        self.received: list[tuple[Any, int]] = []
        self.outcome = ""
        self.txn: Any = None

    def on_start(self, event: Any) -> None:
        self.conn = event.container.connect(self.url)
        self.sender = event.container.create_sender(self.conn, self.address, options=QUEUE)
        event.container.declare_transaction(
            self.conn, handler=self, settle_before_discharge=self.settle_before_discharge
        )

    def on_transaction_declared(self, event: Any) -> None:
        self.txn = event.transaction
        if self.receive:  # only now: every message is accepted under the transaction
            event.container.create_receiver(self.conn, self.address, options=QUEUE)
        for body in self.bodies:
            self.txn.send(self.sender, Message(body=body, durable=True))
        if not self.receive:
            self._end()

    def on_message(self, event: Any) -> None:
        self.received.append((event.message.body, event.message.delivery_count))
        self.txn.accept(event.delivery)
        if len(self.received) == self.receive:
            self._end()

    def on_accepted(self, event: Any) -> None:  # transactional sends, answered at once
        pass

    def _end(self) -> None:
        if self.end == "commit":
            self.txn.commit()
        elif self.end == "abort":
            self.txn.abort()
        else:  # leave without a discharge: the broker must roll back (B-143)
            self.outcome = "closed"
            self.conn.close()

    def on_transaction_committed(self, event: Any) -> None:
        self.outcome = "committed"
        self.conn.close()

    def on_transaction_aborted(self, event: Any) -> None:
        self.outcome = "aborted"
        self.conn.close()

    def on_transaction_commit_failed(self, event: Any) -> None:
        self.outcome = "commit-failed"
        self.conn.close()


def run(scenario: Scenario) -> Scenario:
    Container(scenario).run()
    return scenario


def _nothing_in(conn: BlockingConnection, address: str) -> bool:
    receiver = conn.create_receiver(address, credit=10, options=QUEUE)
    try:
        receiver.receive(timeout=0.5)
    except Exception:
        return True
    finally:
        receiver.close()
    return False


def test_b141_sends_are_routed_on_commit(broker: BrokerProcess, conn: BlockingConnection) -> None:
    done = run(Scenario(broker.url, "tx.commit", bodies=("a", "b")))
    assert done.outcome == "committed"
    receiver = conn.create_receiver("tx.commit", credit=10, options=QUEUE)
    assert receive_bodies(receiver, 2) == ["a", "b"]


def test_b141_sends_are_dropped_on_rollback(
    broker: BrokerProcess, conn: BlockingConnection
) -> None:
    done = run(Scenario(broker.url, "tx.abort", bodies=("a",), end="abort"))
    assert done.outcome == "aborted"
    assert _nothing_in(conn, "tx.abort")


def test_transactional_accept_is_an_acknowledgement_on_commit(
    broker: BrokerProcess, conn: BlockingConnection
) -> None:
    send(conn, "tx.ack", "m", caps=("queue",))
    done = run(Scenario(broker.url, "tx.ack", receive=1))
    assert done.outcome == "committed"
    assert done.received == [("m", 0)]
    assert _nothing_in(conn, "tx.ack")


@pytest.mark.parametrize("settle_before_discharge", [False, True])
def test_rollback_redelivers_with_the_count_incremented(
    broker: BrokerProcess, conn: BlockingConnection, settle_before_discharge: bool
) -> None:
    """Seed 000's first case: rolled back, the message comes again with d+1 (B-142:
    unsettled, held then released by proton's client; B-143: settled, returned)."""
    address = f"tx.rollback.{settle_before_discharge}"
    send(conn, address, "m", caps=("queue",))
    done = run(
        Scenario(
            broker.url,
            address,
            receive=1,
            end="abort",
            settle_before_discharge=settle_before_discharge,
        )
    )
    assert done.outcome == "aborted"
    receiver = conn.create_receiver(address, credit=1, options=QUEUE)
    again = receiver.receive(timeout=5)
    receiver.accept()
    assert (again.body, again.delivery_count) == ("m", 1)


def test_b143_a_connection_closed_mid_transaction_rolls_back(
    broker: BrokerProcess, conn: BlockingConnection
) -> None:
    send(conn, "tx.lost", "m", caps=("queue",))
    done = run(Scenario(broker.url, "tx.lost", bodies=("never",), receive=1, end="close"))
    assert done.received == [("m", 0)]
    receiver = conn.create_receiver("tx.lost", credit=10, options=QUEUE)
    again = receiver.receive(timeout=5)
    receiver.accept()
    receiver.close()
    assert (again.body, again.delivery_count) == ("m", 1)  # the attempt counted
    assert _nothing_in(conn, "tx.lost")  # the transactional send was dropped


def test_an_unknown_transaction_is_rejected_and_the_connection_stays(
    broker: BrokerProcess,
) -> None:
    """B-140 decision: a transfer naming an unknown txn-id gets `rejected` with
    amqp:transaction:unknown-id; the connection stays open."""
    blocking = connect(broker.url)
    try:
        sender = blocking.create_sender("tx.unknown", options=QUEUE)
        delivery = sender.link.delivery(b"t1")
        sender.link.send(Message(body="x").encode())
        delivery.local.data = [b"no-such-txn"]
        delivery.update(0x34)
        sender.link.advance()
        blocking.wait(lambda: delivery.remote_state != 0, msg="an answer")
        assert delivery.remote_state == Delivery.REJECTED
        assert delivery.remote.condition.name == "amqp:transaction:unknown-id"
        sender.close()
        send(blocking, "tx.unknown", "still-open", caps=("queue",))
    finally:
        blocking.close()


def test_committed_transactional_sends_survive_a_crash(
    tmp_path: Path, spawn: Callable[..., BrokerProcess]
) -> None:
    """A commit's durable sends are one journal append, answered after it is on disk."""
    config = "persistence:\n  enabled: true\n"
    broker = spawn(tmp_path, config)
    done = run(Scenario(broker.url, "tx.durable", bodies=("x", "y")))
    assert done.outcome == "committed"
    broker.kill()
    broker = spawn(tmp_path, config)
    try:
        conn = connect(broker.url)
        receiver = conn.create_receiver("tx.durable", credit=10, options=QUEUE)
        assert receive_bodies(receiver, 2) == ["x", "y"]
        conn.close()
    finally:
        assert broker.stop() == 0, broker.log()


def test_events_of_a_commit_and_a_rollback_carry_the_transaction(tmp_path: Path) -> None:
    """B-170 `txn` (hex): the sent/enqueued of a committed send, the acked of a committed
    accept, and the returned/held of a rollback carry their transaction's id; a plain send
    and any dispatch do not."""
    logged = start_broker(tmp_path, "event-log: {enabled: true, level: lifecycle}")
    try:
        plain = connect(logged.url)
        send(plain, "tx.log.commit", "m", caps=("queue",))
        send(plain, "tx.log.abort", "r", caps=("queue",))
        plain.close()
        committed = run(Scenario(logged.url, "tx.log.commit", bodies=("t",), receive=1))
        aborted = run(Scenario(logged.url, "tx.log.abort", receive=1, end="abort"))
        assert (committed.outcome, aborted.outcome) == ("committed", "aborted")
    finally:
        assert logged.stop() == 0, logged.log()
    events = read_events(logged.data_dir / "events")
    commit = [
        (e["event"], e["msg_id"], e["txn"]) for e in events if e["address"] == "tx.log.commit"
    ]
    [m_id] = [i for kind, i, t in commit if kind == "sent" and t is None]  # the plain send
    [txn] = {t for kind, _, t in commit if kind == "sent" and t is not None}
    assert bytes.fromhex(txn).startswith(b"txn:")
    [t_id] = [i for kind, i, t in commit if kind == "sent" and t == txn]
    assert ("enqueued", t_id, txn) in commit
    assert ("acked", m_id, txn) in commit
    assert ("enqueued", m_id, None) in commit
    assert all(t is None for kind, _, t in commit if kind == "dispatched")
    abort = [(e["event"], e["reason"], e["txn"]) for e in events if e["address"] == "tx.log.abort"]
    rolled_back = [(kind, t) for kind, reason, t in abort if reason == "tx-rollback"]
    assert rolled_back
    assert all(t is not None and t != txn for _, t in rolled_back)
    assert all(t is None for kind, _, t in abort if kind in ("sent", "enqueued", "dispatched"))


class RelayScenario(MessagingHandler, TransactionHandler):  # type: ignore[misc]
    """Declare, send each (address, body) on one anonymous-relay link under it; once the
    broker has answered every send, run `before_commit`, then commit."""

    def __init__(
        self, url: str, sends: list[tuple[str, str]], before_commit: Callable[[], None]
    ) -> None:
        super().__init__()
        self.url, self.sends, self.before_commit = url, sends, before_commit
        self.answers: list[str] = []
        self.outcome = ""
        self.txn: Any = None

    def on_start(self, event: Any) -> None:
        self.conn = event.container.connect(self.url)
        self.sender = event.container.create_sender(self.conn, None)
        event.container.declare_transaction(self.conn, handler=self)

    def on_transaction_declared(self, event: Any) -> None:
        self.txn = event.transaction
        for address, body in self.sends:
            anycast = {symbol("x-opt-routing-type"): byte(1)}  # B-008: the queues' type
            message = Message(address=address, body=body, durable=True, annotations=anycast)
            self.txn.send(self.sender, message)

    def _answered(self, outcome: str) -> None:
        self.answers.append(outcome)
        if len(self.answers) == len(self.sends):
            self.before_commit()
            self.txn.commit()

    def on_settled(self, event: Any) -> None:
        """Proton calls no on_accepted for transactional-state (0x34): read the state."""
        state = event.delivery.remote_state
        self._answered({0x34: "accepted", Delivery.REJECTED: "rejected"}.get(state, str(state)))

    def on_transaction_committed(self, event: Any) -> None:
        self.outcome = "committed"
        self.conn.close()

    def on_transaction_commit_failed(self, event: Any) -> None:
        self.outcome = "commit-failed"
        self.conn.close()


def test_b141_a_send_refused_on_arrival_makes_the_commit_route_nothing(
    broker: BrokerProcess, conn: BlockingConnection
) -> None:
    """B-141: a send to an address that cannot be auto-created is rejected when it
    arrives, and the commit routes none of the transaction's sends (it routed the others
    and answered rollback, before)."""
    done = run(
        RelayScenario(
            broker.url,
            [("tx.open.a", "first"), ("tx.closed.b", "refused"), ("tx.open.a", "last")],
            lambda: None,
        )
    )
    assert done.answers == ["accepted", "rejected", "accepted"]
    assert done.outcome == "commit-failed"
    assert _nothing_in(conn, "tx.open.a")


def test_b141_a_commit_whose_address_filled_meanwhile_routes_nothing(
    broker: BrokerProcess, conn: BlockingConnection
) -> None:
    """B-141 with B-151 FAIL: the sends had room when they arrived; before the commit
    another producer fills their address, so the commit is refused as a whole: the send
    to the other address is not routed either."""

    def fill() -> None:
        send(conn, "tx.full.q", "x" * 5000, caps=("queue",))

    done = run(RelayScenario(broker.url, [("tx.ok", "a"), ("tx.full.q", "b")], fill))
    assert done.answers == ["accepted", "accepted"]
    assert done.outcome == "commit-failed"
    assert _nothing_in(conn, "tx.ok")
    receiver = conn.create_receiver("tx.full.q", credit=10, options=QUEUE)
    assert receive_bodies(receiver, 1) == ["x" * 5000]  # only the filler
    receiver.close()
    assert _nothing_in(conn, "tx.full.q")


def test_b141_a_commit_is_let_into_an_address_with_room_as_one_unit(
    broker: BrokerProcess, conn: BlockingConnection
) -> None:
    """Decision (docs/decisions.md): a commit whose FAIL address has room when it starts
    routes all its sends, even those past max-size-bytes, as one message that crosses the
    limit is let in; the next plain send is refused."""
    bodies = [f"{i}" * 1500 for i in range(4)]  # 6,000 bytes for a 4,000-byte address
    done = run(RelayScenario(broker.url, [("tx.full.unit", b) for b in bodies], lambda: None))
    assert done.outcome == "committed"
    with pytest.raises(SendException) as refused:
        send(conn, "tx.full.unit", "over", caps=("queue",))
    assert refused.value.state == Delivery.REJECTED
    receiver = conn.create_receiver("tx.full.unit", credit=10, options=QUEUE)
    assert receive_bodies(receiver, 4) == bodies
