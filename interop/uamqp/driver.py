"""uamqp 1.6.11 (Azure uAMQP-C with Python bindings) against amqpbroker (issue 21).

uamqp only speaks TLS: every connection is amqps to `localhost` with the CA from
`amqpbroker certs create`. Usage: `python driver.py < job.json` -> one JSON line.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uamqp
from uamqp import authentication, c_uamqp, constants, errors
from uamqp.address import Source, Target
from uamqp.message import DataBody, MessageProperties
from uamqp.types import AMQPInt, AMQPLong, AMQPType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # interop/common.py
from common import decoded, emit, payload, read_job, run_cases, same_payload, text

JOB = read_job()
P = JOB["prefix"]
# uamqp offers max-frame-size 63488 and refuses a bigger frame from the broker unless its
# own limit is raised (interop/README.md): a user moving 5 MiB messages raises it.
FRAME = 1024 * 1024
# max_message_size=0 (no limit, in AMQP) is replaced by uamqp's default, 1 MiB: the broker
# then keeps a bigger message from that link, so receivers ask for 16 MiB.
MAX_MESSAGE = 16 * 1024 * 1024


def auth(password: str | None = None) -> authentication.SASLPlain:
    return authentication.SASLPlain(
        JOB["tls_host"],
        JOB["user"],
        password or JOB["password"],
        port=JOB["tls_port"],
        verify=JOB["ca"],
    )


def node(kind: type[Source] | type[Target], name: str) -> Any:
    """uamqp puts the whole `amqps://host/name` URL (without its port) in the attach as the
    node address, as Azure expects; a broker with plain node names needs just `name`."""
    address = kind(f"amqps://{JOB['tls_host']}/{name}")
    address._c_address = c_uamqp.string_value(name.encode())
    address._address.address = address._c_address
    return address


def send(
    address: str,
    messages: list[uamqp.Message],
    *,
    password: str | None = None,
    frame: int | None = FRAME,
) -> None:
    client = uamqp.SendClient(
        node(Target, address),
        auth=auth(password),
        max_frame_size=frame,
        error_policy=errors.ErrorPolicy(max_retries=0),  # a failure is the answer, not retried
    )
    try:
        for message in messages:
            client.queue_message(message)
        results = client.send_all_messages(close_on_done=False)
        bad = [r for r in results if r != constants.MessageState.SendComplete]
        if bad:
            raise RuntimeError(f"send failed: {bad}")
    finally:
        client.close()


class Receiver(uamqp.ReceiveClient):  # type: ignore[misc]
    """ReceiveClient with a chosen link name (uamqp picks a random one), settling by hand."""

    def __init__(self, source: Any, *, link_name: str | None = None, **kw: Any) -> None:
        self._link_name = link_name
        self._inbox: list[uamqp.Message] = []
        super().__init__(
            source if isinstance(source, Source) else node(Source, source),
            auth=auth(),
            auto_complete=False,
            prefetch=10,
            max_frame_size=FRAME,
            max_message_size=MAX_MESSAGE,
            **kw,
        )

    def _client_ready(self) -> bool:
        if not self.message_handler and self._link_name:
            self.message_handler = self.receiver_type(
                self._session,
                self._remote_address,
                self._name,
                on_message_received=self._message_received,
                name=self._link_name,
                receive_settle_mode=self._receive_settle_mode,
                send_settle_mode=self._send_settle_mode,
                prefetch=0,
                max_message_size=self._max_message_size,
                encoding=self._encoding,
            )
            self.message_handler.open()
            return False
        return bool(super()._client_ready())

    def ready(self) -> None:
        self.open()
        deadline = time.monotonic() + 10
        while not self.client_ready():
            assert time.monotonic() < deadline, "receiver never attached"
            self.do_work()

    def next(self, timeout: float = 10) -> uamqp.Message:
        deadline = time.monotonic() + timeout
        while not self._inbox:
            if time.monotonic() > deadline:
                raise TimeoutError("no message")
            batch = self.receive_message_batch(max_batch_size=1, timeout=200)
            self._inbox.extend(batch)
        return self._inbox.pop(0)


def take(source: Any, count: int, **kw: Any) -> list[uamqp.Message]:
    receiver = Receiver(source, **kw)
    out = []
    try:
        for _ in range(count):
            message = receiver.next()
            message.accept()
            out.append(message)
    finally:
        receiver.close()
    return out


def value(text_body: str) -> uamqp.Message:
    return uamqp.Message(text_body, body_type=constants.MessageBodyType.Value)


def body(message: uamqp.Message) -> Any:
    data = message.get_data()
    if isinstance(message._body, DataBody):
        return b"".join(data)
    return text(data)


def delivery_count(message: uamqp.Message) -> int:
    return (message.header.delivery_count if message.header else 0) or 0


def queue_order() -> Any:
    send(f"q.{P}.order", [value(f"m{i}") for i in range(5)])
    return [body(m) for m in take(f"q.{P}.order", 5)]


def topic() -> Any:
    receivers = [Receiver(f"t.{P}.news") for _ in range(2)]
    for r in receivers:
        r.ready()
    send(f"t.{P}.news", [value(f"n{i}") for i in range(3)])
    out = []
    for r in receivers:
        bodies = []
        for _ in range(3):
            message = r.next()
            message.accept()
            bodies.append(body(message))
        out.append(bodies)
        r.close()
    return out


def reject() -> Any:
    send(f"q.{P}.rej", [value("poison")])
    receiver = Receiver(f"q.{P}.rej")
    receiver.next().reject(condition="app:poison", description="cannot parse")
    receiver.close()
    dead = take(f"DLA::DLQ.q.{P}.rej", 1)[0]
    annotations = {text(k): text(v) for k, v in (dead.annotations or {}).items()}
    return {"body": body(dead), "annotations": annotations}


def redelivery(address: str, settle: Callable[[uamqp.Message], Any]) -> Any:
    send(address, [value("again")])
    receiver = Receiver(address)
    first = receiver.next()
    settle(first)
    second = receiver.next()
    second.accept()
    receiver.close()
    return [delivery_count(first), delivery_count(second)]


def tls_plain() -> Any:
    send(f"q.{P}.tls", [value("over-tls")])
    got = body(take(f"q.{P}.tls", 1)[0])
    try:
        send(f"q.{P}.tls", [value("x")], password="wrong")
        refused = False
    except Exception as exc:
        # uamqp surfaces a failed SASL outcome only as this connection error
        refused = "unexpected error state" in str(exc)
    return {"body": got, "wrong_password_refused": refused}


def large() -> Any:
    sent = payload(JOB["large"])
    send(f"q.{P}.large", [uamqp.Message(sent)])
    got = body(take(f"q.{P}.large", 1)[0])
    return same_payload(got, sent)


def durable() -> Any:
    cid = f"uamqp-durable-{P}"

    def source() -> Source:
        s = node(Source, f"t.{P}.dur")
        s.durable = 2  # unsettled-state
        s.expiry_policy = b"never"
        return s

    first = Receiver(source(), link_name="sub", client_name=cid)
    first.ready()
    first._connection.destroy()  # connection gone, link never detached: it stays (B-028)
    send(f"t.{P}.dur", [value("d0"), value("d1")])
    return [body(m) for m in take(source(), 2, link_name="sub", client_name=cid)]


def modify_as_documented() -> Any:
    """The inversion seen from the broker (B-045): modify(failed=True, deliverable=True)
    arrives as undeliverable-here=true, so this link never gets the message again while a
    second link does, with delivery-count 1."""
    address = f"q.{P}.modify-probe"
    send(address, [value("probe")])
    first = Receiver(address)
    first.next().modify(True, True)
    try:
        first.next(timeout=1.5)
        same_link_again = True
    except TimeoutError:
        same_link_again = False
    other = Receiver(address)
    again = other.next()
    again.accept()
    for r in (first, other):
        r.close()
    return {"same_link_again": same_link_again, "other_link_count": delivery_count(again)}


def default_frame_size() -> Any:
    """200 KiB with uamqp's default max_frame_size: its frame codec refuses the frames."""
    try:
        send(f"q.{P}.frame-probe", [uamqp.Message(bytes(200 * 1024))], frame=None)
        return "sent"
    except RuntimeError as exc:
        return str(exc)


# --- cross matrix ---------------------------------------------------------------------


class AMQPBinary(AMQPType):  # type: ignore[misc]
    """uamqp's data_factory says bytes => binary but calls string_value(): a bytes property
    goes out as an AMQP string cut at its first NUL. Wrapping it is the user's way out."""

    def _c_wrapper(self, value: bytes) -> Any:
        return c_uamqp.binary_value(value)


def native(typed: dict[str, Any], *, in_body: bool = False) -> Any:
    t, v = typed["t"], typed.get("v")
    if t == "binary":
        return bytes.fromhex(v) if in_body else AMQPBinary(bytes.fromhex(v))
    if t == "int":
        return AMQPInt(v)
    if t == "long":
        return AMQPLong(v)
    if t == "map":
        return {k: native(x) for k, x in v.items()}
    if t == "list":
        return [native(x) for x in v]
    return v


def make(spec: dict[str, Any]) -> uamqp.Message:
    data = spec["body"]["kind"] == "data"
    return uamqp.Message(
        native(spec["body"]["value"], in_body=True),
        properties=MessageProperties(message_id=spec["id"], content_type=spec["content_type"]),
        application_properties={k: native(v) for k, v in spec["props"].items()},
        body_type=constants.MessageBodyType.Data if data else constants.MessageBodyType.Value,
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
                    {"kind": "data", "value": {"hex": body(m).hex()}}
                    if isinstance(m._body, DataBody)
                    else {"kind": "value", "value": decoded(m.get_data())}
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
            # modify(failed, deliverable) sends `deliverable` as undeliverable-here:
            # deliverable=False is what puts undeliverable-here=false on the wire.
            "modified": lambda: redelivery(f"q.{P}.mod", lambda m: m.modify(True, False)),
            "released": lambda: redelivery(f"q.{P}.rel", lambda m: m.release()),
            "tls": tls_plain,
            "large": large,
            "durable": durable,
        }
        result = run_cases(cases)
        result["probes"] = run_cases(
            {"modify": modify_as_documented, "default_frame_size": default_frame_size}
        )
    emit(result)
    # uamqp's C objects can segfault when the interpreter's final collection frees them
    # (seen once in four runs, after all output, "Garbage-collecting"): leave without it.
    os._exit(0)


if __name__ == "__main__":
    main()
