"""The pure-Python AMQP 1.0 stack inside azure-servicebus 7.x (`azure.servicebus._pyamqp`),
driven directly against an amqp:// URL: every case in one process (issue 21).

Usage: `python driver.py < job.json` -> one JSON line; job["mode"] is cases, send or recv.
"""

from __future__ import annotations

import ssl
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from azure.servicebus._pyamqp import ReceiveClient, SendClient
from azure.servicebus._pyamqp.authentication import SASLPlainAuth
from azure.servicebus._pyamqp.constants import ReceiverSettleMode
from azure.servicebus._pyamqp.endpoints import Source
from azure.servicebus._pyamqp.error import AMQPError
from azure.servicebus._pyamqp.message import Message, Properties
from azure.servicebus._pyamqp.types import TYPE, VALUE, AMQPTypes

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # interop/common.py
from common import decoded, emit, payload, read_job, run_cases, same_payload, text

JOB = read_job()
P = JOB["prefix"]


def endpoint(tls: bool) -> dict[str, Any]:
    """pyamqp's Connection ignores the URL's port under TLS: the port goes in through
    `custom_endpoint_address`; plain TCP needs use_tls=False to keep it."""
    if tls:
        context = ssl.create_default_context(cafile=JOB["ca"])
        return {
            "hostname": JOB["tls_host"],
            "custom_endpoint_address": f"amqps://{JOB['tls_host']}:{JOB['tls_port']}",
            "ssl_context": context,
        }
    return {"hostname": f"{JOB['host']}:{JOB['port']}", "use_tls": False}


def auth(password: str | None = None) -> SASLPlainAuth:
    return SASLPlainAuth(JOB["user"], password or JOB["password"])


def send(
    address: str, messages: list[Message], *, tls: bool = False, password: str | None = None
) -> None:
    ep = endpoint(tls)
    client = SendClient(ep.pop("hostname"), address, auth=auth(password), **ep)
    try:
        client.open()
        for message in messages:
            client.send_message(message, timeout=10)
    finally:
        client.close()


class Receiver(ReceiveClient):  # type: ignore[misc]
    """ReceiveClient with a chosen link name (durable subscriptions need one); deliveries
    are taken with their transfer frame so they can be settled one by one."""

    def __init__(
        self, source: Any, *, link_name: str | None = None, tls: bool = False, **kw: Any
    ) -> None:
        ep = endpoint(tls)
        self._link_name = link_name
        super().__init__(
            ep.pop("hostname"),
            source,
            auth=auth(),
            receive_settle_mode=ReceiverSettleMode.First,
            link_credit=10,
            max_message_size=0,
            **ep,
            **kw,
        )

    def _client_ready(self) -> bool:
        if not self._link:
            self._link = self._session.create_receiver_link(
                source_address=self.source,
                name=self._link_name,
                link_credit=0,
                send_settle_mode=self._send_settle_mode,
                rcv_settle_mode=self._receive_settle_mode,
                max_message_size=self._max_message_size,
                on_transfer=self._message_received,
                properties=self._link_properties,
                desired_capabilities=self._desired_capabilities,
                on_attach=self._on_attach,
            )
            self._link.attach()
            return False
        return bool(super()._client_ready())

    def next(self, timeout: float = 10) -> tuple[Any, Message]:
        self.open()
        deadline = time.monotonic() + timeout
        while self._received_messages.empty():
            if time.monotonic() > deadline:
                raise TimeoutError("no message")
            self.do_work()
        frame, message = self._received_messages.get_nowait()
        return frame, message

    def settle(self, frame: Any, outcome: str, **kw: Any) -> None:
        self.settle_messages(frame[1], frame[2], outcome, **kw)  # delivery-id, delivery-tag


def take(source: Any, count: int, **kw: Any) -> list[Message]:
    receiver = Receiver(source, **kw)
    out = []
    try:
        for _ in range(count):
            frame, message = receiver.next()
            receiver.settle(frame, "accepted")
            out.append(message)
    finally:
        receiver.close()
    return out


def body(message: Message) -> Any:
    return text(message.value) if message.value is not None else b"".join(message.data)


def queue_order() -> Any:
    send(f"q.{P}.order", [Message(value=f"m{i}") for i in range(5)])
    return [body(m) for m in take(f"q.{P}.order", 5)]


def topic() -> Any:
    receivers = [Receiver(f"t.{P}.news") for _ in range(2)]
    for r in receivers:
        r.open()
        while not r.client_ready():
            r.do_work()
    send(f"t.{P}.news", [Message(value=f"n{i}") for i in range(3)])
    out = []
    for r in receivers:
        bodies = []
        for _ in range(3):
            frame, message = r.next()
            r.settle(frame, "accepted")
            bodies.append(body(message))
        out.append(bodies)
        r.close()
    return out


def reject() -> Any:
    send(f"q.{P}.rej", [Message(value="poison")])
    receiver = Receiver(f"q.{P}.rej")
    frame, _ = receiver.next()
    receiver.settle(
        frame, "rejected", error=AMQPError(condition=b"app:poison", description="cannot parse")
    )
    receiver.close()
    dead = take(f"DLA::DLQ.q.{P}.rej", 1)[0]
    annotations = {text(k): text(v) for k, v in (dead.message_annotations or {}).items()}
    return {"body": body(dead), "annotations": annotations}


def redelivery(address: str, outcome: str, **kw: Any) -> Any:
    send(address, [Message(value="again")])
    receiver = Receiver(address)
    frame, first = receiver.next()
    receiver.settle(frame, outcome, **kw)
    frame, second = receiver.next()
    receiver.settle(frame, "accepted")
    receiver.close()
    return [(m.header and m.header.delivery_count) or 0 for m in (first, second)]


def tls_plain() -> Any:
    send(f"q.{P}.tls", [Message(value="over-tls")], tls=True)
    got = body(take(f"q.{P}.tls", 1, tls=True)[0])
    try:
        send(f"q.{P}.tls", [Message(value="x")], tls=True, password="wrong")
        refused = False
    except Exception as exc:
        refused = "SASL negotiation failed" in str(exc)
    return {"body": got, "wrong_password_refused": refused}


def large() -> Any:
    sent = payload(JOB["large"])
    send(f"q.{P}.large", [Message(data=[sent])])
    got = body(take(f"q.{P}.large", 1)[0])
    return same_payload(got, sent)


def source(address: str, *caps: str) -> Source:
    return Source(
        address=address,
        durable=2,  # unsettled-state
        expiry_policy=b"never",
        capabilities=list(caps) or None,
    )


def durable() -> Any:
    cid = f"pyamqp-durable-{P}"
    first = Receiver(source(f"t.{P}.dur"), link_name="sub", client_name=cid)
    first.open()
    while not first.client_ready():
        first.do_work()
    first._connection.close()  # connection gone, link never detached: it stays (B-028)
    send(f"t.{P}.dur", [Message(value="d0"), Message(value="d1")])
    return [body(m) for m in take(source(f"t.{P}.dur"), 2, link_name="sub", client_name=cid)]


def shared() -> Any:
    receivers = [
        Receiver(source(f"t.{P}.shared", "shared", "global"), link_name="shsub") for _ in range(2)
    ]
    for r in receivers:
        r.open()
        while not r.client_ready():
            r.do_work()
    send(f"t.{P}.shared", [Message(value=f"s{i}") for i in range(4)])
    seen: list[list[str]] = [[], []]
    for _ in range(40):
        for i, r in enumerate(receivers):
            try:
                frame, message = r.next(timeout=0.1)
            except TimeoutError:
                continue
            r.settle(frame, "accepted")
            seen[i].append(body(message))
        if sum(map(len, seen)) >= 4:
            break
    for r in receivers:
        r.close()
    return {"bodies": sorted(seen[0] + seen[1]), "per_receiver": [len(s) for s in seen]}


# --- cross matrix ---------------------------------------------------------------------


def native(typed: dict[str, Any]) -> Any:
    t, v = typed["t"], typed.get("v")
    if t == "binary":
        return bytes.fromhex(v)
    if t == "long":
        return {TYPE: AMQPTypes.long, VALUE: v}
    if t == "map":
        return {k: native(x) for k, x in v.items()}
    if t == "list":
        return [native(x) for x in v]
    return v


def make(spec: dict[str, Any]) -> Message:
    value = native(spec["body"]["value"])
    sections = {"data": [value]} if spec["body"]["kind"] == "data" else {"value": value}
    return Message(
        properties=Properties(message_id=spec["id"], content_type=spec["content_type"]),
        application_properties={k: native(v) for k, v in spec["props"].items()},
        **sections,
    )


def matrix_send() -> Any:
    for target in JOB["targets"]:
        send(target, [make(m) for m in JOB["messages"]])
    return {"sent": True}


def matrix_recv() -> Any:
    out = {}
    for src in JOB["sources"]:
        out[src] = [
            {
                "id": text(m.properties.message_id),
                "content_type": text(m.properties.content_type),
                "props": decoded(m.application_properties or {}),
                "body": (
                    {"kind": "value", "value": decoded(m.value)}
                    if m.value is not None
                    else {"kind": "data", "value": {"hex": b"".join(m.data).hex()}}
                ),
            }
            for m in take(src, JOB["count"])
        ]
    return {"received": out}


def main() -> None:
    if JOB["mode"] == "send":
        result = matrix_send()
    elif JOB["mode"] == "recv":
        result = matrix_recv()
    else:
        cases: dict[str, Callable[[], Any]] = {
            "queue": queue_order,
            "topic": topic,
            "reject": reject,
            "modified": lambda: redelivery(f"q.{P}.mod", "modified", delivery_failed=True),
            "released": lambda: redelivery(f"q.{P}.rel", "released"),
            "tls": tls_plain,
            "large": large,
            "durable": durable,
            "shared": shared,
        }
        result = run_cases(cases)
    emit(result)


if __name__ == "__main__":
    main()
