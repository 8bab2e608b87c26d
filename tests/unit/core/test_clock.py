"""One clock in the core (issue 18): a Broker reads only its injected clock, once per call
into it (`clock.entry`), and every event of a call carries that call's time (B-170 `ts`).

The scenario goes through the paths that nest one entry point in another: auto-created
addresses and queues on attach and on an anonymous relay (B-009, B-110), dead letters to
an auto-created DLA (B-073/B-074), redelivery delays (B-065), expiry to an auto-created
expiry address (B-084…B-086), management moves (B-161), temporary queues dying with their
connection, and the reaper (B-111).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from support.core_harness import CONN, Harness

from amqpbroker.core import (
    Accepted,
    AddressSettings,
    Broker,
    ConnectionId,
    ConsumerRequest,
    Dispatch,
    ManualClock,
    Message,
    Modified,
    ProducerRequest,
    Rejected,
)
from amqpbroker.core.operations import move, purge, retry

SETTINGS = {
    "#": AddressSettings.of(
        dead_letter_address="DLA",
        auto_create_dead_letter_resources=True,
        expiry_address="EXP",
        auto_create_expiry_resources=True,
        redelivery_delay=1000,
        max_delivery_attempts=3,
        auto_delete_queues_delay=10,
        auto_delete_addresses_delay=10,
    )
}


class _CountingClock(ManualClock):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def now_ms(self) -> int:
        self.reads += 1
        return super().now_ms()


_TIME_SOURCES = (
    "time",
    "time_ns",
    "monotonic",
    "monotonic_ns",
    "perf_counter",
    "perf_counter_ns",
    "process_time",
    "process_time_ns",
    "thread_time",
    "thread_time_ns",
    "localtime",
    "gmtime",
)


@pytest.fixture
def no_other_clock(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make every `time` function record who called it. Logging stamps its records with
    `time.time()`: that is the log's clock, not the broker's, so it may."""
    callers: list[str] = []

    def guard(name: str) -> Callable[..., Any]:
        real = getattr(time, name)

        def read(*args: Any) -> Any:
            caller = sys._getframe(1).f_globals.get("__name__", "?")
            if caller != "logging":
                callers.append(f"{caller} called time.{name}")
            return real(*args)

        return read

    for name in _TIME_SOURCES:
        monkeypatch.setattr(time, name, guard(name))
    return callers


def dlq_name(broker: Broker, address: str) -> str:
    [queue] = broker.post_office.addresses[address].queues
    return queue.name


def _scenario(h: Harness, call: Callable[..., Any]) -> None:
    """Drive the broker through its nesting paths; `call(fn, *args, **kw)` makes one call
    into it."""
    broker = h.broker
    target = call(
        broker.attach_producer,
        ProducerRequest(connection=CONN, address="orders", capabilities=("queue",)),
    )
    relay = call(broker.attach_producer, ProducerRequest(connection=CONN, address=None))
    attached = call(
        broker.attach_consumer,
        ConsumerRequest(
            connection=CONN,
            container_id="c",
            link_name="l",
            address="orders",
            capabilities=("queue",),
        ),
    )
    consumer = attached.consumer
    for body in (b"a", b"b"):
        call(broker.publish, Message(body, annotations={}, properties={}), target)
    # An anonymous relay to an address that does not exist yet: auto-created inside publish.
    call(broker.publish, Message(b"r", annotations={}, properties={}), relay, to="relayed")
    assert "relayed" in broker.post_office.addresses
    call(broker.publish, Message(b"t", annotations={}, properties={}, ttl_ms=50), target)
    call(broker.set_credit, consumer, 10)
    dispatched = [e for e in broker.take_effects() if isinstance(e, Dispatch)]
    a, b, t = dispatched[:3]
    call(broker.settle, consumer, a.delivery, Modified(delivery_failed=True))  # delayed
    call(broker.settle, consumer, b.delivery, Rejected())  # to the DLA, auto-created
    call(broker.hold, consumer, t.delivery)
    call(broker.rollback_delivery, consumer, t.delivery)  # back, delayed, then expires
    h.clock.advance(1000)
    call(broker.tick)  # a's redelivery is due
    [again] = [e for e in broker.take_effects() if isinstance(e, Dispatch)]
    call(broker.settle, consumer, again.delivery, Accepted())
    h.clock.advance(30_000)
    call(broker.tick)  # expiry scan (auto-creates EXP) and a reaper pass
    assert broker.queues[dlq_name(broker, "EXP")].message_count == 1
    call(broker.set_credit, consumer, 0)
    call(broker.publish, Message(b"p", annotations={}, properties={}), target)
    call(purge, broker, "orders")
    call(move, broker, dlq_name(broker, "DLA"), to_queue="orders")
    call(retry, broker, "orders")
    temporary = call(
        broker.attach_consumer,
        ConsumerRequest(
            connection=ConnectionId(2), container_id="d", link_name="t", address=None, dynamic=True
        ),
    )
    call(broker.set_credit, temporary.consumer, 5)
    call(broker.detach_consumer, consumer, closed=True)
    call(broker.connection_closed, ConnectionId(2), abrupt=True)  # its temporary queue
    h.clock.advance(30_000)
    call(broker.tick)
    h.clock.advance(30_000)
    call(broker.tick)  # reaped on the second pass that finds them idle


def test_a_broker_on_a_manual_clock_reads_no_other_time_source(
    no_other_clock: list[str],
) -> None:
    h = Harness(SETTINGS)
    events = 0
    kinds: set[str] = set()

    def call(fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        nonlocal events
        result = fn(*args, **kw)
        taken = h.broker.emitter.take()
        events += len(taken)
        kinds.update(e.event for e in taken)
        assert {e.ts for e in taken} <= {h.clock.now_ms()}, fn.__name__  # the call's time
        return result

    _scenario(h, call)
    assert no_other_clock == []
    assert events > 20  # the scenario made events, each checked above
    assert {"dead-lettered", "expired", "returned", "moved", "killed", "acked"} <= kinds


def test_each_call_into_the_broker_reads_the_clock_once() -> None:
    """Also the calls that reach other entry points inside the broker (an auto-created
    address in publish, a deleted queue in tick, detach in connection_closed)."""
    clock = _CountingClock()
    h = Harness(SETTINGS)
    h.broker.moment.clock = clock
    h.clock = clock
    names: list[str] = []

    def call(fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        clock.reads = 0
        result = fn(*args, **kw)
        name = getattr(fn, "__name__", repr(fn))  # a method mypyc compiled has none
        assert clock.reads == 1, name
        names.append(name)
        return result

    _scenario(h, call)
    assert len(names) == 26


def test_messages_published_within_a_millisecond_share_one_first_ts() -> None:
    """Issue 20 (memory per queued message): on the system clock, the broker keeps its
    `now_ms` object while the clock reads the same millisecond (`Moment.read`), so the
    messages queued within one share one `first_ts` object, not an int each. Compiled,
    `Message` and `Moment` keep their ints unboxed: no object at all, and a read makes
    one each time, so identity is checked on the pure-Python build only."""
    from random import Random

    from amqpbroker.core import Broker, ProducerRequest, SettingsRepository, SystemClock, model

    broker = Broker(settings=SettingsRepository({}), clock=SystemClock(), rng=Random(0))
    target = broker.attach_producer(ProducerRequest(connection=CONN, address="q"))
    compiled = not model.__file__.endswith(".py")
    for _ in range(1000):  # bounded: two sends within one millisecond come quickly
        first, second = Message(b"1"), Message(b"2")
        broker.publish(first, target)
        broker.publish(second, target)
        if first.first_ts == second.first_ts:
            assert first.first_ts == broker.now_ms
            assert compiled or first.first_ts is second.first_ts
            break
    else:
        pytest.fail("no two sends within one millisecond in 1000 tries")
