"""The event-log frame's payload written by `_frames.c` (issue 20, `writer.payload_of`):
what `marshal.loads` reads back is the value `marshal.dumps` would have carried, objects
that recur written once; what the C refuses goes to marshal; the writer process writes
the same lines either way (B-170)."""

from __future__ import annotations

import marshal
from pathlib import Path
from random import Random
from typing import Any

import pytest
from support.eventframes import frames_module
from unit.eventlog.test_eventlog import ManualLoop, file_bytes, varied_events, writer

from amqpbroker.amqp import sections
from amqpbroker.core import RawEvent
from amqpbroker.core.lifecycle import KNOWN
from amqpbroker.eventlog import frames
from amqpbroker.eventlog import writer as writer_module


def nested(depth: int) -> Any:
    value: Any = "deep"
    for _ in range(depth):
        value = (value,)
    return value


def dumps(value: Any) -> bytes:
    result: bytes = frames_module().dumps(value)
    return result


def frame_of_turn(messages: int) -> tuple[int, int, list[RawEvent]]:
    """A loop turn's frame as the core records it: shapes shared by queue and consumer,
    one part per message shared by its events (some `KNOWN`), epoch-ms times."""
    where = ("orders", "orders", "ANYCAST")
    by = ("conn-1", "link-1")
    shapes = {
        kind: (kind, where, None if kind == "enqueued" else by, None)
        for kind in ("sent", "enqueued", "dispatched", "acked")
    }
    events: list[RawEvent] = []
    for i in range(messages):
        data: Any = KNOWN if i % 4 == 3 else bytes([i % 256]) * (100 + i)
        part = (i + 1, i % 2 == 0, 1024, 1_764_400_000_000 + i, data)
        ts = 1_764_400_000_000 + i
        for kind in ("sent", "enqueued", "dispatched", "acked"):
            events.append((shapes[kind], ts, part, 1 if kind == "dispatched" else None, None))
    events.append(
        (
            ("dead-lettered", ("q\u00e9", "q\u00e9", None), by, "rejected"),
            -(2**40),
            (2**63 - 1, True, 0, -(2**63), b""),
            2**31,
            ("ab", "DLA", ("q1", "q2"), 10_001, 5, "app:poison", "x" * 300, "m-\u20ac"),
        )
    )
    return (1, 1_764_400_000_000, events)


def test_the_payload_reads_back_as_the_value_marshal_carries() -> None:
    """The frame of a loop turn, and values at every boundary marshal or the C encodes
    differently (int32 and int64 ends, ints of one to three 30-bit digits, str of
    255/256 ASCII bytes, non-ASCII, tuples of 255/256 items, lists, empty values), read
    back equal to the value."""
    values: list[Any] = [
        frame_of_turn(50),
        (None, True, False, 0, -1, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1),
        (2**63 - 1, -(2**63), 2**45 + 12345, -(2**45)),
        # one, two and three 30-bit digits (the C reads up to two itself)
        (2**30 - 1, 2**30, -(2**30), 2**60 - 1, 2**60, -(2**60) + 1, -(2**60), 2**62),
        ("", "a" * 255, "a" * 256, "\u00e9" * 300, "\U0001f600", b"", b"\x00" * 70000),
        tuple(range(255)),
        tuple(range(256)),
        [[], (), [()], ((),)],
    ]
    for value in values:
        payload = dumps(value)
        assert marshal.loads(payload) == marshal.loads(marshal.dumps(value)) == value


def test_random_values_read_back_equal() -> None:
    """Nested values of every type the C writes, some objects recurring, read back equal."""
    rng = Random(20)
    pool: list[Any] = []

    def value(depth: int) -> Any:
        kind = rng.randrange(9 if depth < 5 else 5)
        if kind == 0:
            return rng.choice([None, True, False])
        if kind == 1:
            return rng.randrange(-(2**63), 2**63) >> rng.randrange(64)
        if kind == 2:
            return rng.randbytes(rng.randrange(300))
        if kind == 3:
            return rng.choice(["", "abc", "\u00e9\u00e8", "z" * 300, "\U0001f600" * 90])
        if kind == 4 and pool:
            return rng.choice(pool)
        if kind in (5, 6):
            made: Any = tuple(value(depth + 1) for _ in range(rng.randrange(6)))
            pool.append(made)
            return made
        if kind == 7:
            return [value(depth + 1) for _ in range(rng.randrange(6))]
        return rng.randrange(-(2**31), 2**31)

    for _ in range(2000):
        v = value(0)
        assert marshal.loads(dumps(v)) == v


def test_objects_that_recur_are_written_once_and_read_back_as_one() -> None:
    """A message part shared by its events (its 1 KiB once a frame, as marshal writes it)
    and a shape shared by events read back as one object each: the writer process caches
    a frame's texts by `id(shape)`."""
    shape = ("sent", ("a", "q", None), ("c", "l"), None)
    part = (7, False, 1024, 1_764_400_000_000, b"m" * 1024)
    frame = (1, 2, [(shape, 3, part, None, None) for _ in range(100)])
    payload = dumps(frame)
    assert len(payload) < 1024 + 100 * 40
    _, _, events = marshal.loads(payload)
    assert len({id(e[0]) for e in events}) == 1
    assert len({id(e[2]) for e in events}) == 1
    assert events == frame[2]


@pytest.mark.parametrize(
    "refused",
    [
        sections.Symbol("app:poison"),
        sections.UInt(3),
        1.5,
        {"a": 1},
        2**64,
        -(2**63) - 1,
        "\ud800",
        nested(40),
    ],
    ids=["symbol", "uint", "float", "dict", "2**64", "below-int64", "surrogate", "deep"],
)
def test_what_the_c_refuses_goes_to_marshal(refused: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An int or str subclass, a float, a dict, an int beyond int64, a lone surrogate or
    a nesting deeper than the C's bound: ValueError there, and `payload_of` gives
    marshal's payload (subclasses as plain values, `frames.dumps`)."""
    frame = (1, 2, [(("moved", None, None, None), 3, (1, False, 0, 0, b""), None, (refused,))])
    with pytest.raises(ValueError, match=r"_frames|surrogates"):
        dumps(frame)
    monkeypatch.setattr(writer_module, "_sized_dumps", frames_module().dumps)
    assert writer_module.payload_of(frame) == frames.dumps(frame)


def test_the_writer_process_writes_the_same_lines_from_either_payload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B-170: varied events (every type, rare fields, a str subclass that sends its frame
    to marshal) handed over in loop turns of every size make the same file with the C's
    payloads as with marshal's, and the C wrote most frames."""
    events = varied_events()
    config: dict[str, Any] = {"properties": ["tenant"], "body_hash": True}
    written: list[Path] = []
    made = 0
    fast = frames_module().dumps

    def counted(value: Any) -> bytes:
        nonlocal made
        payload: bytes = fast(value)
        made += 1
        return payload

    for name, sized in (("marshal", None), ("c", counted)):
        monkeypatch.setattr(writer_module, "_sized_dumps", sized)
        loop = ManualLoop()
        w = writer(tmp_path / name, queue_events=1 << 20, **config)
        w.start(schedule=loop, soon=loop.soon)
        rest, size = list(events), 1
        while rest:
            turn, rest = rest[:size], rest[size:]
            w.submit(turn)
            loop.end_turn()
            size += 1
        w.close()
        assert w.dropped_total == 0
        written.append(tmp_path / name)
    assert file_bytes(written[0]) == file_bytes(written[1])
    assert made >= 5
