"""python-qpid-proton against amqpbroker: every case in one process (issue 21).

Usage: `python driver.py < job.json` -> one JSON line on stdout. job["mode"] is `cases`,
`send` (the cross-matrix messages to job["targets"]) or `recv` (from job["sources"]).
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import proton._handlers as handlers
from proton import Data, Delivery, Message, SSLDomain, int32, symbol
from proton.handlers import MessagingHandler, TransactionHandler
from proton.reactor import Container, DurableSubscription, ReceiverOption
from proton.utils import BlockingConnection, BlockingReceiver

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # interop/common.py
from common import emit, payload, read_job, run_cases, same_payload

JOB = read_job()
P = JOB["prefix"]


class Caps(ReceiverOption):  # type: ignore[misc]
    """Source capabilities (`shared`, `global`) on a receiving link."""

    def __init__(self, *caps: str) -> None:
        self.caps = caps

    def apply(self, link: Any) -> None:
        link.source.capabilities.put_array(False, Data.SYMBOL)
        link.source.capabilities.enter()
        for cap in self.caps:
            link.source.capabilities.put_symbol(cap)
        link.source.capabilities.exit()


class Both(ReceiverOption):  # type: ignore[misc]
    def __init__(self, *options: ReceiverOption) -> None:
        self.options = options

    def apply(self, link: Any) -> None:
        for option in self.options:
            option.apply(link)


def connect(
    *, tls: bool = False, password: str | None = None, container_id: str | None = None
) -> BlockingConnection:
    domain = None
    url = f"amqp://{JOB['host']}:{JOB['port']}"
    if tls:
        domain = SSLDomain(SSLDomain.MODE_CLIENT)
        domain.set_trusted_ca_db(JOB["ca"])
        domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
        url = f"amqps://{JOB['tls_host']}:{JOB['tls_port']}"
    container = Container()
    container.container_id = container_id or f"proton-python-{uuid.uuid4()}"
    return BlockingConnection(
        url,
        timeout=15,
        container=container,
        ssl_domain=domain,
        user=JOB["user"],
        password=password or JOB["password"],
        allowed_mechs="PLAIN",
        allow_insecure_mechs=True,
    )


def take(receiver: BlockingReceiver, count: int) -> list[Message]:
    out = []
    for _ in range(count):
        out.append(receiver.receive(timeout=10))
        receiver.accept()
    return out


def queue_order(conn: BlockingConnection) -> Any:
    sender = conn.create_sender(f"q.{P}.order")
    for i in range(5):
        sender.send(Message(body=f"m{i}"))
    return [m.body for m in take(conn.create_receiver(f"q.{P}.order"), 5)]


def topic(conn: BlockingConnection) -> Any:
    a = conn.create_receiver(f"t.{P}.news", name="news-a")
    b = conn.create_receiver(f"t.{P}.news", name="news-b")
    sender = conn.create_sender(f"t.{P}.news")
    for i in range(3):
        sender.send(Message(body=f"n{i}"))
    return [[m.body for m in take(r, 3)] for r in (a, b)]


def reject(conn: BlockingConnection) -> Any:
    conn.create_sender(f"q.{P}.rej").send(Message(body="poison"))
    receiver = conn.create_receiver(f"q.{P}.rej")
    receiver.receive(timeout=10)
    receiver.reject()
    dead = take(conn.create_receiver(f"DLA::DLQ.q.{P}.rej"), 1)[0]
    return {"body": dead.body, "annotations": {str(k): v for k, v in dead.annotations.items()}}


def redelivery(conn: BlockingConnection, address: str, *, failed: bool) -> Any:
    conn.create_sender(address).send(Message(body="again"))
    receiver = conn.create_receiver(address)
    counts = [receiver.receive(timeout=10).delivery_count]
    if failed:  # release(delivered=True) sends modified with delivery-failed unset (README)
        delivery = receiver.fetcher.unsettled.popleft()
        delivery.local.failed = True
        delivery.update(Delivery.MODIFIED)
        delivery.settle()
    else:
        receiver.release(delivered=False)
    counts.append(receiver.receive(timeout=10).delivery_count)
    receiver.accept()
    return counts


def tls_plain() -> Any:
    conn = connect(tls=True)
    conn.create_sender(f"q.{P}.tls").send(Message(body="over-tls"))
    body = take(conn.create_receiver(f"q.{P}.tls"), 1)[0].body
    conn.close()
    try:
        connect(tls=True, password="wrong").close()
        refused = False
    except Exception as exc:
        refused = "auth" in str(exc).lower() or "sasl" in str(exc).lower()
    return {"body": body, "wrong_password_refused": refused}


def large(conn: BlockingConnection) -> Any:
    sent = payload(JOB["large"])
    conn.create_sender(f"q.{P}.large").send(Message(body=sent))
    got = take(conn.create_receiver(f"q.{P}.large"), 1)[0].body
    return same_payload(got, sent)


def durable(conn: BlockingConnection) -> Any:
    cid = f"proton-python-durable-{P}"
    first = connect(container_id=cid)
    first.create_receiver(f"t.{P}.dur", name="sub", options=DurableSubscription())
    first.close()  # connection gone, link never closed: the subscription stays (B-028)
    sender = conn.create_sender(f"t.{P}.dur")
    for body in ("d0", "d1"):
        sender.send(Message(body=body))
    again = connect(container_id=cid)
    receiver = again.create_receiver(f"t.{P}.dur", name="sub", options=DurableSubscription())
    bodies = [m.body for m in take(receiver, 2)]
    receiver.close()  # closed=true: unsubscribe
    again.close()
    return bodies


def shared(conn: BlockingConnection) -> Any:
    opts = Both(DurableSubscription(), Caps("shared", "global"))
    one, two = connect(), connect()
    receivers = [c.create_receiver(f"t.{P}.shared", name="shsub", options=opts) for c in (one, two)]
    sender = conn.create_sender(f"t.{P}.shared")
    for i in range(4):
        sender.send(Message(body=f"s{i}"))
    seen: list[list[str]] = [[], []]
    for _ in range(40):
        for i, receiver in enumerate(receivers):
            try:
                seen[i].append(receiver.receive(timeout=0.2).body)
                receiver.accept()
            except Exception:  # proton's Timeout: nothing for this one now
                pass
        if sum(map(len, seen)) >= 4:
            break
    for c in (one, two):
        c.close()
    return {"bodies": sorted(seen[0] + seen[1]), "per_receiver": [len(s) for s in seen]}


class Txn(MessagingHandler, TransactionHandler):  # type: ignore[misc]
    """Send two messages under a transaction and commit, one under another and abort."""

    def __init__(self, address: str) -> None:
        super().__init__()
        self.address, self.round = address, 0

    def on_start(self, event: Any) -> None:
        self.conn = event.container.connect(
            f"amqp://{JOB['host']}:{JOB['port']}",
            user=JOB["user"],
            password=JOB["password"],
            allowed_mechs="PLAIN",
            allow_insecure_mechs=True,
        )
        self.sender = event.container.create_sender(self.conn, self.address)
        event.container.declare_transaction(self.conn, handler=self)

    def on_transaction_declared(self, event: Any) -> None:
        if self.round == 0:
            for body in ("t0", "t1"):
                event.transaction.send(self.sender, Message(body=body))
            event.transaction.commit()
        else:
            event.transaction.send(self.sender, Message(body="aborted"))
            event.transaction.abort()

    def on_transaction_committed(self, event: Any) -> None:
        self.round = 1
        event.container.declare_transaction(self.conn, handler=self)

    def on_transaction_aborted(self, event: Any) -> None:
        self.conn.close()


def transactions(conn: BlockingConnection) -> Any:
    Container(Txn(f"q.{P}.tx")).run()
    receiver = conn.create_receiver(f"q.{P}.tx")
    bodies = [m.body for m in take(receiver, 2)]
    try:
        extra = receiver.receive(timeout=0.5).body
    except Exception:
        extra = None
    return {"committed": bodies, "after": extra}


# --- cross matrix ---------------------------------------------------------------------


def native(typed: dict[str, Any]) -> Any:
    t, v = typed["t"], typed.get("v")
    if t == "binary":
        return bytes.fromhex(v)
    if t == "int":
        return int32(v)
    if t == "map":
        return {k: native(x) for k, x in v.items()}
    if t == "list":
        return [native(x) for x in v]
    return v


def plain(value: Any) -> Any:
    if isinstance(value, bytes | memoryview):
        return {"hex": bytes(value).hex()}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, float) or value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return int(value)
    return str(value)


def make(message: dict[str, Any]) -> Message:
    body = message["body"]
    value = native(body["value"])
    return Message(
        id=message["id"],
        content_type=symbol(message["content_type"]),
        properties={k: native(v) for k, v in message["props"].items()},
        body=value,
        inferred=body["kind"] == "data",
    )


def send(conn: BlockingConnection) -> Any:
    out = {}
    for target in JOB["targets"]:
        sender = conn.create_sender(target)
        for message in JOB["messages"]:
            m = make(message)
            sender.send(m)
            out.setdefault(target, []).append(m.encode().hex())
    return {"sent": out}


def recv(conn: BlockingConnection) -> Any:
    raw_of: dict[int, bytes] = {}

    def recv_msg(delivery: Delivery) -> Message:
        raw = delivery.link.recv(delivery.pending)
        delivery.link.advance()
        msg = Message()
        msg.decode(raw)
        raw_of[id(msg)] = raw
        return msg

    handlers.recv_msg = recv_msg  # keep the wire bytes for the byte-exact comparison
    out: dict[str, Any] = {}
    for source in JOB["sources"]:
        receiver = conn.create_receiver(source)
        for _ in range(JOB["count"]):
            m = receiver.receive(timeout=10)
            receiver.accept()
            kind = "data" if m.inferred and isinstance(m.body, bytes | memoryview) else "value"
            out.setdefault(source, []).append(
                {
                    "id": m.id,
                    "content_type": m.content_type,
                    "props": plain(m.properties or {}),
                    "body": {"kind": kind, "value": plain(m.body)},
                    "raw": raw_of[id(m)].hex(),  # as on the wire, for the bare-message check
                }
            )
        receiver.close()
    return {"received": out}


def main() -> None:
    if JOB["mode"] != "cases":
        conn = connect()
        result = send(conn) if JOB["mode"] == "send" else recv(conn)
        conn.close()
        emit(result)
        return
    cases: dict[str, Callable[[BlockingConnection], Any]] = {
        "queue": queue_order,
        "topic": topic,
        "reject": reject,
        "modified": lambda c: redelivery(c, f"q.{P}.mod", failed=True),
        "released": lambda c: redelivery(c, f"q.{P}.rel", failed=False),
        "tls": lambda c: tls_plain(),
        "large": large,
        "durable": durable,
        "shared": shared,
        "transactions": transactions,
    }
    emit(run_cases({name: own_connection(case) for name, case in cases.items()}))


def own_connection(case: Callable[[BlockingConnection], Any]) -> Callable[[], Any]:
    """One connection per case: a failure stays in its case."""

    def run() -> Any:
        conn = connect()
        try:
            return case(conn)
        finally:
            conn.close()

    return run


if __name__ == "__main__":
    main()
